"""Optimizers and LR schedules against step-by-step NumPy references written from OneFlow
0.5's kernels (model_update_kernel_util.h/.cpp, autograd.cpp, learning_rate_schedule_kernel):
float64 arithmetic on OneFlow's float32 attributes, float32 jobs, 5 steps."""
import math

import types

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.train import lr_schedules as S

A = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
C = np.array([0.25, 1.5, -1.0], np.float32)
W0 = np.array([0.5, 0.25, -1.0, 2.0], np.float32)
B0 = np.array([-0.75, 0.5, 1.25], np.float32)
RTOL, ATOL = 2e-6, 1e-7


def f32(x):
    """A OneFlow float attribute as the kernels see it."""
    return float(np.float32(x))


def fastpow32(beta, n):
    """OneFlow's float32 Fastpow (square-and-multiply)."""
    a, ans = np.float32(beta), np.float32(1)
    while n:
        if n & 1:
            ans = np.float32(ans * a)
        a = np.float32(a * a)
        n >>= 1
    return ans


def bias_correction(beta, t):
    """adam_bias_correction_factor at train step t (0-based): 1 - beta**(t+1) in float32."""
    return float(np.float32(1) - fastpow32(beta, t + 1))


# -- NumPy references (one variable; s is its state dict) ------------------------------
def sgd(wd=0.0):
    def update(w, g, lr, t, s):
        return w - lr * (g + f32(wd) * w)
    return update


def momentum(beta=0.9, wd=0.0):
    def update(w, g, lr, t, s):
        s["m"] = f32(beta) * s.get("m", 0) - lr * g
        return w + s["m"] - lr * f32(wd) * w
    return update


def adam(b1=0.9, b2=0.999, eps=1e-8, bc=False, wd=0.0):
    def update(w, g, lr, t, s):
        s["m"] = f32(b1) * s.get("m", 0) + (1 - f32(b1)) * g
        s["v"] = f32(b2) * s.get("v", 0) + (1 - f32(b2)) * g * g
        bc1, bc2 = (bias_correction(b1, t), bias_correction(b2, t)) if bc else (1.0, 1.0)
        denom = np.sqrt(s["v"]) / math.sqrt(bc2) + f32(eps)
        return w - lr / bc1 * (s["m"] / denom) - lr * f32(wd) * w
    return update


def lamb(b1=0.9, b2=0.999, eps=1e-6, wd=0.0):
    def update(w, g, lr, t, s):
        dt = s.get("dtype", np.float32)  # beta_t are state variables of the model's dtype
        s["b1t"] = float(dt(s.get("b1t", f32(b1)) * f32(b1)))
        s["b2t"] = float(dt(s.get("b2t", f32(b2)) * f32(b2)))
        s["m"] = f32(b1) * s.get("m", 0) + (1 - f32(b1)) * g
        s["v"] = f32(b2) * s.get("v", 0) + (1 - f32(b2)) * g * g
        diff = (s["m"] / (1 - s["b1t"])) / (np.sqrt(s["v"] / (1 - s["b2t"])) + f32(eps))
        ratio = np.linalg.norm(w) / np.linalg.norm(diff)
        return w - lr * ratio * (diff + f32(wd) * w)
    return update


def lars(beta=0.9, eps=1e-9, coeff=1e-4, wd=0.0):
    def update(w, g, lr, t, s):
        wn, gn = np.linalg.norm(w), np.linalg.norm(g)
        local = lr * f32(coeff) * wn / (f32(eps) + gn + f32(wd) * wn)
        s["m"] = f32(beta) * s.get("m", 0) - local * g
        return w + s["m"] - local * f32(wd) * w
    return update


def rmsprop(d=0.99, eps=1e-8, centered=False):
    def update(w, g, lr, t, s):
        s["ms"] = (1 - f32(d)) * g * g + f32(d) * s.get("ms", 0)
        denom = s["ms"]
        if centered:
            s["mg"] = (1 - f32(d)) * g + f32(d) * s.get("mg", 0)
            denom = s["ms"] - s["mg"] ** 2
        return w - lr * g / np.sqrt(denom + f32(eps))
    return update


def reference(updates, steps=5, lr_fn=lambda t: f32(0.1), clip=None, l2=None,
              dtype=np.float32):
    """{"w": [...], "b": [...]}: the variables after each step for loss
    sum(w*w*A/2) + sum(b*b*C/2) (gradients A*w and C*b); `clip` covers the variables that
    have an update."""
    vals = {"w": W0.astype(np.float64), "b": B0.astype(np.float64)}
    coef = {"w": A.astype(np.float64), "b": C.astype(np.float64)}
    states = {n: {"dtype": dtype} for n in vals}
    out = {n: [] for n in vals}
    for t in range(steps):
        grads = {n: coef[n] * vals[n] for n in vals}
        if l2:
            grads = {n: g + f32(l2) * vals[n] for n, g in grads.items()}
        if clip is not None:
            norm = math.sqrt(sum(float(np.sum(g * g)) for n, g in grads.items()
                                 if updates.get(n) is not None))
            grads = {n: g * min(1 / norm, 1 / f32(clip)) for n, g in grads.items()}
        for n in vals:
            if updates.get(n) is not None:
                vals[n] = updates[n](vals[n], grads[n], lr_fn(t), t, states[n])
            out[n].append(vals[n].copy())
    return out


def train(make_opt, steps=5, config=None, l2=None, names=("w", "b"), dtype=flow.float32):
    """Run the two-variable job `steps` times; the variables after each step."""
    reg = flow.regularizers.l2(l2) if l2 else None
    np_dtype = flow.convert_oneflow_dtype_to_numpy_dtype(dtype)

    @flow.global_function(type="train", function_config=config)
    def job(a: tp.Numpy.Placeholder((4,), dtype=dtype),
            c: tp.Numpy.Placeholder((3,), dtype=dtype)) -> tp.Numpy:
        w = flow.get_variable(names[0], (4,), dtype=dtype, initializer=flow.zeros_initializer(),
                              regularizer=reg)
        b = flow.get_variable(names[1], (3,), dtype=dtype, initializer=flow.zeros_initializer(),
                              regularizer=reg)
        loss = flow.math.reduce_sum(w * w * a * 0.5) + flow.math.reduce_sum(b * b * c * 0.5)
        make_opt().minimize(loss)
        return loss

    flow.load_variables({names[0]: W0.astype(np_dtype), names[1]: B0.astype(np_dtype)})
    out = {"w": [], "b": []}
    for _ in range(steps):
        job(A.astype(np_dtype), C.astype(np_dtype))
        values = flow.get_all_variables()
        out["w"].append(values[names[0]].numpy().copy())
        out["b"].append(values[names[1]].numpy().copy())
    return out


