"""`flow.layers`: layers that create their own variables, named `<name>-weight`, ...

Names, shapes, default initializers and train/predict behaviour follow OneFlow 0.5's
`ops/layers.py`; the functional forms they call live in conv.py, normalization.py, ...
"""
import numpy as np

from onnxjob import settings
from onnxjob.errors import TraceError, missing_api
from onnxjob.frontend import initializers, scope
from onnxjob.frontend.variables import VariableSpec, variable_blob
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.graph.tracer import int64_constant as _int64_constant
from onnxjob.graph import moving_averages
from onnxjob.ops import math, qat
from onnxjob.ops.conv import (bias_add, convolution, is_channels_last, oneflow_ndhwc_pads,
                              spatial_tuple)
from onnxjob.ops.linalg import matmul
from onnxjob.ops.conv import upsample as upsample_2d  # noqa: F401  (OneFlow's name)
from onnxjob.ops.normalization import layer_norm as functional_layer_norm
# (under private names: this module is the flow.layers namespace)
from onnxjob.ops.parallel import balanced_parts as _balanced_parts, parallel_num as _parallel_num
from onnxjob.ops.shapes import reshape, transpose
from onnxjob.source_info import user_frame, warn_at_user_line


def _variable(name, shape, dtype, initializer, regularizer=None, trainable=True, reuse=False):
    spec = VariableSpec(name, shape, dtype, initializer, trainable, regularizer)
    return variable_blob(spec, reuse=reuse)


class _DefaultName(str):
    """A layer's default name (OneFlow 0.5's signature default), told apart from the same
    name given by the caller: only a default name is made unique (`_layer_name`)."""


_warned_unnamed = set()


def _layer_name(name, default, layer):
    """The name of a `layer` call whose `name` argument is `name`. A given name is used as
    it is. The default (or None, which OneFlow 0.1.0-0.1.4 documented as the default) is
    used unless a layer of that name already made variables in this job: then, as OneFlow
    0.1.0-0.1.4 named each nameless layer uniquely (later releases raise there), it is
    `<default>_1`, `_2`, ... with one warning per line."""
    if name is not None and not isinstance(name, _DefaultName):
        return name
    taken = current_builder(f"flow.layers.{layer}").variables

    def used(candidate):
        prefix = scope.full_name(candidate) + "-"
        return any(variable.startswith(prefix) for variable in taken)
    if not used(default):
        return str(default)
    n = 1
    while used(f"{default}_{n}"):
        n += 1
    where = user_frame()
    if where not in _warned_unnamed:
        _warned_unnamed.add(where)
        warn_at_user_line(
            f"flow.layers.{layer} without name=: a layer named {default!r} already made "
            f"variables in this job, so this one is named '{default}_{n}' (OneFlow 0.1.0-0.1.4 "
            "named each nameless layer uniquely; later releases raise). Give each layer its "
            "own name= to keep the variable names of checkpoints stable")
    return f"{default}_{n}"


def _named_variable(layer_name, own_name, part, *args, **kwargs):
    """`own_name` if given, else `<layer_name>-<part>`, inside the namespace stack either
    way (OneFlow's layers pass `weight_name=` to get_variable, which prefixes the stack)."""
    if own_name is not None:
        return _variable(scope.full_name(own_name), *args, **kwargs)
    with scope.namespace(layer_name):
        return _variable(scope.full_name(part), *args, **kwargs)


def _activate(out, activation, name):
    """`activation(out)` (a function such as flow.nn.relu), or `out` when it is None or
    not callable (OneFlow's layers apply it only `if callable(activation)`: a string such
    as "relu" is ignored there, so here too, with a warning)."""
    if activation is None:
        return out
    if not callable(activation):
        warn_at_user_line(f"flow.layers: activation={activation!r} is not a function, so "
                          "no activation is applied (as OneFlow); pass e.g. flow.nn.relu")
        return out
    with scope.namespace(name):
        return activation(out, name="activation")


