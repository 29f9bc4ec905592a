"""SplitChannelReductions: per-channel sums and means in two contiguous steps (CUDA only).

Rewrite case (batch norm's statistics and their gradients, a conv bias gradient), x of
shape (N, C, *S):
  ReduceSum|ReduceMean|ReduceSumSquare(x, axes=(0, 2, ..., r-1))
      -> Reshape(Reduce2(Reduce(Reshape(x, (N, C, prod(S))), axes=(2,)), axes=(0,)), out)
where Reduce2 is the same reduction but for ReduceSumSquare, whose second step sums the
first's sums of squares (ReduceSum). Where prod(S) is 1 (x holds one value per row: the
per-row statistics BatchNormRowStatistics reduces), only the reduction over N is made.
onnxruntime's CUDA reductions have fast kernels for reducing the rows or the columns of a
matrix, and a general one for other axis sets; both steps here are matrix reductions.
A mean of equal-sized group means is the mean, so ReduceMean stays ReduceMean.
"""
import numpy as np
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, reduce_axes, replace_value, static_shape

# the reductions split
_SPLIT = ("ReduceSum", "ReduceMean", "ReduceSumSquare")
# the second step of each (the first step's results are summed, not squared again)
_SECOND_STEP = {"ReduceSum": "ReduceSum", "ReduceMean": "ReduceMean",
                "ReduceSumSquare": "ReduceSum"}


class SplitChannelReductions(InPlacePass):
    def call(self, model):
        graph = model.graph
        opset = model.opset_imports.get("", 1)
        modified = False
        for node in list(graph):
            if node.op_type not in _SPLIT or node.graph is None:
                continue
            shape = static_shape(node.inputs[0])
            out_shape = static_shape(node.outputs[0])
            axes = reduce_axes(node)
            if shape is None or out_shape is None or axes is None or len(shape) < 3:
                continue
            rank = len(shape)
            if sorted(a % rank for a in axes) != [0] + list(range(2, rank)):
                continue
            replacement = self._split(graph, node, shape, out_shape, opset)
            if replace_value(node.outputs[0], replacement):
                graph.remove(node, safe=True)
                modified = True
        return PassResult(model, modified)

    @staticmethod
    def _split(graph, node, shape, out_shape, opset):
        n, c = shape[0], shape[1]
        e = NodeEmitter(graph, node, "split")
        dtype = node.outputs[0].type.dtype

        matrix = e.node("Reshape", [node.inputs[0], e.const(np.array([n, c, -1], np.int64))],
                        (n, c, int(np.prod(shape[2:]))), dtype)
        if np.prod(shape[2:]) == 1:
            # rows of one value (statistics of per-row statistics): the first step would be a
            # kernel that copies (or squares) them; the reduction over N is all there is
            per_channel = e.reduce(node.op_type, matrix, [0], (1, c, 1), dtype, 1, opset)
        else:
            per_row = e.reduce(node.op_type, matrix, [2], (n, c, 1), dtype, 1, opset)
            per_channel = e.reduce(_SECOND_STEP[node.op_type], per_row, [0], (1, c, 1), dtype,
                                   1, opset)
        return e.node("Reshape", [per_channel, e.const(np.array(out_shape, np.int64))],
                      out_shape, dtype)
