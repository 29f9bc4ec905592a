"""Normalization ops: shape rules and gradient rules."""
from onnxjob.graph.registry import register


def _bn_infer(inputs, attrs, num_outputs):
    x, scale, bias, mean, var = inputs
    c = x.shape[1]
    for name, t in (("gamma", scale), ("beta", bias), ("moving_mean", mean),
                    ("moving_variance", var)):
        if t.shape != (c,):
            raise ValueError(f"{name} has shape {t.shape}, expected ({c},)")
    return [(x.shape, x.np_dtype)]


# Inference form only: train jobs build batch normalization from primitives (see ops/nn).
register("BatchNormalization", _bn_infer, None)
