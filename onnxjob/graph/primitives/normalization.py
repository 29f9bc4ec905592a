"""Normalization ops: shape rules and gradient rules."""
import numpy as np

from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.registry import normalize_axis, register
from onnxjob.graph.tracer import as_blob, int64_constant, op


def _bn_infer(inputs, attrs, num_outputs):
    x, scale, bias, mean, var = inputs
    c = x.shape[1]
    for name, t in (("gamma", scale), ("beta", bias), ("moving_mean", mean),
                    ("moving_variance", var)):
        if t.shape != (c,):
            raise ValueError(f"{name} has shape {t.shape}, expected ({c},)")
    return [(x.shape, x.np_dtype)]


def _bn_grad(n, g, need):
    """The inference form (moving statistics are constants of the step):
    y = (x - mean) * gamma / sqrt(var + eps) + beta."""
    x, gamma, _beta, mean, var = n.inputs
    c = x.shape[1]
    bshape = [1, c] + [1] * (len(x.shape) - 2)
    eps = n.attrs.get("epsilon", 1e-5)
    inv_std = op("Reciprocal", op("Sqrt", op("Add", var, as_blob(eps, like=var))))
    gy = g[0]
    axes = int64_constant(gy, [0] + list(range(2, len(x.shape))))
    dx = op("Mul", gy, reshape_to(op("Mul", gamma, inv_std), bshape)) if need[0] else None
    dgamma = None
    if need[1]:
        xhat = op("Mul", op("Sub", x, reshape_to(mean, bshape)), reshape_to(inv_std, bshape))
        dgamma = op("ReduceSum", op("Mul", gy, xhat), axes, keepdims=0)
    dbeta = op("ReduceSum", gy, axes, keepdims=0) if need[2] else None
    return [dx, dgamma, dbeta, None, None]


# The inference form (moving statistics); train jobs normalize with batch statistics
# built from primitives (ops/layers.py).
register("BatchNormalization", _bn_infer, _bn_grad)


# -- layer and instance normalization ------------------------------------------------------

def _centered_and_rstd(x, axes, epsilon):
    """(x - mean, 1 / sqrt(var + epsilon)) over `axes` (kept), the variance divided by the
    count, as OneFlow's moments."""
    mean = op("ReduceMean", x, axes=list(axes), keepdims=1)
    centered = op("Sub", x, mean)
    var = op("ReduceMean", op("Mul", centered, centered), axes=list(axes), keepdims=1)
    rstd = op("Reciprocal", op("Sqrt", op("Add", var, as_blob(epsilon, like=var))))
    return centered, rstd


def _normalized_input_grad(g_xhat, xhat, rstd, axes):
    """d x of xhat = (x - mean(x)) * rstd over `axes`, given d xhat:
    rstd * (g - mean(g) - xhat * mean(g * xhat)).

    Where `axes` are the trailing axes of a static shape, each leading position is a row
    and the per-row affine parts are inference BatchNormalizations with the rows as
    channels: rstd * g - rstd * m1 and -rstd * m2 * xhat, then one Add (three passes over
    the rows where Sub, Mul, Sub, Mul take four, reading and writing more)."""
    axes = list(axes)
    m1 = op("ReduceMean", g_xhat, axes=axes, keepdims=1)
    m2 = op("ReduceMean", op("Mul", g_xhat, xhat), axes=axes, keepdims=1)
    shape = g_xhat.shape
    if g_xhat.is_dynamic or axes != list(range(axes[0], len(shape))) or axes[0] == 0:
        return op("Mul", op("Sub", op("Sub", g_xhat, m1), op("Mul", xhat, m2)), rstd)
    rows, width = int(np.prod(shape[:axes[0]])), int(np.prod(shape[axes[0]:]))
    per_row = [reshape_to(v, [rows]) for v in (rstd, m1, m2)]
    scale, neg_scaled_m1 = per_row[0], op("Neg", op("Mul", per_row[0], per_row[1]))
    spread = channel_affine(reshape_to(xhat, [1, rows, width]),
                            op("Neg", op("Mul", per_row[0], per_row[2])))
    dx = op("Add", channel_affine(reshape_to(g_xhat, [1, rows, width]), scale, neg_scaled_m1),
            spread)
    return reshape_to(dx, shape)


# NOTE: cuDNN raises a smaller epsilon to 1e-5, so the affine's variance is 1 - 1e-5
CHANNEL_AFFINE_EPSILON = 1e-5


def channel_affine(x, scale, bias=None, center=None):
    """(x - center) * scale + bias per channel (axis 1; `scale`, `bias`, `center` of shape
    (C,), bias and center 0 when None) as one inference BatchNormalization whose
    variance + epsilon is exactly 1: one pass over x where Sub, Mul and Add take more,
    and under mixed precision it follows its data (passes/auto_mixed_precision.py)."""
    channels, eps = x.shape[1], CHANNEL_AFFINE_EPSILON
    zeros = as_blob(np.zeros(channels, x.np_dtype), like=x)
    unit = as_blob(np.ones(channels, x.np_dtype) - x.np_dtype.type(eps), like=x)
    return op("BatchNormalization", x, scale, zeros if bias is None else bias,
              zeros if center is None else center, unit, epsilon=eps)


