"""Reductions, softmax and arg-reductions: shape rules and gradient rules.

Opset 17: ReduceSum takes its axes as an input, the others as an attribute.
"""
import numpy as np

from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.graph.registry import const_value, normalize_axis, register
from onnxjob.graph.primitives.shape_ops import reshape_to


def reduce_axes(node_or_inputs, attrs, rank):
    if isinstance(node_or_inputs, list) and len(node_or_inputs) > 1 and node_or_inputs[1] is not None:
        axes = [int(a) for a in const_value(node_or_inputs[1])]
    else:
        axes = attrs.get("axes")
    if axes is None or len(axes) == 0:
        return list(range(rank))
    return sorted({normalize_axis(a, rank) for a in axes})


def _reduce_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axes = reduce_axes(inputs, attrs, len(x.shape))
    keep = attrs.get("keepdims", 1)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    return [(shape, x.np_dtype)]


def _kept_shape(x, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _broadcast_back(gy, x, axes):
    """gy of a reduction, reshaped to keep dims and expanded to x's shape."""
    return op("Expand", reshape_to(gy, _kept_shape(x, axes)), int64_constant(gy, x.shape))


def _reduce_sum_grad(n, g, need):
    x = n.inputs[0]
    axes = reduce_axes(n.inputs, n.attrs, len(x.shape))
    return [_broadcast_back(g[0], x, axes)] + [None] * (len(n.inputs) - 1)


def _reduce_mean_grad(n, g, need):
    x = n.inputs[0]
    axes = reduce_axes(n.inputs, n.attrs, len(x.shape))
    count = int(np.prod([x.shape[a] for a in axes]))
    scaled = op("Mul", g[0], as_blob(1.0 / count, like=g[0]))
    return [_broadcast_back(scaled, x, axes)] + [None] * (len(n.inputs) - 1)


def _reduce_extreme_grad(n, g, need):
    """Gradient flows to the extreme elements, split evenly among ties."""
    x = n.inputs[0]
    axes = reduce_axes(n.inputs, n.attrs, len(x.shape))
    y = reshape_to(n.outputs[0], _kept_shape(x, axes))
    mask = op("Cast", op("Equal", x, y), to=_ir_dtype(x))
    ties = op("ReduceSum", mask, int64_constant(mask, axes), keepdims=1)
    gy = reshape_to(g[0], _kept_shape(x, axes))
    return [op("Mul", mask, op("Div", gy, ties))] + [None] * (len(n.inputs) - 1)


def _ir_dtype(blob):
    from onnxjob import dtypes
    return dtypes.from_numpy(blob.np_dtype).ir_dtype.value


register("ReduceSum", _reduce_infer, _reduce_sum_grad)
register("ReduceMean", _reduce_infer, _reduce_mean_grad)
register("ReduceMax", _reduce_infer, _reduce_extreme_grad)
register("ReduceMin", _reduce_infer, _reduce_extreme_grad)
register("ReduceProd", _reduce_infer, None)


def _arg_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axis = normalize_axis(attrs.get("axis", 0), len(x.shape))
    keep = attrs.get("keepdims", 1)
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis)
    return [(shape, np.dtype(np.int64))]


register("ArgMax", _arg_infer, None, differentiable=False)
register("ArgMin", _arg_infer, None, differentiable=False)


def _softmax_grad(n, g, need):
    axis = n.attrs.get("axis", -1)
    y = n.outputs[0]
    gy_y = op("Mul", g[0], y)
    s = op("ReduceSum", gy_y, int64_constant(y, [axis]), keepdims=1)
    return [op("Sub", gy_y, op("Mul", y, s))]


def _log_softmax_grad(n, g, need):
    axis = n.attrs.get("axis", -1)
    s = op("ReduceSum", g[0], int64_constant(g[0], [axis]), keepdims=1)
    return [op("Sub", g[0], op("Mul", op("Exp", n.outputs[0]), s))]


_same = lambda i, a, k: [(i[0].shape, i[0].np_dtype)]  # noqa: E731
register("Softmax", _same, _softmax_grad)
register("LogSoftmax", _same, _log_softmax_grad)


def _top_k_infer(inputs, attrs, num_outputs):
    x, k = inputs
    axis = normalize_axis(attrs.get("axis", -1), len(x.shape))
    k = int(const_value(k).reshape(-1)[0])
    if not 1 <= k <= x.shape[axis]:
        raise ValueError(f"k={k} must be in [1, {x.shape[axis]}]")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [(shape, x.np_dtype), (shape, np.dtype(np.int64))][:num_outputs]


def _top_k_grad(n, g, need):
    """The values' cotangent goes back to the positions they were taken from."""
    x = n.inputs[0]
    zeros = op("ConstantOfShape", int64_constant(g[0], x.shape), value=np.zeros(1, x.np_dtype))
    return [op("ScatterElements", zeros, n.outputs[1], g[0], axis=n.attrs.get("axis", -1),
               reduction="add"), None]


register("TopK", _top_k_infer, _top_k_grad)
