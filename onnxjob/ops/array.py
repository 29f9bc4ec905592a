"""Top-level array ops: flow.reshape, transpose, concat, constant, matmul, slice, pad, ...

Everything in `__all__` is re-exported as `flow.<name>`. Ops whose output size depends
on the data give what OneFlow gives: argwhere, nonzero and sync_dynamic_resize dynamic
Blobs (static shape: the largest, read with tp.ListNumpy), unique_with_counts static
Blobs zero-padded after the valid entries, with their count.
"""
import builtins

import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import resolve_reshape
from onnxjob.graph.registry import normalize_axis
from onnxjob.graph.tracer import Blob, as_blob, current_builder, int64_constant, op

__all__ = ["amp_white_identity", "argwhere", "broadcast_like", "cast",
           "cast_to_current_logical_view", "cast_to_static_shape", "concat", "constant",
           "constant_like", "constant_pad2d", "constant_scalar", "diag", "dim_gather",
           "dynamic_reshape", "elem_cnt", "expand", "expand_dims", "flatten", "gather",
           "gather_nd", "identity", "identity_n", "masked_fill", "matmul", "nonzero", "one_hot",
           "ones", "ones_like", "pad", "pad_grad", "parallel_cast", "range", "reflection_pad2d",
           "replication_pad2d", "reshape", "reshape_like", "reverse", "same_padding",
           "scatter_nd", "slice", "slice_update", "slice_v2", "split", "squeeze", "stack",
           "sync_dynamic_resize", "tensor_scatter_nd_add", "tensor_scatter_nd_update",
           "transpose", "where", "zero_pad2d", "zeros", "zeros_like"]

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min
_INDEX_DTYPES = (np.int32, np.int64)


# -- shapes -------------------------------------------------------------------------------

def reshape(x, shape, name=None):
    """Reshape with at most one -1 (OneFlow semantics: 0 is a real zero)."""
    try:
        shape = resolve_reshape(x.shape, list(shape))
    except ValueError as e:
        raise TraceError(f"reshape: {e}") from None
    if tuple(shape) == x.shape:
        return op("Identity", x, name=name)
    return op("Reshape", x, int64_constant(x, shape), name=name)


def dynamic_reshape(x, shape, name=None):
    """OneFlow's reshape of a dynamic blob; shapes are static here, so a reshape."""
    return reshape(x, shape, name=name)


def reshape_like(x, like, name=None):
    """`x` reshaped to the shape of `like`."""
    return reshape(x, like.shape, name=name)


def flatten(input, start_dim=0, end_dim=-1, name=None):
    """Merge the axes start_dim..end_dim (inclusive, negatives count from the end)."""
    rank = len(input.shape)
    start, end = (_check_axis(d, max(rank, 1), "flatten") for d in (start_dim, end_dim))
    if start > end:
        raise TraceError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = input.shape[:start] + (int(np.prod(input.shape[start:end + 1])),) + \
        input.shape[end + 1:]
    return reshape(input, shape, name=name)


def squeeze(input, axis=None, name=None):
    """Remove the given axes of size 1 (all of them when `axis` is None)."""
    rank = len(input.shape)
    if axis is None:
        axes = [i for i, d in enumerate(input.shape) if d == 1]
    else:
        axes = [_check_axis(a, rank, "squeeze") for a in np.atleast_1d(axis)]
    if not axes:   # ONNX Squeeze with no axes would remove every axis of size 1
        return op("Identity", input, name=name)
    return op("Squeeze", input, int64_constant(input, axes), name=name)


def expand_dims(input, axis, name=None):
    """Insert an axis of size 1 at `axis` (in [-rank-1, rank])."""
    axis = _check_axis(axis, len(input.shape) + 1, "expand_dims")
    return op("Unsqueeze", input, int64_constant(input, [axis]), name=name)


