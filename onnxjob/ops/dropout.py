"""`flow.nn.dropout`: inverted dropout in train jobs."""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.graph.primitives.random import dropout_scale
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.ops.random import op_seed


def dropout(x, rate, noise_shape=None, seed=None, name=None):
    """Inverted dropout in train jobs (keep with probability 1 - rate, scale kept values by
    1 / (1 - rate), a fresh mask every run); identity in predict jobs and for rate 0."""
    assert 0.0 <= rate < 1.0, f"dropout rate must be in [0, 1), got {rate}"
    builder = current_builder("flow.nn.dropout")
    if not builder.is_train or rate == 0.0:
        return x
    if noise_shape is not None:
        # refused as OneFlow refuses it past the identity cases above (random_mask_like:
        # assert 0, "noise_shape will be supported later."); ignored, it would drop out
        # elementwise where a mask shared along some axes was asked for
        raise TraceError("flow.nn.dropout: noise_shape is not supported (nor by OneFlow, "
                         "whose random_mask_like asserts on it); leave it None")
    ratio = as_blob(np.array(rate, dtype=x.np_dtype), like=x)
    training = as_blob(np.array(True), like=x, dtype=bool)
    y, mask = op("Dropout", x, ratio, training, num_outputs=2, name=name, seed=op_seed(seed))
    scale = np.array(dropout_scale(rate), x.np_dtype)
    one = np.array(1, x.np_dtype)
    if scale != one / (one - np.array(rate, x.np_dtype)):
        # (where onnxruntime's own float scale is not OneFlow's, e.g. rate 0.9: the kept
        # values scaled by OneFlow's from the mask, and so their gradient)
        y = op("Where", mask, op("Mul", x, as_blob(scale, like=x)), as_blob(0, like=x))
    return y
