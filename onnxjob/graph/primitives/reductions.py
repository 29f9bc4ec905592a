"""Reductions, softmax, sorting and segment sums: shape rules and gradient rules.

Opset 17: ReduceSum takes its axes as an input, the others as an attribute.
"""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.graph.primitives.elementwise import FLOATS, cast
from onnxjob.graph.primitives.shape_ops import reshape_to, shape_of, zeros_of
from onnxjob.graph.registry import (const_value, normalize_axis, register, register_composite,
                                    static_value)
from onnxjob.graph.tracer import as_blob, int64_constant, op


def reduce_axes(node_or_inputs, attrs, rank):
    if isinstance(node_or_inputs, list) and len(node_or_inputs) > 1 \
            and node_or_inputs[1] is not None:
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


def _float_reduce_infer(op_type):
    def infer(inputs, attrs, num_outputs):
        if inputs[0].np_dtype not in FLOATS:
            raise TraceError(f"{op_type} takes float16, float32 or float64 values, "
                             f"got {inputs[0].np_dtype}")
        return _reduce_infer(inputs, attrs, num_outputs)
    return infer


def _kept_shape(x, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _axes_of(n):
    return reduce_axes(n.inputs, n.attrs, len(n.inputs[0].shape))


def _with_axes_kept(blob, x, axes):
    """`blob`, a reduction of `x` over `axes` (or its cotangent), with those axes kept as
    1s: a Reshape, or where x is dynamic (its sizes known at run time only) an Unsqueeze
    of the axes a reduction without keepdims dropped."""
    if not x.is_dynamic or len(blob.shape) == len(x.shape):
        return reshape_to(blob, _kept_shape(x, axes))
    return op("Unsqueeze", blob, int64_constant(blob, list(axes)))


def _broadcast_back(gy, x, axes):
    """gy of a reduction, with the reduced axes kept and expanded to x's shape (its run-time
    shape for a dynamic x)."""
    return op("Expand", _with_axes_kept(gy, x, axes), shape_of(x))


def _kept(blob, n):
    """An output-shaped Blob (the output, its cotangent) with the reduced axes kept."""
    return _with_axes_kept(blob, n.inputs[0], _axes_of(n))


def run_time_count(x, axes, like):
    """How many elements of a dynamic `x` each output of a reduction over `axes` reads (the
    product of its run-time sizes), in the dtype of `like`."""
    sizes = op("Gather", op("Shape", x), int64_constant(x, list(axes)), axis=0)
    return cast(op("ReduceProd", sizes, keepdims=0), like.np_dtype)


def _no_axes_grad(gx, n):
    return [gx] + [None] * (len(n.inputs) - 1)


def _reduce_sum_grad(n, g, need):
    return _no_axes_grad(_broadcast_back(g[0], n.inputs[0], _axes_of(n)), n)


def _reduce_mean_grad(n, g, need):
    x = n.inputs[0]
    axes = _axes_of(n)
    if x.is_dynamic:
        scaled = op("Div", g[0], run_time_count(x, axes, g[0]))
    else:
        count = int(np.prod([x.shape[a] for a in axes]))
        scaled = op("Mul", g[0], as_blob(1.0 / count, like=g[0]))
    return _no_axes_grad(_broadcast_back(scaled, x, axes), n)


def _reduce_extreme_grad(n, g, need):
    """Gradient flows to the extreme elements, split evenly among ties."""
    x = n.inputs[0]
    axes = _axes_of(n)
    mask = cast(op("Equal", x, _kept(n.outputs[0], n)), x.np_dtype)
    ties = op("ReduceSum", mask, int64_constant(mask, axes), keepdims=1)
    return _no_axes_grad(op("Mul", mask, op("Div", _kept(g[0], n), ties)), n)


def _reduce_prod_grad(n, g, need):
    """prod / x where no element of the group is 0; with exactly one 0, only that element
    gets the product of the others; with more, nothing (zeros in the input are exact)."""
    x = n.inputs[0]
    axes = _axes_of(n)
    zero, one = as_blob(0, like=x), as_blob(1, like=x)
    is_zero = op("Equal", x, zero)
    nonzero_x = op("Where", is_zero, one, x)
    others = op("ReduceProd", nonzero_x, axes=axes, keepdims=1)
    zeros = op("ReduceSum", cast(is_zero, x.np_dtype), int64_constant(x, axes), keepdims=1)
    gy = _kept(g[0], n)
    no_zero = op("Mul", gy, op("Div", others, nonzero_x))
    one_zero = op("Where", is_zero, op("Mul", gy, others), zero)
    gx = op("Where", op("Equal", zeros, zero), no_zero,
            op("Where", op("Equal", zeros, one), one_zero, zero))
    return _no_axes_grad(gx, n)


def _reduce_l2_grad(n, g, need):
    """x / ||x|| (0 where the norm is 0, the subgradient PyTorch takes)."""
    x = n.inputs[0]
    norm = _kept(n.outputs[0], n)
    zero = op("Equal", norm, as_blob(0, like=x))
    safe = op("Where", zero, as_blob(1, like=x), norm)
    direction = op("Where", zero, as_blob(0, like=x), op("Div", x, safe))
    return _no_axes_grad(op("Mul", _kept(g[0], n), direction), n)


def _reduce_log_sum_exp_grad(n, g, need):
    """softmax(x) over the reduced axes times gy."""
    x = n.inputs[0]
    weights = op("Exp", op("Sub", x, _kept(n.outputs[0], n)))
    return _no_axes_grad(op("Mul", _kept(g[0], n), weights), n)


def _through_int32(op_type):
    """onnxruntime has no int8 kernel for `op_type`: int8 is reduced in int32 and cast back
    (wrapping as OneFlow's int8 arithmetic does)."""
    def lower(inputs, attrs, num_outputs):
        x = inputs[0]
        if x.np_dtype != np.int8:
            return None
        return [cast(op(op_type, cast(x, np.int32), *inputs[1:], **attrs), np.int8)]
    return lower


register("ReduceSum", _reduce_infer, _reduce_sum_grad, lower=_through_int32("ReduceSum"))
register("ReduceMean", _reduce_infer, _reduce_mean_grad, lower=_through_int32("ReduceMean"))
register("ReduceProd", _reduce_infer, _reduce_prod_grad, lower=_through_int32("ReduceProd"))
register("ReduceMax", _reduce_infer, _reduce_extreme_grad)
register("ReduceMin", _reduce_infer, _reduce_extreme_grad)
register("ReduceL2", _float_reduce_infer("ReduceL2"), _reduce_l2_grad)
register("ReduceLogSumExp", _float_reduce_infer("ReduceLogSumExp"), _reduce_log_sum_exp_grad)


def _arg_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axis = normalize_axis(attrs.get("axis", 0), len(x.shape))
    keep = attrs.get("keepdims", 1)
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape) if keep or i != axis)
    return [(shape, np.dtype(np.int64))]