@two_generations(("a", "perm", "conjugate", "name"), positional_is(3, str))
def transpose(a, perm=None, conjugate=False, batch_axis_non_change=False, name=None):
    """Permute the axes by `perm` (None: reverse them); OneFlow <= 0.4's order (a string
    fourth argument is the name) is accepted too."""
    if conjugate:
        raise TraceError("transpose: conjugate=True is not supported (as in OneFlow)")
    rank = len(a.shape)
    perm = list(builtins.range(rank))[::-1] if perm is None else [
        _check_axis(p, rank, "transpose") for p in perm]
    return op("Transpose", a, perm=perm, name=name)


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
    axes = list(builtins.range(rank)) if broadcast_axes is None else list(broadcast_axes)
    if not 0 < len(axes) <= rank:
        raise TraceError("broadcast_like: broadcast_axes must name 1 to rank(like) axes")
    axes = sorted(_check_axis(a, rank, "broadcast_like") for a in axes)
    kept = tuple(1 if i in axes else d for i, d in enumerate(like.shape))
    removed = tuple(d for i, d in enumerate(like.shape) if i not in axes)
    if x.shape not in (kept, removed) and not (x.shape == (1,) and not removed):
        raise TraceError(f"broadcast_like: x {x.shape} does not fit like {like.shape} with "
                         f"broadcast_axes {axes} (expected {kept} or {removed})")
    if x.np_dtype != like.np_dtype:
        raise TraceError(f"broadcast_like: x is {x.np_dtype}, like is {like.np_dtype}; "
                         "they must share a dtype")
    return op("Expand", reshape(x, kept), int64_constant(x, like.shape), name=name)


def stack(inputs, axis=0, name=None):
    """Stack same-shaped Blobs along a new axis `axis`."""
    inputs = list(inputs)
    first = inputs[0].shape
    if any(x.shape != first for x in inputs):
        raise TraceError(f"stack: every input must have shape {first}, got "
                         f"{[x.shape for x in inputs]}")
    axis = _check_axis(axis, len(first) + 1, "stack")
    return concat([expand_dims(x, axis) for x in inputs], axis=axis, name=name)


def _check_axis(axis, rank, api):
    """`axis` in [0, rank), negatives counted from the end (TraceError when out of range)."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise TraceError(f"{api}: axis {axis} is out of range [{-rank}, {rank})")
    return axis % rank


# -- identities -------------------------------------------------------------------------

def identity(x, name=None):
    """`x` unchanged."""
    return op("Identity", x, name=name)


def identity_n(inputs, name=None):
    """Each of `inputs`, unchanged (a list)."""
    return [op("Identity", x) for x in inputs]


def amp_white_identity(x, name=None):
    """A mixed-precision marker in OneFlow; the identity here."""
    return op("Identity", x, name=name)


def parallel_cast(input, name=None, distribute=None, gradient_distribute=None):
    """A placement hint in OneFlow (split/broadcast between devices); the identity on
    onnxjob's one device."""
    return input


def cast_to_current_logical_view(x):
    """The identity: onnxjob has one logical view per job."""
    return x


def cast_to_static_shape(x, name=None):
    """`x` with a static shape: its (maximum) shape, the runtime shape must equal it."""
    if not x.is_dynamic:
        return x
    out = op("Identity", x, name=name)
    out.is_dynamic = False
    return out


def sync_dynamic_resize(inputs, size, name=None):
    """The first `size` rows of `inputs` (`size`: a 1-element int32/int64 Blob): a
    dynamic Blob whose static shape is inputs'."""
    if not isinstance(size, Blob) or int(np.prod(size.shape)) != 1 or \
            size.np_dtype not in _INDEX_DTYPES:
        raise TraceError("sync_dynamic_resize: size must be a 1-element int32/int64 Blob")
    if not inputs.shape:
        raise TraceError("sync_dynamic_resize needs a Blob of rank >= 1, got a scalar")
    end = op("Cast", op("Reshape", size, int64_constant(size, [1])),
             to=dtypes.int64.ir_dtype.value)
    return op("Slice", inputs, int64_constant(inputs, [0]), end, int64_constant(inputs, [0]),
              name=name)


def elem_cnt(inputs, dtype=None, name=None):
    """The number of elements of `inputs`, a scalar of `dtype` (default int32)."""
    flow_dtype = dtypes.int32 if dtype is None else _flow_dtype(dtype)
    return op("Cast", op("Size", inputs), to=flow_dtype.ir_dtype.value, name=name)


# -- constants ----------------------------------------------------------------------------

def constant(value, dtype=None, shape=None, name=None):
    """A Blob of `shape` filled with `value` (dtype default float32)."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.float32
    arr = np.asarray(value, dtype=np_dtype)
    if shape is not None:
        arr = np.broadcast_to(arr, tuple(shape))
    return current_builder("flow.constant").constant(np.array(arr), name_hint=name or "constant")


def constant_scalar(value, dtype=None, name=None):
    """A shape-(1,) Blob holding `value`."""
    return constant(value, dtype=dtype, shape=[1], name=name)


def constant_like(like, value, dtype=None, name=None):
    """A Blob of like's shape filled with `value` (dtype default: like's)."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else like.np_dtype
    if like.is_dynamic:     # of like's run-time shape
        return op("ConstantOfShape", op("Shape", like), value=np.full(1, value, np_dtype),
                  name=name)
    return like.builder.constant(np.full(like.shape, value, dtype=np_dtype))


