"""`flow.data`: data a job makes or reads itself (and `load_mnist` for the docs)."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError, missing_api
from onnxjob.frontend import initializers
from onnxjob.graph.tracer import current_builder
from onnxjob.io.mnist import load_mnist  # noqa: F401
from onnxjob.runtime.pipeline import HostNode


def decode_random(shape, dtype, batch_size=1, initializer=None, tick=None, name=None):
    """A (batch_size, *shape) batch drawn afresh from `initializer` (default uniform on
    [0, 1]) for every run of the job: synthetic data with no placeholder."""
    if not isinstance(shape, (list, tuple)):
        raise TraceError(f"flow.data.decode_random: shape must be a list or tuple, got {shape!r}")
    if dtype is None:
        raise TraceError("flow.data.decode_random needs a dtype")
    builder = current_builder("flow.data.decode_random")
    np_dtype = dtypes.to_numpy(dtype)
    full_shape = (int(batch_size),) + tuple(int(d) for d in shape)
    initializer = initializer or initializers.random_uniform_initializer()
    rng = np.random.default_rng(builder.random.randrange(2 ** 63))
    name = builder.unique_name(name or "DecodeRandom")
    node = HostNode(name, lambda: initializer.sample(full_shape, np_dtype, rng).astype(
        np_dtype, copy=False))
    return builder.add_source(name, full_shape, np_dtype, node)


__getattr__ = missing_api("flow.data")
