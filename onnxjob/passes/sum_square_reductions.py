"""SumSquareReductions: a sum or mean of a tensor's square in one pass over the tensor.

Rewrite cases, when the square is read by nothing else:
    ReduceSum(Mul(c, c), axes, keepdims)   ->  ReduceSumSquare(c, axes, keepdims)
    ReduceMean(Mul(c, c), axes, keepdims)  ->  Mul(ReduceSumSquare(c, axes, keepdims), 1/n)
with n the number of elements each output sums. The square is no longer written and read
back (graph/traffic.py): a batch norm's variance (the mean of the centered activation's
square: ResNet50's float32 step at batch 64, 5.3 GiB less) and an optimizer's norms (LAMB's
|w| and |update| per variable, the global norm of clipping by it). The sum of squares is
accumulated in the same precision as the sum or the mean was.
A mean that a data-parallel step keeps as its rank's own (onnxjob.distributed.RankLocal,
graph/primitives/collectives.py) is left alone: the rank's count of rows is decided when
the step is split (graph/split_batch.py), after the passes, and ReduceMean divides by it.
"""
import numpy as np
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph.primitives.collectives import DOMAIN as COLLECTIVES
from ._util import NodeEmitter, attr, has_single_use, reduce_axes, replace_value, static_shape


def _reduced(node, rank):
    """The axes a ReduceSum or ReduceMean of a rank-`rank` input reduces, or None when
    unknown."""
    axes = reduce_axes(node)
    if axes is None:
        computed = len(node.inputs) > 1 and node.inputs[1] is not None
        return None if computed or attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted({a % rank for a in axes})     # (a repeated axis is reduced once)


def _kept_rank_local(value):
    """Whether a collective reads `value` (or a view of it)."""
    for use in value.uses():
        node = use.node
        if node.domain == COLLECTIVES:
            return True
        if node.op_type in ("Reshape", "Squeeze", "Unsqueeze", "Identity") and \
                _kept_rank_local(node.outputs[0]):
            return True
    return False


class SumSquareReductions(InPlacePass):
    def call(self, model):
        graph = model.graph
        opset = model.opset_imports.get("", 1)
        modified = False
        for node in list(graph):
            if node.op_type not in ("ReduceSum", "ReduceMean") or node.graph is None or \
                    node.domain != "":
                continue
            mean = node.op_type == "ReduceMean"
            square = node.inputs[0].producer()
            if square is None or square.op_type != "Mul" or \
                    square.inputs[0] is not square.inputs[1] or \
                    not has_single_use(node.inputs[0]) or \
                    (mean and _kept_rank_local(node.outputs[0])):
                continue
            shape, out_shape = static_shape(square.inputs[0]), static_shape(node.outputs[0])
            axes = _reduced(node, len(shape)) if shape is not None else None
            if axes is None or out_shape is None or not axes:
                continue
            count = int(np.prod([shape[a] for a in axes]))
            e = NodeEmitter(graph, node, "sumsq")
            dtype = node.outputs[0].type.dtype
            keepdims = attr(node, "keepdims", 1)
            total = e.reduce("ReduceSumSquare", square.inputs[0], axes, out_shape, dtype,
                             keepdims, opset)
            if mean:
                total = e.node("Mul", [total, e.const(np.array(1.0 / count, dtype.numpy()))],
                               out_shape, dtype)
            if replace_value(node.outputs[0], total):
                graph.remove(node, safe=True)
                if not square.outputs[0].uses():
                    graph.remove(square, safe=True)
                modified = True
        return PassResult(model, modified)
