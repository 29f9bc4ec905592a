"""Blobs made from values: flow.constant, constant_scalar, constant_like, zeros, ones,
zeros_like, ones_like, range.

Shape rules of ConstantOfShape and Range: onnxjob/graph/primitives/shape_ops.py.
"""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import current_builder, op
from onnxjob.ops._array_common import to_flow_dtype

__all__ = ["constant", "constant_like", "constant_scalar", "ones", "ones_like", "range", "zeros",
           "zeros_like"]


def constant(value, dtype=None, shape=None, name=None):
    """A Blob of `shape` filled with `value` (dtype default float32)."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.float32
    arr = dtypes.scalar_array(value, np_dtype)
    if shape is not None:
        arr = np.broadcast_to(arr, tuple(shape))
    return current_builder("flow.constant").constant(np.array(arr), name_hint=name or "constant")


def constant_scalar(value, dtype=None, name=None):
    """A shape-(1,) Blob holding `value`."""
    return constant(value, dtype=dtype, shape=[1], name=name)


def constant_like(like, value, dtype=None, name=None):
    """A Blob of like's shape filled with `value` (dtype default: like's)."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else like.np_dtype
    value = dtypes.scalar_array(value, np_dtype)
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


# NOTE: defined last: from here on `range` in this module is flow.range.
def range(start, limit=None, delta=1, dtype=None, name="range"):
    """[start, start + delta, ...) below `limit` (one argument: [0, start)); int64 default."""
    flow_dtype = dtypes.int64 if dtype is None else to_flow_dtype(dtype)
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
    if np.issubdtype(np_dtype, np.floating):
        # OneFlow's kernel (range_kernel_util.h DoRange): out[i] = start + i * delta in T,
        # sized by the ceil of a float64 division; onnxruntime's Range adds delta up
        count = int(math.ceil((float(limit) - float(start)) / float(delta)))
        steps = op("Cast", op("Range", *(builder.constant(np.array(v, np.int64))
                                          for v in (0, count, 1))),
                   to=flow_dtype.ir_dtype.value)
        return op("Add", op("Mul", steps, builder.constant(np.array(delta, np_dtype))),
                  builder.constant(np.array(start, np_dtype)), name=name)
    bounds = [builder.constant(np.array(v, dtype=np_dtype)) for v in (start, limit, delta)]
    return op("Identity", op("Range", *bounds), name=name)