def assert_steps(got, ref, rtol=RTOL, atol=ATOL):
    for n in ref:
        for step, (a, b) in enumerate(zip(got[n], ref[n])):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{n} step {step + 1}")


optim = flow.optimizer
OPTIMIZERS = {
    "sgd": (lambda: optim.SGD(0.1, momentum=0), sgd()),
    "sgd_momentum_default": (lambda: optim.SGD(0.1), momentum()),
    "sgdw": (lambda: optim.SGDW(0.1, momentum=0, weight_decay=0.05), sgd(wd=0.05)),
    "sgdw_momentum": (lambda: optim.SGDW(0.1, momentum=0.8, weight_decay=0.05),
                      momentum(0.8, wd=0.05)),
    "adam_oneflow_default": (lambda: optim.Adam(0.1), adam()),
    "adam_bias_correction": (lambda: optim.Adam(0.1, 0.8, 0.9, 1e-3, do_bias_correction=True),
                             adam(0.8, 0.9, 1e-3, bc=True)),
    "adamw": (lambda: optim.AdamW(0.1, weight_decay=0.01), adam(wd=0.01)),
    "adamw_bias_correction": (lambda: optim.AdamW(0.1, do_bias_correction=True, weight_decay=0.3),
                              adam(bc=True, wd=0.3)),
    "lazy_adam_dense": (lambda: optim.LazyAdam(0.1, beta2=0.99), adam(b2=0.99, bc=True)),
    "rmsprop": (lambda: optim.RMSProp(0.1), rmsprop()),
    "rmsprop_centered": (lambda: optim.RMSProp(0.1, 0.9, 1e-6, centered=True),
                         rmsprop(0.9, 1e-6, True)),
    "lamb": (lambda: optim.LAMB(0.1), lamb()),
    "lamb_weight_decay": (lambda: optim.LAMB(0.1, 0.8, 0.9, 1e-4, weight_decay=0.1),
                          lamb(0.8, 0.9, 1e-4, 0.1)),
    "lars": (lambda: optim.LARS(0.1), lars()),
    "lars_weight_decay": (lambda: optim.LARS(0.1, 0.8, 1e-6, 0.01, weight_decay=0.2),
                          lars(0.8, 1e-6, 0.01, 0.2)),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_matches_oneflow_kernel(name):
    make, update = OPTIMIZERS[name]
    assert_steps(train(make), reference({"w": update, "b": update}))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_on_float64_variables(name):
    """OneFlow's update kernels take float64 models too (float32 attributes, lr and bias
    corrections): the float64 reference then holds to ~1e-12."""
    make, update = OPTIMIZERS[name]
    got = train(make, dtype=flow.float64)
    assert got["w"][0].dtype == np.float64
    ref = reference({"w": update, "b": update}, dtype=np.float64)
    assert_steps(got, ref, rtol=1e-11, atol=1e-13)


def test_optimizer_state_variables_have_oneflow_names():
    train(lambda: optim.LAMB(0.1), steps=1)
    names = set(flow.get_all_variables())
    assert {"w-m", "w-v", "w-beta1_t", "w-beta2_t", "System-Train-TrainStep-job"} <= names
    np.testing.assert_array_equal(flow.get_all_variables()["w-beta1_t"].numpy(),
                                  np.float32([np.float32(0.9) * np.float32(0.9)]))


def test_lamb_of_a_zero_variable_takes_the_unit_ratio():
    """||w|| = 0 (a zero-initialized variable's first step): OneFlow's trust ratio is 1, so
    w moves by lr * (adam_diff + wd*w); from the second step on the ratio is the norms'."""
    b1, b2, eps, wd, lr = 0.8, 0.9, 1e-4, 0.1, f32(0.1)

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(w * w * a * 0.5 + w * a)
        optim.LAMB(0.1, b1, b2, eps, weight_decay=wd).minimize(loss)
        return loss

    w, s, update = np.zeros(4), {}, lamb(b1, b2, eps, wd)
    for step in range(3):
        job(A)
        g = A * w + A
        if step == 0:   # the reference's ratio is ||w|| / ||diff||: 0 here, 1 in OneFlow
            s["b1t"], s["b2t"] = float(f32(b1) * f32(b1)), float(f32(b2) * f32(b2))
            s["m"], s["v"] = (1 - f32(b1)) * g, (1 - f32(b2)) * g * g
            w = w - lr * (s["m"] / (1 - s["b1t"])) / (np.sqrt(s["v"] / (1 - s["b2t"])) + f32(eps))
        else:
            w = update(w, g, lr, step, s)
        np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), w, rtol=RTOL,
                                   atol=ATOL, err_msg=f"step {step + 1}")


