"""flow.quantization against NumPy versions of OneFlow's CPU kernels (min_max_observer,
moving_average_min_max_observer, fake_quantization) and its straight-through gradient."""
import math
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError


def observe(x, bit, scheme, formula):
    """OneFlow's GenQuantScale{Symmetric,Affine,Cambricon} over all of `x`."""
    high, low = x.max(), x.min()
    if formula == "cambricon":
        return math.floor(math.log2(max(abs(high), abs(low)))) - (bit - 2), 0.0
    if scheme == "symmetric":
        return max(abs(high), abs(low)) / (2.0 ** (bit - 1) - 1), 0.0
    scale = (high - low) / (2.0 ** bit - 1)
    return scale, -np.rint(low / scale)


def fake_quant(x, scale, zero_point, bit, scheme, formula):
    if formula == "cambricon":
        scale = 2.0 ** int(scale)
    if scheme == "affine" and formula == "google":
        point = np.uint8(np.int64(np.floor(abs(zero_point) + 0.5) * np.sign(zero_point)) % 256)
        q = np.clip(np.rint(x / scale + point), 0, 2 ** bit - 1)
        return (q - point) * scale
    upper = 2 ** (bit - 1) - 1
    return np.clip(np.rint(x / scale), -upper - 1, upper) * scale


CASES = [(8, "symmetric", "google"), (8, "affine", "google"), (7, "affine", "google"),
         (8, "symmetric", "cambricon"), (4, "symmetric", "google")]


@pytest.mark.parametrize("bit,scheme,formula", CASES)
def test_min_max_observer_and_fake_quantization_per_layer(bit, scheme, formula):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((6, 5))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        scale, zero_point = flow.quantization.min_max_observer(x, bit, scheme, formula)
        out = flow.quantization.fake_quantization(x, scale, zero_point, bit, scheme, formula)
        return scale, zero_point, out

    x = (np.random.default_rng(bit).random((6, 5)) - 0.3).astype(np.float32) * 3
    scale, zero_point, out = job(x)
    ref_scale, ref_point = observe(x, bit, scheme, formula)
    assert scale.shape == zero_point.shape == (1,)
    np.testing.assert_allclose(scale, [ref_scale], rtol=1e-6)
    np.testing.assert_array_equal(zero_point, [ref_point])
    np.testing.assert_allclose(out, fake_quant(x, scale[0], zero_point[0], bit, scheme, formula),
                               rtol=1e-6, atol=1e-7)
    levels = np.unique(np.round(out / (2.0 ** int(scale[0]) if formula == "cambricon"
                                       else scale[0])))
    assert len(levels) <= 2 ** bit


def test_cambricon_shift_is_exact_at_powers_of_two():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.quantization.min_max_observer(x, 8, "symmetric", "cambricon")[0]

    for top in (8.0, 0.25, 1.0, 7.999, 1024.0):
        x = np.array([top / 10, -top, top / 3], np.float32)
        assert job(x)[0] == math.floor(math.log2(top)) - 6


@pytest.mark.parametrize("scheme", ["symmetric", "affine"])
def test_per_channel_observer_and_fake_quantization(scheme):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3, 2))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        scale, point = flow.quantization.min_max_observer(x, 8, scheme, "google", False)
        return scale, point, flow.quantization.fake_quantization(x, scale, point, 8, scheme)

    x = np.random.default_rng(1).normal(size=(4, 3, 2)).astype(np.float32)
    scale, point, out = job(x)
    assert scale.shape == (4,)
    for c in range(4):
        ref_scale, ref_point = observe(x[c], 8, scheme, "google")
        np.testing.assert_allclose(scale[c], ref_scale, rtol=1e-6)
        assert point[c] == ref_point
        np.testing.assert_allclose(out[c], fake_quant(x[c], scale[c], point[c], 8, scheme,
                                                      "google"), rtol=1e-6, atol=1e-7)


