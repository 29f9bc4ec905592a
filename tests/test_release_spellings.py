"""Names that OneFlow's releases 0.1-0.5 gave programs and that later releases renamed or
dropped: every function_config flag of those releases, flow.config / flow.env names,
the InitializerConf messages that 0.1-0.2 kept in op_conf_pb2 (accepted wherever a
variable's initializer is), 0.1.0's flow.keras; and unknown names of each of these
(and of a lazy blob) raising UnsupportedAPIError with the user's line, never a raw
AttributeError / AssertionError / TypeError from onnxjob's code."""
import os
import warnings

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
from onnxjob.errors import UnsupportedAPIError
from onnxjob.frontend import config as config_module

THIS_FILE = os.path.basename(__file__)

# function_config flags that OneFlow 0.1.0 - 0.5.0 define (framework/function_util.py's
# @oneflow_function_config names and the C++ REGISTER_FUNCTION_CONFIG_DEF flags), with a
# value each takes
RELEASE_FLAGS = {
    "all_reduce_group_min_mbyte": 16, "all_reduce_group_num": 8,
    "all_reduce_group_size_warmup": 2.0, "all_reduce_lazy_ratio": 0.5,
    "allow_cpu_return_op": True, "concurrency_width": 128,
    "cudnn_buf_limit_mbyte": 1024, "cudnn_conv_enable_pseudo_half": True,
    "cudnn_conv_enable_true_half": False, "cudnn_conv_force_bwd_data_algo": 0,
    "cudnn_conv_force_bwd_filter_algo": 0, "cudnn_conv_force_fwd_algo": 0,
    "cudnn_conv_heuristic_search_algo": True, "cudnn_conv_use_deterministic_algo_only": False,
    "default_data_type": flow.float, "default_distribute_strategy": flow.scope.consistent_view(),
    "default_logical_view": flow.scope.consistent_view(), "disable_all_reduce_sequence": True,
    "do_parallel_cast_before_widening_type_cast": True, "enable_all_reduce_group": True,
    "enable_auto_mixed_precision": False, "enable_cudnn": True,
    "enable_cudnn_conv_pseudo_half": True, "enable_cudnn_fused_normalization_add_relu": True,
    "enable_float_compute_for_half_gemm": False, "enable_fuse_add_to_output": True,
    "enable_fuse_cast_scale": True, "enable_fuse_model_update_ops": True,
    "enable_gradients_stats_aggregation": True, "enable_inplace": True,
    "enable_inplace_in_reduce_struct": True, "enable_keep_header_only": False,
    "enable_nccl": True, "enable_non_distributed_optimizer": False,
    "enable_pseudo_chain_merge": True, "enable_qat": False,
    "enable_quantization_aware_training": False, "enable_reused_mem": True,
    "enable_ssp": False, "enable_true_half_config_when_conv": False,
    "exp_run_conf": {"enable_experiment_run": False},
    "non_distributed_optimizer_group_size_mbyte": 4,
    "optimizer_placement_optimization_mode": None,
    "optimizer_placement_optimization_threshold": 1024,
    "prune_amp_white_identity_ops": True, "prune_cast_to_static_shape_ops": True,
    "prune_parallel_cast_ops": True, "ratio_sequantial_optimizers": 0.5,
    "ssp_partition_strategy": "naive_sequential", "use_boxing_v2": True,
    "use_memory_allocation_algorithm_v2": True, "use_nccl_inter_node_communication": True,
    "use_xla_jit": False, "train.num_gradient_accumulation_steps": 1,
    "train.optimizer_placement_optimization_mode": None,
    "train.optimizer_placement_optimization_threshold": 1024,
    "qat.symmetric": True, "tensorrt.use_fp16": False,
}
X = np.arange(6, dtype=np.float32).reshape(2, 3)


def _set(config, dotted, value):
    setter = config
    for part in dotted.split("."):
        setter = getattr(setter, part)
    setter(value)


def test_every_function_config_flag_of_oneflow_0_1_to_0_5_is_accepted():
    config = flow.FunctionConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unsupported ones warn, at most
        for name, value in RELEASE_FLAGS.items():
            _set(config, name, value)
    config.enable_auto_mixed_precision(False)

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        return flow.math.relu(x - 2)

    np.testing.assert_array_equal(job(X), np.maximum(X - 2, 0))