def zeros_like(like, dtype=None, name=None):
    """Zeros of like's shape."""
    return constant_like(like, 0, dtype, name)


def ones_like(like, dtype=None, name=None):
    """Ones of like's shape."""
    return constant_like(like, 1, dtype, name)


def zeros(shape, dtype=None, name=None):
    """Zeros of `shape` (dtype default float32)."""
    return constant(0, dtype=dtype or dtypes.float32, shape=shape, name=name)


def ones(shape, dtype=None, name=None):
    """Ones of `shape` (dtype default float32)."""
    return constant(1, dtype=dtype or dtypes.float32, shape=shape, name=name)


def _flow_dtype(dtype):
    """The flow dtype class of a flow dtype or a NumPy dtype."""
    return dtypes.from_numpy(dtypes.to_numpy(dtype))


def cast(x, dtype, name=None):
    """`x` converted to `dtype` (returned as is when it already has it)."""
    flow_dtype = _flow_dtype(dtype)
    if x.np_dtype == flow_dtype.np_dtype:
        return x
    return op("Cast", x, to=flow_dtype.ir_dtype.value, name=name)


def _to_bool(x):
    """Nonzero entries as True (OneFlow's conditions and masks are int8/int32/int64)."""
    return x if x.np_dtype == np.bool_ else op("Cast", x, to=dtypes.bool_.ir_dtype.value)


# -- matmul -------------------------------------------------------------------------------

@two_generations(("a", "b", "transpose_a", "transpose_b", "name"), positional_is(4, str))
def matmul(a, b, transpose_a=False, transpose_b=False, alpha=1.0, name=None):
    """alpha * a @ b, optionally with the last two axes of a or b swapped (OneFlow <= 0.4's
    order without alpha is accepted too: a string fifth argument is the name)."""
    for what, x in (("a", a), ("b", b)):
        if len(x.shape) < 2:
            raise TraceError(f"matmul: {what} must have rank >= 2 (a matrix or a batch of "
                             f"them), got shape {x.shape}")
    if transpose_a:
        a = _swap_last(a)
    if transpose_b:
        b = _swap_last(b)
    out = op("MatMul", a, b, name=name)
    return out if alpha == 1.0 else out * alpha


