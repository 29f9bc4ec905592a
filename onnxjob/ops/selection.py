"""Picking entries by a condition: flow.where, masked_fill, argwhere, nonzero, and
flow.experimental.unique_with_counts.

Outputs whose size depends on the data give what OneFlow gives: argwhere and nonzero
dynamic Blobs (static shape: the largest, read with tp.ListNumpy), unique_with_counts
static Blobs zero-padded after the valid entries, with their count (argwhere_with_size
pads argwhere's coordinates the same way). Rules of Where:
onnxjob/graph/primitives/elementwise.py; of NonZero: onnxjob/graph/primitives/shape_ops.py.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op
from onnxjob.ops._array_common import INDEX_DTYPES
from onnxjob.ops.shapes import expand_dims, reshape, transpose

__all__ = ["argwhere", "masked_fill", "nonzero", "where"]


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


def _to_bool(x):
    """Nonzero entries as True (OneFlow's conditions and masks are int8/int32/int64)."""
    return x if x.np_dtype == np.bool_ else op("Cast", x, to=dtypes.bool_.ir_dtype.value)


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
    if np_dtype not in INDEX_DTYPES:
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
    if np_dtype not in INDEX_DTYPES:
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
    if np_idx not in INDEX_DTYPES:
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
