"""Each optimizer and LR schedule against a step-by-step NumPy reference (5 steps)."""
import math

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.train import lr_schedules as S

A = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
W0 = np.array([0.5, 0.25, -1.0, 2.0], np.float32)


def np_reference(update, steps=5, lr_fn=lambda t: 0.1):
    w = W0.astype(np.float64).copy()
    state = {}
    out = []
    for t in range(steps):
        g = A * w / 4
        w = update(w, g, lr_fn(t), t, state)
        out.append(w.copy())
    return out


def sgd(w, g, lr, t, s):
    return w - lr * g


def momentum(w, g, lr, t, s):
    s["m"] = 0.9 * s.get("m", 0) - lr * g
    return w + s["m"]


def adam(bias_correction):
    def update(w, g, lr, t, s):
        s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
        s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
        if bias_correction:
            lr = lr * math.sqrt(1 - 0.999 ** (t + 1)) / (1 - 0.9 ** (t + 1))
        return w - lr * s["m"] / (np.sqrt(s["v"]) + 1e-8)
    return update


def adamw(w, g, lr, t, s):
    s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
    s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
    return w - lr * (s["m"] / (np.sqrt(s["v"]) + 1e-8) + 0.01 * w)


def rmsprop(w, g, lr, t, s):
    s["ms"] = 0.99 * s.get("ms", 0) + 0.01 * g * g
    return w - lr * g / np.sqrt(s["ms"] + 1e-8)


def lamb(w, g, lr, t, s):
    s["m"] = 0.9 * s.get("m", 0) + 0.1 * g
    s["v"] = 0.999 * s.get("v", 0) + 0.001 * g * g
    m_hat = s["m"] / (1 - 0.9 ** (t + 1))
    v_hat = s["v"] / (1 - 0.999 ** (t + 1))
    d = m_hat / (np.sqrt(v_hat) + 1e-6)
    return w - lr * np.linalg.norm(w) / np.linalg.norm(d) * d


def lars(w, g, lr, t, s):
    local = lr * 0.0001 * np.linalg.norm(w) / (np.linalg.norm(g) + 1e-9)
    s["m"] = 0.9 * s.get("m", 0) - local * g
    return w + s["m"]


def clipped(w, g, lr, t, s):
    norm = np.linalg.norm(g)
    return w - lr * g * 0.05 / max(norm, 0.05)


OPTIMIZERS = {
    "sgd": (lambda: flow.optimizer.SGD(0.1, momentum=0), sgd),
    "sgd_momentum_default": (lambda: flow.optimizer.SGD(0.1), momentum),
    "adam_oneflow_default": (lambda: flow.optimizer.Adam(0.1), adam(False)),
    "adam_bias_correction": (lambda: flow.optimizer.Adam(0.1, do_bias_correction=True), adam(True)),
    "adamw": (lambda: flow.optimizer.AdamW(0.1, weight_decay=0.01), adamw),
    "rmsprop": (lambda: flow.optimizer.RMSProp(0.1), rmsprop),
    "lamb": (lambda: flow.optimizer.LAMB(0.1), lamb),
    "lars": (lambda: flow.optimizer.LARS(0.1), lars),
    "clip_by_global_norm": (lambda: flow.optimizer.SGD(
        0.1, momentum=0, grad_clipping=flow.optimizer.grad_clipping.by_global_norm(0.05)), clipped),
}


def _steps(make):
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0))
        make().minimize(w * w * a * 0.5)
        return w

    flow.load_variables({"w": W0})
    out = []
    for _ in range(5):
        job(A)
        out.append(flow.get_all_variables()["w"].numpy().copy())
    return out


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_matches_numpy(name):
    make, update = OPTIMIZERS[name]
    got = _steps(make)
    ref = np_reference(update)
    for step, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=f"step {step + 1}")


SCHEDULES = {
    "piecewise_constant": S.PiecewiseConstantScheduler([1, 3], [0.1, 0.05, 0.01]),
    "piecewise_scaling": S.PiecewiseScalingScheduler(0.1, [2, 4], [0.5, 0.1]),
    "cosine": S.CosineScheduler(0.1, 4, alpha=0.1),
    "linear_cosine": S.LinearCosineScheduler(0.1, 4),
    "polynomial": S.PolynomialScheduler(0.1, 3, power=2.0),
    "polynomial_cycle": S.PolynomialScheduler(0.1, 2, cycle=True),
    "exponential_staircase": S.ExponentialScheduler(0.1, 2, 0.5, staircase=True),
    "inverse_time": S.InverseTimeScheduler(0.1, 2, 0.5),
    "natural_exp": S.NaturalExpScheduler(0.1, 2, 0.5),
    "linear_warmup": S.CosineScheduler(0.1, 10, warmup=S.warmup.linear(2, 0.5)),
    "constant_warmup": S.PiecewiseConstantScheduler([], [0.1], warmup=S.warmup.constant(3, 0.1)),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_matches_numpy(name):
    sched = SCHEDULES[name]
    got = _steps(lambda: flow.optimizer.SGD(sched, momentum=0))
    ref = np_reference(sgd, lr_fn=sched.numpy_lr)
    for step, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6, err_msg=f"step {step + 1}")


def test_piecewise_constant_uses_less_or_equal():
    sched = S.PiecewiseConstantScheduler([1], [1.0, 2.0])
    assert [sched.numpy_lr(t) for t in range(3)] == [1.0, 1.0, 2.0]


def test_l2_regularizer_adds_to_gradient():
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0),
                              regularizer=flow.regularizers.l2(0.5))
        flow.optimizer.SGD(0.1, momentum=0).minimize(w * w * a * 0.5)
        return w

    flow.load_variables({"w": W0})
    job(A)
    expected = W0 - 0.1 * (A * W0 / 4 + 0.5 * W0)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), expected, rtol=1e-6)


def test_old_api_primary_lr_and_add_loss(capsys):
    config = flow.FunctionConfig()
    config.train.primary_lr(0.1)
    config.train.model_update_conf({"naive_conf": {}})
    assert "deprecated" in capsys.readouterr().out

    @flow.global_function(type="train", function_config=config)
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0))
        flow.losses.add_loss(w * w * a * 0.5)
        return w

    with pytest.warns(DeprecationWarning):
        flow.load_variables({"w": W0})
    job(A)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), W0 - 0.1 * A * W0 / 4, rtol=1e-6)