def _swap_last(x):
    perm = list(builtins.range(len(x.shape)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return op("Transpose", x, perm=perm)


# -- concat, split, slices ----------------------------------------------------------------

def concat(inputs=None, axis=0, max_dim_size=None, name=None, values=None):
    """Concatenate Blobs along `axis` (`values=` is OneFlow 0.5's other spelling)."""
    if values is not None:
        if inputs is not None:
            raise TraceError("flow.concat takes `inputs` or `values`, not both")
        inputs = values
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise TraceError(f"flow.concat takes a non-empty list of Blobs, got {inputs!r}")
    if len(inputs) == 1:
        return inputs[0]
    out = op("Concat", *inputs, axis=int(axis), name=name)
    if max_dim_size is not None and out.is_dynamic:
        # OneFlow: a dynamic result's static (largest) size along `axis` is max_dim_size
        shape = list(out.shape)
        shape[normalize_axis(int(axis), len(shape))] = int(max_dim_size)
        out.shape = tuple(shape)
    return out


def split(x, num_or_size_splits, axis=0, name=None):
    """`x` split along `axis` into equal parts (an int) or parts of the given sizes."""
    if isinstance(num_or_size_splits, int):
        return op("Split", x, None, axis=axis, num_outputs=num_or_size_splits, name=name)
    sizes = list(num_or_size_splits)
    return op("Split", x, int64_constant(x, sizes), axis=axis, num_outputs=len(sizes), name=name)


def slice(x, begin, size, name=None):
    """OneFlow slice: per-axis begin and size (None = whole axis, size -1 = to the end)."""
    if not isinstance(begin, (list, tuple)) or len(begin) != len(x.shape):
        raise TraceError(f"slice: begin must be a list of {len(x.shape)} ints or None")
    if not isinstance(size, (list, tuple)) or len(size) != len(x.shape):
        raise TraceError(f"slice: size must be a list of {len(x.shape)} ints or None")
    tuples = []
    for b, s, dim in zip(begin, size, x.shape):
        if b is not None and not -dim <= b < dim:
            raise TraceError(f"slice: begin {b} is out of range for an axis of size {dim}")
        if s is not None and s != -1 and not 0 < s <= dim:
            raise TraceError(f"slice: size {s} is invalid for an axis of size {dim}")
        b = 0 if b is None else b % dim   # a negative begin counts from the end
        tuples.append((b, dim if s in (None, -1) else min(b + s, dim), 1))
    return slice_v2(x, tuples, name=name)


def _slice_tuples(slice_tup_list, shape, api):
    """OneFlow's (start, stop, step) per axis, completed to every axis and checked."""
    if not isinstance(slice_tup_list, (list, tuple)) or len(slice_tup_list) > len(shape):
        raise TraceError(f"{api}: slice_tup_list must be a list of at most {len(shape)} "
                         "(start, stop, step) tuples")
    tuples = list(slice_tup_list) + [(None, None, None)] * (len(shape) - len(slice_tup_list))
    out = []
    for tup, dim in zip(tuples, shape):
        if not isinstance(tup, (list, tuple)) or len(tup) != 3 or not all(
                v is None or isinstance(v, (int, np.integer)) for v in tup):
            raise TraceError(f"{api}: each slice must be a (start, stop, step) tuple of ints "
                             f"or None, got {tup!r}")
        start, stop, step = tup
        step = 1 if step is None else int(step)
        if step == 0:
            raise TraceError(f"{api}: slice step cannot be 0")
        if start is None:
            start = 0 if step > 0 else _INT64_MAX
        elif not -dim <= start < dim:
            raise TraceError(f"{api}: slice start {start} must be in [{-dim}, {dim})")
        if stop is None:
            stop = _INT64_MAX if step > 0 else _INT64_MIN
        elif not -dim - 1 <= stop <= dim:
            raise TraceError(f"{api}: slice stop {stop} must be in [{-dim - 1}, {dim}]")
        out.append((int(start), int(stop), step))
    return out


def slice_v2(x, slice_tup_list, name=None):
    """Slice every axis by its (start, stop, step) tuple; missing axes are whole."""
    tuples = _slice_tuples(slice_tup_list, x.shape, "slice_v2")
    if not tuples:   # a 0-d Blob: nothing to slice (ONNX Slice needs rank >= 1)
        return op("Identity", x, name=name)
    starts, stops, steps = (list(v) for v in zip(*tuples))
    axes = list(builtins.range(len(tuples)))
    return op("Slice", x, *(int64_constant(x, v) for v in (starts, stops, axes, steps)),
              name=name)


def reverse(input, axis, name=None):
    """`input` with the order of the entries along `axis` (an int or a list) reversed."""
    axes = [axis] if isinstance(axis, int) else axis
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, int) for a in axes):
        raise TraceError(f"reverse: axis must be an int or a list of ints, got {axis!r}")
    tuples = [(None, None, None)] * len(input.shape)
    for a in axes:
        tuples[_check_axis(a, len(input.shape), "reverse")] = (None, None, -1)
    return slice_v2(input, tuples, name=name)


def slice_update(x, update, slice_tup_list, name=None):
    """`x` with its slice `slice_tup_list` replaced by `update` (x[start:stop:step] = update)."""
    tuples = _slice_tuples(slice_tup_list, x.shape, "slice_update")
    ranges = [np.arange(*builtins.slice(*t).indices(d)) for t, d in zip(tuples, x.shape)]
    counts = tuple(len(r) for r in ranges)
    if update.shape != counts or update.np_dtype != x.np_dtype:
        raise TraceError(f"slice_update: update must have shape {counts} and dtype "
                         f"{x.np_dtype}, got {update.shape} {update.np_dtype}")
    positions = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1)
    return op("ScatterND", x, int64_constant(x, positions), update, name=name)


# -- gathers and scatters ---------------------------------------------------------------

