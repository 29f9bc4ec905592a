"""SplitChannelReductions: per-channel sums and means in two contiguous steps (CUDA only).

Rewrite case (batch norm's statistics and their gradients, a conv bias gradient), x of
shape (N, C, *S):
  ReduceSum|ReduceMean(x, axes=(0, 2, ..., r-1))
      -> Reshape(Reduce(Reduce(Reshape(x, (N, C, prod(S))), axes=(2,)), axes=(0,)), out)
onnxruntime's CUDA reductions have fast kernels for reducing the rows or the columns of a
matrix, and a general one for other axis sets; both steps here are matrix reductions.
A mean of equal-sized group means is the mean, so ReduceMean stays ReduceMean.
"""
import numpy as np
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, attr, const_array, replace_value, static_shape

# the first opset where the op takes its axes as an input rather than an attribute
_AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18}


def _axes(node):
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        array = const_array(node.inputs[1])
        return None if array is None else [int(a) for a in array.reshape(-1)]
    return attr(node, "axes")


class SplitChannelReductions(InPlacePass):
    def call(self, model):
        graph = model.graph
        opset = model.opset_imports.get("", 1)
        modified = False
        for node in list(graph):
            if node.op_type not in _AXES_INPUT_SINCE or node.graph is None:
                continue
            shape = static_shape(node.inputs[0])
            out_shape = static_shape(node.outputs[0])
            axes = _axes(node)
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

        def reduce(x, axis, out):
            if opset >= _AXES_INPUT_SINCE[node.op_type]:
                return e.node(node.op_type, [x, e.const(np.array([axis], np.int64))], out, dtype,
                              keepdims=1)
            return e.node(node.op_type, [x], out, dtype, axes=[axis], keepdims=1)

        matrix = e.node("Reshape", [node.inputs[0], e.const(np.array([n, c, -1], np.int64))],
                        (n, c, int(np.prod(shape[2:]))), dtype)
        per_row = reduce(matrix, 2, (n, c, 1))
        per_channel = reduce(per_row, 0, (1, c, 1))
        return e.node("Reshape", [per_channel, e.const(np.array(out_shape, np.int64))],
                      out_shape, dtype)