register("ArgMax", _arg_infer, None, differentiable=False)
register("ArgMin", _arg_infer, None, differentiable=False)


# -- softmax ------------------------------------------------------------------------------

def _softmax_infer(op_type):
    def infer(inputs, attrs, num_outputs):
        x = inputs[0]
        if x.np_dtype not in FLOATS:
            raise TraceError(f"{op_type} takes float16, float32 or float64 values, got {x.np_dtype}")
        normalize_axis(attrs.get("axis", -1), len(x.shape))
        return [(x.shape, x.np_dtype)]
    return infer


def softmax_backward(y, gy, axis):
    """dx of y = softmax(x) along `axis`: y * (gy - sum(gy * y))."""
    gy_y = op("Mul", gy, y)
    s = op("ReduceSum", gy_y, int64_constant(y, [axis]), keepdims=1)
    return op("Sub", gy_y, op("Mul", y, s))


def _softmax_grad(n, g, need):
    return [softmax_backward(n.outputs[0], g[0], n.attrs.get("axis", -1))]


def _log_softmax_grad(n, g, need):
    axis = n.attrs.get("axis", -1)
    s = op("ReduceSum", g[0], int64_constant(g[0], [axis]), keepdims=1)
    return [op("Sub", g[0], op("Mul", op("Exp", n.outputs[0]), s))]


register("Softmax", _softmax_infer("Softmax"), _softmax_grad)
register("LogSoftmax", _softmax_infer("LogSoftmax"), _log_softmax_grad)


# -- top k and sorting --------------------------------------------------------------------

def _top_k_infer(inputs, attrs, num_outputs):
    x, k = inputs
    if x.np_dtype not in FLOATS + (np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)):
        raise TraceError(f"TopK takes float32, float64, int8, int32 or int64 values, "
                         f"got {x.np_dtype}")
    axis = normalize_axis(attrs.get("axis", -1), len(x.shape))
    k = int(static_value(k).reshape(-1)[0])
    if not 1 <= k <= x.shape[axis]:
        raise ValueError(f"k={k} must be in [1, {x.shape[axis]}]")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [(shape, x.np_dtype), (shape, np.dtype(np.int64))][:num_outputs]


