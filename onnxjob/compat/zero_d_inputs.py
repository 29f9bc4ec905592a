"""0-d blobs where OneFlow <= 0.4 had one-element vectors.

OneFlow 0.5 (onnxjob's signatures) gives 0-d blobs where OneFlow <= 0.4 gave shape (1,):
a reduction over every axis (0.4's `Shape::RemoveOnes` kept one axis when none was left),
argmax of a vector, `shape_elem_cnt` (flow.elem_cnt, reduced_shape_elem_cnt) and a constant
without a shape. onnxjob returns 0.5's shapes. Programs written for 0.4 feed such values to
ops that need an axis (`flow.concat([flow.math.reduce_max(v_i) ...])`, a slice or a gather
of a loss, a (1,) variable assigned a sum), so those ops take a 0-d input as the (1,)
vector 0.4 had, where OneFlow 0.5 would refuse the call; what they return for the inputs
0.5 takes does not change.
"""
from onnxjob.graph.tracer import Blob, int64_constant, op


def is_zero_d(x):
    """Whether `x` is a 0-d Blob."""
    return isinstance(x, Blob) and x.shape == ()


def as_vector(x, where=True):
    """`x` reshaped to (1,) if it is a 0-d Blob and `where` holds, else `x` itself."""
    if where and is_zero_d(x):
        return op("Reshape", x, int64_constant(x, [1]))
    return x


def as_vectors(blobs, mixed_only=False):
    """`blobs` (a list) with each 0-d Blob as (1,) where every one is 0-d or of rank 1, as
    in OneFlow 0.4, where all of them had one axis; with `mixed_only`, only where some are
    vectors (a list of 0-d Blobs alone is one OneFlow 0.5 takes as it is)."""
    blobs = list(blobs)
    ranks = {len(b.shape) if isinstance(b, Blob) else None for b in blobs}
    if 0 in ranks and ranks <= {0, 1} and (ranks == {0, 1} or not mixed_only):
        return [as_vector(b) for b in blobs]
    return blobs