def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None,
          bias_initializer=None, kernel_regularizer=None, bias_regularizer=None, trainable=True,
          name=_DefaultName("Dense"), model_distribute=None):
    """Fully connected layer; weight `<name>-weight` of shape (units, in_features).

    OneFlow's default kernel and bias initializers are zeros. Inputs of rank > 2 are
    flattened to (-1, last) and the result reshaped back.
    """
    if len(inputs.shape) < 2:
        raise TraceError(f"flow.layers.dense needs an input of rank >= 2, got {inputs.shape}")
    name = _layer_name(name, "Dense", "dense")
    in_shape = inputs.shape
    x = reshape(inputs, (-1, in_shape[-1])) if len(in_shape) > 2 else inputs
    weight = _named_variable(name, None, "weight", (units, in_shape[-1]), inputs.np_dtype,
                             kernel_initializer or initializers.constant_initializer(0),
                             kernel_regularizer, trainable)
    bias = None
    if use_bias:
        bias = _named_variable(name, None, "bias", (units,), inputs.np_dtype,
                               bias_initializer or initializers.constant_initializer(0),
                               bias_regularizer, trainable)
    if qat.active() is not None:
        # OneFlow's dense is a matmul, then a bias_add: QAT quantizes the matmul's output
        with scope.namespace(name):
            out = matmul(x, weight, transpose_b=True, name="matmul")
            out = bias_add(out, bias, name="bias_add") if bias is not None else out
    elif bias is not None:
        out = op("Gemm", x, weight, bias, transB=1)
    else:
        out = op("Gemm", x, weight, transB=1)
    if len(in_shape) > 2:
        out = reshape(out, in_shape[:-1] + (units,))
    return _activate(out, activation, name)


