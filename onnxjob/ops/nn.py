"""`flow.nn`: convolution and pooling, activations, normalization, losses and dropout.

The functions live in one module per family (conv, activations, normalization, losses);
this module is the namespace that gathers them.
"""
from onnxjob.errors import missing_api
from onnxjob.ops.activations import *  # noqa: F401,F403
from onnxjob.ops.conv import *  # noqa: F401,F403
from onnxjob.ops.losses import *  # noqa: F401,F403
from onnxjob.ops.normalization import *  # noqa: F401,F403
from onnxjob.ops.math import (fused_scale_tril, fused_scale_tril_softmax_dropout,  # noqa: F401
                              tril)
from onnxjob.ops.dropout import dropout  # noqa: F401
from onnxjob.ops.legacy import fused_self_attention_query_mul_key_and_value  # noqa: F401
from onnxjob.ops.module import Module  # noqa: F401
from onnxjob.ops.random import random_mask_like  # noqa: F401


__getattr__ = missing_api("flow.nn")
# (flow.nn.Parameter, an eager tensor, is bound by onnxjob/__init__.py)
