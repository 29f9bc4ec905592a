"""Gathers and scatters by index: flow.gather (and OneFlow's batch_gather), gather_nd,
dim_gather, scatter_nd, tensor_scatter_nd_update, tensor_scatter_nd_add, one_hot.

Shape and gradient rules: onnxjob/graph/primitives/shape_ops.py.
"""
import weakref

import numpy as np

from onnxjob import dtypes
from onnxjob.compat.generations import written_for_0_4
from onnxjob.compat.zero_d_inputs import as_vector, is_zero_d
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import dim_of
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op
from onnxjob.ops._array_common import INDEX_DTYPES, indices_in_range, known_in_range
from onnxjob.ops.creation import zeros, zeros_like
from onnxjob.ops.shapes import reshape

__all__ = ["dim_gather", "gather", "gather_nd", "one_hot", "scatter_nd", "tensor_scatter_nd_add",
           "tensor_scatter_nd_update"]


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """Rows of `params` along `axis` (default: `batch_dims`) picked by `indices`.

    `batch_dims > 0` (with `axis == batch_dims`) is OneFlow's batch_gather, whose batch
    axes are all but the last axis of `indices`, whatever `batch_dims` says: with b =
    rank(indices) - 1, out[i.., k] = params[i.., indices[i.., k], ...] for the first b
    axes shared (BERT's masked-LM positions call it with batch_dims=2 on (B, P) indices;
    1-D indices pick rows of axis 0).
    0-d `params` are their one-element vector, as OneFlow <= 0.4's (compat/zero_d_inputs.py).
    """
    params = as_vector(params)
    if not isinstance(indices, Blob):
        indices = as_blob(np.asarray(indices, np.int64), like=params, dtype=np.int64)
    if indices.np_dtype not in INDEX_DTYPES:     # (OneFlow's gather_op.cpp checks it too)
        raise TraceError(f"gather: indices must be int32 or int64, got {indices.np_dtype} "
                         "(a placeholder's dtype defaults to float: give dtype=flow.int32)")
    rank = len(params.shape)
    axis = batch_dims if axis is None else axis
    if not -rank <= axis < rank:
        raise TraceError(f"gather: axis {axis} is out of range for params of rank {rank}")
    axis %= rank
    if batch_dims == 0:
        return _gather_zero_outside(params, indices, axis, name)
    if axis != batch_dims:
        raise TraceError(f"gather with batch_dims={batch_dims} needs axis={batch_dims} (OneFlow "
                         f"has no other batched gather), got axis={axis}")
    b = len(indices.shape) - 1
    if not 0 <= b < rank or tuple(indices.shape[:b]) != tuple(params.shape[:b]):
        raise TraceError(f"gather (batch_gather): all but the last axis of indices "
                         f"{indices.shape} must be the leading axes of params {params.shape}")
    return _batch_gather(params, indices, b, name)


def _gather_zero_outside(params, indices, axis, name):
    """Gather along `axis` where an index outside [0, size) picks a row of zeros, as
    OneFlow's gather kernels do (user/kernels/gather_kernel_util.cpp and .cu: `if (idx >=
    0 && idx < gather_dim_size)` copy, else zeros; a "padding id" equal to the vocabulary
    size is the common case). ONNX's Gather wraps negative indices and fails the run past
    the end, so the indices are made safe and the rows masked; constant indices all in
    range keep the plain Gather."""
    size = params.shape[axis]
    if not params.is_dynamic and known_in_range(indices, size):
        return op("Gather", params, indices, axis=int(axis), name=name)
    limit = dim_of(params, axis) if params.is_dynamic else size
    if isinstance(limit, Blob):     # (1,) int64 -> a scalar of the indices' type
        limit = op("Cast", op("Squeeze", limit, int64_constant(limit, [0])),
                   to=dtypes.from_numpy(indices.np_dtype).ir_dtype.value)
    else:
        limit = as_blob(limit, like=indices)
    zero = as_blob(0, like=indices)
    inside = op("And", op("GreaterOrEqual", indices, zero), op("Less", indices, limit))
    safe = op("Where", inside, indices, zero)
    _MASKED_LOOKUPS[safe.value] = (indices, inside)
    rows = op("Gather", params, safe, axis=int(axis))
    r, rank = len(indices.shape), len(params.shape)
    new_axes = list(range(axis)) + list(range(axis + r, rank - 1 + r))
    mask = op("Unsqueeze", inside, int64_constant(inside, new_axes)) if new_axes else inside
    return op("Where", mask, rows, as_blob(0, like=params), name=name)


