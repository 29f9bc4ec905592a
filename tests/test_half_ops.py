"""float16 inputs of the ops whose OneFlow GPU kernels take them (fused_bias_add_gelu,
fused_bias_add_dropout, unsorted_segment_sum): computed through float32 as onnxruntime
runs float16 math, with float16 results."""
import math

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp


def _half_job(fn, *arrays):
    @flow.global_function()
    def job(a: tp.Numpy.Placeholder(arrays[0].shape),
            b: tp.Numpy.Placeholder(arrays[1].shape, dtype=flow.int32 if
                                    arrays[1].dtype == np.int32 else flow.float)) -> tp.Numpy:
        a16 = flow.cast(a, flow.float16)
        b16 = b if arrays[1].dtype == np.int32 else flow.cast(b, flow.float16)
        out = fn(a16, b16)
        assert out.dtype is flow.float16
        return flow.cast(out, flow.float)
    return job(*arrays)


def test_fused_bias_add_gelu_in_half():
    rng = np.random.default_rng(0)
    x, bias = rng.standard_normal((2, 3, 4)).astype(np.float32), rng.random(3).astype(np.float32)
    got = _half_job(lambda a, b: flow.nn.fused_bias_add_gelu(a, b, data_format="NCHW"), x, bias)
    v = (x.astype(np.float16).astype(np.float32)
         + bias.astype(np.float16).astype(np.float32)[:, None])
    erf = np.vectorize(math.erf)
    expected = (0.5 * v * (1 + erf(v / np.sqrt(2)))).astype(np.float16)
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)


def test_fused_bias_add_dropout_in_half_without_dropping():
    x, bias = np.ones((2, 3), np.float32), np.float32([0.5, 1.5, 2.5])
    got = _half_job(lambda a, b: flow.nn.fused_bias_add_dropout(a, b, data_format="NC",
                                                                 rate=0.0), x, bias)
    np.testing.assert_array_equal(got, x + bias)


def test_unsorted_segment_sum_in_half():
    rng = np.random.default_rng(1)
    data = rng.uniform(-1, 1, (40, 3)).astype(np.float32)
    ids = rng.integers(0, 5, 40).astype(np.int32)
    got = _half_job(lambda a, s: flow.math.unsorted_segment_sum(a, s, 5), data, ids)
    expected = np.zeros((5, 3), np.float32)
    np.add.at(expected, ids, data.astype(np.float16).astype(np.float32))
    np.testing.assert_allclose(got, expected.astype(np.float16), rtol=1e-3, atol=1e-3)


def test_softmax_cross_entropy_with_logits_in_half():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((4, 5)).astype(np.float32)
    labels = np.eye(5, dtype=np.float32)[[0, 3, 1, 4]]
    got = _half_job(lambda y, x: flow.nn.softmax_cross_entropy_with_logits(x, y), logits,
                    labels)
    x = logits.astype(np.float16).astype(np.float64)
    log_p = x - np.log(np.exp(x).sum(1, keepdims=True))
    expected = (-(labels * log_p).sum(1)).astype(np.float16)
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_half_arithmetic_rounds_its_inputs_and_results():
    """cast(x, half) + cast(y, half): onnxruntime's CPU provider once merged the Casts
    and added in float32 precision."""
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-10, 10, (2, 8)).astype(np.float32), rng.uniform(0.5, 2, (8,))
    y = y.astype(np.float32)
    for fn, ref in [(lambda a, b: a + b, np.add), (lambda a, b: a - b, np.subtract),
                    (lambda a, b: a * b, np.multiply), (lambda a, b: a / b, np.divide)]:
        flow.clear_default_session()
        got = _half_job(fn, x, y)
        expected = ref(x.astype(np.float16), y.astype(np.float16)).astype(np.float32)
        np.testing.assert_array_equal(got, expected)


def test_half_softmax_gradient_is_rounded_once():
    """The backward of a float16 softmax is computed as OneFlow's half kernel does it:
    in float32, rounded to float16 once (not after every Mul and Sub of the rule)."""
    seen = {}

    @flow.global_function(type="train")
    def job() -> tp.Numpy:
        x = flow.get_variable("x", (4, 1000), initializer=flow.random_uniform_initializer(-1, 1))
        y = flow.cast(flow.nn.softmax(flow.cast(x, flow.float16)), flow.float)
        flow.watch(x, lambda v: seen.setdefault("x", v.numpy()))
        flow.watch_diff(x, lambda d: seen.setdefault("dx", d.numpy()))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(y * flow.identity(x))
        return y

    y = job().astype(np.float64)
    x = seen["x"].astype(np.float64)
    # d(sum y * x)/dx: y through the product, y * (x - sum(x * y)) through the softmax
    expected = y + y * (x - (x * y).sum(1, keepdims=True))
    np.testing.assert_allclose(seen["dx"], expected, rtol=2e-3, atol=1e-5)
