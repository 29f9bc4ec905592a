"""onnxjob: OneFlow's job functions, traced to ONNX and run on onnxruntime.

    import onnxjob as flow
    import onnxjob.typing as tp

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        return flow.math.relu(x)
"""
import types as _types

from onnxjob.io import checkpoint, mnist as data  # noqa: F401
from onnxjob.frontend import initializers, scope  # noqa: F401
from onnxjob.train import optimizer  # noqa: F401
from onnxjob import typing  # noqa: F401
from onnxjob.frontend.config import FunctionConfig, ExecutionConfig, config, env, function_config  # noqa: F401
from onnxjob.dtypes import (char, double, float, float16, float32, float64, int8, int32,  # noqa: F401
                     int64, record, tensor_buffer, uint8)
from onnxjob.frontend.initializers import (constant_initializer, glorot_normal_initializer,  # noqa: F401
                           glorot_uniform_initializer, kaiming_initializer,
                           ones_initializer, random_normal_initializer,
                           random_uniform_initializer, truncated_normal,
                           truncated_normal_initializer, variance_scaling_initializer,
                           xavier_normal_initializer, xavier_uniform_initializer,
                           zeros_initializer)
from onnxjob.frontend.job_function import FixedTensorDef, MirroredTensorDef, global_function  # noqa: F401
from onnxjob.ops import layers, math, nn  # noqa: F401
from onnxjob.ops.array import (cast, concat, constant, constant_like, expand_dims, flatten,  # noqa: F401
                            gather, identity, matmul, one_hot, ones_like, reshape, slice,
                            slice_v2, split, squeeze, transpose, where, zeros_like)
from onnxjob.runtime.session import clear_default_session, sync_default_session  # noqa: F401
from onnxjob.frontend.variables import get_variable, regularizers  # noqa: F401
from onnxjob.frontend.watch import watch, watch_diff  # noqa: F401
from onnxjob.io.export import export  # noqa: F401

__version__ = "0.1.0"

load = checkpoint.get
load_variables = checkpoint.load_variables
get_all_variables = checkpoint.get_all_variables
train = _types.SimpleNamespace(CheckPoint=checkpoint.CheckPoint)
losses = _types.SimpleNamespace(add_loss=optimizer.add_loss)
fixed_placement = scope.placement
name_scope = scope.namespace
broadcast_add = math.add
broadcast_mul = math.multiply


class _Distribute:
    """flow.distribute: placement hints (accepted; onnxjob runs each job on one device)."""

    @staticmethod
    def split(axis):
        return ("split", axis)

    @staticmethod
    def broadcast():
        return ("broadcast",)

    @staticmethod
    def auto():
        return ("auto",)


distribute = _Distribute()


def _enable_typing_check(value=True):
    """Accepted for compatibility (onnxjob always checks annotations it is given)."""
    return None


experimental = _types.SimpleNamespace(enable_typing_check=_enable_typing_check,
                                      name_scope=scope.namespace)


def enable_eager_execution(value=True):
    if value:
        raise NotImplementedError("onnxjob runs lazy job functions only; eager execution "
                                  "is not supported")
