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
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import add_initializer, attr, const_array, replace_value, static_shape

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
        prefix = node.name or node.op_type
        meta = dict(node.metadata_props)
        dtype = node.outputs[0].type
        steps = []

        def emit(op_type, inputs, out, tag, **attributes):
            created = ir.node(op_type, inputs, attributes=attributes, name=f"{prefix}/{tag}",
                              metadata_props=dict(meta))
            value = created.outputs[0]
            value.name, value.shape, value.type = f"{prefix}/{tag}", ir.Shape(out), dtype
            steps.append(created)
            return value

        def reduce(x, axis, out, tag):
            if opset >= _AXES_INPUT_SINCE[node.op_type]:
                axes = add_initializer(graph, np.array([axis], np.int64), f"{prefix}/{tag}_axes")
                return emit(node.op_type, [x, axes], out, tag, keepdims=1)
            return emit(node.op_type, [x], out, tag, axes=[axis], keepdims=1)

        rows = add_initializer(graph, np.array([n, c, -1], np.int64), f"{prefix}/rows_shape")
        matrix = emit("Reshape", [node.inputs[0], rows], (n, c, int(np.prod(shape[2:]))), "rows")
        per_row = reduce(matrix, 2, (n, c, 1), "per_row")
        per_channel = reduce(per_row, 0, (1, c, 1), "per_channel")
        target = add_initializer(graph, np.array(out_shape, np.int64), f"{prefix}/out_shape")
        result = emit("Reshape", [per_channel, target], out_shape, "split")
        graph.insert_before(node, steps)
        return result
