"""Private helpers shared by the array-op modules of onnxjob/ops/ (shapes, slicing,
indexing, selection, creation, casts, math): axis checks, dtype lookups, OneFlow <= 0.4's
(1,) for results without an axis."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import int64_constant, op

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


def keep_one_axis(y, name=None):
    """`y` as shape (1,) where it has no axis left, else `y` (named `name` if given).

    OneFlow's lazy API, up to 0.4, had no 0-d blobs: a reduction over every axis (its shape
    rule `Shape::RemoveOnes` keeps one axis when none is left), argmax of a vector, a
    constant or element count without a shape give (1,), and programs concatenate such
    results. (OneFlow 0.5 gives 0-d blobs there; (1,) holds the same value. A squeeze of
    every axis stays 0-d: OneFlow 0.5's own test_squeeze compares its shape with
    TensorFlow's.)"""
    if y.shape:
        return y if name is None else op("Identity", y, name=name)
    return op("Reshape", y, int64_constant(y, [1]), name=name)
