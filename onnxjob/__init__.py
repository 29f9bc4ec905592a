"""onnxjob: OneFlow's job functions, traced to ONNX and run on onnxruntime.

    import onnxjob as flow
    import onnxjob.typing as tp

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((8, 4))) -> tp.Numpy:
        return flow.math.relu(x)

This module is the `flow` namespace: it only re-exports. A OneFlow name that onnxjob
does not provide raises UnsupportedAPIError naming it and the caller's line.
"""
import sys as _sys

from onnxjob import typing  # noqa: F401
from onnxjob.dtypes import (bfloat16, char, double, float, float16, float32,  # noqa: F401
                            float64, int8, int32, int64, record, tensor_buffer, uint8)
from onnxjob.errors import missing_api as _missing_api
from onnxjob.frontend import distribute, initializers, scope  # noqa: F401
from onnxjob.frontend.config import (FunctionConfig, ExecutionConfig, config, env,  # noqa: F401
                                     function_config)
from onnxjob.frontend.config import (cache_int8_calibration as _cache_int8_calibration,
                                     write_int8_calibration as _write_int8_calibration)
from onnxjob.frontend.helpers import (Size, convert_oneflow_dtype_to_numpy_dtype,  # noqa: F401
                                      current_machine_id, current_resource,
                                      eager_execution_enabled, enable_eager_execution,
                                      manual_seed, InitEagerGlobalSession)
from onnxjob.frontend.scope import current_scope  # noqa: F401
from onnxjob.eager import autograd as _eager_autograd
from onnxjob.eager import lr_scheduler as _lr_scheduler
from onnxjob.eager import optim as _optim
from onnxjob.eager.autograd import no_grad  # noqa: F401
from onnxjob.eager.tensor import Tensor  # noqa: F401
from onnxjob.eager.tensor import Parameter as _Parameter
from onnxjob.frontend.helpers import enable_typing_check as _enable_typing_check
from onnxjob.frontend.custom_op_module import custom_op_module as _custom_op_module
from onnxjob.frontend.helpers import (
    delete_worker_by_bootstrap as _delete_worker_by_bootstrap,
    delete_worker_of_multi_process as _delete_worker_of_multi_process)
from onnxjob.frontend.devices import device, placement  # noqa: F401
from onnxjob.frontend.generators import create_generator as Generator  # noqa: F401
from onnxjob.frontend.generators import default_generator  # noqa: F401
from onnxjob.frontend.initializers import (constant_initializer, glorot_normal_initializer,  # noqa: F401
                                           glorot_uniform_initializer, kaiming_initializer,
                                           ones_initializer, random_normal_initializer,
                                           random_uniform_initializer, truncated_normal,
                                           truncated_normal_initializer,
                                           variance_scaling_initializer,
                                           xavier_normal_initializer, xavier_uniform_initializer,
                                           zeros_initializer)
from onnxjob.frontend.job_function import (FixedTensorDef, MirroredTensorDef,  # noqa: F401
                                           MirroredTensorListDef, function, global_function)
from onnxjob.frontend import blob_arguments as _blob_arguments
from onnxjob.frontend.namespaces import ApiNamespace as _Namespace
from onnxjob.frontend.variables import assign, get_variable, regularizers  # noqa: F401
from onnxjob.frontend.watch import watch, watch_diff  # noqa: F401
from onnxjob.io import checkpoint  # noqa: F401
from onnxjob.io.checkpoint_manager import SimpleCheckPointManager as _SimpleCheckPointManager
from onnxjob.io.export import export  # noqa: F401
from onnxjob.io.oneflow_onnx import export as _onnx_export
from onnxjob.io import saved_model, serving  # noqa: F401
from onnxjob.ops import data, image, layers, math, nn, random, summary  # noqa: F401
from onnxjob.ops.legacy import (acc, categorical_ordinal_encode, combined_margin_loss,  # noqa: F401
                                count_not_finite, distributed_partial_fc_sample,
                                indexed_slices_reduce_sum, multi_count_not_finite, pack,
                                repeat, unpack)
from onnxjob.ops.casts import (amp_white_identity, cast,  # noqa: F401
                               cast_to_current_logical_view, cast_to_static_shape, identity,
                               identity_n, parallel_cast)
