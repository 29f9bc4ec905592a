"""Tensor lists (OneFlow <= 0.4's TensorList: a tp.ListListNumpy value, a list of arrays
of one rank and dtype) to and from tensor buffers, as OneFlow's documented image and
detection pipelines use them: `flow.tensor_list_to_tensor_buffer` on a tp.ListListNumpy
placeholder feeds the host image ops (ops/image.py, ops/detection.py) with the arrays of
the call, and `flow.tensor_buffer_to_tensor_list` gives their results back as a
tp.ListListNumpy value. The conversions are OneFlow's kernels': every tensor of a list
holds one item (its first dimension is 1) and an item becomes the tensor (1, *item.shape).
"""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError, unsupported_form
from onnxjob.graph.tracer import Blob
from onnxjob.io.ofrecord import RecordError
from onnxjob.ops.host import TENSOR_BUFFER, HostValue, host_readable, host_value, to_blob
from onnxjob.ops.tensor_buffer import GraphTensorBuffer


def tensor_list_to_tensor_buffer(input, name=None):  # noqa: A002  (OneFlow's name)
    """A tensor buffer with one entry per tensor of the list `input` (a tp.ListListNumpy
    placeholder, or flow.tensor_buffer_to_tensor_list's): tensor i, of shape (1, *s),
    becomes an entry of shape s."""
    api = "flow.tensor_list_to_tensor_buffer"
    if not (isinstance(input, Blob) and input.is_tensor_list):
        raise TraceError(f"{api} takes a tensor list (a tp.ListListNumpy placeholder), got "
                         f"{input!r}")
    if not host_readable(input):
        raise unsupported_form(f"{api} of a tensor list computed in the graph",
                               "the image and detection ops run on the host, which reads a "
                               "tp.ListListNumpy placeholder's arrays or a tensor list made "
                               "there (flow.tensor_buffer_to_tensor_list)")

    def compute(tensors):
        entries = []
        for i, tensor in enumerate(tensors):
            if tensor.ndim < 1 or tensor.shape[0] != 1:
                raise RecordError(f"{api}: tensor {i} of the list has shape {tensor.shape}; "
                                  "each tensor of a list holds one item (first dimension 1)")
            entries.append((f"{api}: tensor {i} of the list", tensor[0]))
        return entries

    return host_value(name or "TensorListToTensorBuffer", compute, [input], input.shape[0],
                      TENSOR_BUFFER, api)


def tensor_buffer_to_tensor_list(input, shape, dtype, name=None):  # noqa: A002
    """The entries of tensor buffer `input` as a tensor list (returned as tp.ListListNumpy):
    entry i, of the rank of `shape` and at most prod(shape) values, becomes the tensor
    (1, *entry.shape) of `dtype`."""
    api = "flow.tensor_buffer_to_tensor_list"
    np_dtype = dtypes.to_numpy(dtype)
    shape = tuple(int(d) for d in shape)
    count = math.prod(shape)
    if isinstance(input, GraphTensorBuffer):
        if input.instance_shape != shape and not (
                len(input.instance_shape) == len(shape)
                and math.prod(input.instance_shape) <= count):
            raise TraceError(f"{api}: the entries are {input.instance_shape}, which a tensor "
                             f"list of {shape} items cannot hold")
        if not host_readable(input.data):
            raise unsupported_form(f"{api} of a blob computed in the graph",
                                   "tensor lists are made on the host, from a job argument "
                                   "or a data op")
        instance_dims = len(input.instance_shape)
        source = input.data
        n = math.prod(input.shape)

        def items(array):
            flat = np.asarray(array).reshape((-1,) + array.shape[array.ndim - instance_dims:])
            return [(f"{api}: entry {i}", item) for i, item in enumerate(flat)]

        input = host_value(f"{name or 'TensorBufferToTensorList'}_entries", items, [source], n,
                           TENSOR_BUFFER, api)
    if not (isinstance(input, HostValue) and input.dtype is TENSOR_BUFFER):
        raise TraceError(f"{api} takes a tensor buffer (flow.tensor_list_to_tensor_buffer, an "
                         f"image op's, flow.tensor_to_tensor_buffer), got {input!r}")

    def compute(batch):
        tensors = []
        for where, item in batch:
            item = np.asarray(item)
            if item.ndim != len(shape) or item.size > count:
                raise RecordError(f"{where}: {api}: the entry is {item.shape}, which a tensor "
                                  f"list of {shape} items cannot hold (same rank, at most "
                                  f"{count} values)")
            tensors.append(item.astype(np_dtype, copy=False)[None])
        return tensors

    return to_blob(name or "TensorBufferToTensorList", compute, [input],
                   (input.batch_size,) + shape, np_dtype, api, tensor_list=True)


def tensor_list_split(input_tensor_list, name=None):
    """One blob per tensor of the list (a tp.ListListNumpy placeholder's), without the
    tensor's leading 1: returned as tp.ListNumpy values, each at most the list's item shape.
    """
    api = "flow.tensor_list_split"
    x = input_tensor_list
    buffer = tensor_list_to_tensor_buffer(x, name=f"{name or 'TensorListSplit'}_buffer")
    outs = []
    for i in range(x.shape[0]):
        def take(batch, i=i):
            if i >= len(batch):
                raise RecordError(f"{api}: the list has {len(batch)} tensors, the job returns "
                                  f"tensor {i} (the placeholder's first dimension is "
                                  f"{x.shape[0]}: feed that many)")
            return np.asarray(batch[i][1], x.np_dtype)
        outs.append(to_blob(f"{name or 'TensorListSplit'}_{i}", take, [buffer], x.shape[1:],
                            x.np_dtype, api, dynamic=True))
    return tuple(outs)
