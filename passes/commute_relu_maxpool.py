"""CommuteReluMaxPool: pool before the ReLU, so the ReLU and its gradient touch 1/k^2 of
the elements. max_pool(relu(x)) == relu(max_pool(x)), and the gradients agree: where the
window max is positive both route it to the same arg-max; elsewhere both give zero.

Rewrite cases (non-overlapping pools, whose gradient is a MaxUnpool):
  1. forward only (predict graphs):
       MaxPool(Relu(c))                      -> Relu(MaxPool(c))
  2. forward and backward (train graphs), r = Relu(c), (p, idx) = MaxPool(r):
       Where(Greater(r, 0), MaxUnpool(gp, idx), 0)
                                             -> MaxUnpool(Where(Greater(relu(p), 0), gp, 0), idx)
The ReLU must feed only the pool (and, in case 2, its own gradient mask).
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import attr, replace_value


def _non_overlapping(pool):
    k = list(attr(pool, "kernel_shape", []))
    return (list(attr(pool, "strides", k)) == k and not any(attr(pool, "pads", [0] * 4))
            and not attr(pool, "ceil_mode", 0) and list(attr(pool, "dilations", [1, 1])) == [1, 1])


def _grad_pattern(relu_out, pool):
    """(greater, where, unpool) of case 2, or None when the graph has another shape."""
    greater = next((u.node for u in relu_out.uses() if u.node.op_type == "Greater"), None)
    if greater is None or len(pool.outputs) < 2:
        return None
    mask = greater.outputs[0]
    if len(mask.uses()) != 1 or mask.uses()[0].node.op_type != "Where":
        return None
    where = mask.uses()[0].node
    unpool = where.inputs[1].producer()
    if unpool is None or unpool.op_type != "MaxUnpool" or unpool.inputs[1] is not pool.outputs[1]:
        return None
    if len(where.inputs[1].uses()) != 1:
        return None
    return greater, where, unpool


class CommuteReluMaxPool(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for pool in list(graph):
            if pool.op_type != "MaxPool" or pool.graph is None or not _non_overlapping(pool):
                continue
            relu = pool.inputs[0].producer()
            if relu is None or relu.op_type != "Relu" or relu.outputs[0].is_graph_output():
                continue
            r = relu.outputs[0]
            users = [u.node for u in r.uses()]
            grad = _grad_pattern(r, pool)
            if grad is None and users != [pool]:
                continue
            if grad is not None and sorted(n.op_type for n in users) != ["Greater", "MaxPool"]:
                continue
            p = pool.outputs[0]
            pool.replace_input_with(0, relu.inputs[0])
            new_relu = ir.node("Relu", [p], name=f"{relu.name}/after_pool",
                               metadata_props=dict(relu.metadata_props))
            graph.insert_after(pool, new_relu)
            pooled = new_relu.outputs[0]
            pooled.name, pooled.shape, pooled.type = f"{p.name}/relu", p.shape, p.type
            for use in list(p.uses()):
                if use.node is not new_relu:
                    use.node.replace_input_with(use.idx, pooled)
            if p.is_graph_output():
                replace_value(p, pooled)
            if grad is not None:  # case 2
                greater, where, unpool = grad
                greater.replace_input_with(0, pooled)
                greater.outputs[0].shape = p.shape
                gp = unpool.inputs[0]
                old_grad = where.outputs[0]
                where.replace_input_with(1, gp)
                where.outputs[0].shape = p.shape
                # move the unpool after the mask: its output takes the old gradient's uses
                graph.remove(unpool, safe=False)
                graph.insert_after(where, unpool)
                unpool.replace_input_with(0, where.outputs[0])
                for use in list(old_grad.uses()):
                    if use.node is not unpool:
                        use.node.replace_input_with(use.idx, unpool.outputs[0])
            graph.remove(relu, safe=True)
            modified = True
        return PassResult(model, modified)
