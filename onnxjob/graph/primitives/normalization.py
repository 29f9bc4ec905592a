"""Normalization ops: shape rules and gradient rules."""
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.registry import register
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