def _lamb_steps(grouped, monkeypatch, steps=4):
    """Variables after 4 steps of a three-variable LAMB job (weight decay on two, clipping,
    a dynamic loss scale, the third step's gradients not finite), with the group's
    per-variable scalars as vectors (update_rules.lamb_group) or one `lamb` each."""
    from onnxjob.train.optimizer import LAMB, Optimizer
    if not grouped:
        monkeypatch.setattr(LAMB, "_update_group", Optimizer._update_group)
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.ones_initializer())
        u = flow.get_variable("u", (2, 4), initializer=flow.constant_initializer(0.5))
        bias = flow.get_variable("bias", (4,), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(w * w * a + flow.math.reduce_sum(u, axis=0) * a + bias * a)
        optim.LAMB(0.1, 0.8, 0.9, 1e-4, weight_decay=0.1, weight_decay_excludes=["bias"],
                   grad_clipping=optim.grad_clipping.by_global_norm(1.0),
                   loss_scale_policy=optim.loss_scale.dynamic_loss_scale()).minimize(loss)
        return loss

    for step in range(steps):
        job(A if step != 2 else np.array([1.0, np.nan, 2.0, np.inf], np.float32))
    return {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}


def test_lamb_over_a_group_gives_each_variable_what_its_own_lamb_gives(monkeypatch):
    """The same values, but for the last bits: w and bias (one shape) are updated as the
    rows of one matrix, whose norms are row sums, added in another order than a
    variable's own sum (the trust ratio 1 ulp apart)."""
    grouped = _lamb_steps(True, monkeypatch)
    one_by_one = _lamb_steps(False, monkeypatch)
    assert set(grouped) == set(one_by_one) and "u-beta2_t" in grouped
    for name, value in one_by_one.items():
        np.testing.assert_allclose(grouped[name], value, rtol=1e-6, atol=0, err_msg=name)
    assert not np.array_equal(grouped["w"], _lamb_steps(True, monkeypatch, steps=3)["w"])


def test_lamb_stacks_small_variables_of_one_shape():
    """The small variables of one shape and gradient factor are one stack (rows of one
    matrix); the others are updated one by one."""
    from onnxjob.train.update_rules import _lamb_stacks

    def item(shape, factor):
        return (types.SimpleNamespace(shape=shape), None, None, None, None, None, 0.0, factor)
    scale, clip = object(), object()
    items = [item((4,), scale), item((2, 4), scale), item((4,), scale), item((4,), clip),
             item((512, 256), scale), item((512, 256), scale)]
    order, stacks = _lamb_stacks(items)
    assert stacks == [[0, 2]] and order == [0, 2, 1, 3, 4, 5]


def _small_variables_steps(make_opt, grouped, monkeypatch, skip_step=True):
    """Every variable after 4 steps of a job with three small variables (two share a
    weight decay rate; an l2 regularizer on one), with them updated as one
    (train/flat_groups.py) or one by one; the third step's gradients not finite under
    the dynamic loss scale."""
    from onnxjob.train import flat_groups
    if not grouped:
        monkeypatch.setattr(flat_groups, "small_groups", lambda *args: [])
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.ones_initializer())
        u = flow.get_variable("u", (2, 4), initializer=flow.constant_initializer(0.5),
                              regularizer=flow.regularizers.l2(0.01))
        bias = flow.get_variable("bias", (4,), initializer=flow.zeros_initializer())
        loss = flow.math.reduce_sum(w * w * a + flow.math.reduce_sum(u, axis=0) * a + bias * a)
        make_opt().minimize(loss)
        return loss

    for step in range(4):
        bad = skip_step and step == 2
        job(A if not bad else np.array([1.0, np.nan, 2.0, np.inf], np.float32))
    return {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}


_SCALE = optim.loss_scale.dynamic_loss_scale
FLAT_OPTIMIZERS = {
    "momentum": lambda: optim.SGD(0.1, momentum=0.9, loss_scale_policy=_SCALE()),
    "sgdw_clipped": lambda: optim.SGDW(
        0.1, momentum=0.8, weight_decay=0.05, weight_decay_excludes=["bias"],
        grad_clipping=optim.grad_clipping.by_global_norm(1.0), loss_scale_policy=_SCALE()),
    "adamw_bias_correction": lambda: optim.AdamW(
        0.1, do_bias_correction=True, weight_decay=0.3, weight_decay_excludes=["bias"],
        loss_scale_policy=_SCALE()),
    "rmsprop_centered": lambda: optim.RMSProp(0.1, centered=True, loss_scale_policy=_SCALE()),
    "sgd_plain": lambda: optim.SGD(0.1, momentum=0),
}


@pytest.mark.parametrize("name", sorted(FLAT_OPTIMIZERS))
def test_small_variables_updated_as_one_get_what_their_own_updates_give(name, monkeypatch):
    make = FLAT_OPTIMIZERS[name]
    skip = name != "sgd_plain"
    grouped = _small_variables_steps(make, True, monkeypatch, skip)
    one_by_one = _small_variables_steps(make, False, monkeypatch, skip)
    assert set(grouped) == set(one_by_one)
    for variable, value in one_by_one.items():
        np.testing.assert_array_equal(grouped[variable], value, err_msg=variable)
    if skip:    # the non-finite step left every variable as the second step made it
        assert np.isfinite(grouped["w"]).all()


def test_small_variables_of_a_step_are_updated_as_one():
    """The three small variables of the job above: one concatenated update, split back."""
    from onnxjob.graph.compiler import compile_job
    from onnxjob.runtime.session import default_session
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        ws = [flow.get_variable(f"v{k}", (4,), initializer=flow.ones_initializer())
              for k in range(3)]
        loss = flow.math.reduce_sum((ws[0] * ws[1] + ws[2]) * a)
        optim.SGD(0.1, momentum=0.9).minimize(loss)
        return loss

    session = default_session()
    graph = compile_job(session.jobs["job"], session, 0).model.graph
    ops = [n.op_type for n in graph]
    assert ops.count("Split") == 2      # the variables and their momenta
    assert ops.count("Concat") >= 3     # the variables, their gradients and momenta


def test_lr_schedule_with_warmup_feeds_adam():
    sched = S.PolynomialScheduler(0.1, 4, 0.0, warmup=S.warmup.linear(2, 0.0))
    ref = reference({"w": adam(bc=True), "b": adam(bc=True)}, lr_fn=sched.numpy_lr)
    assert_steps(train(lambda: optim.Adam(sched, do_bias_correction=True)), ref)


@pytest.mark.parametrize("clip", [0.5, 1.0, 50.0])
def test_clip_by_global_norm_as_oneflow(clip):
    """g * min(1/global_norm, 1/clip_norm) over the optimizer's variables, after l2."""
    clipping = optim.grad_clipping.by_global_norm(clip)
    make = lambda: optim.SGD(0.1, momentum=0, grad_clipping=clipping)  # noqa: E731
    ref = reference({"w": sgd(), "b": sgd()}, clip=clip, l2=0.25)
    assert_steps(train(make, l2=0.25), ref)


def test_l2_regularizer_adds_to_gradient():
    ref = reference({"w": momentum(), "b": momentum()}, l2=0.5)
    assert_steps(train(lambda: optim.SGD(0.1), l2=0.5), ref)