def test_affine_zero_point_wraps_as_uint8():
    # all values positive: the zero point is negative and OneFlow casts it to uint8
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> Tuple[tp.Numpy, tp.Numpy]:
        scale, point = flow.quantization.min_max_observer(x, 8, "affine")
        return point, flow.quantization.fake_quantization(x, scale, point, 8, "affine")

    point, out = job(x)
    scale = 3.0 / 255
    assert point[0] == -np.rint(1.0 / np.float32(scale))
    np.testing.assert_allclose(out, fake_quant(x, np.float32(scale), point[0], 8, "affine",
                                               "google"), rtol=1e-6)


def test_fake_quantization_gradient_is_straight_through():
    grads = {}

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 3), initializer=flow.constant_initializer(0.3))
        flow.watch_diff(w, lambda g: grads.setdefault("w", g))
        scale, point = flow.quantization.min_max_observer(w, 4)
        q = flow.quantization.fake_quantization(w, scale, point, 4)
        loss = flow.math.reduce_sum(q * x)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return loss

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    train(x)
    np.testing.assert_allclose(grads["w"], x)


@pytest.mark.parametrize("scheme,formula", [("symmetric", "google"), ("affine", "google"),
                                            ("symmetric", "cambricon")])
def test_moving_average_observer_updates_in_train_jobs_only(scheme, formula):
    momentum = 0.9

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((8,))) -> Tuple[tp.Numpy, tp.Numpy]:
        w = flow.get_variable("w", (8,), initializer=flow.constant_initializer(1.0))
        scale, point = flow.quantization.moving_average_min_max_observer(
            x * w, 8, scheme, formula, momentum, name="obs")
        loss = flow.math.reduce_sum(w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return scale, point

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder((8,))) -> Tuple[tp.Numpy, tp.Numpy]:
        return flow.quantization.moving_average_min_max_observer(
            x, 8, scheme, formula, momentum, name="obs")

    rng = np.random.default_rng(0)
    moving_max = moving_min = np.float32(0)
    for _ in range(4):
        x = (rng.random(8) * 4 - 1).astype(np.float32)
        high, low = x.max(), x.min()
        if scheme == "symmetric":
            high = low = max(abs(high), abs(low))
        f32 = np.float32
        moving_max = high if moving_max == 0 else f32(moving_max * f32(momentum)
                                                      + high * (f32(1) - f32(momentum)))
        moving_min = low if moving_min == 0 else f32(moving_min * f32(momentum)
                                                     + low * (f32(1) - f32(momentum)))
        scale, point = train(x)
        if formula == "cambricon":
            want = (math.floor(math.log2(moving_max)) - 6, 0)
        elif scheme == "symmetric":
            want = (moving_max / 127, 0)
        else:
            s = (moving_max - moving_min) / 255
            want = (s, -np.sign(moving_min / s) * np.floor(abs(moving_min / s) + 0.5))
        np.testing.assert_allclose(scale, [want[0]], rtol=1e-5)
        np.testing.assert_allclose(point, [want[1]])
    stored = flow.get_all_variables()["obs-moving_max"].numpy()
    np.testing.assert_allclose(stored, [moving_max], rtol=1e-6)
    # a predict job reads the moving values and changes nothing
    np.testing.assert_allclose(predict(np.full(8, 100, np.float32))[0], scale, rtol=1e-6)
    np.testing.assert_allclose(flow.get_all_variables()["obs-moving_max"].numpy(), stored)


def test_arguments_are_checked():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        return flow.quantization.min_max_observer(x, 9)[0]

    with pytest.raises(TraceError, match="quantization_bit"):
        job(np.zeros((4, 2), np.float32))
    flow.clear_default_session()

    @flow.global_function()
    def cambricon(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        return flow.quantization.min_max_observer(x, 8, "symmetric", "cambricon", False)[0]

    with pytest.raises(NotImplementedError, match="per-channel"):
        cambricon(np.zeros((4, 2), np.float32))