def _top_k_grad(n, g, need):
    """The values' cotangent goes back to the positions they were taken from."""
    x = n.inputs[0]
    zeros = zeros_of(x, x.shape, g[0].np_dtype)
    return [op("ScatterElements", zeros, n.outputs[1], g[0], axis=n.attrs.get("axis", -1),
               reduction="add"), None]


register("TopK", _top_k_infer, _top_k_grad)


# -- running sums -------------------------------------------------------------------------

def _cum_sum_grad(n, g, need):
    """Each input entry reaches the outputs after it (before it when reverse=1): the
    cotangent is the running sum of g the other way, with the same exclusive flag."""
    attrs = {"exclusive": n.attrs.get("exclusive", 0),
             "reverse": 1 - n.attrs.get("reverse", 0)}
    return [op("CumSum", g[0], n.inputs[1], **attrs), None]


register("CumSum", lambda i, a, k: [(i[0].shape, i[0].np_dtype)], _cum_sum_grad)


# -- segment sums -------------------------------------------------------------------------

def _segment_layout(data, ids, axis):
    """(outer, rows, inner) sizes of `data` around the `ids.ndim` axes starting at `axis`."""
    rank = len(ids.shape)
    if data.shape[axis:axis + rank] != ids.shape:
        raise TraceError(f"segment_ids {ids.shape} must match data {data.shape} on axes "
                         f"{axis}..{axis + rank - 1}")
    outer = int(np.prod(data.shape[:axis]))
    inner = int(np.prod(data.shape[axis + rank:]))
    return outer, int(np.prod(ids.shape)), inner


def _routed_ids(ids, num_segments):
    """int64 ids with those outside [0, num_segments) sent to the spare row num_segments."""
    ids = cast(ids, np.int64)
    n = int64_constant(ids, num_segments)
    valid = op("And", op("GreaterOrEqual", ids, int64_constant(ids, 0)), op("Less", ids, n))
    return op("Where", valid, ids, n)


def _segment_sum_expand(inputs, attrs, num_outputs):
    """Sum the rows of data (axis `axis`, one per element of ids) into num_segments rows:
    ScatterND adds each row into a zero buffer with a spare row for ids out of range
    (which OneFlow skips), cut off afterwards."""
    data, ids = inputs
    axis, num_segments = attrs["axis"], attrs["num_segments"]
    if not np.issubdtype(ids.np_dtype, np.integer):
        raise TraceError(f"segment_ids must be integers, got {ids.np_dtype}")
    outer, rows, inner = _segment_layout(data, ids, axis)
    routed = reshape_to(_routed_ids(ids, num_segments), [rows, 1])
    # rows first: (rows, outer, inner), or (rows, inner) when nothing precedes `axis`
    kept = [outer, inner] if outer > 1 else [inner]
    updates = reshape_to(data, [outer, rows, inner] if outer > 1 else [rows, inner])
    if outer > 1:
        updates = op("Transpose", updates, perm=[1, 0, 2])
    buffer = op("ConstantOfShape", int64_constant(data, [num_segments + 1] + kept),
                value=np.zeros(1, data.np_dtype))
    summed = op("ScatterND", buffer, routed, updates, reduction="add")
    summed = op("Slice", summed, int64_constant(data, [0]), int64_constant(data, [num_segments]),
                int64_constant(data, [0]))
    if outer > 1:
        summed = op("Transpose", summed, perm=[1, 0, 2])
    out_shape = data.shape[:axis] + (num_segments,) + data.shape[axis + len(ids.shape):]
    return [reshape_to(summed, out_shape)]


def _segment_sum_grad(n, g, need):
    """OneFlow's rule: gather gy at segment_ids (0 for ids out of range)."""
    data, ids = n.inputs
    axis, num_segments = n.attrs["axis"], n.attrs["num_segments"]
    spare_shape = list(g[0].shape)
    spare_shape[axis] = 1
    spare = op("ConstantOfShape", int64_constant(g[0], spare_shape),
               value=np.zeros(1, data.np_dtype))
    padded = op("Concat", g[0], spare, axis=axis)
    return [op("Gather", padded, _routed_ids(ids, num_segments), axis=axis), None]


register_composite("onnxjob.UnsortedSegmentSum", _segment_sum_expand, _segment_sum_grad)