def test_runtime_only_flags_of_0_1_change_nothing_and_say_nothing():
    config = flow.FunctionConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.disable_all_reduce_sequence(True)      # OneFlow 0.1 benchmark scripts
        config.all_reduce_group_min_mbyte(8)
        config.all_reduce_group_num(128)
        config.enable_pseudo_chain_merge(True)
        config.cudnn_conv_enable_pseudo_half(True)    # OneFlow's default
    assert config.get("enable_true_half_config_when_conv") is False


@pytest.mark.parametrize("name, value", [("cudnn_conv_enable_pseudo_half", False),
                                         ("enable_cudnn_conv_pseudo_half", False),
                                         ("cudnn_conv_enable_true_half", True)])
def test_true_half_convolutions_by_any_name_warn_as_written(name, value):
    config_module._warned_flags.discard("enable_true_half_config_when_conv")
    config = flow.FunctionConfig()
    with pytest.warns(UserWarning, match=rf"function_config\.{name}\({value}\) is not "
                                         "supported") as caught:
        getattr(config, name)(value)
    assert caught[0].filename.endswith(THIS_FILE)
    assert config.get("enable_true_half_config_when_conv") is True


@pytest.mark.parametrize("dotted", ["no_such_flag", "train.weight_l2", "qat.bits",
                                    "tensorrt.use_int4"])
def test_an_unknown_flag_is_unsupported_api_naming_the_line(dotted):
    config = flow.FunctionConfig()
    group, _, name = dotted.rpartition(".")
    owner = getattr(config, group) if group else config
    with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: function_config\."
                                                  rf"{dotted} is not a OneFlow"):
        getattr(owner, name)
    assert not hasattr(owner, name)


def test_config_and_env_names_of_oneflow_0_1_are_accepted():
    assert flow.config.save_downloaded_file_to_local_fs(True) is None
    assert flow.env.disable_setting() is None


@pytest.mark.parametrize("namespace", ["config", "env"])
def test_an_unknown_config_or_env_name_is_unsupported_api_not_a_type_error(namespace):
    owner = getattr(flow, namespace)
    with pytest.raises(UnsupportedAPIError,
                       match=rf"{THIS_FILE}:\d+: flow\.{namespace}\.no_such_setting is not"):
        owner.no_such_setting(1)
    assert getattr(owner, "no_such_setting", "absent") == "absent"


def test_a_job_flag_on_flow_config_says_where_it_went():
    # OneFlow before 0.1: flow.config.default_data_type(flow.float) and the like
    with pytest.raises(UnsupportedAPIError, match=r"func_config\.default_data_type"):
        flow.config.default_data_type(flow.float)


# -- InitializerConf messages --------------------------------------------------------------

@pytest.fixture
def op_conf_pb2():
    install_oneflow_alias()
    try:
        from oneflow.core.operator import op_conf_pb2
        yield op_conf_pb2
    finally:
        uninstall_oneflow_alias()


def test_op_conf_pb2_has_0_2s_initializer_messages(op_conf_pb2):
    install_oneflow_alias()
    try:
        from oneflow.core.job import initializer_conf_pb2
    finally:
        uninstall_oneflow_alias()
    conf = op_conf_pb2.InitializerConf()
    conf.truncated_normal_conf.std = 0.5
    # the same message as 0.3+'s initializer_conf_pb2: same bytes both ways
    again = initializer_conf_pb2.InitializerConf.FromString(conf.SerializeToString())
    assert again.truncated_normal_conf.std == 0.5
    assert op_conf_pb2.kFanIn == 0 and op_conf_pb2.kTruncatedNormal == 2
    assert op_conf_pb2.kRelu == 3


def test_an_unknown_op_conf_pb2_name_is_unsupported_api(op_conf_pb2):
    with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: .*op_conf_pb2\.NoSuchConf"):
        op_conf_pb2.NoSuchConf()


def test_initializer_conf_messages_initialize_layer_variables(op_conf_pb2):
    kernel = op_conf_pb2.InitializerConf()
    kernel.constant_conf.value = 0.25
    bias = op_conf_pb2.InitializerConf()
    bias.random_uniform_conf.min, bias.random_uniform_conf.max = 3.0, 4.0
    filters = op_conf_pb2.InitializerConf()
    filters.constant_conf.value = 0.5

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        dense = flow.layers.dense(x, 4, kernel_initializer=kernel, bias_initializer=bias,
                                  name="fc")
        image = flow.reshape(dense, (2, 1, 2, 2))
        conv = flow.layers.conv2d(image, 1, 1, kernel_initializer=filters, use_bias=False,
                                  name="conv")
        return flow.reshape(conv, (2, 4)) - 0.5 * dense

    assert np.abs(job(X)).max() < 1e-5
    weights = flow.get_all_variables()
    np.testing.assert_array_equal(weights["fc-weight"].numpy(), np.full((4, 3), 0.25))
    b = weights["fc-bias"].numpy()
    assert b.shape == (4,) and (b >= 3).all() and (b < 4).all() and len(set(b)) == 4