from onnxjob.ops.creation import (constant, constant_like, constant_scalar, ones,  # noqa: F401
                                  ones_like, range, zeros, zeros_like)
from onnxjob.ops.indexing import (dim_gather, gather, gather_nd, one_hot, scatter_nd,  # noqa: F401
                                  tensor_scatter_nd_add, tensor_scatter_nd_update)
from onnxjob.ops.linalg import diag, matmul  # noqa: F401
from onnxjob.ops.padding import (constant_pad2d, pad, pad_grad, reflection_pad2d,  # noqa: F401
                                 replication_pad2d, same_padding, zero_pad2d)
from onnxjob.ops.selection import argwhere, masked_fill, nonzero, where  # noqa: F401
from onnxjob.ops.selection import unique_with_counts as _unique_with_counts
from onnxjob.ops.shapes import (broadcast_like, dynamic_reshape, elem_cnt, expand,  # noqa: F401
                                expand_dims, flatten, reshape, reshape_like, squeeze, transpose)
from onnxjob.ops.slicing import (concat, reverse, slice, slice_update, slice_v2,  # noqa: F401
                                 split, stack, sync_dynamic_resize)
from onnxjob.ops.losses import ctc_loss, smooth_l1_loss  # noqa: F401
from onnxjob.ops.math import (argsort, broadcast_to_compatible_with, clip_by_value,  # noqa: F401
                              in_top_k, sort, unsorted_batch_segment_sum, unsorted_segment_sum,
                              unsorted_segment_sum_like)
from onnxjob.runtime.session import clear_default_session, sync_default_session  # noqa: F401
from onnxjob.train import optimizer  # noqa: F401
from onnxjob.dtypes import dtype  # noqa: F401  (the class of flow.float & co.)
from onnxjob.frontend import distributed, model, profiler, sysconfig  # noqa: F401
from onnxjob.compat.keras import keras  # noqa: F401  (OneFlow 0.1.0's flow.keras)
from onnxjob.frontend.extras import (INVALID_BATCH_AXIS, INVALID_SPLIT_AXIS,  # noqa: F401
                                     current_global_function_desc,
                                     empty_initializer, inter_job_reuse_mem_strategy,
                                     system_assign as _system_assign, unique_str as _unique_str)
from onnxjob.frontend.model import Model  # noqa: F401
from onnxjob.frontend.user_op_builder import (consistent_user_op_builder,  # noqa: F401
                                              consistent_user_op_module_builder,
                                              find_or_create_module, user_op_builder,
                                              user_op_module_builder)
from onnxjob.frontend.user_op_builder import BuiltinOp as builtin_op  # noqa: F401
nn.Parameter = _Parameter      # the eager tensor an optimizer updates (onnxjob/eager/)
from onnxjob.ops import experimental as _experimental, quantization  # noqa: F401
from onnxjob.ops import parallel as _parallel
from onnxjob.ops.detection import (object_bbox_flip, object_bbox_scale,  # noqa: F401
                                   object_segmentation_polygon_flip,
                                   object_segmentation_polygon_scale,
                                   object_segmentation_polygon_to_mask)
from onnxjob.ops.parallel import hierarchical_parallel_cast  # noqa: F401
from onnxjob.ops.tensor_buffer import (gen_tensor_buffer, tensor_buffer_to_list_of_tensors,  # noqa: F401
                                       tensor_buffer_to_tensor, tensor_to_tensor_buffer)
from onnxjob.ops.tensor_list import (tensor_buffer_to_tensor_list,  # noqa: F401
                                     tensor_list_split, tensor_list_to_tensor_buffer)

from onnxjob.compat import unittest_helpers as unittest  # noqa: E402,F401  (flow.unittest)

__version__ = "0.1.0"

half = float16
long = int64
int = int32  # noqa: A001  (OneFlow's alias; shadows the builtin in this module only)

load = checkpoint.read     # (OneFlow's Load starts no session: jobs may follow)
load_variables = checkpoint.load_variables
get_all_variables = checkpoint.get_all_variables
save = checkpoint.save_var_dict
clip = clamp = clip_by_scalar = clip_by_value
fixed_placement = device_prior_placement = scope.placement
name_scope = scope.namespace
broadcast_add = math.add
broadcast_mul = math.multiply

train = _Namespace("flow.train", CheckPoint=checkpoint.CheckPoint,
                   SimpleCheckPointManager=_SimpleCheckPointManager)
