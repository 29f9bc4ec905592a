"""Top-level array ops: flow.reshape, transpose, concat, constant, matmul, slice, ...

Everything in `__all__` is re-exported as `flow.<name>`.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import resolve_reshape
from onnxjob.graph.tracer import Blob, as_blob, current_builder, int64_constant, op

__all__ = ["cast", "cast_to_current_logical_view", "concat", "constant", "constant_like",
           "expand_dims", "flatten", "gather", "identity", "identity_n", "matmul", "one_hot",
           "ones_like", "parallel_cast", "reshape", "slice", "slice_v2", "split", "squeeze",
           "transpose", "where", "zeros_like"]


def reshape(x, shape, name=None):
    """Reshape with at most one -1 (OneFlow semantics: 0 is a real zero)."""
    shape = resolve_reshape(x.shape, list(shape))
    if tuple(shape) == x.shape:
        return op("Identity", x, name=name)
    return op("Reshape", x, int64_constant(x, shape), name=name)


def flatten(x, start_dim=0, end_dim=-1, name=None):
    end = end_dim % len(x.shape)
    shape = list(x.shape[:start_dim]) + [int(np.prod(x.shape[start_dim:end + 1]))] + list(x.shape[end + 1:])
    return reshape(x, shape, name=name)


def transpose(a, perm=None, conjugate=False, batch_axis_non_change=False, name=None):
    perm = list(range(len(a.shape)))[::-1] if perm is None else [int(p) % len(a.shape) for p in perm]
    return op("Transpose", a, perm=perm, name=name)


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
    return op("Concat", *inputs, axis=int(axis), name=name)


def split(x, num_or_size_splits, axis=0, name=None):
    if isinstance(num_or_size_splits, int):
        return op("Split", x, None, axis=axis, num_outputs=num_or_size_splits, name=name)
    sizes = list(num_or_size_splits)
    return op("Split", x, int64_constant(x, sizes), axis=axis, num_outputs=len(sizes), name=name)


def identity(x, name=None):
    return op("Identity", x, name=name)


def identity_n(inputs, name=None):
    """Each of `inputs`, unchanged (a list)."""
    return [op("Identity", x) for x in inputs]


def parallel_cast(input, name=None, distribute=None, gradient_distribute=None):
    """A placement hint in OneFlow (split/broadcast between devices); the identity on
    onnxjob's one device."""
    return input


def cast_to_current_logical_view(x):
    """The identity: onnxjob has one logical view per job."""
    return x


def squeeze(x, axis=None, name=None):
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axis is None else list(np.atleast_1d(axis))
    return op("Squeeze", x, int64_constant(x, axes), name=name)


def expand_dims(x, axis, name=None):
    return op("Unsqueeze", x, int64_constant(x, [axis]), name=name)


def constant(value, dtype=None, shape=None, name=None):
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.float32
    arr = np.asarray(value, dtype=np_dtype)
    if shape is not None:
        arr = np.broadcast_to(arr, tuple(shape))
    return current_builder("flow.constant").constant(np.array(arr), name_hint=name or "constant")


def constant_like(like, value, dtype=None, name=None):
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else like.np_dtype
    return like.builder.constant(np.full(like.shape, value, dtype=np_dtype))


def zeros_like(like, dtype=None, name=None):
    return constant_like(like, 0, dtype, name)


def ones_like(like, dtype=None, name=None):
    return constant_like(like, 1, dtype, name)


def matmul(a, b, transpose_a=False, transpose_b=False, alpha=1.0, name=None):
    if transpose_a:
        a = _swap_last(a)
    if transpose_b:
        b = _swap_last(b)
    out = op("MatMul", a, b, name=name)
    return out if alpha == 1.0 else out * alpha


def _swap_last(x):
    perm = list(range(len(x.shape)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return op("Transpose", x, perm=perm)


def slice(x, begin, size, name=None):
    """OneFlow slice: per-axis begin and size (None = whole axis)."""
    starts, ends, axes = [], [], []
    for axis, (b, s) in enumerate(zip(begin, size)):
        if b is None and s is None:
            continue
        b = 0 if b is None else b
        starts.append(b)
        ends.append(x.shape[axis] if s is None or s == -1 else b + s)
        axes.append(axis)
    return op("Slice", x, *(int64_constant(x, v) for v in (starts, ends, axes)), name=name)


def slice_v2(x, slice_tup_list, name=None):
    starts, ends, axes, steps = [], [], [], []
    for axis, (b, e, st) in enumerate(slice_tup_list):
        starts.append(0 if b is None else b)
        ends.append(np.iinfo(np.int64).max if e is None else e)
        axes.append(axis)
        steps.append(1 if st is None else st)
    return op("Slice", x, *(int64_constant(x, v) for v in (starts, ends, axes, steps)), name=name)


def gather(params, indices, validate_indices=None, axis=None, batch_dims=0, name=None):
    """Rows of `params` along `axis` (default: `batch_dims`) picked by `indices`.

    With `batch_dims=b` the first b axes of `params` and `indices` are shared (OneFlow's
    batch_gather; `axis` must then be b): out[i.., k..] = params[i.., indices[i.., k..]].
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
        raise TraceError(f"gather with batch_dims={batch_dims} gathers along axis "
                         f"{batch_dims}, got axis={axis} (as in OneFlow)")
    if tuple(indices.shape[:batch_dims]) != tuple(params.shape[:batch_dims]):
        raise TraceError(f"gather: the first {batch_dims} axes of indices {indices.shape} and "
                         f"params {params.shape} must agree")
    return _batch_gather(params, indices, batch_dims, name)


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


def cast(x, dtype, name=None):
    flow_dtype = dtype if isinstance(dtype, type) else dtypes.from_numpy(dtype)
    if x.np_dtype == flow_dtype.np_dtype:
        return x
    return op("Cast", x, to=flow_dtype.ir_dtype.value, name=name)


def where(condition, x=None, y=None, name=None):
    assert x is not None and y is not None, "flow.where needs x and y"
    x = as_blob(x, like=y if isinstance(y, Blob) else None)
    y = as_blob(y, like=x)
    return op("Where", condition, x, y, name=name)


def one_hot(indices, depth, on_value=1, off_value=0, axis=-1, dtype=None, name=None):
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.float32
    values = as_blob(np.array([off_value, on_value], np_dtype), like=indices, dtype=np_dtype)
    return op("OneHot", indices, int64_constant(indices, [depth]), values, axis=axis, name=name)