def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """Rows of `params` along `axis` (default: `batch_dims`) picked by `indices`.

    `batch_dims > 0` (with `axis == batch_dims`) is OneFlow's batch_gather, whose batch
    axes are all but the last axis of `indices`, whatever `batch_dims` says: with b =
    rank(indices) - 1, out[i.., k] = params[i.., indices[i.., k], ...] for the first b
    axes shared (BERT's masked-LM positions call it with batch_dims=2 on (B, P) indices).
    """
    if not isinstance(indices, Blob):
        indices = as_blob(np.asarray(indices, np.int64), like=params, dtype=np.int64)
    rank = len(params.shape)
    axis = batch_dims if axis is None else axis
    if not -rank <= axis < rank:
        raise TraceError(f"gather: axis {axis} is out of range for params of rank {rank}")
    axis %= rank
    if batch_dims == 0:
        return op("Gather", params, indices, axis=int(axis), name=name)
    if axis != batch_dims:
        raise TraceError(f"gather with batch_dims={batch_dims} needs axis={batch_dims} (OneFlow "
                         f"has no other batched gather), got axis={axis}")
    b = len(indices.shape) - 1
    if not 1 <= b < rank or tuple(indices.shape[:b]) != tuple(params.shape[:b]):
        raise TraceError(f"gather (batch_gather): all but the last axis of indices "
                         f"{indices.shape} must be the leading axes of params {params.shape}")
    return _batch_gather(params, indices, b, name)


def _batch_gather(params, indices, b, name):
    """Gather over the flattened batch: row i*n + index of a (batch*n, ...) table."""
    batch = int(np.prod(params.shape[:b]))
    n, rest = params.shape[b], params.shape[b + 1:]
    table = reshape(params, (batch * n,) + rest)
    offsets = (np.arange(batch) * n).reshape((batch,) + (1,) * (len(indices.shape) - b))
    flat_idx = reshape(indices, (batch,) + indices.shape[b:]) + as_blob(
        offsets.astype(indices.np_dtype), like=indices)
    out = op("Gather", table, flat_idx, axis=0)
    return reshape(out, params.shape[:b] + indices.shape[b:] + rest, name=name)


def _nd_indices(indices, like, api):
    """int64 indices for GatherND / ScatterND (OneFlow takes int32 or int64)."""
    if not isinstance(indices, Blob):
        return int64_constant(like, np.asarray(indices, np.int64))
    if indices.np_dtype not in _INDEX_DTYPES:
        raise TraceError(f"{api}: indices must be int32 or int64, got {indices.np_dtype}")
    return indices if indices.np_dtype == np.int64 else op(
        "Cast", indices, to=dtypes.int64.ir_dtype.value)


def gather_nd(params, indices, name=None):
    """Slices of `params` at the index tuples in the last axis of `indices`."""
    return op("GatherND", params, _nd_indices(indices, params, "gather_nd"), name=name)


def scatter_nd(indices, updates, shape, name=None):
    """Zeros of `shape` with `updates` added at `indices` (repeated indices add up)."""
    base = zeros(shape, dtype=dtypes.from_numpy(updates.np_dtype))
    return op("ScatterND", base, _nd_indices(indices, updates, "scatter_nd"), updates,
              reduction="add", name=name)


def tensor_scatter_nd_update(params, indices, updates, name=None):
    """`params` with the slices at `indices` replaced by `updates` (as OneFlow, repeated
    indices add their updates up)."""
    idx = _nd_indices(indices, params, "tensor_scatter_nd_update")
    cleared = op("ScatterND", params, idx, zeros_like(updates))
    return op("ScatterND", cleared, idx, updates, reduction="add", name=name)


def tensor_scatter_nd_add(params, indices, updates, name=None):
    """`params` with `updates` added to the slices at `indices`."""
    idx = _nd_indices(indices, params, "tensor_scatter_nd_add")
    return op("ScatterND", params, idx, updates, reduction="add", name=name)


def dim_gather(input, dim, index, name=None):
    """out[i][j][k] = input[index[i][j][k]][j][k] for dim 0 (and so on for other dims)."""
    if len(input.shape) != len(index.shape):
        raise TraceError(f"dim_gather: input {input.shape} and index {index.shape} must have "
                         "the same number of axes")
    if not 0 <= dim < len(index.shape):
        raise TraceError(f"dim_gather: dim {dim} must be in [0, {len(index.shape)})")
    if any(a != b for i, (a, b) in enumerate(zip(input.shape, index.shape)) if i != dim):
        raise TraceError(f"dim_gather: input {input.shape} and index {index.shape} must agree "
                         f"except on dim {dim}")
    if index.np_dtype not in _INDEX_DTYPES:
        raise TraceError(f"dim_gather: index must be int32 or int64, got {index.np_dtype}")
    return op("GatherElements", input, index, axis=int(dim), name=name)