losses = _Namespace("flow.losses", add_loss=optimizer.add_loss)
linalg = _Namespace("flow.linalg", matmul=matmul)

experimental = _Namespace(
    "flow.experimental", enable_typing_check=_enable_typing_check, name_scope=scope.namespace,
    unique_with_counts=_unique_with_counts, indexed_slices_reduce_sum=indexed_slices_reduce_sum,
    square_sum=_experimental.square_sum, logical_slice=_experimental.logical_slice,
    logical_slice_assign=_experimental.logical_slice_assign,
    ssp_variable_proxy=_experimental.ssp_variable_proxy,
    get_interface_blob_value=_experimental.get_interface_blob_value,
    set_interface_blob_value=_experimental.set_interface_blob_value,
    custom_op_module=_custom_op_module,
    scope=_Namespace("flow.experimental.scope", config=scope.config), unittest=unittest,
    optim=_Namespace("flow.experimental.optim", Optimizer=_optim.Optimizer, SGD=_optim.SGD,
                     Adam=_optim.Adam, AdamW=_optim.AdamW, RMSprop=_optim.RMSprop,
                     lr_scheduler=_Namespace(
                         "flow.experimental.optim.lr_scheduler",
                         LrScheduler=_lr_scheduler.LrScheduler, StepLR=_lr_scheduler.StepLR,
                         LambdaLR=_lr_scheduler.LambdaLR,
                         CosineDecayLR=_lr_scheduler.CosineDecayLR)))
advanced = _Namespace("flow.advanced", distribute_add=_parallel.distribute_add,
                      distribute_clone=_parallel.distribute_clone,
                      distribute_concat=_parallel.distribute_concat,
                      distribute_map=_parallel.distribute_map,
                      distribute_split=_parallel.distribute_split)
sbp = _Namespace("flow.sbp", split=_parallel.sbp_split, broadcast=_parallel.sbp_broadcast,
                 partial_sum=_parallel.sbp_partial_sum)
detection = _Namespace("flow.detection", object_bbox_flip=object_bbox_flip,
                       object_bbox_scale=object_bbox_scale,
                       object_segmentation_polygon_flip=object_segmentation_polygon_flip,
                       object_segmentation_polygon_scale=object_segmentation_polygon_scale,
                       object_segmentation_polygon_to_mask=object_segmentation_polygon_to_mask)
system = _Namespace("flow.system", assign=_system_assign)
util = _Namespace("flow.util", unique_str=_unique_str)
onnx = _Namespace("flow.onnx", export=_onnx_export)   # OneFlow <= 0.3's exporter
tensorrt = _Namespace("flow.tensorrt", cache_int8_calibration=_cache_int8_calibration,
                      write_int8_calibration=_write_int8_calibration)
autograd = _Namespace("flow.autograd", no_grad=no_grad, backward=_eager_autograd.backward,
                      grad=_eager_autograd.grad)
deprecated = _Namespace("flow.deprecated", variable_scope=scope.namespace,
                        delete_worker_of_multi_process=_delete_worker_of_multi_process,
                        delete_worker_by_bootstrap=_delete_worker_by_bootstrap,
                        nn=_Namespace("flow.deprecated.nn", Module=nn.Module))
image_batch_align = image.batch_align
image_decode = image.decode
image_flip = image.flip
image_normalize = image.normalize
image_random_crop = image.random_crop
image_resize = image.resize
image_target_resize = image.target_resize

# the op families first: flow.<name> stays the very function of its family module
for _family in ("casts", "creation", "indexing", "linalg", "padding", "selection", "shapes",
                "slicing"):
    _blob_arguments.guard(_sys.modules[f"onnxjob.ops.{_family}"], "flow")
for _namespace, _prefix in [(math, "flow.math"), (nn, "flow.nn"), (layers, "flow.layers"),
                            (random, "flow.random"), (image, "flow.image"), (data, "flow.data"),
                            (detection, "flow.detection"), (experimental, "flow.experimental"),
                            (linalg, "flow.linalg"), (quantization, "flow.quantization"),
                            (_sys.modules[__name__], "flow")]:
    _blob_arguments.guard(_namespace, _prefix)    # a non-Blob for a Blob: onnxjob's error
del _family, _namespace, _prefix

__getattr__ = _missing_api("flow")