def test_a_layer_given_a_non_initializer_names_the_line():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        return flow.layers.dense(x, 2, kernel_initializer="glorot")

    with pytest.raises(TypeError, match=rf"{THIS_FILE}:\d+: a variable's initializer must be"):
        job(X)


# -- flow.keras (OneFlow 0.1.0) --------------------------------------------------------------

def test_keras_names_of_0_1_0_are_the_math_ops():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        y = flow.keras.activations.relu(x - 2)
        y = flow.keras.maths.add(y, flow.keras.activations.sigmoid(x))
        return y + flow.keras.activations.tanh(x) - flow.math.gelu(x) + \
            flow.keras.activations.gelu(x)

    expected = np.maximum(X - 2, 0) + 1 / (1 + np.exp(-X)) + np.tanh(X)
    np.testing.assert_allclose(job(X), expected, rtol=1e-5)


def test_keras_relu_options_that_0_1_0_asserted_on_are_unsupported():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        return flow.keras.activations.relu(x, alpha=0.1)

    with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: .*alpha=0.1"):
        job(X)
    with pytest.raises(UnsupportedAPIError, match="gradient op"):
        flow.keras.activations.tanh_grad


def test_flow_function_of_before_0_1_defines_jobs_as_global_function_did():
    """@flow.function(func_config), OneFlow's job decorator until June 2020: a train job
    where the config sets the old train conf (the era's optimizer, flow.losses.add_loss),
    a predict job otherwise; results through .get() as then."""
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.default_data_type(flow.float)
    config.train.primary_lr(0.5)
    config.train.model_update_conf({"naive_conf": {}})

    @flow.function(config)
    def train(x=flow.FixedTensorDef((4, 3))):
        w = flow.get_variable("w", (3, 1), initializer=flow.constant_initializer(1.0))
        y = flow.matmul(x, w)
        loss = flow.math.reduce_mean(y * y)
        flow.losses.add_loss(loss)
        return loss

    @flow.function(flow.FunctionConfig())
    def weight():
        return flow.get_variable("w", (3, 1), initializer=flow.constant_initializer(1.0))

    x = np.full((4, 3), 0.1, np.float32)
    losses = [float(train(x).get().numpy()) for _ in range(3)]
    # loss = mean((x @ w)^2) with every w_i equal: w' = w - 0.5 * 2 * 0.3 w * 0.1 = 0.97 w
    np.testing.assert_allclose(losses, [0.09, 0.09 * 0.97 ** 2, 0.09 * 0.97 ** 4], rtol=1e-5)
    np.testing.assert_allclose(weight().get().numpy(), np.full((3, 1), 0.97 ** 3), rtol=1e-5)
    with pytest.raises(TypeError, match=rf"{THIS_FILE}:\d+: flow.function takes a "):
        flow.function("train")


# -- attributes of lazy blobs ------------------------------------------------------------------

def test_an_unknown_blob_attribute_is_unsupported_api_naming_the_line():
    seen = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        seen["hasattr"] = hasattr(x, "numpy"), hasattr(x, "shape")
        seen["static_shape"] = x.static_shape      # OneFlow 0.1's name of the shape
        for name in ("numpy", "no_such_attribute"):
            try:
                getattr(x, name)
            except UnsupportedAPIError as e:
                seen[name] = str(e)
        return x

    job(X)
    assert seen["hasattr"] == (False, True)
    assert THIS_FILE in seen["numpy"] and "eager blob's value" in seen["numpy"]
    assert seen["static_shape"] == X.shape
    assert "blob.no_such_attribute" in seen["no_such_attribute"]


def test_a_blob_property_that_raises_keeps_its_own_error():
    from onnxjob.graph.tracer import Blob

    class Probe(Blob):
        __slots__ = ()

        @property
        def broken(self):
            raise AttributeError("the property's own message")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        probe = Probe(x.builder, x.value, x.shape, x.np_dtype)
        with pytest.raises(AttributeError, match="the property's own message"):
            probe.broken
        return x

    job(X)
