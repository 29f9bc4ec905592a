"""`flow.layers.layer_norm_grad` / `layer_norm_param_grad`: layer norm's backward pass
as ops of their own (OneFlow exposes its gradient kernels), for jobs that differentiate
by hand."""
import math

from onnxjob.errors import TraceError
from onnxjob.ops.math import reduce_mean, reduce_sum
from onnxjob.ops.shapes import reshape


def _axis(axis, rank, api):
    axis = axis + rank if axis < 0 else axis
    if not 0 < axis < rank:
        raise TraceError(f"{api}: the axis must be in [1, {rank - 1}] (or negative), got {axis}")
    return axis


def layer_norm_grad(dy, x, mean, inv_variance, begin_norm_axis=1, name="LayerNormGrad"):
    """dx of a layer norm without scale and shift over axes begin_norm_axis...:
    inv_variance * (dy - mean(dy) - x_hat * mean(dy * x_hat)) with x_hat = (x - mean) *
    inv_variance, the means over the normalized axes; `mean` and `inv_variance` are the
    forward pass's, of shape x.shape[:begin_norm_axis] (with or without the trailing 1s)."""
    api = "flow.layers.layer_norm_grad"
    rank = len(x.shape)
    axis = _axis(begin_norm_axis, rank, api)
    if tuple(dy.shape) != tuple(x.shape):
        raise TraceError(f"{api}: dy {dy.shape} and x {x.shape} must have the same shape")
    stats_shape = list(x.shape[:axis]) + [1] * (rank - axis)
    for label, blob in (("mean", mean), ("inv_variance", inv_variance)):
        if math.prod(blob.shape) != math.prod(x.shape[:axis]):
            raise TraceError(f"{api}: {label} {blob.shape} must hold x.shape[:{axis}] = "
                             f"{tuple(x.shape[:axis])} values")
    mean = reshape(mean, stats_shape)
    inv_variance = reshape(inv_variance, stats_shape)
    axes = list(range(axis, rank))
    x_hat = (x - mean) * inv_variance
    centered = dy - reduce_mean(dy, axis=axes, keepdims=True)
    return (centered - x_hat * reduce_mean(dy * x_hat, axis=axes, keepdims=True)) * inv_variance


def layer_norm_param_grad(dy, norm, gamma, begin_params_axis=-1, name="LayerNormParamGrad"):
    """(normalized_diff, beta_diff, gamma_diff) of a layer norm's scale and shift over
    axes begin_params_axis...: dy * gamma, sum(dy) and sum(dy * norm) over the leading
    axes (the parameters' shape dy.shape[begin_params_axis:])."""
    api = "flow.layers.layer_norm_param_grad"
    rank = len(dy.shape)
    axis = _axis(begin_params_axis, rank, api)
    params = list(dy.shape[axis:])
    if tuple(norm.shape) != tuple(dy.shape):
        raise TraceError(f"{api}: norm {norm.shape} and dy {dy.shape} must have the same shape")
    leading = list(range(axis))
    beta_diff = reduce_sum(dy, axis=leading)
    gamma_diff = reduce_sum(dy * norm, axis=leading)
    normalized_diff = dy * reshape(gamma, params) if gamma is not None else dy
    return normalized_diff, beta_diff, gamma_diff
