"""Private helpers shared by the array-op modules of onnxjob/ops/ (shapes, slicing,
indexing, selection, creation, casts, losses): axis checks, dtype lookups, index ranges."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import FAILURE, as_blob, op

INDEX_DTYPES = (np.int32, np.int64)   # the dtypes OneFlow takes for indices and sizes


def check_axis(axis, rank, api):
    """`axis` in [0, rank), negatives counted from the end (TraceError when out of range)."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise TraceError(f"{api}: axis {axis} is out of range [{-rank}, {rank})")
    return axis % rank


def to_flow_dtype(dtype):
    """The flow dtype class of a flow dtype or a NumPy dtype."""
    return dtypes.from_numpy(dtypes.to_numpy(dtype))


# a value's OneFlow <= 0.3 batch axis as its op set it (transpose's batch_axis_non_change),
# kept as metadata on the value (frontend/distribute.py's Blob.batch_axis reads it)
BATCH_AXIS = "onnxjob.batch_axis"


def keep_batch_axis(blob, axis):
    """Make `axis` (or None) `blob`'s batch_axis, whatever axis the rows are on."""
    blob.value.metadata_props[BATCH_AXIS] = "none" if axis is None else str(axis)


def known_in_range(indices, size):
    """Whether `indices` are a constant whose values all lie in [0, size)."""
    known = indices.value.const_value
    if known is None:
        return False
    values = known.numpy()
    return values.size == 0 or (values.min() >= 0 and values.max() < size)


def indices_in_range(indices, size, what):
    """`indices` as they are, through a Gather of arange(size) that fails the run when one
    is outside [0, size), its error naming `what` at the user's line: OneFlow's CPU kernels
    CHECK these ranges (sparse cross entropy, one_hot, batch_gather) where ONNX's ops wrap a
    negative index silently. Jobs compiled for CUDA, whose kernels do not check (nor do
    OneFlow's GPU kernels in a release build: their asserts are compiled out), and indices
    known in range keep them as they are."""
    if known_in_range(indices, size) or indices.builder.device == "cuda" or \
            not isinstance(size, (int, np.integer)):
        return indices
    table = as_blob(np.arange(size, dtype=indices.np_dtype), like=indices)
    negative = op("Less", indices, as_blob(0, like=indices))
    past_end = op("Where", negative, as_blob(size, like=indices), indices)
    checked = op("Gather", table, past_end, axis=0)
    checked.producer.ir_node.metadata_props[FAILURE] = f"{what} outside [0, {size})"
    return checked
