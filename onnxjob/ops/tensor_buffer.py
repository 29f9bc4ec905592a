"""Tensor buffers: blobs whose entries are arrays of their own shape (OneFlow's
kTensorBuffer), and their conversions to and from ordinary blobs.

Two kinds, both with `.shape` (the buffer's) and `.dtype` flow.tensor_buffer:
- host tensor buffers (ops/host.HostValue): what the data ops and flow.gen_tensor_buffer
  make on the host each run, as lists of (where, array); entries may differ in shape.
- GraphTensorBuffer: flow.tensor_to_tensor_buffer of a blob computed in the graph; its
  entries all have the same shape (the blob's last `instance_dims` axes).
"""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import Blob, current_builder
from onnxjob.io.ofrecord import RecordError
from onnxjob.ops.host import TENSOR_BUFFER, HostValue, to_blob
from onnxjob.ops.shapes import reshape, squeeze
from onnxjob.ops.slicing import split
from onnxjob.runtime.pipeline import HostNode


class GraphTensorBuffer:
    """A tensor buffer over a graph blob `data` of shape `shape + instance_shape`."""

    dtype = TENSOR_BUFFER

    def __init__(self, data, instance_dims):
        self.data = data
        self.shape = tuple(data.shape[:len(data.shape) - instance_dims])
        self.instance_shape = tuple(data.shape[len(data.shape) - instance_dims:])

    def __repr__(self):
        return (f"GraphTensorBuffer({self.data.name}, shape {self.shape}, entries "
                f"{self.instance_shape} {self.data.np_dtype})")


def tensor_to_tensor_buffer(x, instance_dims, name=None):
    """`x` as a tensor buffer of shape x.shape[:-instance_dims] whose entries are its last
    `instance_dims` axes."""
    api = "flow.tensor_to_tensor_buffer"
    if not isinstance(x, Blob):
        raise TraceError(f"{api} takes a blob, got {x!r}")
    if not 0 < instance_dims < len(x.shape):
        raise TraceError(f"{api}: instance_dims must be in [1, {len(x.shape) - 1}] for a "
                         f"{x.shape} blob, got {instance_dims}")
    return GraphTensorBuffer(x, int(instance_dims))


def _check_entry(where, array, np_dtype, count, api):
    if array.dtype != np_dtype:
        raise RecordError(f"{where}: {api}: the entry holds {array.dtype}, not {np_dtype}")
    if array.size != count:
        raise RecordError(f"{where}: {api}: the entry has {array.size} values ({array.shape}), "
                          f"the instance shape holds {count}")


def tensor_buffer_to_tensor(x, dtype, instance_shape, name=None):
    """A (*x.shape, *instance_shape) blob of `dtype` from the entries of tensor buffer `x`,
    each of which must hold that dtype and prod(instance_shape) values."""
    api = "flow.tensor_buffer_to_tensor"
    np_dtype = dtypes.to_numpy(dtype)
    instance_shape = tuple(int(d) for d in instance_shape)
    count = math.prod(instance_shape)
    if isinstance(x, GraphTensorBuffer):
        if x.data.np_dtype != np_dtype or math.prod(x.instance_shape) != count:
            raise TraceError(f"{api}: the entries are {x.instance_shape} {x.data.np_dtype}, "
                             f"not {count} values of {np_dtype}")
        return reshape(x.data, list(x.shape + instance_shape), name=name)
    _host_buffer(x, api)

    def compute(batch):
        out = np.empty((len(batch),) + instance_shape, np_dtype)
        for i, (where, array) in enumerate(batch):
            array = np.asarray(array)
            _check_entry(where, array, np_dtype, count, api)
            out[i] = array.reshape(instance_shape)
        return out.reshape(x.shape + instance_shape)

    return to_blob(name or "TensorBufferToTensor", compute, [x], x.shape + instance_shape,
                   np_dtype, api)


def _host_buffer(x, api):
    if not isinstance(x, HostValue) or x.dtype is not TENSOR_BUFFER:
        raise TraceError(f"{api} takes a tensor buffer (flow.tensor_to_tensor_buffer, "
                         f"flow.gen_tensor_buffer, a data op's), got {x!r}")