# a masked gather's safe indices (their ir.Value: a Blob's == compares values) -> (the
# indices given, which of them are inside)
_MASKED_LOOKUPS = weakref.WeakKeyDictionary()


def rows_looked_up(indices):
    """The rows an indexed-slices update of the table a gather read with `indices` writes
    (train/update_rules.picked_rows): for a gather that masks indices outside the table,
    each outside one replaced by the largest inside (0 if none), so that the update writes
    that row twice with the same value instead of touching a row not looked up, as
    OneFlow's sparse updates skip ids outside the table. Other indices as they are. Made
    in the update, not the forward: a reduction over the batch's indices there would stop
    data-parallel ranks (graph/split_rules.py)."""
    masked = _MASKED_LOOKUPS.get(indices.value)
    if masked is None:
        return indices
    given, inside = masked
    marked = op("Where", inside, given, as_blob(-1, like=given))
    largest = op("ReduceMax", op("Concat", reshape(marked, [-1]), as_blob([-1], like=given),
                                 axis=0), keepdims=0)
    return op("Where", inside, given, op("Max", largest, as_blob(0, like=given)))


def _batch_gather(params, indices, b, name):
    """Gather over the flattened batch: row i*n + index of a (batch*n, ...) table."""
    batch = int(np.prod(params.shape[:b]))
    n, rest = params.shape[b], params.shape[b + 1:]
    # (an index outside the row would read another row of the flattened table)
    indices = indices_in_range(indices, n, "gather (batch_gather): an index is")
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
    if indices.np_dtype not in INDEX_DTYPES:
        raise TraceError(f"{api}: indices must be int32 or int64, got {indices.np_dtype}")
    return indices if indices.np_dtype == np.int64 else op(
        "Cast", indices, to=dtypes.int64.ir_dtype.value)


def gather_nd(params, indices, name=None):
    """Slices of `params` at the index tuples in the last axis of `indices` (0-d `params`:
    their one-element vector, compat/zero_d_inputs.py)."""
    params = as_vector(params)
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
    """out[i][j][k] = input[index[i][j][k]][j][k] for dim 0 (and so on for other dims); a
    0-d `input` beside a vector index is its one-element vector (compat/zero_d_inputs.py)."""
    input = as_vector(input, where=len(index.shape) == 1)
    if len(input.shape) != len(index.shape):
        raise TraceError(f"dim_gather: input {input.shape} and index {index.shape} must have "
                         "the same number of axes")
    if not 0 <= dim < len(index.shape):
        raise TraceError(f"dim_gather: dim {dim} must be in [0, {len(index.shape)})")
    if any(a != b for i, (a, b) in enumerate(zip(input.shape, index.shape)) if i != dim):
        raise TraceError(f"dim_gather: input {input.shape} and index {index.shape} must agree "
                         f"except on dim {dim}")
    if index.np_dtype not in INDEX_DTYPES:
        raise TraceError(f"dim_gather: index must be int32 or int64, got {index.np_dtype}")
    return op("GatherElements", input, index, axis=int(dim), name=name)


def one_hot(indices, depth, on_value=1, off_value=0, axis=-1, dtype=None, name=None):
    """`on_value` at each index along a new axis of size `depth`, `off_value` elsewhere
    (0-d indices in code written for OneFlow <= 0.4, whose argmax of a vector was (1,), are
    that one-element vector: (1, depth))."""
    indices = as_vector(indices, where=is_zero_d(indices) and written_for_0_4())
    if indices.np_dtype not in INDEX_DTYPES:    # (OneFlow's one_hot_op.cpp checks it too)
        raise TraceError(f"one_hot: indices must be int32 or int64, got {indices.np_dtype} "
                         "(a placeholder's dtype defaults to float: give dtype=flow.int32)")
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.float32
    values = as_blob(np.array([off_value, on_value], np_dtype), like=indices, dtype=np_dtype)
    indices = indices_in_range(indices, int(depth), "one_hot: an index is")
    return op("OneHot", indices, int64_constant(indices, [depth]), values, axis=axis, name=name)