def one_hot(indices, depth, on_value=1, off_value=0, axis=-1, dtype=None, name=None):
    """`on_value` at each index along a new axis of size `depth`, `off_value` elsewhere."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.float32
    values = as_blob(np.array([off_value, on_value], np_dtype), like=indices, dtype=np_dtype)
    return op("OneHot", indices, int64_constant(indices, [depth]), values, axis=axis, name=name)


# -- selection ----------------------------------------------------------------------------

def where(condition, x=None, y=None, name=None):
    """x where condition is nonzero, else y (broadcasting); without x and y, argwhere."""
    if x is None and y is None:
        return argwhere(condition, name=name)
    if x is None or y is None:
        raise TraceError("flow.where takes both x and y, or neither (then it is argwhere)")
    x = as_blob(x, like=y if isinstance(y, Blob) else None)
    y = as_blob(y, like=x)
    return op("Where", _to_bool(condition), x, y, name=name)


def masked_fill(x, mask, value, name=None):
    """`x` with `value` where `mask` is nonzero (x and mask broadcast)."""
    fill = as_blob(np.array(value, dtype=x.np_dtype), like=x)
    return op("Where", _to_bool(mask), fill, x, name=name)


def _array_constant(array, like):
    """A constant holding `array` with its own dtype, in the graph of Blob `like`."""
    return like.builder.constant(np.asarray(array))


def _first_in_order(mask, n):
    """Positions 0..n-1 reordered: those where `mask` holds first (in order), then the rest."""
    iota = int64_constant(mask, np.arange(n))
    key = op("Where", mask, iota, int64_constant(mask, np.arange(n, 2 * n)))
    _, order = op("TopK", key, int64_constant(mask, [n]), axis=0, largest=0, sorted=1,
                  num_outputs=2)
    return order


def _count(mask, np_dtype):
    """The number of true entries of a 1-D bool `mask`, shape (1,)."""
    total = op("ReduceSum", op("Cast", mask, to=dtypes.int64.ir_dtype.value),
               int64_constant(mask, [0]), keepdims=1)
    return op("Cast", total, to=dtypes.from_numpy(np_dtype).ir_dtype.value)


def _zero_after(x, count):
    """`x` with the entries of its first axis at positions >= count (shape (1,)) zeroed."""
    n = x.shape[0]
    iota = _array_constant(np.arange(n, dtype=count.np_dtype).reshape(
        (n,) + (1,) * (len(x.shape) - 1)), like=count)
    return op("Where", op("Less", iota, count), x, as_blob(np.zeros((), x.np_dtype), like=x))


def argwhere_with_size(condition, dtype=None):
    """(coordinates, count): the (elem_cnt, rank) coordinates of the nonzero entries of
    `condition` in row-major order, zero rows after the first `count`, and count (1,)."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.int32
    if np_dtype not in _INDEX_DTYPES:
        raise TraceError(f"argwhere: dtype must be int32 or int64, got {np_dtype}")
    shape, n = condition.shape, int(np.prod(condition.shape))
    if not shape:
        raise TraceError("argwhere needs a Blob of rank >= 1, got a scalar")
    if n == 0:
        size = _array_constant(np.zeros(1, np_dtype), like=condition)
        return _array_constant(np.zeros((0, len(shape)), np_dtype), like=condition), size
    mask = _to_bool(reshape(condition, [n]))
    coords = np.stack(np.unravel_index(np.arange(n), shape), axis=1).astype(np_dtype)
    rows = op("Gather", _array_constant(coords, like=condition), _first_in_order(mask, n), axis=0)
    size = _count(mask, np_dtype)
    return _zero_after(rows, size), size


