"""Values a job makes on the host (runtime/pipeline.py), as the data ops hand them around.

OneFlow's data ops pass blobs of records and tensor buffers (variable-size images) from
op to op; onnxjob keeps those on the host as HostValues: a host node plus what OneFlow's
blob would say about it (`.shape` is the batch, `.dtype` flow.record / tensor_buffer).
A HostValue that becomes a fixed-shape array is turned into a graph input with
`to_blob` (decoders do that); a Blob made that way keeps its node, so host ops can read
it back with `host_node_of` (CropMirrorNormalize reads CoinFlip's Blob).
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.io.ofrecord import RecordError
from onnxjob.graph.tracer import Blob, current_builder
from onnxjob.runtime.pipeline import FedValue, HostNode
from onnxjob.source_info import user_location


class HostValue:
    """A per-run host value of a job: records, encoded bytes or decoded images."""

    __slots__ = ("node", "batch_size", "dtype", "builder", "dims")

    def __init__(self, node, batch_size, dtype, builder, dims=None):
        self.node = node
        self.batch_size = batch_size
        self.dtype = dtype
        self.builder = builder
        self.dims = dims   # the buffer's shape when not (batch_size,) (flow.gen_tensor_buffer)

    @property
    def shape(self):
        return self.dims or (self.batch_size,)

    @property
    def is_dynamic(self):
        return False

    def as_graph_input(self, api):
        """What a graph op gets for this value: none, as in OneFlow, whose ops take no
        record or tensor_buffer blobs; the error says how to make one it takes."""
        raise UnsupportedAPIError(
            f"{user_location()}: {api} takes a blob of numbers; {self!r} is a "
            f"{self.dtype.__name__} blob of the data pipeline (records or variable-size "
            "items), which OneFlow's graph ops do not take either: make it a fixed-shape blob "
            "with flow.tensor_buffer_to_tensor(x, dtype, instance_shape), a decoder "
            "(flow.data.OFRecordRawDecoder, ofrecord_image_decoder + flow.image.Resize) or "
            "flow.image.CropMirrorNormalize")

    def __getattr__(self, name):
        # a Blob attribute an op reads (np_dtype, builder, ...): the same explanation
        if name.startswith("__"):
            raise AttributeError(name)
        return self.as_graph_input(f"this op (reading .{name})")

    def __repr__(self):
        return f"HostValue({self.node.name}, batch {self.batch_size}, {self.dtype.__name__})"


def host_value(name, compute, inputs, batch_size, dtype, api, dims=None):
    """A new HostValue computed by `compute(*input values)` in the job being traced."""
    builder = current_builder(api)
    node = HostNode(builder.unique_name(name), compute, [host_node_of(i, api) for i in inputs])
    return HostValue(node, batch_size, dtype, builder, dims)


def to_blob(name, compute, inputs, shape, np_dtype, api, dynamic=False, tensor_list=False):
    """A graph input of `shape` filled each run with `compute(*input values)` (`dynamic`:
    an array of at most `shape`; `tensor_list`: a list of arrays, a tp.ListListNumpy value)."""
    builder = current_builder(api)
    node = HostNode(builder.unique_name(name), compute, [host_node_of(i, api) for i in inputs])
    return builder.add_source(node.name, shape, np_dtype, node, dynamic=dynamic,
                              tensor_list=tensor_list)


def host_node_of(value, api):
    """The host node behind a HostValue, a Blob fed by the host pipeline or a job
    parameter (the value its call feeds: pipeline.FedValue)."""
    if isinstance(value, HostValue):
        return value.node
    if isinstance(value, Blob) and value.host_node is not None:
        return value.host_node
    if is_placeholder(value):
        fed_nodes = value.builder.fed_nodes
        if value.name not in fed_nodes:
            fed_nodes[value.name] = FedValue(value.builder.unique_name(f"{value.name}_fed"),
                                             value.name)
        return fed_nodes[value.name]
    raise TraceError(f"{api} takes the output of a data op (ofrecord_reader, a decoder, an "
                     f"image op, flow.random.CoinFlip) or a job argument, got {value!r}: "
                     "values computed in the graph cannot flow back to the host")


def is_placeholder(value):
    """Whether `value` is a job parameter's Blob, which host ops may read."""
    return isinstance(value, Blob) and value.builder.placeholders.get(value.name) is value


def host_readable(value):
    """Whether a host op can read `value`: a host value, a host-fed Blob or a job argument."""
    return isinstance(value, HostValue) or (isinstance(value, Blob) and (
        value.host_node is not None or is_placeholder(value)))


def check_host_value(value, api, dtype=None):
    """`value` as a HostValue (of flow dtype `dtype` if given), or a TraceError."""
    if not isinstance(value, HostValue) or (dtype is not None and value.dtype is not dtype):
        what = f"a {dtype.__name__} blob" if dtype is not None else "a host value"
        raise TraceError(f"{api} takes {what} from a data op, got {value!r}")
    return value


def encoded_items(batch, api):
    """A tensor buffer's items as encoded bytes: OFRecordBytesDecoder's, or 1-D int8 /
    uint8 arrays of them (a file's bytes fed through flow.tensor_list_to_tensor_buffer)."""
    items = []
    for where, value in batch:
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype in (np.int8,
                                                                                 np.uint8):
            value = value.tobytes()
        if not isinstance(value, (bytes, bytearray)):
            raise RecordError(f"{where}: {api} takes encoded image bytes "
                              "(flow.data.OFRecordBytesDecoder, or a 1-D int8 array of a "
                              f"file's bytes), got {_describe(value)}")
        items.append((where, value))
    return items


def _describe(value):
    if isinstance(value, np.ndarray):
        return f"a {value.shape} {value.dtype} array"
    return type(value).__name__


def checked_args(check, api, *args):
    """`check(*args)` with its ValueError raised as a TraceError naming `api`."""
    try:
        return check(*args)
    except ValueError as e:
        raise TraceError(f"{api}: {e}") from None


RECORD = dtypes.record
TENSOR_BUFFER = dtypes.tensor_buffer
