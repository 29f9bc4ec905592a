"""Normalization functions of `flow.nn` (statistics and parameters passed in as Blobs,
or created as variables by GroupNorm / InstanceNorm*), and OneFlow's fused bias_add forms.

The layers that own their parameters as variables (flow.layers.batch_normalization,
flow.layers.layer_norm, ...) are in layers.py.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend import initializers, scope
from onnxjob.frontend.variables import VariableSpec, variable_blob
from onnxjob.graph.primitives.shape_ops import reshape_back, reshape_rows, reshape_to
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.ops import math
from onnxjob.ops.casts import cast
from onnxjob.ops.conv import add_bias
from onnxjob.ops.dropout import dropout

__all__ = ["GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d",
           "batch_normalization", "fused_bias_add_dropout", "fused_bias_add_gelu", "layer_norm",
           "moments"]


def moments(x, axes, keepdims=False, name=None):
    """(mean, variance) of `x` over `axes` (the variance divides by the count)."""
    _check_floating(x, "flow.nn.moments", half=True)   # OneFlow's reductions take half
    if isinstance(axes, (list, tuple)) and not axes:
        # as OneFlow's: reduce_mean over no axis (x / its size), reduce_variance's zeros
        return (math.reduce_mean(x, axis=[], keepdims=keepdims, name=name),
                math.reduce_variance(x, axis=[], keepdims=keepdims))
    mean = math.reduce_mean(x, axis=axes, keepdims=True)
    var = math.reduce_mean(math.square(x - mean), axis=axes, keepdims=keepdims)
    if not keepdims:
        mean = math.reduce_mean(x, axis=axes, keepdims=False)
    return mean, var


def _check_floating(x, api, half=False):
    """float32 or float64 (and float16 where `half`: ops OneFlow's GPU kernels take in
    half precision, computed here as onnxruntime runs float16 math, through float32)."""
    allowed = (np.float32, np.float64) + ((np.float16,) if half else ())
    if x.np_dtype not in allowed:
        names = "float16, float32 or float64" if half else "a float32 or float64"
        raise TraceError(f"{api} takes {names} input, got {x.np_dtype}")


def _axis(axis, rank, api):
    if not -rank <= axis < rank:
        raise TraceError(f"{api}: axis {axis} is out of range for an input of rank {rank}")
    return axis % rank


def batch_normalization(x, mean, variance, offset=None, scale=None, variance_epsilon=1e-05,
                        axis=1, name=None):
    """(x - mean) / sqrt(variance + variance_epsilon) * scale + offset.

    1-D statistics and parameters lie along `axis`; statistics of x's rank (moments with
    keepdims=True) broadcast as they are. A float16 `x` takes float32 statistics and
    parameters as OneFlow's GPU kernel does: computed in float32, rounded once. As OneFlow:
    on its CPU kernel (scope.oneflow_places_on_cpu) these flow.math ops, every input with a
    gradient; on a GPU its inference-mode `normalization` op, whose statistics take none
    (normalization_op.cpp: requires_grad(false)).
    """
    if x.np_dtype == np.float16 and mean.np_dtype == np.float32:
        wide = batch_normalization(cast(x, dtypes.float32), mean, variance, offset, scale,
                                   variance_epsilon, axis)
        return cast(wide, dtypes.float16, name=name)
    _check_floating(x, "flow.nn.batch_normalization")
    rank = len(x.shape)
    axis = _axis(axis, rank, "flow.nn.batch_normalization")
    if len(mean.shape) == 1:
        nd_shape = [1] * rank
        nd_shape[axis] = x.shape[axis]
        mean, variance = reshape_to(mean, nd_shape), reshape_to(variance, nd_shape)
        scale = reshape_to(scale, nd_shape) if scale is not None else None
        offset = reshape_to(offset, nd_shape) if offset is not None else None
    elif len(mean.shape) != rank:
        raise TraceError(f"flow.nn.batch_normalization: mean {mean.shape} must be 1-D or of "
                         f"the rank of x {x.shape}")
    if not scope.oneflow_places_on_cpu(current_builder("flow.nn.batch_normalization")):
        mean, variance = (op("onnxjob.StopGradient", v) for v in (mean, variance))
    std_inv = math.rsqrt(variance + as_blob(variance_epsilon, like=variance))
    out = (x - mean) * std_inv
    if scale is not None:
        out = out * scale
    if offset is not None:
        out = out + offset
    return out if name is None else op("Identity", out, name=name)


def layer_norm(inputs, gamma=None, beta=None, begin_norm_axis=1, begin_params_axis=-1,
               epsilon=1e-05, name=None):
    """Normalize over the axes from `begin_norm_axis` on, then scale by `gamma` and shift by
    `beta`, both of shape inputs.shape[begin_params_axis:]."""
    api = "flow.nn.layer_norm"
    _check_floating(inputs, api, half=True)
    rank = len(inputs.shape)
    norm_axis = _axis(begin_norm_axis, rank, api)
    params_axis = _axis(begin_params_axis, rank, api)
    param_shape = inputs.shape[params_axis:]
    gamma, beta = (_param(p, param_shape, inputs, what, api)
                   for p, what in ((gamma, "gamma"), (beta, "beta")))
    if params_axis == norm_axis:  # one LayerNormalization node with the affine part
        scale = gamma if gamma is not None else _ones(inputs, param_shape)
        args = (inputs, scale) if beta is None else (inputs, scale, beta)
        y, _mean, _inv_std = op("LayerNormalization", *args, axis=norm_axis,
                                epsilon=float(epsilon), num_outputs=3, name=name)
        return y
    y, _mean, _inv_std = op("LayerNormalization", inputs, _ones(inputs, inputs.shape[norm_axis:]),
                            axis=norm_axis, epsilon=float(epsilon), num_outputs=3, name=name)
    nd_shape = [1] * (rank - len(param_shape)) + list(param_shape)
    if gamma is not None:
        y = y * reshape_to(gamma, nd_shape)
    if beta is not None:
        y = y + reshape_to(beta, nd_shape)
    return y


def _param(p, shape, like, what, api):
    """`p` reshaped to `shape` (None stays None)."""
    if p is None:
        return None
    if int(np.prod(p.shape)) != int(np.prod(shape)) or p.np_dtype != like.np_dtype:
        raise TraceError(f"{api}: {what} is {p.shape} {p.np_dtype}, expected {shape} "
                         f"{like.np_dtype}")
    return reshape_to(p, shape)


def _ones(like, shape):
    return as_blob(np.ones(shape, like.np_dtype), like=like)


# -- group and instance normalization (their affine parameters are variables) --------------

def _default_name(prefix):
    """OneFlow names these ops `<prefix><k>`; here k is the first index whose variables
    this job does not have yet, so jobs built from the same code share their variables."""
    builder = current_builder(prefix)
    k = 0
    while builder.variables.get(scope.full_name(f"{prefix}{k}_gamma")) is not None:
        k += 1
    return f"{prefix}{k}"


def _affine_variables(name, channels, dtype):
    """OneFlow's `<name>_gamma` (ones) and `<name>_beta` (zeros), of shape (1, C, 1)."""
    params = []
    for part, init in (("gamma", initializers.ones_initializer()),
                       ("beta", initializers.zeros_initializer())):
        spec = VariableSpec(scope.full_name(f"{name}_{part}"), (1, channels, 1), dtype, init)
        params.append(variable_blob(spec, reuse=True))
    return params