def _conv_layer(ndims, inputs, filters, kernel_size, strides, padding, data_format,
                dilation_rate, groups, activation, use_bias, kernel_initializer,
                bias_initializer, kernel_regularizer, bias_regularizer, trainable, name,
                weight_name, bias_name):
    if len(inputs.shape) != ndims + 2:
        raise TraceError(f"flow.layers.conv{ndims}d needs a {ndims + 2}-D input, got "
                         f"{inputs.shape}")
    if ndims == 3 and is_channels_last(data_format):
        # OneFlow's conv3d layer computes NDHWC as NCDHW between two transposes: its weight
        # is (filters, in/groups, kd, kh, kw), groups are taken, and explicit pads are
        # read as its nn.conv3d reads them (oneflow_ndhwc_pads)
        out = _conv_layer(ndims, transpose(inputs, [0, 4, 1, 2, 3]), filters, kernel_size,
                          strides, _ncdhw_pads(oneflow_ndhwc_pads(padding, data_format)),
                          "NCDHW", dilation_rate, groups, activation, use_bias,
                          kernel_initializer, bias_initializer, kernel_regularizer,
                          bias_regularizer, trainable, name, weight_name, bias_name)
        return transpose(out, [0, 2, 3, 4, 1])
    kernel = tuple(spatial_tuple(kernel_size, ndims, "kernel_size"))
    channels_last = is_channels_last(data_format)
    in_channels = inputs.shape[-1] if channels_last else inputs.shape[1]
    if not isinstance(groups, int) or groups < 1 or in_channels % groups or filters % groups:
        raise TraceError(f"groups={groups!r} must divide both the {in_channels} input channels "
                         f"and the {filters} filters")
    if channels_last and groups != 1:
        raise TraceError("grouped convolutions take channels-first (NC...) inputs, as in OneFlow")
    shape = ((filters,) + kernel + (in_channels // groups,) if channels_last
             else (filters, in_channels // groups) + kernel)
    name = _layer_name(name, f"Conv{ndims}d", f"conv{ndims}d")
    weight = _named_variable(name, weight_name, "weight", shape, inputs.np_dtype,
                             kernel_initializer
                             or initializers.xavier_uniform_initializer(data_format),
                             kernel_regularizer, trainable)
    out = convolution(inputs, weight, strides, padding, data_format, dilation_rate, groups,
                      None, name, ndims)
    if use_bias:
        bias = _named_variable(name, bias_name, "bias", (filters,), inputs.np_dtype,
                               bias_initializer or initializers.constant_initializer(0),
                               bias_regularizer, trainable)
        with scope.namespace(name):   # OneFlow's op name, which QAT's observers take
            out = bias_add(out, bias, data_format, name="bias_add")
    return _activate(out, activation, name)


def _ncdhw_pads(padding):
    """An explicit NDHWC pad list in NCDHW order (strings and per-axis forms as they are)."""
    if isinstance(padding, (list, tuple)) and len(padding) == 5:
        return [padding[0], padding[4], padding[1], padding[2], padding[3]]
    return padding


def _conv_layer_function(ndims, default_format, default_name, doc):
    """flow.layers.conv{ndims}d: one signature (OneFlow 0.5's) for the three ranks."""
    def layer(inputs, filters, kernel_size=1, strides=1, padding="VALID",
              data_format=default_format, dilation_rate=None, groups=1, activation=None,
              use_bias=True, kernel_initializer=None, bias_initializer=None,
              kernel_regularizer=None, bias_regularizer=None, trainable=True,
              name=_DefaultName(default_name), weight_name=None, bias_name=None):
        return _conv_layer(ndims, inputs, filters, kernel_size, strides, padding, data_format,
                           dilation_rate, groups, activation, use_bias, kernel_initializer,
                           bias_initializer, kernel_regularizer, bias_regularizer, trainable,
                           name, weight_name, bias_name)
    layer.__name__ = layer.__qualname__ = f"conv{ndims}d"
    layer.__doc__ = doc
    return layer


conv1d = _conv_layer_function(1, "NCW", "Conv1d",
                              "1-D convolution layer; weight (filters, in/groups, k) for NCW.")
conv2d = _conv_layer_function(
    2, "NCHW", "Conv2d", "2-D convolution layer; weight `<name>-weight` (filters, in/groups, "
    "kh, kw) for NCHW, (filters, kh, kw, in) for NHWC.")
conv3d = _conv_layer_function(3, "NCDHW", "Conv3d",
                              "3-D convolution layer; weight (filters, in/groups, kd, kh, kw), "
                              "for NDHWC too (computed as NCDHW between transposes).")


# -- batch normalization ------------------------------------------------------------------

def _bn_parameters(name, c, dtype, center, scale, trainable, beta_initializer,
                   gamma_initializer, beta_regularizer, gamma_regularizer,
                   moving_mean_initializer, moving_variance_initializer, names):
    gamma_name, beta_name, mean_name, var_name = names
    gamma = beta = None
    if scale:
        gamma = _named_variable(name, gamma_name, "gamma", (c,), dtype,
                                gamma_initializer or initializers.ones_initializer(),
                                gamma_regularizer, trainable)
    if center:
        beta = _named_variable(name, beta_name, "beta", (c,), dtype,
                               beta_initializer or initializers.zeros_initializer(),
                               beta_regularizer, trainable)
    moving_mean = _named_variable(name, mean_name, "moving_mean", (c,), dtype,
                                  moving_mean_initializer or initializers.zeros_initializer(),
                                  trainable=False)
    moving_var = _named_variable(name, var_name, "moving_variance", (c,), dtype,
                                 moving_variance_initializer or initializers.ones_initializer(),
                                 trainable=False)
    return gamma, beta, moving_mean, moving_var


def batch_normalization(inputs, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True,
                        beta_initializer=None, gamma_initializer=None, beta_regularizer=None,
                        gamma_regularizer=None, moving_mean_initializer=None,
                        moving_variance_initializer=None, trainable=True, training=True,
                        name=_DefaultName("BatchNorm"), gamma_name=None, beta_name=None,
                        moving_mean_name=None, moving_variance_name=None):
    """Batch normalization over every axis but `axis`.

    In train jobs with `training` and `trainable` it normalizes with the batch's
    statistics and updates the moving ones as state: moving = momentum * moving +
    (1 - momentum) * batch, the variance unbiased (n / (n - 1)), as OneFlow's cuDNN kernel
    does. Otherwise (predict jobs, `training=False`, `trainable=False`) it uses the
    moving statistics; gamma and beta still get gradients when trainable.
    """
    rank = len(inputs.shape)
    if not -rank <= axis < rank:
        raise TraceError(f"axis {axis} is out of range for an input of rank {rank}")
    axis = axis % rank
    c = inputs.shape[axis]
    builder = current_builder("flow.layers.batch_normalization")
    name = _layer_name(name, "BatchNorm", "batch_normalization")
    training = bool(training and trainable and builder.is_train)
    gamma, beta, moving_mean, moving_var = _bn_parameters(
        name, c, inputs.np_dtype, center, scale, trainable, beta_initializer,
        gamma_initializer, beta_regularizer, gamma_regularizer, moving_mean_initializer,
        moving_variance_initializer,
        (gamma_name, beta_name, moving_mean_name, moving_variance_name))
    site = qat.chain("normalization", inputs)   # part of a convolution chain under QAT
    if training:
        out = _batch_norm_train(builder, inputs, axis, momentum, epsilon, gamma, beta,
                                moving_mean, moving_var)
    else:
        out = _batch_norm_inference(inputs, axis, epsilon, gamma, beta, moving_mean,
                                    moving_var)
    return qat.done(site, out)


def rank_local_statistics(builder):
    """Whether a data-parallel step's batch norm normalizes each rank's rows by their own
    statistics. ONNXJOB_SYNC_BATCH_NORM=1 / 0 says; unset, as OneFlow does on the device:
    its CPU layer takes the moments of the consistent (whole) batch, so CPU ranks share the
    whole batch's statistics; on GPUs its normalization op normalizes each device's rows
    (the op's sbp signature splits x, not the statistics), so CUDA ranks keep their own."""
    if builder.data_parallel_ranks is None:
        return False
    sync = settings.get("SYNC_BATCH_NORM")
    return not (builder.device != "cuda" if sync is None else sync)


def _batch_norm_train(builder, x, axis, momentum, epsilon, gamma, beta, moving_mean,
                      moving_var):
    c, dt = x.shape[axis], x.np_dtype
    gamma = gamma if gamma is not None else as_blob(np.ones(c, dt), like=x)
    beta = beta if beta is not None else as_blob(np.zeros(c, dt), like=x)
    devices = _oneflow_gpus_of_one_process(builder)
    if devices > 1 and axis != 0 and x.shape[0] >= devices and not x.is_dynamic:
        return _per_device_batch_norm(builder, x, axis, momentum, epsilon, gamma, beta,
                                      moving_mean, moving_var, devices)
    ranks = builder.data_parallel_ranks
    local = rank_local_statistics(builder)
    y, mean, var = op("onnxjob.BatchNormTrain", x, gamma, beta, axis=axis,
                      epsilon=float(epsilon), ranks=ranks,
                      local_statistics=1 if local else None, num_outputs=3)
    # elements per channel behind the statistics (the graph is traced at the whole batch)
    count = int(np.prod(x.shape)) // c // (ranks if local else 1)
    moving_averages.update(builder, moving_mean, mean, momentum)
    # OneFlow's CPU layer (flow.nn.moments and assigns) keeps the biased variance, its GPU
    # normalization op the unbiased one (ops/layers.py of v0.5.0)
    unbiased = 1.0 if scope.oneflow_places_on_cpu(builder) else count / max(count - 1, 1)
    moving_averages.update(builder, moving_var, var, momentum, unbiased)
    return y


def _oneflow_gpus_of_one_process(builder):
    """The GPUs OneFlow would run this consistent-view train job's batch norm on, where
    onnxjob runs them as this one process (no data-parallel ranks): the program's GPU
    placement's device count (flow.scope.placement("gpu", "0:0-3"), a default_placement_
    scope, else flow.config.gpu_device_num times machine_num); 1 for a CPU layer, a
    mirrored step (one device per list element already) or ranks."""
    job = getattr(builder, "job_function", None)
    if builder.data_parallel_ranks is not None or job is None or job.mirrored_step or \
            scope.oneflow_places_on_cpu(builder):
        return 1
    return _parallel_num()


def _per_device_batch_norm(builder, x, axis, momentum, epsilon, gamma, beta, moving_mean,
                           moving_var, devices):
    """OneFlow's batch norm on `devices` GPUs, in one process: its normalization op splits
    x over the devices (normalization_op.cpp's sbp signature: x and y split on axis 0, the
    statistics broadcast), so each device's rows (a balanced split: the first N % n get a
    row more) are normalized by their own statistics; the moving statistics are device
    0's (each device updates its own copy; the one a checkpoint saves), with cuDNN's
    unbiased variance of its rows. The gradients of gamma and beta sum over the devices,
    as OneFlow's all-reduce of the model's gradients does."""
    sizes = _balanced_parts(x.shape[0], devices)
    parts = op("Split", x, _int64_constant(x, sizes), axis=0, num_outputs=devices)
    outs, first = [], None
    for part in parts:
        y, mean, var = op("onnxjob.BatchNormTrain", part, gamma, beta, axis=axis,
                          epsilon=float(epsilon), num_outputs=3)
        outs.append(y)
        first = first or (part, mean, var)
    part, mean, var = first
    count = int(np.prod(part.shape)) // x.shape[axis]
    moving_averages.update(builder, moving_mean, mean, momentum)
    moving_averages.update(builder, moving_var, var, momentum, count / max(count - 1, 1))
    return op("Concat", *outs, axis=0)


def _affine(normed, axis, gamma, beta):
    bshape = [1] * len(normed.shape)
    bshape[axis] = normed.shape[axis]
    out = normed
    if gamma is not None:
        out = out * reshape(gamma, bshape)
    if beta is not None:
        out = out + reshape(beta, bshape)
    return out


def _batch_norm_inference(x, axis, epsilon, gamma, beta, moving_mean, moving_var):
    c, dt = x.shape[axis], x.np_dtype
    if axis == 1 and len(x.shape) >= 3:
        return op("BatchNormalization", x,
                  gamma if gamma is not None else as_blob(np.ones(c, dt), like=x),
                  beta if beta is not None else as_blob(np.zeros(c, dt), like=x),
                  moving_mean, moving_var, epsilon=float(epsilon))
    bshape = [1] * len(x.shape)
    bshape[axis] = c
    inv = op("Reciprocal", op("Sqrt", reshape(moving_var, bshape) + as_blob(epsilon, like=x)))
    return _affine((x - reshape(moving_mean, bshape)) * inv, axis, gamma, beta)


def batch_normalization_add_relu(inputs, addend=None, axis=-1, momentum=0.99, epsilon=0.001,
                                 center=True, scale=True, beta_initializer=None,
                                 gamma_initializer=None, beta_regularizer=None,
                                 gamma_regularizer=None, moving_mean_initializer=None,
                                 moving_variance_initializer=None, trainable=True,
                                 training=True, name=_DefaultName("BatchNorm"), gamma_name=None,
                                 beta_name=None, moving_mean_name=None,
                                 moving_variance_name=None):
    """relu(batch_normalization(inputs) + addend): OneFlow's fused form, same variables
    (its CPU and predict form: batch normalization, add_n and relu ops, as QAT sees them)."""
    out = batch_normalization(inputs, axis, momentum, epsilon, center, scale, beta_initializer,
                              gamma_initializer, beta_regularizer, gamma_regularizer,
                              moving_mean_initializer, moving_variance_initializer, trainable,
                              training, name, gamma_name, beta_name, moving_mean_name,
                              moving_variance_name)
    if addend is not None:
        out = math.add(out, addend)
    return math.relu(out)


def batch_normalization_relu(inputs, axis=-1, momentum=0.99, epsilon=0.001, center=True,
                             scale=True, beta_initializer=None, gamma_initializer=None,
                             beta_regularizer=None, gamma_regularizer=None,
                             moving_mean_initializer=None, moving_variance_initializer=None,
                             trainable=True, training=True, name=_DefaultName("BatchNorm")):
    """relu(batch_normalization(inputs)): OneFlow's fused form, same variables."""
    return batch_normalization_add_relu(
        inputs, None, axis, momentum, epsilon, center, scale, beta_initializer,
        gamma_initializer, beta_regularizer, gamma_regularizer, moving_mean_initializer,
        moving_variance_initializer, trainable, training, name)


# -- layer normalization and PReLU ---------------------------------------------------------

def layer_norm(inputs, center=True, scale=True, trainable=True, begin_norm_axis=1,
               begin_params_axis=-1, epsilon=1e-05, name=_DefaultName("LayerNorm")):
    """Layer normalization over the axes from `begin_norm_axis` on, with variables
    `<name>-beta` (zeros) and `<name>-gamma` (ones) of shape inputs.shape[begin_params_axis:].
    """
    if inputs.np_dtype not in (np.float16, np.float32, np.float64):   # half: OneFlow's GPU op
        raise TraceError(f"flow.layers.layer_norm takes a float16, float32 or float64 input, "
                         f"got {inputs.np_dtype}")
    rank = len(inputs.shape)
    if not -rank <= begin_params_axis < rank:
        raise TraceError(f"flow.layers.layer_norm: begin_params_axis {begin_params_axis} is "
                         f"out of range for an input of rank {rank}")
    if not center and not scale:
        trainable = False
    name = _layer_name(name, "LayerNorm", "layer_norm")
    param_shape = inputs.shape[begin_params_axis:]
    beta = gamma = None
    if center:
        beta = _named_variable(name, None, "beta", param_shape, inputs.np_dtype,
                               initializers.constant_initializer(0.0), None, trainable)
    if scale:
        gamma = _named_variable(name, None, "gamma", param_shape, inputs.np_dtype,
                                initializers.constant_initializer(1.0), None, trainable)
    return functional_layer_norm(inputs, gamma, beta, begin_norm_axis, begin_params_axis,
                                 epsilon, name)


def prelu(inputs, alpha_initializer=None, alpha_regularizer=None, shared_axes=None,
          trainable=True, name=_DefaultName("PRelu"), model_distribute=None):
    """x where x > 0, alpha * x elsewhere; variable `<name>-alpha` of shape inputs.shape[1:]
    with the `shared_axes` set to 1 (zeros by default)."""
    if inputs.np_dtype not in (np.float32, np.float64):
        raise TraceError(f"flow.layers.prelu takes a float32 or float64 input, got "
                         f"{inputs.np_dtype}")
    rank = len(inputs.shape)
    alpha_shape = list(inputs.shape[1:])
    for axis in shared_axes or []:
        if not 1 <= axis < rank:
            raise TraceError(f"flow.layers.prelu: shared axis {axis} must be in [1, {rank})")
        alpha_shape[axis - 1] = 1
    name = _layer_name(name, "PRelu", "prelu")
    alpha = _named_variable(name, None, "alpha", alpha_shape, inputs.np_dtype,
                            alpha_initializer or initializers.constant_initializer(0),
                            alpha_regularizer, trainable)
    positive = op("Greater", inputs, as_blob(0, like=inputs))
    return op("Where", positive, inputs, inputs * alpha, name=name)


from onnxjob.ops.legacy import categorical_ordinal_encoder  # noqa: E402,F401
from onnxjob.ops.layer_norm_grads import layer_norm_grad, layer_norm_param_grad  # noqa: E402,F401

__getattr__ = missing_api("flow.layers")
