"""onnxjob: OneFlow's job functions, traced to ONNX and run on onnxruntime.

    import onnxjob as flow
    import onnxjob.typing as tp

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        return flow.math.relu(x)

This module is the `flow` namespace: it only re-exports. A OneFlow name that onnxjob
does not provide raises UnsupportedAPIError naming it and the caller's line.
"""
from onnxjob import typing  # noqa: F401
from onnxjob.dtypes import (bfloat16, char, double, float, float16, float32,  # noqa: F401
                            float64, int8, int32, int64, record, tensor_buffer, uint8)
from onnxjob.errors import missing_api as _missing_api
from onnxjob.frontend import distribute, initializers, scope  # noqa: F401
from onnxjob.frontend.config import (FunctionConfig, ExecutionConfig, config, env,  # noqa: F401
                                     function_config)
from onnxjob.frontend.helpers import (Size, convert_oneflow_dtype_to_numpy_dtype,  # noqa: F401
                                      current_machine_id, current_resource, current_scope,
                                      eager_execution_enabled, manual_seed, no_grad)
from onnxjob.frontend.initializers import (constant_initializer, glorot_normal_initializer,  # noqa: F401
                                           glorot_uniform_initializer, kaiming_initializer,
                                           ones_initializer, random_normal_initializer,
                                           random_uniform_initializer, truncated_normal,
                                           truncated_normal_initializer,
                                           variance_scaling_initializer,
                                           xavier_normal_initializer, xavier_uniform_initializer,
                                           zeros_initializer)
from onnxjob.frontend.job_function import (FixedTensorDef, MirroredTensorDef,  # noqa: F401
                                           global_function)
from onnxjob.frontend.namespaces import ApiNamespace as _Namespace
from onnxjob.frontend.variables import assign, get_variable, regularizers  # noqa: F401
from onnxjob.frontend.watch import watch, watch_diff  # noqa: F401
from onnxjob.io import checkpoint  # noqa: F401
from onnxjob.io.checkpoint_manager import SimpleCheckPointManager as _SimpleCheckPointManager
from onnxjob.io.export import export  # noqa: F401
from onnxjob.ops import data, image, layers, math, nn, random, summary  # noqa: F401
from onnxjob.ops.legacy import (acc, categorical_ordinal_encode, combined_margin_loss,  # noqa: F401
                                count_not_finite, distributed_partial_fc_sample,
                                indexed_slices_reduce_sum, multi_count_not_finite, pack,
                                repeat, unpack)
from onnxjob.ops.array import *  # noqa: F401,F403
from onnxjob.ops.array import unique_with_counts as _unique_with_counts
from onnxjob.ops.losses import ctc_loss, smooth_l1_loss  # noqa: F401
from onnxjob.ops.math import (argsort, broadcast_to_compatible_with, clip_by_value,  # noqa: F401
                              in_top_k, sort, unsorted_batch_segment_sum, unsorted_segment_sum,
                              unsorted_segment_sum_like)
from onnxjob.runtime.session import clear_default_session, sync_default_session  # noqa: F401
from onnxjob.train import optimizer  # noqa: F401

from onnxjob.compat import unittest_helpers as unittest  # noqa: E402,F401  (flow.unittest)

__version__ = "0.1.0"

half = float16
long = int64
int = int32  # noqa: A001  (OneFlow's alias; shadows the builtin in this module only)

load = checkpoint.get
load_variables = checkpoint.load_variables
get_all_variables = checkpoint.get_all_variables
save = checkpoint.save
clip = clamp = clip_by_scalar = clip_by_value
fixed_placement = device_prior_placement = scope.placement
name_scope = scope.namespace
broadcast_add = math.add
broadcast_mul = math.multiply

train = _Namespace("flow.train", CheckPoint=checkpoint.CheckPoint,
                   SimpleCheckPointManager=_SimpleCheckPointManager)
losses = _Namespace("flow.losses", add_loss=optimizer.add_loss)
linalg = _Namespace("flow.linalg", matmul=matmul)  # noqa: F405  (from ops.array)


def _enable_typing_check(value=True):
    """Accepted for compatibility (onnxjob always checks annotations it is given)."""
    return None


experimental = _Namespace("flow.experimental", enable_typing_check=_enable_typing_check,
                          name_scope=scope.namespace, unique_with_counts=_unique_with_counts,
                          indexed_slices_reduce_sum=indexed_slices_reduce_sum)


def enable_eager_execution(value=True):
    """OneFlow's eager mode; onnxjob runs lazy job functions only."""
    if value:
        raise NotImplementedError("onnxjob runs lazy job functions only; eager execution "
                                  "is not supported")


__getattr__ = _missing_api("flow")