def _normalize_groups(x, groups, eps, affine, name, prefix):
    """x (N, C, ...) normalized per sample over C/groups channels and the other axes,
    then scaled and shifted per channel by the variables if `affine`."""
    n, c = x.shape[:2]
    name = name if name is not None else _default_name(prefix)
    size = int(np.prod(x.shape[2:]))
    grouped = reshape_rows(x, (n, groups, c // groups * size), x.is_dynamic)
    ones = as_blob(np.ones(groups, x.np_dtype), like=x)
    zeros = as_blob(np.zeros(groups, x.np_dtype), like=x)
    y = op("InstanceNormalization", grouped, ones, zeros, epsilon=float(eps))
    if affine:
        gamma, beta = _affine_variables(name, c, x.np_dtype)
        y = reshape_rows(y, (n, c, size), x.is_dynamic) * gamma + beta
    return reshape_back(y, x)


def group_normalization(x, num_groups=32, eps=1e-05, affine=True, name=None):
    """Group normalization of an (N, C, ...) input; variables `<name>_gamma`/`_beta` of
    shape (1, C, 1) when `affine`."""
    _check_floating(x, "flow.nn.GroupNorm")
    if len(x.shape) < 3:
        raise TraceError(f"flow.nn.GroupNorm needs an (N, C, ...) input of rank >= 3, got "
                         f"{x.shape}")
    if num_groups < 1 or x.shape[1] % num_groups:
        raise TraceError(f"flow.nn.GroupNorm: num_groups={num_groups} must divide the "
                         f"{x.shape[1]} channels")
    return _normalize_groups(x, num_groups, eps, affine, name, "GroupNorm_")


def _instance_norm(x, eps, affine, name, ndims):
    api = f"flow.nn.InstanceNorm{ndims}d"
    _check_floating(x, api)
    if len(x.shape) != ndims + 2:
        raise TraceError(f"{api} needs a {ndims + 2}-D input, got {x.shape}")
    return _normalize_groups(x, x.shape[1], eps, affine, name, f"InstanceNorm{ndims}D_")


def instance_normalization1d(x, eps=1e-05, affine=True, name=None):
    """Instance normalization of (N, C, L): per sample and channel over L."""
    return _instance_norm(x, eps, affine, name, 1)


def instance_normalization2d(x, eps=1e-05, affine=True, name=None):
    """Instance normalization of (N, C, H, W); the variables are those of InstanceNorm1d."""
    return _instance_norm(x, eps, affine, name, 2)


def instance_normalization3d(x, eps=1e-05, affine=True, name=None):
    """Instance normalization of (N, C, D, H, W)."""
    return _instance_norm(x, eps, affine, name, 3)


GroupNorm = group_normalization
InstanceNorm1d = instance_normalization1d
InstanceNorm2d = instance_normalization2d
InstanceNorm3d = instance_normalization3d


# -- OneFlow's fused bias_add kernels, as compositions -------------------------------------

def _check_bias_format(data_format):
    """OneFlow's fused ops take None or "NC..." (bias on axis 1) or "N...C" (last axis)."""
    if data_format is None or data_format.startswith("NC") or (
            data_format.startswith("N") and data_format.endswith("C")):
        return data_format
    raise TraceError(f"data_format must be of the form `N...C` or `NC...`, got {data_format!r}")


def fused_bias_add_gelu(value, bias, data_format=None, name=None):
    """gelu(bias_add(value, bias)), bias along axis 1 (or the last axis for "N...C")."""
    _check_floating(value, "flow.nn.fused_bias_add_gelu", half=True)
    out = add_bias(value, bias, _check_bias_format(data_format))
    return math.gelu(out) if name is None else op("Identity", math.gelu(out), name=name)


def fused_bias_add_dropout(value, bias, data_format=None, rate=0.0, noise_shape=None,
                           seed=None, name=None):
    """dropout(bias_add(value, bias), rate) in train jobs; bias_add alone otherwise."""
    _check_floating(value, "flow.nn.fused_bias_add_dropout", half=True)
    if rate is None or not 0.0 <= rate < 1.0:
        raise TraceError(f"fused_bias_add_dropout: rate must be in [0, 1), got {rate!r}")
    out = add_bias(value, bias, _check_bias_format(data_format))
    return dropout(out, rate, noise_shape=noise_shape, seed=seed, name=name)