@pytest.mark.parametrize("cpu, fuse, clip, sign_at_zero", [
    # where OneFlow runs l1_l2_regularize_gradient: its CUDA kernel computes
    # l1 * ((w >= 0) - (w <= 0)), 0 at 0, its CPU kernel l1 * (w >= 0 ? 1 : -1)
    (False, False, None, 0.0),      # a program that says nothing ran on GPUs
    (True, False, None, 1.0),       # placed on CPUs
    # FuseUpdateOpsPass folds the regularizer into the update, whose kernels (CPU and
    # CUDA, model_update_kernel_util.h) give 0 at 0 ...
    (True, True, None, 0.0),
    # ... unless clipping reads the regularized gradient: not folded
    (True, True, 100.0, 1.0),
])
def test_l1_regularizer_term_at_zero(cpu, fuse, clip, sign_at_zero):
    config = flow.function_config()
    config.enable_fuse_model_update_ops(fuse)
    if cpu:
        config.default_placement_scope(flow.scope.placement("cpu", "0:0"))
    clipping = clip and optim.grad_clipping.by_global_norm(clip)

    @flow.global_function(type="train", function_config=config)
    def job(a: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.zeros_initializer(),
                              regularizer=flow.regularizers.l1(0.5))
        optim.SGD(0.1, momentum=0, grad_clipping=clipping).minimize(
            flow.math.reduce_sum(w * a))
        return w

    a = np.array([1.0, 1.0, 1.0], np.float32)
    flow.load_variables({"w": np.array([0.0, -2.0, 3.0], np.float32)})
    job(a)
    g = a + 0.5 * np.array([sign_at_zero, -1.0, 1.0])
    if clip:
        g = g * min(1 / np.linalg.norm(g), 1 / clip)
    expected = np.array([0.0, -2.0, 3.0]) - 0.1 * g
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), expected, rtol=1e-6)


def test_l1_regularizer_of_a_variable_placed_on_cpus_in_a_gpu_job():
    """The variable's own placement decides (OneFlow puts the regularizer beside it)."""
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0"):
            on_cpu = flow.get_variable("on_cpu", (2,), initializer=flow.zeros_initializer(),
                                       regularizer=flow.regularizers.l1(0.5))
        on_gpu = flow.get_variable("on_gpu", (2,), initializer=flow.zeros_initializer(),
                                   regularizer=flow.regularizers.l1(0.5))
        optim.SGD(0.1, momentum=0).minimize(flow.math.reduce_sum((on_cpu + on_gpu) * a))
        return a

    job(np.zeros(2, np.float32))
    values = flow.get_all_variables()
    np.testing.assert_allclose(values["on_cpu"].numpy(), [-0.05, -0.05], rtol=1e-6)
    np.testing.assert_array_equal(values["on_gpu"].numpy(), [0.0, 0.0])


# -- weight decay patterns, variables=, CombinedOptimizer --------------------------------
@pytest.mark.parametrize("kw, decayed", [
    (dict(weight_decay_includes="weight"), "w"),
    (dict(weight_decay_includes=["^nothing", "ght$"]), "w"),
    (dict(weight_decay_excludes="bias"), "w"),
    (dict(weight_decay_excludes=["ias", "zzz"]), "w"),
    (dict(), "both"),
    # an empty list is none given: OneFlow's wrappers add no includes message for it
    (dict(weight_decay_includes=[]), "both"),
    (dict(weight_decay_excludes=[]), "both"),
])
def test_weight_decay_patterns_partial_match(kw, decayed):
    make = lambda: optim.AdamW(0.1, weight_decay=0.3, **kw)  # noqa: E731
    with_wd, without = adam(wd=0.3), adam()
    updates = {"w": with_wd, "b": with_wd if decayed == "both" else without}
    assert_steps(train(make, names=("layer/weight", "layer/bias")), reference(updates))


@pytest.mark.parametrize("opt", ["SGDW", "LAMB", "LARS"])
def test_weight_decay_excludes_for_every_optimizer_taking_it(opt):
    refs = {"SGDW": (momentum, dict(wd=0.2)), "LAMB": (lamb, dict(wd=0.2)),
            "LARS": (lars, dict(wd=0.2))}
    fn, kw = refs[opt]
    kind = getattr(optim, opt)
    make = lambda: kind(0.1, weight_decay=0.2, weight_decay_excludes="bias")  # noqa: E731
    ref = reference({"w": fn(**kw), "b": fn()})
    assert_steps(train(make, names=("layer/weight", "layer/bias")), ref)


def test_weight_decay_includes_and_excludes_together_is_an_error():
    with pytest.raises(TraceError, match="cannot both be set"):
        optim.AdamW(0.1, weight_decay=0.1, weight_decay_includes="a", weight_decay_excludes="b")
    # without a rate OneFlow reads neither (its assert sits under `if weight_decay`)
    optim.AdamW(0.1, weight_decay_includes="a", weight_decay_excludes="b")


@pytest.mark.parametrize("opt", ["SGD", "SGDW", "Adam", "AdamW", "LazyAdam", "RMSProp",
                                 "LAMB", "LARS"])
def test_variables_list_and_callable(opt):
    got = train(lambda: getattr(optim, opt)(0.1, variables=["w"]), steps=2)
    np.testing.assert_array_equal(got["b"][-1], B0)
    assert not np.array_equal(got["w"][-1], W0)
    flow.clear_default_session()
    got = train(lambda: getattr(optim, opt)(0.1, variables=lambda: ["b"]), steps=2)
    np.testing.assert_array_equal(got["w"][-1], W0)
    assert not np.array_equal(got["b"][-1], B0)


def test_combined_optimizer_updates_each_variable_with_its_optimizer():
    sched = S.PiecewiseConstantScheduler([2], [0.1, 0.05])
    make = lambda: optim.CombinedOptimizer([  # noqa: E731
        optim.SGD(0.2, momentum=0.5, variables=["w"]),
        optim.Adam(sched, do_bias_correction=True, variables=["b"],
               grad_clipping=optim.grad_clipping.by_global_norm(0.5))])
    got = train(make)
    ref_w = reference({"w": momentum(0.5), "b": None}, lr_fn=lambda t: f32(0.2))
    ref_b = reference({"w": None, "b": adam(bc=True)}, lr_fn=sched.numpy_lr, clip=0.5)
    assert_steps(got, {"w": ref_w["w"], "b": ref_b["b"]})


def test_combined_optimizer_overlap_is_an_error():
    make = lambda: optim.CombinedOptimizer([optim.SGD(0.1, variables=["w", "b"]),  # noqa: E731
                                        optim.Adam(0.1, variables=["b"])])
    with pytest.raises(TraceError, match="'b' is given to optimizers 0 and 1"):
        train(make, steps=1)


# -- indexed slices (sparse) updates -------------------------------------------------------
TABLE0 = np.arange(30, dtype=np.float32).reshape(10, 3) / 7 - 2
IDS = [np.array([[1, 3], [3, 8]], np.int32), np.array([[0, 1], [1, 1]], np.int32),
       np.array([[9, 8], [3, 0]], np.int32)]


