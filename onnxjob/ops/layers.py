"""flow.layers: dense, conv2d, batch_normalization (variables created by name)."""
import numpy as np

from onnxjob.frontend import initializers, scope
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.frontend.variables import VariableSpec, variable_blob
from onnxjob.ops import math as math_ops
from onnxjob.ops.array import reshape
from onnxjob.ops.nn import _pair, resolve_padding


def _variable(name, shape, dtype, initializer, regularizer=None, trainable=True, reuse=False):
    spec = VariableSpec(name, shape, dtype, initializer, trainable, regularizer)
    return variable_blob(spec, reuse=reuse)


def _activate(out, activation):
    return activation(out, name="activation") if activation is not None else out


def dense(inputs, units, activation=None, use_bias=True, kernel_initializer=None,
          bias_initializer=None, kernel_regularizer=None, bias_regularizer=None, trainable=True,
          name="Dense", model_distribute=None):
    """Fully connected layer; weight `<name>-weight` of shape (units, in_features)."""
    if len(inputs.shape) < 2:
        raise TraceError(f"flow.layers.dense needs an input of rank >= 2, got {inputs.shape}")
    in_shape = inputs.shape
    x = reshape(inputs, (-1, in_shape[-1])) if len(in_shape) > 2 else inputs
    with scope.namespace(name):
        weight = _variable(scope.full_name("weight"), (units, in_shape[-1]), inputs.np_dtype,
                           kernel_initializer or initializers.constant_initializer(0),
                           kernel_regularizer, trainable)
        bias = None
        if use_bias:
            bias = _variable(scope.full_name("bias"), (units,), inputs.np_dtype,
                             bias_initializer or initializers.constant_initializer(0),
                             bias_regularizer, trainable)
    out = op("Gemm", x, weight, bias, transB=1) if bias is not None else op("Gemm", x, weight, transB=1)
    if len(in_shape) > 2:
        out = reshape(out, in_shape[:-1] + (units,))
    return _activate(out, activation)


def conv2d(inputs, filters, kernel_size=1, strides=1, padding="VALID", data_format="NCHW",
           dilation_rate=None, groups=1, activation=None, use_bias=True, kernel_initializer=None,
           bias_initializer=None, kernel_regularizer=None, bias_regularizer=None, trainable=True,
           name="Conv2d", weight_name=None, bias_name=None):
    """2-D convolution layer; weight `<name>-weight` (filters, in/groups, kh, kw) for NCHW."""
    nhwc = data_format.upper() in ("NHWC", "CHANNELS_LAST")
    x = op("Transpose", inputs, perm=[0, 3, 1, 2]) if nhwc else inputs
    if len(x.shape) != 4:
        raise TraceError(f"flow.layers.conv2d needs a 4-D input, got {inputs.shape}")
    k = _pair(kernel_size, "kernel_size")
    s = _pair(strides, "strides")
    d = _pair(dilation_rate or 1, "dilation_rate")
    if x.shape[1] % groups:
        raise TraceError(f"{x.shape[1]} input channels do not divide into {groups} groups")
    with scope.namespace(name):
        weight = _variable(weight_name or scope.full_name("weight"),
                           (filters, x.shape[1] // groups, *k), inputs.np_dtype,
                           kernel_initializer or initializers.xavier_uniform_initializer(data_format),
                           kernel_regularizer, trainable)
        bias = None
        if use_bias:
            bias = _variable(bias_name or scope.full_name("bias"), (filters,), inputs.np_dtype,
                             bias_initializer or initializers.constant_initializer(0),
                             bias_regularizer, trainable)
    pads = resolve_padding(padding, x.shape[2:], k, s, d)
    inputs_ = [x, weight] + ([bias] if bias is not None else [])
    out = op("Conv", *inputs_, strides=s, pads=pads, dilations=d, group=int(groups),
             kernel_shape=k)
    if nhwc:
        out = op("Transpose", out, perm=[0, 2, 3, 1])
    return _activate(out, activation)


def batch_normalization(inputs, axis=-1, momentum=0.99, epsilon=0.001, center=True, scale=True,
                        beta_initializer=None, gamma_initializer=None, beta_regularizer=None,
                        gamma_regularizer=None, moving_mean_initializer=None,
                        moving_variance_initializer=None, trainable=True, training=True,
                        name="BatchNorm"):
    """Batch normalization over all axes but `axis`; moving statistics updated in train jobs."""
    rank = len(inputs.shape)
    axis = axis % rank
    c = inputs.shape[axis]
    dt = inputs.np_dtype
    with scope.namespace(name):
        gamma = _variable(scope.full_name("gamma"), (c,), dt,
                          gamma_initializer or initializers.ones_initializer(),
                          gamma_regularizer, trainable and scale) if scale else None
        beta = _variable(scope.full_name("beta"), (c,), dt,
                         beta_initializer or initializers.zeros_initializer(),
                         beta_regularizer, trainable and center) if center else None
        moving_mean = _variable(scope.full_name("moving_mean"), (c,), dt,
                                moving_mean_initializer or initializers.zeros_initializer(),
                                trainable=False)
        moving_var = _variable(scope.full_name("moving_variance"), (c,), dt,
                               moving_variance_initializer or initializers.ones_initializer(),
                               trainable=False)
    bshape = [1] * rank
    bshape[axis] = c
    builder = current_builder("flow.layers.batch_normalization")
    reduce_axes = [i for i in range(rank) if i != axis]
    if builder.is_train and training:
        mean = math_ops.reduce_mean(inputs, axis=reduce_axes, keepdims=True)
        centered = inputs - mean
        var = math_ops.reduce_mean(centered * centered, axis=reduce_axes, keepdims=True)
        normed = centered * op("Reciprocal", op("Sqrt", var + as_blob(epsilon, like=var)))
        m = as_blob(momentum, like=mean)
        one_minus = as_blob(1.0 - momentum, like=mean)
        builder.state_updates[moving_mean.name] = moving_mean * m + reshape(mean, (c,)) * one_minus
        builder.state_updates[moving_var.name] = moving_var * m + reshape(var, (c,)) * one_minus
    elif axis == 1 and rank >= 3:
        return op("BatchNormalization", inputs,
                  gamma if gamma is not None else as_blob(np.ones(c, dt), like=inputs),
                  beta if beta is not None else as_blob(np.zeros(c, dt), like=inputs),
                  moving_mean, moving_var, epsilon=float(epsilon))
    else:
        inv = op("Reciprocal", op("Sqrt", reshape(moving_var, bshape) + as_blob(epsilon, like=inputs)))
        normed = (inputs - reshape(moving_mean, bshape)) * inv
    out = normed
    if gamma is not None:
        out = out * reshape(gamma, bshape)
    if beta is not None:
        out = out + reshape(beta, bshape)
    return out
