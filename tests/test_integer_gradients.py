"""Gradients through integer values, as OneFlow computes them: its cast passes the diff
back cast to the input's dtype, and a loss may be an integer Blob (its diff is ones).
The variables' gradients are then divided by the loss's element count at the end."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp


def _sgd(loss):
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                       momentum=0).minimize(loss)


@pytest.mark.parametrize("dtype", [flow.int8, flow.int32, flow.int64])
def test_gradient_through_an_integer_product(dtype):
    seen = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((3, 4)), y: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        v = flow.get_variable("v", (1,), initializer=flow.zeros_initializer())
        xi = flow.cast(x + v, dtype)
        out = flow.cast(xi * flow.cast(y, dtype), flow.float)
        _sgd(out)
        flow.watch_diff(xi, lambda d: seen.setdefault("xi", d.numpy()))
        return out

    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (3, 4)).astype(np.float32)
    y = rng.integers(0, 10, (3, 4)).astype(np.float32)
    np.testing.assert_array_equal(job(x, y), x * y)
    assert seen["xi"].dtype == {flow.int8: np.int8, flow.int32: np.int32, flow.int64: np.int64}[dtype]
    np.testing.assert_array_equal(seen["xi"], y)          # unscaled, as OneFlow's diff
    np.testing.assert_allclose(flow.get_all_variables()["v"].numpy(), [-y.sum() / y.size],
                               rtol=1e-6)


def test_an_integer_loss():
    seen = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 4), dtype=flow.int32)) -> tp.Numpy:
        v = flow.get_variable("v", (1,), initializer=flow.zeros_initializer())
        x = x + flow.cast(v, flow.int32)
        out = flow.math.tril(x, 0)
        _sgd(out)
        flow.watch_diff(x, lambda d: seen.setdefault("x", d.numpy()))
        flow.watch_diff(out, lambda d: seen.setdefault("out", d.numpy()))
        return out

    x = np.arange(16, dtype=np.int32).reshape(4, 4)
    np.testing.assert_array_equal(job(x), np.tril(x))
    np.testing.assert_array_equal(seen["out"], np.ones((4, 4), np.int32))
    np.testing.assert_array_equal(seen["x"], np.tril(np.ones((4, 4), np.int32)))
    np.testing.assert_allclose(flow.get_all_variables()["v"].numpy(), [-10 / 16], rtol=1e-6)


def test_float_gradients_keep_their_values():
    """A float-only path still folds 1/elem_cnt into the seed: watch_diff shows the
    unscaled diff, the variable moves by the mean."""
    seen = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        v = flow.get_variable("v", (1,), initializer=flow.zeros_initializer())
        y = x * (x + v)
        _sgd(y)
        flow.watch_diff(y, lambda d: seen.setdefault("y", d.numpy()))
        return y

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    job(x)
    np.testing.assert_array_equal(seen["y"], np.ones((2, 3), np.float32))
    np.testing.assert_allclose(flow.get_all_variables()["v"].numpy(), [-x.mean()], rtol=1e-6)