def sparse_config(names=("emb",)):
    config = flow.FunctionConfig()
    config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=list(names))))
    return config


def train_embedding(make_opt, config=None, scale=None, extra_use=False, read=None):
    """loss = sum(gather(read(table [* scale]), ids) * k); the table after each step."""
    k = np.array([1.0, -2.0, 0.5], np.float32)

    @flow.global_function(type="train", function_config=config)
    def job(ids: tp.Numpy.Placeholder((2, 2), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("emb", (10, 3), initializer=flow.zeros_initializer())
        params = table * scale if scale is not None else table
        params = read(params) if read is not None else params
        loss = flow.math.reduce_sum(flow.gather(params, ids) * k)
        if extra_use:
            loss = loss + flow.math.reduce_sum(table * table) * 0.01
        make_opt().minimize(loss)
        return table

    flow.load_variables({"emb": TABLE0})
    out = []
    for ids in IDS:
        job(ids)
        out.append(flow.get_all_variables()["emb"].numpy().copy())
    return out


def sparse_reference(update, scale=1.0, lr=0.1):
    """OneFlow's indexed_slices_*_update: the dense update on the unique looked-up rows
    (duplicate ids' gradients summed), every other row of model and state untouched."""
    k = np.array([1.0, -2.0, 0.5])
    w = TABLE0.astype(np.float64)
    states = [{} for _ in range(10)]
    out = []
    for t, ids in enumerate(IDS):
        g = np.zeros_like(w)
        np.add.at(g, ids.reshape(-1), np.broadcast_to(k * scale, (ids.size, 3)))
        for row in np.unique(ids):
            w[row] = update(w[row], g[row], f32(lr), t, states[row])
        out.append(w.copy())
    return out


def assert_sparse(got, ref):
    for t, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"step {t + 1}")
        untouched = np.setdiff1d(np.arange(10), np.concatenate([i.ravel() for i in IDS[:t + 1]]))
        np.testing.assert_array_equal(a[untouched], TABLE0[untouched])
        previous = got[t - 1] if t else TABLE0
        missed = np.setdiff1d(np.arange(10), IDS[t].ravel())
        np.testing.assert_array_equal(a[missed], previous[missed])  # bit-identical rows


SPARSE = {
    "sgd": (lambda: optim.SGD(0.1, momentum=0), sgd()),
    "momentum": (lambda: optim.SGD(0.1, momentum=0.9), momentum()),
    "sgdw_momentum": (lambda: optim.SGDW(0.1, momentum=0.9, weight_decay=0.5),
                      momentum(wd=0.5)),
    "adam_bias_correction": (lambda: optim.Adam(0.1, do_bias_correction=True), adam(bc=True)),
    "adamw": (lambda: optim.AdamW(0.1, weight_decay=0.5), adam(wd=0.5)),
    "lazy_adam": (lambda: optim.LazyAdam(0.1), adam(bc=True)),
}


@pytest.mark.parametrize("name", SPARSE)
def test_indexed_slices_update_touches_only_looked_up_rows(name):
    make, update = SPARSE[name]
    assert_sparse(train_embedding(make, sparse_config()), sparse_reference(update))


def test_indexed_slices_keeps_optimizer_state_rows():
    train_embedding(lambda: optim.Adam(0.1), sparse_config())
    m = flow.get_all_variables()["emb-m"].numpy()
    np.testing.assert_array_equal(m[[2, 4, 5, 6, 7]], 0.0)
    assert np.all(m[[0, 1, 3, 8, 9]] != 0)


def test_indexed_slices_through_a_scalar_multiply():
    got = train_embedding(lambda: optim.SGD(0.1, momentum=0.9), sparse_config(), scale=2.0)
    assert_sparse(got, sparse_reference(momentum(), scale=2.0))


def test_lazy_adam_without_the_config_updates_every_row_as_oneflow_and_says_so():
    """OneFlow 0.2-0.5's adam_optm.cpp reads lazy_adam_conf into a dense adam_update; only
    indexed_slices_optimizer_conf makes it row-sparse (test above). The documentation's
    promise of row updates is a trap: said once."""
    with pytest.warns(UserWarning, match=r"LazyAdam updates every row of 'emb'.*"
                                         r"indexed_slices_optimizer_conf") as caught:
        got = train_embedding(lambda: optim.LazyAdam(0.1))
    assert sum("LazyAdam" in str(w.message) for w in caught) == 1
    for t, (a, b) in enumerate(zip(got, dense_reference(adam(bc=True)))):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"step {t + 1}")
    assert not np.array_equal(got[1][[3, 8]], got[0][[3, 8]])  # moments move unseen rows


def dense_reference(update, clip=None, self_coef=0.0, lr=0.1):
    """The dense update of every row (gradient rows of ids not looked up are 0)."""
    k = np.array([1.0, -2.0, 0.5])
    w = TABLE0.astype(np.float64)
    state = {}
    out = []
    for t, ids in enumerate(IDS):
        g = np.zeros_like(w)
        np.add.at(g, ids.reshape(-1), np.broadcast_to(k, (ids.size, 3)))
        g = g + self_coef * w
        if clip is not None:
            g = g * min(1 / np.linalg.norm(g), 1 / f32(clip))
        w = update(w, g, f32(lr), t, state)
        out.append(w.copy())
    return out


def _cast_with_gradient_distribute(table):
    return flow.parallel_cast(table, distribute=flow.distribute.broadcast(),
                              gradient_distribute=flow.distribute.broadcast())


def test_indexed_slices_through_a_parallel_cast_without_gradient_distribute():
    """OneFlow binds the gradient through such a cast without an op of its own."""
    got = train_embedding(lambda: optim.SGD(0.1, momentum=0.9), sparse_config(),
                          read=lambda t: flow.parallel_cast(t, flow.distribute.broadcast()))
    assert_sparse(got, sparse_reference(momentum()))


@pytest.mark.parametrize("case", ["not_included", "used_elsewhere", "clipped", "rmsprop",
                                  "gradient_distribute"])