def gen_tensor_buffer(shape, shape_list, value_list, data_type=dtypes.float32,
                      dynamic_out=False, name=None):
    """A tensor buffer of `shape` whose i-th entry (row-major) is an array of shape
    shape_list[i] filled with value_list[i], of `data_type`."""
    api = "flow.gen_tensor_buffer"
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if len(shape_list) != n or len(value_list) != n:
        raise TraceError(f"{api}: a {shape} buffer needs {n} entries in shape_list and "
                         f"value_list, got {len(shape_list)} and {len(value_list)}")
    np_dtype = dtypes.to_numpy(data_type)
    entries = [(f"{api} entry {i}", np.full(tuple(s), v, np_dtype))
                for i, (s, v) in enumerate(zip(shape_list, value_list))]
    builder = current_builder(api)
    node = _ConstantEntries(builder.unique_name(name or "GenTensorBuffer"), entries)
    return HostValue(node, n, TENSOR_BUFFER, builder, dims=shape)


class _ConstantEntries(HostNode):
    """The host node of a tensor buffer known when the job is traced."""

    __slots__ = ("entries",)

    def __init__(self, name, entries):
        super().__init__(name, lambda: list(entries))
        self.entries = entries


def _bound_text(dynamic_out):
    return ("does not have the rank and at most the element count of" if dynamic_out else
            "does not have the element count of")


def tensor_buffer_to_list_of_tensors(x, out_shape, out_dtype, dynamic_out=False, name=None):
    """One blob of `out_shape` and `out_dtype` per entry of tensor buffer `x` (row-major),
    as OneFlow's kernel: with dynamic_out=True an entry of out_shape's rank and at most its
    element count (any axis may be longer) gives a blob of the entry's own shape (fixed
    when the entries are known at trace time, a flow.gen_tensor_buffer or a
    GraphTensorBuffer; else each run's, a dynamic blob); otherwise an entry of exactly
    out_shape's element count is read as out_shape (row-major)."""
    api = "flow.tensor_buffer_to_list_of_tensors"
    np_dtype = dtypes.to_numpy(out_dtype)
    out_shape = tuple(int(d) for d in out_shape)

    def fits(shape, varies):
        """Whether an entry of `shape` gives an output (OneFlow's CHECKs on the counts)."""
        if varies:
            return len(shape) == len(out_shape) and math.prod(shape) <= math.prod(out_shape)
        return math.prod(shape) == math.prod(out_shape)

    if isinstance(x, GraphTensorBuffer):
        n = math.prod(x.shape)
        if x.data.np_dtype != np_dtype:
            raise TraceError(f"{api}: the entries hold {x.data.np_dtype}, not {np_dtype}")
        if not fits(x.instance_shape, dynamic_out):
            raise TraceError(f"{api}: the entries are {x.instance_shape}, which "
                             f"{_bound_text(dynamic_out)} {out_shape}")
        shape = x.instance_shape if dynamic_out else out_shape
        flat = reshape(x.data, [n] + list(shape))
        parts = [flat] if n == 1 else split(flat, n, axis=0)
        return [squeeze(p, axis=[0]) for p in parts]
    _host_buffer(x, api)
    known = x.node.entries if isinstance(x.node, _ConstantEntries) else None
    outs = []
    for i in range(x.batch_size):
        shape = out_shape
        if known is not None:
            where, entry = known[i]
            if not fits(entry.shape, dynamic_out):
                raise TraceError(f"{api}: entry {i} is {entry.shape}, which "
                                 f"{_bound_text(dynamic_out)} {out_shape}")
            shape = entry.shape if dynamic_out else out_shape

        # entries read each run, with dynamic_out: a dynamic blob of the entry's shape
        varies = dynamic_out and known is None

        def take(batch, i=i, shape=shape, varies=varies):
            where, array = batch[i]
            array = np.asarray(array)
            ok = fits(array.shape, True) if varies else \
                math.prod(array.shape) == math.prod(shape)
            if not ok or array.dtype != np_dtype:
                raise RecordError(f"{where}: {api}: the entry is {array.shape} "
                                  f"{array.dtype}, which {_bound_text(varies)} {shape} "
                                  f"{np_dtype}")
            return array if varies else array.reshape(shape)
        outs.append(to_blob(f"{name or 'TensorBufferToListOfTensors'}_{i}", take, [x], shape,
                            np_dtype, api, dynamic=varies))
    return outs
