"""Shape ops: flow.reshape, dynamic_reshape, reshape_like, flatten, squeeze, expand_dims,
transpose, expand, broadcast_like, and elem_cnt (a Blob's number of entries).

Every shape is known while tracing. Shape and gradient rules:
onnxjob/graph/primitives/shape_ops.py.
"""
import numpy as np

from onnxjob.compat.generations import positional_is, two_generations, written_for_0_4
from onnxjob.compat.zero_d_inputs import as_vector, is_zero_d
from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import resolve_reshape
from onnxjob.graph.tracer import int64_constant, op
from onnxjob.ops import qat
from onnxjob.ops._array_common import check_axis, keep_batch_axis, to_flow_dtype

__all__ = ["broadcast_like", "dynamic_reshape", "elem_cnt", "expand", "expand_dims", "flatten",
           "reshape", "reshape_like", "squeeze", "transpose"]


def reshape(x, shape, name=None):
    """Reshape with at most one -1 (OneFlow semantics: 0 is a real zero)."""
    shape = [int(d) for d in shape]
    resolved = _resolved(x, shape)
    site = qat.transparent(x)   # QAT's scales pass through reshapes (ops/qat.py)
    return qat.done(site, _reshape(x, resolved, name, requested=shape))


def _reshape(x, shape, name=None, requested=None):
    """A reshape to a resolved shape that is part of another OneFlow op (QAT's
    transparent reshapes are OneFlow's reshape op only). A dynamic `x` (sizes known at
    run time only) asked for a shape with a -1 (`requested`) keeps the -1, as OneFlow's
    dynamic_reshape: that axis takes what the run's elements leave."""
    if tuple(shape) == x.shape:
        return op("Identity", x, name=name)
    if x.is_dynamic and requested is not None and -1 in requested:
        return op("Reshape", x, int64_constant(x, list(requested)), name=name)
    return op("Reshape", x, int64_constant(x, shape), name=name)


def _resolved(x, shape):
    try:
        return resolve_reshape(x.shape, list(shape))
    except ValueError as e:
        raise TraceError(f"reshape: {e}") from None


def dynamic_reshape(x, shape, name=None):
    """OneFlow's reshape of a dynamic blob (a -1 axis takes the run's size)."""
    shape = [int(d) for d in shape]
    return _reshape(x, _resolved(x, shape), name=name, requested=shape)


def reshape_like(x, like, name=None):
    """`x` reshaped to the shape of `like` (its run-time shape when `like` is dynamic)."""
    if like.is_dynamic:
        _resolved(x, like.shape)
        return op("Reshape", x, op("Shape", like), name=name)
    return dynamic_reshape(x, like.shape, name=name)


def flatten(input, start_dim=0, end_dim=-1, name=None):
    """Merge the axes start_dim..end_dim (inclusive, negatives count from the end)."""
    rank = len(input.shape)
    start, end = (check_axis(d, max(rank, 1), "flatten") for d in (start_dim, end_dim))
    if start > end:
        raise TraceError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = input.shape[:start] + (int(np.prod(input.shape[start:end + 1])),) + \
        input.shape[end + 1:]
    if input.is_dynamic and end > start:
        # the merged axes' size at run time: the input's other sizes, and -1 between them
        target = op("Concat", op("Shape", input, start=0, end=start),
                    int64_constant(input, [-1]), op("Shape", input, start=end + 1), axis=0)
        return op("Reshape", input, target, name=name)
    return _reshape(input, shape, name=name)


def squeeze(input, axis=None, name=None):
    """Remove the given axes of size 1 (all of them when `axis` is None); a 0-d `input`
    given an axis is its one-element vector (compat/zero_d_inputs.py)."""
    if axis is None:
        axes = [i for i, d in enumerate(input.shape) if d == 1]
    else:
        input = as_vector(input, where=np.atleast_1d(axis).size > 0)
        rank = len(input.shape)
        axes = [check_axis(a, rank, "squeeze") for a in np.atleast_1d(axis)]
        if len(set(axes)) != len(axes):   # OneFlow's squeeze shape rule refuses it too
            raise TraceError(f"squeeze: axis {list(np.atleast_1d(axis))} names an axis twice")
    if not axes:   # ONNX Squeeze with no axes would remove every axis of size 1
        return op("Identity", input, name=name)
    return op("Squeeze", input, int64_constant(input, axes), name=name)


