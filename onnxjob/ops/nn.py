"""`flow.nn`: convolution and pooling, activations, normalization, losses and dropout.

The functions live in one module per family (conv, activations, normalization, losses);
this module is the namespace that gathers them.
"""
import numpy as np

from onnxjob.errors import missing_api
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.ops.activations import *  # noqa: F401,F403
from onnxjob.ops.conv import *  # noqa: F401,F403
from onnxjob.ops.losses import *  # noqa: F401,F403
from onnxjob.ops.normalization import *  # noqa: F401,F403
from onnxjob.ops.math import fused_scale_tril, tril  # noqa: F401
from onnxjob.ops.random import op_seed, random_mask_like  # noqa: F401


def dropout(x, rate, noise_shape=None, seed=None, name=None):
    """Inverted dropout in train jobs; identity in predict jobs and for rate 0."""
    assert 0.0 <= rate < 1.0, f"dropout rate must be in [0, 1), got {rate}"
    builder = current_builder("flow.nn.dropout")
    if not builder.is_train or rate == 0.0:
        return x
    ratio = as_blob(np.array(rate, dtype=x.np_dtype), like=x)
    training = as_blob(np.array(True), like=x, dtype=bool)
    y, _mask = op("Dropout", x, ratio, training, num_outputs=2, name=name, seed=op_seed(seed))
    return y


__getattr__ = missing_api("flow.nn")