def test_dense_update_where_oneflow_keeps_it_dense(case):
    """Not in include_op_names, a gradient that is not one gather's, clipping (its scale
    op breaks OneFlow's pattern), an optimizer without indexed-slices kernel, a table read
    through parallel_cast with gradient_distribute (its backward is a parallel_cast op,
    which IndexedSlicesOptimizerRewritePass does not step over)."""
    config = sparse_config(["other"] if case == "not_included" else ["emb"])
    clip = optim.grad_clipping.by_global_norm(2.0) if case == "clipped" else None
    make = (lambda: optim.RMSProp(0.1)) if case == "rmsprop" else (  # noqa: E731
        lambda: optim.SGD(0.1, momentum=0.9, grad_clipping=clip))
    read = _cast_with_gradient_distribute if case == "gradient_distribute" else None
    got = train_embedding(make, config, extra_use=case == "used_elsewhere", read=read)
    ref = dense_reference(rmsprop() if case == "rmsprop" else momentum(),
                          clip=2.0 if case == "clipped" else None,
                          self_coef=0.02 if case == "used_elsewhere" else 0.0)
    for t, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"step {t + 1}")
    if case != "rmsprop":  # rows 3, 8 left out of step 2 still move with their momentum
        assert not np.array_equal(got[1][[3, 8]], got[0][[3, 8]])


def test_bad_indexed_slices_conf_is_an_error():
    config = flow.FunctionConfig()
    config.indexed_slices_optimizer_conf(["emb"])
    with pytest.raises(TraceError, match="include_op_names"):
        train_embedding(lambda: optim.SGD(0.1), config)


# -- train step, bias correction, loss scale, accumulation ---------------------------------
@pytest.mark.parametrize("beta", [0.9, 0.999, 0.5, 0.99999])
def test_adam_bias_correction_is_oneflow_float32_fastpow(beta):
    """A custom train step (train_step_lbn) far from 0: lr/bc1 and sqrt(bc2) exactly."""
    @flow.global_function(type="train")
    def job(step: tp.Numpy.Placeholder((1,), dtype=flow.int64),
            a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.zeros_initializer())
        optim.Adam(0.1, beta, beta, do_bias_correction=True,
               train_step_lbn=step.logical_blob_name).minimize(flow.math.reduce_sum(w * a))
        return w

    for t in [0, 1, 2, 6, 37, 1000, 123457]:
        flow.load_variables({"w": W0, "w-m": np.zeros(4, np.float32),
                             "w-v": np.zeros(4, np.float32)})
        job(np.array([t], np.int64), A)
        got = flow.get_all_variables()["w"].numpy()
        ref = adam(beta, beta, bc=True)(W0.astype(np.float64), A.astype(np.float64),
                                        f32(0.1), t, {})
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=f"t={t}")
    assert "System-Train-TrainStep-job" not in flow.get_all_variables()


@pytest.mark.parametrize("beta", [0.9, 0.999, 0.99999, 0.0, 1.0])
def test_bias_correction_factor_is_bit_exact(beta):
    """1 - Fastpow<float>(beta, step + 1), bit for bit, for small and large steps."""
    from onnxjob.train.update_rules import adam_bias_correction

    @flow.global_function(type="predict")
    def job(step: tp.Numpy.Placeholder((1,), dtype=flow.int64)) -> tp.Numpy:
        return adam_bias_correction(step, beta)

    for t in list(range(40)) + [127, 128, 1000, 65535, 123457, 2 ** 40 + 3]:
        assert job(np.array([t], np.int64)) == np.float32(1) - fastpow32(beta, t + 1), t


def test_static_loss_scale_of_a_power_of_two_matches_the_unscaled_reference():
    make = lambda: optim.Adam(0.1, loss_scale_factor=1024.0)  # noqa: E731
    assert_steps(train(make), reference({"w": adam(), "b": adam()}))
    with pytest.raises(TraceError, match="not both"):
        optim.SGD(0.1, loss_scale_factor=2.0,
                  loss_scale_policy=optim.loss_scale.static_loss_scale(2.0))


def test_dynamic_loss_scale_skips_a_step_with_non_finite_gradients():
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.zeros_initializer())
        optim.Adam(0.1, do_bias_correction=True,
               loss_scale_policy=optim.loss_scale.dynamic_loss_scale(increment_period=10)
               ).minimize(flow.math.reduce_sum(w * a))
        return w

    flow.load_variables({"w": W0})
    job(A)
    before = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    job(np.array([1.0, np.nan, 2.0, np.inf], np.float32))
    after = flow.get_all_variables()
    scale = "System-Train-DynamicLossScale-job-LossScale"
    for name, value in before.items():
        if not name.startswith("System-Train-DynamicLossScale-"):
            np.testing.assert_array_equal(after[name].numpy(), value, err_msg=name)
    assert after[scale].numpy()[0] == before[scale][0] / 2  # tests/test_loss_scale.py: more
    job(A)  # the next finite step is step 1 of Adam's bias correction
    ref = adam(bc=True)
    s = {}
    w = ref(W0.astype(np.float64), A.astype(np.float64), f32(0.1), 0, s)
    w = ref(w, A.astype(np.float64), f32(0.1), 1, s)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), w, rtol=RTOL)


def test_a_non_finite_gradient_of_one_small_variable_among_several_skips_the_step():
    """The small gradients are checked as one concatenation (update_rules.all_finite):
    an inf in one of them alone still skips the step for every variable."""
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,)), b: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.ones_initializer())
        u = flow.get_variable("u", (4,), initializer=flow.ones_initializer())
        big = flow.get_variable("big", (300, 300), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(w * a) + flow.math.reduce_sum(u * b) + \
            flow.math.reduce_mean(big)
        optim.SGD(0.1, momentum=0.9,
                  loss_scale_policy=optim.loss_scale.dynamic_loss_scale()).minimize(loss)
        return loss

    job(A, A)
    before = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    job(A, np.array([1.0, 2.0, np.inf, 3.0], np.float32))     # u's gradient alone
    after = flow.get_all_variables()
    for name in ("w", "u", "big", "w-momentum", "u-momentum"):
        np.testing.assert_array_equal(after[name].numpy(), before[name], err_msg=name)


def test_gradient_accumulation_over_one_step_is_the_plain_step():
    # (over several: tests/test_gradient_accumulation.py)
    config = flow.FunctionConfig()
    config.train.num_gradient_accumulation_steps(1)
    assert_steps(train(lambda: optim.SGD(0.1, momentum=0), config=config),
                 reference({"w": sgd(), "b": sgd()}))


# -- LR schedules ---------------------------------------------------------------------------
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
    got = train(lambda: optim.SGD(sched, momentum=0))
    assert_steps(got, reference({"w": sgd(), "b": sgd()}, lr_fn=sched.numpy_lr))


def test_schedule_rules_as_oneflow_kernel():
    assert [S.PiecewiseConstantScheduler([1], [1.0, 2.0]).numpy_lr(t) for t in range(3)] == \
        [1.0, 1.0, 2.0]
    # cycle: step 0 counts as step 1
    assert S.PolynomialScheduler(0.1, 2, 0.0, cycle=True).numpy_lr(0) == f32(0.05)
    # the base rate is a float32 attribute; the result is float32
    assert S.CosineScheduler(0.1, 4).numpy_lr(0) == f32(0.1)


def test_custom_scheduler_reads_the_job_blob():
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,)), lr: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.zeros_initializer())
        optim.SGD(optim.CustomScheduler(lr), momentum=0).minimize(flow.math.reduce_sum(w * a))
        return w

    flow.load_variables({"w": W0})
    job(A, np.float32([0.25]))
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), W0 - 0.25 * A, rtol=1e-6)


