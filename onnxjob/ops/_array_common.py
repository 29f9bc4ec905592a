"""Private helpers shared by the array-op modules of onnxjob/ops/ (shapes, slicing,
indexing, selection, creation, casts): axis checks and dtype lookups."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError

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
