"""flow.layers.layer_norm_grad / layer_norm_param_grad against the derivative of layer
norm (central differences in float64) and the parameter-gradient sums."""
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError

EPS = 1e-5


def normalized(x, axis):
    axes = tuple(range(axis, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(x.var(axis=axes, keepdims=True) + EPS)
    return (x - mean) * inv, mean, inv


def numeric_dx(x, dy, axis, h=1e-6):
    x = x.astype(np.float64)
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        out[i] = np.sum(dy * (normalized(up, axis)[0] - normalized(down, axis)[0])) / (2 * h)
    return out


@pytest.mark.parametrize("shape,axis,keepdims", [((3, 4), 1, False), ((2, 3, 4), 1, True),
                                                 ((2, 3, 4), -1, False)])
def test_layer_norm_grad_is_the_derivative(shape, axis, keepdims):
    rng = np.random.default_rng(len(shape) + axis)
    x = rng.normal(size=shape)
    dy = rng.normal(size=shape)
    k = axis % len(shape)
    _, mean, inv = normalized(x, k)
    if not keepdims:
        mean, inv = mean.reshape(shape[:k]), inv.reshape(shape[:k])

    @flow.global_function()
    def job(dy_: tp.Numpy.Placeholder(shape, dtype=flow.double),
            x_: tp.Numpy.Placeholder(shape, dtype=flow.double),
            mean_: tp.Numpy.Placeholder(mean.shape, dtype=flow.double),
            inv_: tp.Numpy.Placeholder(inv.shape, dtype=flow.double)) -> tp.Numpy:
        return flow.layers.layer_norm_grad(dy_, x_, mean_, inv_, begin_norm_axis=axis)

    np.testing.assert_allclose(job(dy, x, mean, inv), numeric_dx(x, dy, k), rtol=1e-5,
                               atol=1e-7)


def test_layer_norm_param_grad():
    rng = np.random.default_rng(0)
    dy, norm = rng.normal(size=(2, 3, 4, 5)).astype(np.float32), rng.normal(
        size=(2, 3, 4, 5)).astype(np.float32)
    gamma = rng.normal(size=(4, 5)).astype(np.float32)

    @flow.global_function()
    def job(dy_: tp.Numpy.Placeholder((2, 3, 4, 5)), norm_: tp.Numpy.Placeholder((2, 3, 4, 5)),
            gamma_: tp.Numpy.Placeholder((4, 5))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        return flow.layers.layer_norm_param_grad(dy_, norm_, gamma_, begin_params_axis=2)

    normalized_diff, beta_diff, gamma_diff = job(dy, norm, gamma)
    np.testing.assert_allclose(normalized_diff, dy * gamma, rtol=1e-6)
    np.testing.assert_allclose(beta_diff, dy.sum(axis=(0, 1)), rtol=1e-5)
    np.testing.assert_allclose(gamma_diff, (dy * norm).sum(axis=(0, 1)), rtol=1e-5, atol=1e-6)


def test_layer_norm_grad_checks_shapes():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3, 4)), stats: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.layers.layer_norm_grad(x, x, stats, stats, begin_norm_axis=1)

    with pytest.raises(TraceError, match="must hold"):
        job(np.zeros((3, 4), np.float32), np.zeros(4, np.float32))
