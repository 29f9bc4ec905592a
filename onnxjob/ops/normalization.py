"""Normalization functions of `flow.nn` (statistics and parameters passed in as Blobs).

The layers that own their parameters as variables (flow.layers.batch_normalization, ...)
are in layers.py.
"""
from onnxjob.ops import math

__all__ = ["moments"]


def moments(x, axes, keepdims=False, name=None):
    """(mean, variance) of `x` over `axes` (the variance divides by the count)."""
    mean = math.reduce_mean(x, axis=axes, keepdims=True)
    var = math.reduce_mean(math.square(x - mean), axis=axes, keepdims=keepdims)
    if not keepdims:
        mean = math.reduce_mean(x, axis=axes, keepdims=False)
    return mean, var
