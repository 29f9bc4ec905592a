"""Joining and cutting along axes: flow.concat, stack, split, slice, slice_v2, reverse,
slice_update, sync_dynamic_resize.

sync_dynamic_resize gives what OneFlow gives: a dynamic Blob (its static shape is the
largest, read with tp.ListNumpy). Shape and gradient rules:
onnxjob/graph/primitives/shape_ops.py.
"""
import builtins

import numpy as np

from onnxjob import dtypes
from onnxjob.compat.generations import written_for_0_4
from onnxjob.compat.zero_d_inputs import as_vector, as_vectors, is_zero_d
from onnxjob.errors import TraceError
from onnxjob.graph.registry import normalize_axis
from onnxjob.graph.tracer import Blob, int64_constant, op
from onnxjob.ops._array_common import INDEX_DTYPES, check_axis
from onnxjob.ops.shapes import expand_dims

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min

__all__ = ["concat", "reverse", "slice", "slice_update", "slice_v2", "split", "stack",
           "sync_dynamic_resize"]


def concat(inputs=None, axis=0, max_dim_size=None, name=None, values=None):
    """Concatenate Blobs along `axis` (`values=` is OneFlow 0.5's other spelling); 0-d
    Blobs among vectors, or only 0-d Blobs, are one-element vectors, as OneFlow <= 0.4's
    full reductions were (compat/zero_d_inputs.py)."""
    if values is not None:
        if inputs is not None:
            raise TraceError("flow.concat takes `inputs` or `values`, not both")
        inputs = values
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise TraceError(f"flow.concat takes a non-empty list of Blobs, got {inputs!r}")
    if len(inputs) == 1:
        return inputs[0]
    inputs = as_vectors(inputs)
    out = op("Concat", *inputs, axis=int(axis), name=name)
    if max_dim_size is not None and out.is_dynamic:
        # OneFlow: a dynamic result's static (largest) size along `axis` is max_dim_size
        shape = list(out.shape)
        shape[normalize_axis(int(axis), len(shape))] = int(max_dim_size)
        out.shape = tuple(shape)
    return out


def stack(inputs, axis=0, name=None):
    """Stack same-shaped Blobs along a new axis `axis` (0-d Blobs beside (1,) ones, 0-d
    Blobs stacked along axis 1, or any in code written for OneFlow <= 0.4, whose full
    reductions were (1,), are one-element vectors: compat/zero_d_inputs.py)."""
    inputs = as_vectors(inputs, mixed_only=isinstance(axis, int) and -1 <= axis <= 0
                        and not (any(is_zero_d(x) for x in inputs) and written_for_0_4()))
    first = inputs[0].shape
    if any(x.shape != first for x in inputs):
        raise TraceError(f"stack: every input must have shape {first}, got "
                         f"{[x.shape for x in inputs]}")
    axis = check_axis(axis, len(first) + 1, "stack")
    return concat([expand_dims(x, axis) for x in inputs], axis=axis, name=name)


def split(x, num_or_size_splits, axis=0, name=None):
    """`x` split along `axis` into equal parts (an int) or parts of the given sizes."""
    if isinstance(num_or_size_splits, int):
        return op("Split", x, None, axis=axis, num_outputs=num_or_size_splits, name=name)
    sizes = list(num_or_size_splits)
    return op("Split", x, int64_constant(x, sizes), axis=axis, num_outputs=len(sizes), name=name)


def slice(x, begin, size, name=None):
    """OneFlow slice: per-axis begin and size (None = whole axis, size -1 = to the end); a
    0-d `x` with one begin is its one-element vector (compat/zero_d_inputs.py)."""
    x = as_vector(x, where=isinstance(begin, (list, tuple)) and len(begin) == 1)
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


def _one_tuple(slice_tup_list):
    return isinstance(slice_tup_list, (list, tuple)) and len(slice_tup_list) == 1


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
    """Slice every axis by its (start, stop, step) tuple; missing axes are whole (a 0-d `x`
    with one tuple is its one-element vector: compat/zero_d_inputs.py)."""
    x = as_vector(x, where=_one_tuple(slice_tup_list))
    tuples = _slice_tuples(slice_tup_list, x.shape, "slice_v2")
    if not tuples:   # a 0-d Blob: nothing to slice (ONNX Slice needs rank >= 1)
        return op("Identity", x, name=name)
    starts, stops, steps = (list(v) for v in zip(*tuples))
    axes = list(range(len(tuples)))
    return op("Slice", x, *(int64_constant(x, v) for v in (starts, stops, axes, steps)),
              name=name)


def reverse(input, axis, name=None):
    """`input` with the order of the entries along `axis` (an int or a list) reversed."""
    axes = [axis] if isinstance(axis, int) else axis
    input = as_vector(input, where=bool(axes))     # compat/zero_d_inputs.py
    if not isinstance(axes, (list, tuple)) or not all(isinstance(a, int) for a in axes):
        raise TraceError(f"reverse: axis must be an int or a list of ints, got {axis!r}")
    tuples = [(None, None, None)] * len(input.shape)
    for a in axes:
        tuples[check_axis(a, len(input.shape), "reverse")] = (None, None, -1)
    return slice_v2(input, tuples, name=name)


def slice_update(x, update, slice_tup_list, name=None):
    """`x` with its slice `slice_tup_list` replaced by `update` (x[start:stop:step] = update;
    0-d Blobs where one-element vectors fit are those: compat/zero_d_inputs.py)."""
    x = as_vector(x, where=_one_tuple(slice_tup_list))
    tuples = _slice_tuples(slice_tup_list, x.shape, "slice_update")
    ranges = [np.arange(*builtins.slice(*t).indices(d)) for t, d in zip(tuples, x.shape)]
    counts = tuple(len(r) for r in ranges)
    update = as_vector(update, where=counts == (1,))
    if update.shape != counts or update.np_dtype != x.np_dtype:
        raise TraceError(f"slice_update: update must have shape {counts} and dtype "
                         f"{x.np_dtype}, got {update.shape} {update.np_dtype}")
    positions = np.stack(np.meshgrid(*ranges, indexing="ij"), axis=-1)
    return op("ScatterND", x, int64_constant(x, positions), update, name=name)


def sync_dynamic_resize(inputs, size, name=None):
    """The first `size` rows of `inputs` (`size`: a 1-element int32/int64 Blob): a
    dynamic Blob whose static shape is inputs'."""
    if not isinstance(size, Blob) or int(np.prod(size.shape)) != 1 or \
            size.np_dtype not in INDEX_DTYPES:
        raise TraceError("sync_dynamic_resize: size must be a 1-element int32/int64 Blob")
    if not inputs.shape:
        raise TraceError("sync_dynamic_resize needs a Blob of rank >= 1, got a scalar")
    end = op("Cast", op("Reshape", size, int64_constant(size, [1])),
             to=dtypes.int64.ir_dtype.value)
    return op("Slice", inputs, int64_constant(inputs, [0]), end, int64_constant(inputs, [0]),
              name=name)