def argwhere(condition, dtype=None, name=None):
    """Coordinates of the nonzero entries of `condition`, one row each, row-major: as
    OneFlow, a dynamic (count, rank) Blob (static shape (elem_cnt, rank))."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.int32
    if np_dtype not in _INDEX_DTYPES:
        raise TraceError(f"argwhere: dtype must be int32 or int64, got {np_dtype}")
    if not condition.shape:
        raise TraceError("argwhere needs a Blob of rank >= 1, got a scalar")
    rows = op("Transpose", op("NonZero", _to_bool(condition)), perm=[1, 0])
    return op("Cast", rows, to=dtypes.from_numpy(np_dtype).ir_dtype.value, name=name)


def nonzero(a, name=None):
    """argwhere(a) transposed: one row per axis (a dynamic (rank, count) Blob)."""
    return transpose(argwhere(a), perm=[1, 0], name=name)


def unique_with_counts(x, out_idx=dtypes.int32, name=None):
    """[y, idx, count, num_unique] of a 1-D `x`, as OneFlow's CPU kernel: y holds the
    distinct values in order of first appearance, x = y[idx], count[k] counts y[k];
    y and count are zero-padded to len(x) after the first num_unique (shape (1,))."""
    if len(x.shape) != 1:
        raise TraceError(f"unique_with_counts takes a 1-D Blob, got shape {x.shape}")
    np_idx = dtypes.to_numpy(out_idx)
    if np_idx not in _INDEX_DTYPES:
        raise TraceError(f"unique_with_counts: out_idx must be int32 or int64, got {np_idx}")
    n = x.shape[0]
    to_idx = dtypes.from_numpy(np_idx).ir_dtype.value
    # NOTE: an (n, n) equality table keeps every shape static; NaNs are all distinct,
    # as in OneFlow's hash map (the diagonal makes each NaN its own first occurrence).
    same = op("Or", op("Equal", expand_dims(x, 1), expand_dims(x, 0)),
              _array_constant(np.eye(n, dtype=bool), like=x))
    first = op("ArgMax", op("Cast", same, to=dtypes.int32.ir_dtype.value), axis=1, keepdims=0)
    is_first = op("Equal", first, int64_constant(x, np.arange(n)))
    order = _first_in_order(is_first, n)
    num_unique = _count(is_first, np_idx)
    y = _zero_after(op("Gather", x, order, axis=0), num_unique)
    _, rank = op("TopK", order, int64_constant(x, [n]), axis=0, largest=0, sorted=1,
                 num_outputs=2)
    idx = op("Gather", rank, first, axis=0)
    hits = op("Equal", expand_dims(idx, 0), int64_constant(x, np.arange(n).reshape(n, 1)))
    count = op("ReduceSum", op("Cast", hits, to=to_idx), int64_constant(x, [1]), keepdims=0)
    return [op("Identity", y, name=name), op("Cast", idx, to=to_idx), count, num_unique]


def diag(input, diagonal=0, name=None):
    """A vector's square diagonal matrix, or a matrix's diagonal; `diagonal` > 0 is above
    the main diagonal, < 0 below."""
    k = int(diagonal)
    if len(input.shape) == 1:
        n = input.shape[0]
        m = n + abs(k)
        table = np.full((m, m), n, dtype=np.int64)  # n: the appended zero
        table[np.arange(n) + max(-k, 0), np.arange(n) + max(k, 0)] = np.arange(n)
        padded = concat([input, as_blob(np.zeros(1, input.np_dtype), like=input)], axis=0)
        return op("Gather", padded, int64_constant(input, table), axis=0, name=name)
    if len(input.shape) != 2:
        raise TraceError(f"diag takes a 1-D or 2-D Blob, got shape {input.shape}")
    rows, cols = input.shape
    size = min(rows, cols - k) if k >= 0 else min(rows + k, cols)
    if size <= 0:
        raise TraceError(f"diag: diagonal {k} is outside a {rows}x{cols} matrix")
    flat = (np.arange(size) + max(-k, 0)) * cols + np.arange(size) + max(k, 0)
    return op("Gather", reshape(input, [rows * cols]), int64_constant(input, flat), axis=0,
              name=name)


# -- padding ------------------------------------------------------------------------------

def _pad(x, before, after, mode, constant_value=0, name=None):
    if any(int(p) < 0 for p in list(before) + list(after)):
        raise TraceError(f"pad: paddings must be >= 0, got {list(before)} and {list(after)}")
    if not x.shape:   # a 0-d Blob has no axis to pad (onnxruntime's Pad needs rank >= 1)
        return op("Identity", x, name=name)
    pads = int64_constant(x, [int(p) for p in list(before) + list(after)])
    if mode != "constant":
        return op("Pad", x, pads, mode=mode, name=name)
    value = as_blob(np.array(constant_value, dtype=x.np_dtype), like=x)
    return op("Pad", x, pads, value, mode="constant", name=name)


def _pairs(paddings, x, api):
    if not isinstance(paddings, (list, tuple)) or len(paddings) != len(x.shape) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in paddings):
        raise TraceError(f"{api}: paddings must be {len(x.shape)} (before, after) pairs, got "
                         f"{paddings!r}")
    return [p[0] for p in paddings], [p[1] for p in paddings]


def pad(x, paddings, constant_value=0, name=None):
    """`x` padded with `constant_value`; paddings holds a (before, after) pair per axis."""
    before, after = _pairs(paddings, x, "pad")
    return _pad(x, before, after, "constant", constant_value, name=name)


def pad_grad(x, paddings, constant_value=0, name=None):
    """The gradient of pad: `x` with the paddings cut off."""
    before, after = _pairs(paddings, x, "pad_grad")
    tuples = [(b, d - a, 1) for b, a, d in zip(before, after, x.shape)]
    return slice_v2(x, tuples, name=name)


def _pad2d(x, padding, api):
    """(before, after) of an NCHW Blob for `padding` = int or [left, right, top, bottom]."""
    if len(x.shape) != 4:
        raise TraceError(f"{api} takes an NCHW Blob, got shape {x.shape}")
    if isinstance(padding, int):
        padding = [padding] * 4
    if not isinstance(padding, (list, tuple)) or len(padding) != 4:
        raise TraceError(f"{api}: padding must be an int or [left, right, top, bottom]")
    left, right, top, bottom = (int(p) for p in padding)
    return [0, 0, top, left], [0, 0, bottom, right]


def constant_pad2d(x, padding, constant_value=0, name=None):
    """NCHW `x` padded with `constant_value` by [left, right, top, bottom] (or an int)."""
    before, after = _pad2d(x, padding, "constant_pad2d")
    return _pad(x, before, after, "constant", constant_value, name=name)


def zero_pad2d(x, padding, name=None):
    """constant_pad2d with zeros."""
    return constant_pad2d(x, padding, 0, name=name)


def reflection_pad2d(x, padding, name=None):
    """NCHW `x` padded with its reflection (the border itself is not repeated)."""
    before, after = _pad2d(x, padding, "reflection_pad2d")
    if before[2] >= x.shape[2] or after[2] >= x.shape[2] or before[3] >= x.shape[3] or \
            after[3] >= x.shape[3]:
        raise TraceError("reflection_pad2d: padding size should be less than the "
                         f"corresponding input dimension, got {padding} for {x.shape}")
    return _pad(x, before, after, "reflect", name=name)


def replication_pad2d(x, padding, name=None):
    """NCHW `x` padded by repeating its border."""
    before, after = _pad2d(x, padding, "replication_pad2d")
    return _pad(x, before, after, "edge", name=name)


def same_padding(x, padding, data_format, kernel_size, strides, dilation_rate, name=None):
    """Zero-pad the spatial axes so that a convolution keeps ceil(size / stride) outputs;
    SAME_UPPER puts the odd pixel at the end, SAME_LOWER at the start."""
    mode = str(padding).lower()
    if mode not in ("same_lower", "same_upper"):
        raise TraceError(f'same_padding: padding must be "SAME_LOWER" or "SAME_UPPER", '
                         f"got {padding!r}")
    n_spatial = len(x.shape) - 2
    if not all(isinstance(v, (list, tuple)) and len(v) == n_spatial
               for v in (kernel_size, strides, dilation_rate)):
        raise TraceError(f"same_padding: kernel_size, strides and dilation_rate must be "
                         f"lists of {n_spatial} ints")
    first = 2 if data_format.startswith("NC") else 1
    before, after = [0] * len(x.shape), [0] * len(x.shape)
    for i, (k, s, d) in enumerate(zip(kernel_size, strides, dilation_rate)):
        size = x.shape[first + i]
        needed = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = needed // 2, needed - needed // 2
        before[first + i], after[first + i] = (large, small) if mode == "same_lower" else (
            small, large)
    return _pad(x, before, after, "constant", name=name)


# NOTE: defined last: from here on `range` in this module is flow.range (hence
# builtins.range above).
def range(start, limit=None, delta=1, dtype=None, name="range"):
    """[start, start + delta, ...) below `limit` (one argument: [0, start)); int64 default."""
    flow_dtype = dtypes.int64 if dtype is None else _flow_dtype(dtype)
    np_dtype = flow_dtype.np_dtype
    if limit is None:
        start, limit = 0, start
    if not limit > start:
        raise TraceError(f"range: limit {limit} should be larger than start {start}")
    if not np.issubdtype(np_dtype, np.floating):  # OneFlow's integer attributes
        start, limit, delta = int(start), int(limit), int(delta)
    if not 0 < delta <= limit - start:
        raise TraceError(f"range: delta {delta} must be in (0, limit - start] for {np_dtype}")
    builder = current_builder("flow.range")
    # NOTE: float ranges are computed in float64 and cast, as OneFlow's float kernel
    # sizes them (ceil of a float64 division); onnxruntime's Range accumulates in T.
    wide = np.float64 if np.issubdtype(np_dtype, np.floating) else np_dtype
    bounds = [builder.constant(np.array(v, dtype=wide)) for v in (start, limit, delta)]
    out = op("Range", *bounds)
    return op("Cast", out, to=flow_dtype.ir_dtype.value, name=name) if wide != np_dtype else \
        op("Identity", out, name=name)