def _sum_over(blob, axes):
    return op("ReduceSum", blob, int64_constant(blob, axes), keepdims=0) if axes else blob


def _layer_norm_infer(inputs, attrs, num_outputs):
    x, scale = inputs[:2]
    if not np.issubdtype(x.np_dtype, np.floating):
        raise ValueError(f"LayerNormalization takes a floating input, got {x.np_dtype}")
    axis = normalize_axis(attrs.get("axis", -1), len(x.shape))
    norm_shape = x.shape[axis:]
    for what, t in (("scale", scale), ("bias", inputs[2] if len(inputs) > 2 else None)):
        if t is not None and (t.shape != norm_shape or t.np_dtype != x.np_dtype):
            raise ValueError(f"{what} is {t.shape} {t.np_dtype}, expected {norm_shape} "
                             f"{x.np_dtype}")
    stats_shape = x.shape[:axis] + (1,) * len(norm_shape)
    # stash_type 1 (the default): onnxruntime keeps Mean and InvStdDev in float32
    outs = [(x.shape, x.np_dtype)] + [(stats_shape, np.dtype(np.float32))] * 2
    return outs[:num_outputs]


def _layer_norm_grad(n, g, need):
    """The usual layer-norm backward over the axes from `axis` on; float32 reuses the
    Mean / InvStdDev outputs, other dtypes recompute them in their own precision (the
    outputs are float32)."""
    if any(gy is not None for gy in g[1:]):
        raise NotImplementedError("gradient through LayerNormalization's Mean/InvStdDev")
    x, scale = n.inputs[:2]
    rank = len(x.shape)
    axis = normalize_axis(n.attrs.get("axis", -1), rank)
    axes, lead = list(range(axis, rank)), list(range(axis))
    if x.np_dtype == np.float32 and len(n.outputs) == 3:
        rstd = n.outputs[2]
        xhat = op("Mul", op("Sub", x, n.outputs[1]), rstd)
    else:
        centered, rstd = _centered_and_rstd(x, axes, n.attrs.get("epsilon", 1e-5))
        xhat = op("Mul", centered, rstd)
    gy = g[0]
    dx = _normalized_input_grad(op("Mul", gy, scale), xhat, rstd, axes) if need[0] else None
    dscale = _sum_over(op("Mul", gy, xhat), lead) if need[1] else None
    grads = [dx, dscale]
    if len(n.inputs) > 2:
        grads.append(_sum_over(gy, lead) if need[2] else None)
    return grads


register("LayerNormalization", _layer_norm_infer, _layer_norm_grad)


def _instance_norm_check(x, scale, bias):
    if len(x.shape) < 3:
        raise ValueError(f"InstanceNormalization needs an (N, C, ...) input, got {x.shape}")
    c = x.shape[1]
    for what, t in (("scale", scale), ("bias", bias)):
        if t.shape != (c,) or t.np_dtype != x.np_dtype:
            raise ValueError(f"{what} is {t.shape} {t.np_dtype}, expected ({c},) {x.np_dtype}")


def _instance_norm_infer(inputs, attrs, num_outputs):
    x, scale, bias = inputs
    _instance_norm_check(x, scale, bias)
    return [(x.shape, x.np_dtype)]


def _channel_shape(x):
    return [1, x.shape[1]] + [1] * (len(x.shape) - 2)


def _instance_norm_lower(inputs, attrs, num_outputs):
    """onnxruntime's CPU InstanceNormalization is float32 (and float16) only: float64 is
    emitted as its formula, whose parts autodiff differentiates."""
    x, scale, bias = inputs
    if x.np_dtype != np.float64:
        return None
    _instance_norm_check(x, scale, bias)
    centered, rstd = _centered_and_rstd(x, range(2, len(x.shape)), attrs.get("epsilon", 1e-5))
    shape = _channel_shape(x)
    y = op("Mul", op("Mul", centered, rstd), reshape_to(scale, shape))
    return [op("Add", y, reshape_to(bias, shape))]


def _instance_norm_grad(n, g, need):
    """Statistics per (sample, channel) over the spatial axes, recomputed."""
    x, scale, _bias = n.inputs
    axes = list(range(2, len(x.shape)))
    centered, rstd = _centered_and_rstd(x, axes, n.attrs.get("epsilon", 1e-5))
    xhat = op("Mul", centered, rstd)
    gy = g[0]
    shape = _channel_shape(x)
    dx = None
    if need[0]:
        dx = _normalized_input_grad(op("Mul", gy, reshape_to(scale, shape)), xhat, rstd, axes)
    per_channel = [0] + axes
    dscale = _sum_over(op("Mul", gy, xhat), per_channel) if need[1] else None
    dbias = _sum_over(gy, per_channel) if need[2] else None
    return [dx, dscale, dbias]


register("InstanceNormalization", _instance_norm_infer, _instance_norm_grad,
         lower=_instance_norm_lower)
