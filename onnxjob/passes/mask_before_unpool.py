"""MaskBeforeMaxUnpool: apply a ReLU-style gradient mask on the pooled side of MaxUnpool.

Rewrite case (the gradient of ReLU -> MaxPool, with P, I = MaxPool(R)):
  Where(Greater(R, 0), MaxUnpool(G, I, shape), 0)
      -> MaxUnpool(Where(Greater(P, 0), G, 0), I, shape)
MaxUnpool leaves zeros everywhere except at each window's arg-max, where R equals P, so
the mask can be taken there: the Greater and Where then touch the pooled tensor (a quarter
of the elements for 2x2 windows) instead of the full one. Exact, ties included (MaxUnpool
writes each window's gradient to one position).
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import has_single_use, is_zero_constant, replace_value


def _match(where):
    """(greater, unpool, pool) when `where` is the rewrite's pattern, else None."""
    if where.op_type != "Where" or not is_zero_constant(where.inputs[2]):
        return None
    greater, unpool = where.inputs[0].producer(), where.inputs[1].producer()
    if greater is None or greater.op_type != "Greater" or \
            not is_zero_constant(greater.inputs[1]):
        return None
    if unpool is None or unpool.op_type != "MaxUnpool" or not has_single_use(where.inputs[1]):
        return None
    pool = unpool.inputs[1].producer()
    if pool is None or pool.op_type != "MaxPool" or len(pool.outputs) < 2:
        return None
    if pool.outputs[1] is not unpool.inputs[1] or pool.inputs[0] is not greater.inputs[0]:
        return None
    return greater, unpool, pool


class MaskBeforeMaxUnpool(InPlacePass):
    def call(self, model):
        modified = False
        graph = model.graph
        for where in list(graph):
            if where.graph is None:
                continue
            found = _match(where)
            if found is None:
                continue
            greater, unpool, pool = found
            pooled, grad = pool.outputs[0], unpool.inputs[0]
            meta = dict(where.metadata_props)
            mask = ir.node("Greater", [pooled, greater.inputs[1]], name=f"{where.name}/pooled_mask",
                           metadata_props=meta)
            masked = ir.node("Where", [mask.outputs[0], grad, where.inputs[2]],
                             name=f"{where.name}/pooled", metadata_props=meta)
            for value, suffix, shape, type_ in (
                    (mask.outputs[0], "pooled_mask", pooled.shape, ir.TensorType(ir.DataType.BOOL)),
                    (masked.outputs[0], "pooled", grad.shape, grad.type)):
                value.name = f"{where.outputs[0].name}/{suffix}"
                value.shape, value.type = shape, type_
            if not replace_value(where.outputs[0], unpool.outputs[0]):
                continue
            graph.insert_before(unpool, [mask, masked])
            unpool.replace_input_with(0, masked.outputs[0])
            graph.remove(where, safe=True)
            if not greater.outputs[0].uses():
                graph.remove(greater, safe=True)
            modified = True
        return PassResult(model, modified)