def test_custom_scheduler_by_logical_blob_name_and_bad_names():
    def define(lbn_of):
        @flow.global_function(type="train")
        def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
            w = flow.get_variable("w", (4,), initializer=flow.zeros_initializer())
            lr = flow.math.reduce_mean(a) * 0.0 + 0.5
            opt = optim.SGD(optim.CustomScheduler(lbn_of(lr)), momentum=0)
            opt.minimize(flow.math.reduce_sum(w * a))
            return w
        return job

    job = define(lambda lr: lr.logical_blob_name)
    flow.load_variables({"w": W0})
    job(A)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), W0 - 0.5 * A, rtol=1e-6)
    flow.clear_default_session()
    with pytest.raises(TraceError, match="CustomScheduler"):
        define(lambda lr: "no-such-blob")(A)


def test_train_step_lbn_must_name_an_int64_blob():
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.zeros_initializer())
        optim.SGD(0.1, train_step_lbn=a.logical_blob_name).minimize(flow.math.reduce_sum(w * a))
        return w

    with pytest.raises(TraceError, match="must be an int64 blob"):
        job(A)


# -- old API --------------------------------------------------------------------------------
def old_api_job(model_update_conf):
    config = flow.FunctionConfig()
    config.train.primary_lr(0.1)
    config.train.model_update_conf(model_update_conf)

    @flow.global_function(type="train", function_config=config)
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0))
        flow.losses.add_loss(w * w * a * 0.5)
        return w

    return job


def test_old_api_primary_lr_and_add_loss(capsys):
    job = old_api_job({"naive_conf": {}})
    assert "deprecated" in capsys.readouterr().out
    flow.load_variables({"w": W0})  # compiles the job: add_loss gives no warning (OneFlow 0.5)
    job(A)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), W0 - 0.1 * A * W0 / 4,
                               rtol=1e-6)


def test_minimize_replaces_the_losses_add_loss_declared_before_it():
    """As OneFlow's minimize (SetTrainConf replaces the train conf and its losses, then
    minimize adds its own): a loss given to add_loss and to minimize counts once, a loss
    only given to add_loss before minimize not at all; the same loss added again after
    minimize is refused, as OneFlow's autograd CHECK refuses it."""
    def trained(body):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
            w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0))
            body(w, a)
            return w
        flow.load_variables({"w": W0})
        job(A)
        return flow.get_all_variables()["w"].numpy()

    sgd = optim.SGD(optim.PiecewiseConstantScheduler([], [0.1]), momentum=0)
    expected = W0 - 0.1 * A * W0 / 4

    def both(w, a):
        loss = w * w * a * 0.5
        flow.losses.add_loss(loss)
        sgd.minimize(loss)

    def earlier_other(w, a):
        flow.losses.add_loss(flow.math.reduce_sum(w * 100.0))
        sgd.minimize(w * w * a * 0.5)

    np.testing.assert_allclose(trained(both), expected, rtol=1e-6)
    np.testing.assert_allclose(trained(earlier_other), expected, rtol=1e-6)

    def again_after(w, a):
        loss = w * w * a * 0.5
        sgd.minimize(loss)
        flow.losses.add_loss(loss)

    with pytest.raises(TraceError, match="already a loss of this job"):
        trained(again_after)


def test_a_second_optimizer_s_minimize_replaces_the_first_as_in_oneflow():
    """OneFlow accepts minimize() of two optimizers in one job and keeps the last (its
    SetTrainConf replaces the train conf): only it updates, on its own loss; said once."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0))
        optim.SGD(optim.PiecewiseConstantScheduler([], [5.0])).minimize(
            flow.math.reduce_sum(w * 100.0))
        optim.SGD(optim.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(
            w * w * a * 0.5)
        return w

    with pytest.warns(UserWarning, match=r"SGD.minimize\(\) replaces the SGD minimize\(\) "
                                         "set earlier in this job"):
        flow.load_variables({"w": W0})
    job(A)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), W0 - 0.1 * A * W0 / 4,
                               rtol=1e-6)


def test_an_optimizer_object_s_variables_are_fixed_by_the_first_job_as_in_oneflow():
    """OneFlow's Optimizer.Variables() is computed once per object, in the first job
    traced (by default that job's variables): one SGD object minimizing in two jobs with
    their own variables trains the first job's only; the second's stay, with a warning.
    A job sharing the first's variables trains them."""
    flow.clear_default_session()
    sgd = optim.SGD(optim.PiecewiseConstantScheduler([], [0.1]), momentum=0)

    @flow.global_function(type="train")
    def job_a() -> tp.Numpy:
        a = flow.get_variable("a", (1,), initializer=flow.constant_initializer(1.0))
        sgd.minimize(a * a)
        return a

    @flow.global_function(type="train")
    def job_b() -> tp.Numpy:
        b = flow.get_variable("b", (1,), initializer=flow.constant_initializer(1.0))
        sgd.minimize(b * b)
        return b

    @flow.global_function(type="train")
    def job_c() -> tp.Numpy:
        a = flow.get_variable("a", (1,), initializer=flow.constant_initializer(1.0))
        sgd.minimize(a * a)
        return a

    with pytest.warns(UserWarning, match=r"job 'job_b': this SGD object's variables were "
                                         r"fixed in job 'job_a'.*'b' are not updated here"):
        job_a()     # (the session starts: every job is traced, in definition order)
    job_b(), job_c()
    variables = flow.get_all_variables()
    np.testing.assert_allclose(variables["b"].numpy(), [1.0])      # not trained
    np.testing.assert_allclose(variables["a"].numpy(), [0.8 * 0.8])     # two steps


def test_old_api_adam_conf_defaults_to_bias_correction():
    job = old_api_job({"adam_conf": {}})
    flow.load_variables({"w": W0})
    job(A)
    ref = adam(bc=True)(W0.astype(np.float64), (A * W0 / 4).astype(np.float64), f32(0.1), 0, {})
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), ref, rtol=RTOL)


