"""Floor modulo and the rounding functions: values as NumPy computes them, and the zero
gradients OneFlow gives floor, ceil, round and floordiv."""
import typing

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_mod_is_exact_for_small_remainders(dtype):
    """x % y for x much larger than the remainder: x - floor(x / y) * y would be off by
    an error relative to x; NumPy's (and OneFlow's) floor mod is exact."""
    rng = np.random.default_rng(0)
    a = rng.random((64, 64)).astype(dtype)
    b = (rng.random((1, 64)) * 0.1).astype(dtype)
    a[0, :] = -a[0, :]          # negative dividends: the result takes y's sign

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder(a.shape, dtype=flow.float if dtype == np.float32
                                     else flow.double),
            y: tp.Numpy.Placeholder(b.shape, dtype=flow.float if dtype == np.float32
                                    else flow.double)) -> typing.Tuple[tp.Numpy, tp.Numpy]:
        return flow.math.mod(x, y), x % -y

    got, negative = job(a, b)
    np.testing.assert_array_equal(got, np.mod(a, b))
    np.testing.assert_array_equal(negative, np.mod(a, -b))


def test_mod_sign_follows_the_divisor():
    a = np.array([5.5, -5.5, 5.5, -5.5, 6.0, -6.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 3.0], np.float32)

    @flow.global_function(type="predict")
    def job(x: tp.Numpy.Placeholder((6,)), y: tp.Numpy.Placeholder((6,))) -> tp.Numpy:
        return x % y

    got = job(a, b)
    np.testing.assert_array_equal(got, np.mod(a, b))


@pytest.mark.parametrize("fn", [flow.math.floor, flow.math.ceil, flow.math.round,
                                lambda x: flow.math.floordiv(x, x * 0 + 3.0)])
def test_rounding_functions_have_zero_gradients(fn):
    x0 = np.linspace(-3, 3, 12).astype(np.float32).reshape(3, 4)

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        v = flow.get_variable("v", (3, 4), initializer=flow.constant_initializer(0.5))
        y = fn(x + v)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                           momentum=0).minimize(y)
        return y

    job(x0)
    np.testing.assert_array_equal(flow.get_all_variables()["v"].numpy(),
                                  np.full((3, 4), 0.5, np.float32))