def expand_dims(input, axis, name=None):
    """Insert an axis of size 1 at `axis` (in [-rank-1, rank]); a 0-d `input` given an
    axis beyond [-1, 0], or in code written for OneFlow <= 0.4 (whose full reductions were
    (1,): expand_dims(loss, 0) is (1, 1)), is its one-element vector
    (compat/zero_d_inputs.py)."""
    input = as_vector(input, where=is_zero_d(input) and (
        (isinstance(axis, int) and not -1 <= axis <= 0) or written_for_0_4()))
    axis = check_axis(axis, len(input.shape) + 1, "expand_dims")
    return op("Unsqueeze", input, int64_constant(input, [axis]), name=name)


@two_generations(("a", "perm", "conjugate", "name"), positional_is(3, str))
def transpose(a, perm=None, conjugate=False, batch_axis_non_change=False, name=None):
    """Permute the axes by `perm` (None: reverse them); OneFlow <= 0.4's order (a string
    fourth argument is the name) is accepted too. `batch_axis_non_change`: the result's
    `batch_axis` (OneFlow <= 0.3's) is `a`'s, not moved with the axes."""
    if conjugate:
        raise TraceError("transpose: conjugate=True is not supported (as in OneFlow)")
    a = as_vector(a, where=perm is not None and len(perm) == 1)   # compat/zero_d_inputs.py
    rank = len(a.shape)
    perm = list(range(rank))[::-1] if perm is None else [
        check_axis(p, rank, "transpose") for p in perm]
    out = op("Transpose", a, perm=perm, name=name)
    if batch_axis_non_change:
        keep_batch_axis(out, a.batch_axis)
    return out


def expand(x, expand_size, name=None):
    """Broadcast `x` to `expand_size`; -1 keeps an axis, new axes are added in front."""
    size = [int(d) for d in expand_size]
    lead = len(size) - len(x.shape)
    if lead < 0:
        raise TraceError(f"expand: expand_size {size} has fewer axes than x {x.shape}")
    shape = []
    for i, d in enumerate(size):
        old = x.shape[i - lead] if i >= lead else None
        if d == -1 and old is not None:
            d = old
        if d < 1 or (old is not None and old not in (1, d)):
            raise TraceError(f"expand: cannot expand {x.shape} to {size}")
        shape.append(d)
    return op("Expand", x, int64_constant(x, shape), name=name)


def broadcast_like(x, like, broadcast_axes=None, name=None):
    """Broadcast `x` to the shape of `like` along `broadcast_axes` (default: all axes).

    `x` has like's shape with those axes of size 1, or with them removed.
    """
    rank = len(like.shape)
    axes = list(range(rank)) if broadcast_axes is None else list(broadcast_axes)
    if not 0 < len(axes) <= rank:
        raise TraceError("broadcast_like: broadcast_axes must name 1 to rank(like) axes")
    axes = sorted(check_axis(a, rank, "broadcast_like") for a in axes)
    kept = tuple(1 if i in axes else d for i, d in enumerate(like.shape))
    removed = tuple(d for i, d in enumerate(like.shape) if i not in axes)
    if x.shape not in (kept, removed) and not (x.shape == (1,) and not removed):
        raise TraceError(f"broadcast_like: x {x.shape} does not fit like {like.shape} with "
                         f"broadcast_axes {axes} (expected {kept} or {removed})")
    if x.np_dtype != like.np_dtype:
        raise TraceError(f"broadcast_like: x is {x.np_dtype}, like is {like.np_dtype}; "
                         "they must share a dtype")
    return op("Expand", reshape(x, kept), int64_constant(x, like.shape), name=name)


def elem_cnt(inputs, dtype=None, name=None):
    """The number of elements of `inputs`, a scalar of `dtype` (default int32)."""
    flow_dtype = dtypes.int32 if dtype is None else to_flow_dtype(dtype)
    return op("Cast", op("Size", inputs), to=flow_dtype.ir_dtype.value, name=name)