# Every kind of OneFlow's LearningRateDecayConf given to the old API as a dict, with the
# learning rate of train steps 0..4 written from learning_rate_schedule_kernel.cpp
# (primary_lr 0.1; a piecewise_constant_conf's values replace it, its warmup starts from it).
_LIN_COS = [0.1 * (((4 - t) / 4) * 0.5 * (1 + math.cos(math.pi * t / 4)) + 0.001)
            for t in range(5)]
OLD_API_DECAYS = {
    "piecewise_scaling": ({"learning_rate_decay": {"piecewise_scaling_conf": {
        "boundaries": [1, 3], "scales": [1.0, 0.5, 0.1]}}}, [0.1, 0.1, 0.05, 0.05, 0.01]),
    "piecewise_constant": ({"learning_rate_decay": {"piecewise_constant_conf": {
        "boundaries": [2], "values": [0.3, 0.2]}}}, [0.3, 0.3, 0.3, 0.2, 0.2]),
    "inverse_time": ({"learning_rate_decay": {"inverse_time_conf": {
        "decay_batches": 2, "decay_rate": 0.5}}}, [0.1 / (1 + 0.25 * t) for t in range(5)]),
    "natural_exp_staircase": ({"learning_rate_decay": {"natural_exp_conf": {
        "decay_batches": 2, "decay_rate": 0.5, "staircase": True}}},
        [0.1 * math.exp(-0.5 * (t // 2)) for t in range(5)]),
    "linear_cosine": ({"learning_rate_decay": {"linear_cosine_conf": {"decay_batches": 4}}},
                      _LIN_COS),
    "warmup_then_piecewise_constant": ({
        "warmup_conf": {"linear_conf": {"warmup_batches": 2, "start_multiplier": 0.5}},
        "learning_rate_decay": {"piecewise_constant_conf": {"boundaries": [3],
                                                            "values": [0.4, 0.2]}}},
        [0.05, 0.075, 0.4, 0.4, 0.2]),
}


@pytest.mark.parametrize("name", OLD_API_DECAYS)
def test_old_api_learning_rate_decay_kinds(name):
    conf, lrs = OLD_API_DECAYS[name]
    job = old_api_job(dict(conf, naive_conf={}))
    flow.load_variables({"w": W0})
    w = W0.astype(np.float64)
    for lr in lrs:
        job(A)
        w = w - f32(lr) * A * w / 4
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), w, rtol=1e-5)


@pytest.mark.parametrize("conf,match", [
    ({"learning_rate_decay": {"piecewise_scaling_conf": {"boundaries": [10],
                                                         "scales": [0.1]}},
      "naive_conf": {}}, "one more of 'scales'"),
    ({"learning_rate_decay": {"cosine_conf": {"alpha": 0.1}}, "naive_conf": {}},
     "needs 'decay_batches'"),
    ({"learning_rate_decay": {"step_conf": {"step_size": 2}}, "naive_conf": {}},
     "not a kind of OneFlow's LearningRateDecayConf"),
    ({"warmup_conf": {"constant_conf": {"warmup_batches": 2}}, "naive_conf": {}},
     "needs 'multiplier'"),
    ({"learning_rate_decay": {"cosine_conf": {"decay_batches": 4}}},
     "exactly one optimizer"),
])
def test_old_api_malformed_confs_raise_trace_errors(conf, match):
    job = old_api_job(conf)
    with pytest.raises(TraceError, match=match):
        job(A)


def _regularized_steps(defer, monkeypatch, make_opt):
    """Variables after 4 steps of small variables with L2 regularizers (two rates in one
    flat group, one without, one alone in its size class), the third step's gradients not
    finite, with the regularization deferred to the update or applied first."""
    from onnxjob.train.optimizer import Optimizer
    if not defer:
        monkeypatch.setattr(Optimizer, "_deferred_regularizers", lambda self, b, g: {})
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        def var(name, shape, l2):
            return flow.get_variable(name, shape, initializer=flow.constant_initializer(0.5),
                                     regularizer=flow.regularizers.l2(l2) if l2 else None)
        p, q = var("p", (4,), 0.01), var("q", (4,), 0.03)
        r, s = var("r", (4,), 0), var("s", (2, 3), 0.01)
        loss = flow.math.reduce_sum(p * p * a + q * a + r * a) + flow.math.reduce_sum(s * s)
        make_opt().minimize(loss)
        return loss

    for step in range(4):
        job(A if step != 2 else np.array([1.0, np.nan, 2.0, np.inf], np.float32))
    return {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}


@pytest.mark.parametrize("name", ["momentum", "adamw_bias_correction", "sgd_clipped"])
def test_l2_regularization_in_the_update_gives_what_it_gave_first(name, monkeypatch):
    """Small variables' L2 regularization waits for their (flat group's) update where
    nothing reads the regularized gradient before (Optimizer._deferred_regularizers):
    the same values, bit for bit, as regularizing first; a clipping optimizer, whose norm
    reads it, regularizes first."""
    from onnxjob.train.optimizer import Optimizer
    make = {"momentum": FLAT_OPTIMIZERS["momentum"],
            "adamw_bias_correction": FLAT_OPTIMIZERS["adamw_bias_correction"],
            "sgd_clipped": lambda: optim.SGD(
                0.1, momentum=0.9, grad_clipping=optim.grad_clipping.by_global_norm(1.0),
                loss_scale_policy=_SCALE())}[name]
    deferred = {}
    real = Optimizer._deferred_regularizers

    def recording(self, builder, grads):
        deferred.update(real(self, builder, grads))
        return deferred
    monkeypatch.setattr(Optimizer, "_deferred_regularizers", recording)
    later = _regularized_steps(True, monkeypatch, make)
    assert sorted(deferred) == ([] if name == "sgd_clipped" else ["p", "q", "s"])
    first = _regularized_steps(False, monkeypatch, make)
    for variable, value in first.items():
        np.testing.assert_array_equal(later[variable], value, err_msg=variable)
    assert np.isfinite(later["p"]).all() and not np.allclose(later["p"], 0.5)
