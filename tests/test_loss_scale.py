"""Loss scaling as OneFlow does it: static and dynamic policies (dynamic_loss_scale_schedule
kernel, DynamicLossScaleSchedulePass, autograd.cpp's ScaleInitialDiffByLossScale and
ScaleModelDiffByLossScale, auto_train_step.cpp), driven through whole train steps."""
import math

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from test_optimizers import (IDS, TABLE0, assert_sparse, dense_reference, momentum,
                             sparse_config, sparse_reference, train_embedding)

optim = flow.optimizer
FLT_MAX = float(np.finfo(np.float32).max)
SCALE = "System-Train-DynamicLossScale-job-LossScale"
COUNTER = "System-Train-DynamicLossScale-job-GoodStepCounter"
STEP = "System-Train-TrainStep-job"

# A dense layer y = x @ w + b with loss_i = sum_j (y_ij - t_ij)^2 (4 elements).
# x > 0 and y - t > 0 make every gradient element positive, so the largest scaled one is
# predictable in float64 (no cancellation inside the float32 sums).
X = np.array([[1.0, 1.5, 2.0], [1.25, 1.75, 1.0], [2.0, 1.0, 1.5], [1.5, 1.25, 1.75]],
             np.float32)
T = np.full((4, 2), -6.0, np.float32)
W0 = np.array([[0.1, -0.2], [0.05, 0.15], [-0.1, 0.2]], np.float32)
B0 = np.array([0.05, -0.05], np.float32)


def dense_job(make_opt, watch=None, regularize=False):
    reg = flow.regularizers.l2(0.01) if regularize else None

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3)), t: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (3, 2), initializer=flow.zeros_initializer(),
                              regularizer=reg)
        b = flow.get_variable("b", (2,), initializer=flow.zeros_initializer())
        y = flow.matmul(x, w) + b
        if watch is not None:
            flow.watch_diff(y, watch)
        loss = flow.math.reduce_sum(flow.math.square(y - t), axis=1)
        make_opt().minimize(loss)
        return loss

    flow.load_variables({"w": W0, "b": B0})
    return job


def snapshot():
    return {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}


def run_dense(make_opt, steps, **kwargs):
    """All variables after each of `steps` steps of dense_job."""
    job = dense_job(make_opt, **kwargs)
    out = []
    for _ in range(steps):
        job(X, T)
        out.append(snapshot())
    return out


def largest_gradient(w, b):
    """The largest backward value of dense_job per unit of loss scale, in float64: the
    seed (the scale, as OneFlow: 1/elem_cnt comes after) is multiplied through 2(y - t)
    into dy, summed into db and x^T dy (all positive)."""
    dy = 2 * (X.astype(np.float64) @ w + b - T)
    assert np.all(dy > 0)
    return max(dy.max(), dy.sum(axis=0).max(), (X.T.astype(np.float64) @ dy).max())


def oneflow_schedule(scale, counter, finite, increment_period, multiplier):
    """dynamic_loss_scale_schedule_kernel.cpp, in double, stored as float."""
    multiplier = float(np.float32(multiplier))
    if finite:
        counter += 1
        if counter >= increment_period:
            scale, counter = float(np.float32(min(scale * multiplier, FLT_MAX))), 0
        return scale, counter
    return float(np.float32(max(scale / multiplier, 1.0))), 0


def dynamic(initial=2.0 ** 127, period=3, multiplier=2.0):
    return optim.loss_scale.dynamic_loss_scale(initial_loss_scale=initial,
                                               increment_period=period, multiplier=multiplier)


# -- dynamic loss scale: the skip, the slots and the schedule --------------------------------
DYNAMIC = {
    "momentum": (lambda p: optim.SGD(0.0002, momentum=0.9, loss_scale_policy=p),
                 ["w-momentum", "b-momentum"]),
    "adam": (lambda p: optim.Adam(0.01, do_bias_correction=True, loss_scale_policy=p),
             ["w-m", "w-v", "b-m", "b-v"]),
    "lamb": (lambda p: optim.LAMB(0.01, loss_scale_policy=p),
             ["w-m", "w-v", "w-beta1_t", "w-beta2_t", "b-m", "b-v"]),
    "rmsprop_centered": (lambda p: optim.RMSProp(0.0005, centered=True, loss_scale_policy=p),
                         ["w-mean_square", "w-mean_gradient", "b-mean_square"]),
}


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_scale_skips_exactly_the_overflowing_steps(name):
    """From 2**127 the scaled gradients overflow float32 until the scale is 2**121; after
    3 good steps it doubles, overflows again and halves: the Python rule predicts each skip
    and scale, and the good steps are bit for bit an unscaled run's steps."""
    make, slots = DYNAMIC[name]
    period, steps = 3, 16
    job = dense_job(lambda: make(dynamic(2.0 ** 127, period, 2.0)))
    scale, counter = 2.0 ** 127, 0
    kept, finite_flags, scales = [], [], []
    for step in range(steps):
        before = snapshot()
        assert before[SCALE].tolist() == [scale] and before[COUNTER].tolist() == [counter]
        largest = math.log2(scale * largest_gradient(before["w"], before["b"]))
        assert abs(largest - 128) > 0.1, "the data sits on float32's overflow boundary"
        finite = largest < 128
        job(X, T)
        after = snapshot()
        state = [n for n in after if n not in (SCALE, COUNTER)]
        assert set(["w", "b", STEP] + slots) <= set(state), sorted(after)
        for n in state:
            if finite:
                assert not np.array_equal(after[n], before[n]), f"step {step}: {n} unchanged"
            else:
                np.testing.assert_array_equal(after[n], before[n], err_msg=f"step {step}: {n}")
        scale, counter = oneflow_schedule(scale, counter, finite, period, 2.0)
        assert after[SCALE].dtype == np.float32 and after[SCALE].shape == (1,)
        assert after[COUNTER].dtype == np.int64 and after[COUNTER].shape == (1,)
        assert after[SCALE].tolist() == [scale], f"step {step}"
        assert after[COUNTER].tolist() == [counter], f"step {step}"
        finite_flags.append(finite)
        scales.append(scale)
        if finite:
            kept.append(after)
    # 6 overflows, then (3 good steps, the doubled scale overflows) twice, then 2 good
    assert finite_flags == [False] * 6 + ([True] * 3 + [False]) * 2 + [True] * 2
    assert scales[:10] == [2.0 ** e for e in (126, 125, 124, 123, 122, 121, 121, 121, 122, 121)]
    assert kept[-1][STEP].tolist() == [len(kept)]
    flow.clear_default_session()
    plain = run_dense(lambda: make(None), len(kept))
    for t, (got, ref) in enumerate(zip(kept, plain)):
        for n in ["w", "b"] + slots:
            np.testing.assert_array_equal(got[n], ref[n], err_msg=f"good step {t}: {n}")


def test_schedule_bounds_and_rounding():
    """The scale never drops below 1, is capped at FLT_MAX, and a multiplier of 3 rounds
    as the kernel's double arithmetic stored as float; the counter restarts at each change.
    The gradients are 0 (or NaN) whatever the scale, so the placeholder decides."""
    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", (2,), initializer=flow.ones_initializer())
        optim.SGD(0.1, momentum=0,
                  loss_scale_policy=dynamic(1e38, 2, 3.0)).minimize(flow.math.reduce_sum(w * a))
        return w

    good, bad = np.zeros(2, np.float32), np.array([0.0, np.nan], np.float32)
    pattern = [True] * 5 + [False] * 3 + [True, False] * 2 + [False] * 90 + [True] * 3
    scale, counter, seen = float(np.float32(1e38)), 0, []
    for finite in pattern:
        job(good if finite else bad)
        scale, counter = oneflow_schedule(scale, counter, finite, 2, 3.0)
        got = snapshot()
        assert got[SCALE].tolist() == [scale] and got[COUNTER].tolist() == [counter]
        seen.append(scale)
    assert FLT_MAX in seen and seen[-4] == 1.0 and seen[-1] == 3.0
    assert seen[5] == float(np.float32(FLT_MAX / 3))  # not a power-of-two step


def test_dynamic_scale_needs_the_own_train_step():
    @flow.global_function(type="train")
    def job(step: tp.Numpy.Placeholder((1,), dtype=flow.int64),
            a: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        w = flow.get_variable("w", (2,), initializer=flow.ones_initializer())
        optim.SGD(0.1, train_step_lbn=step.logical_blob_name,
                  loss_scale_policy=dynamic()).minimize(flow.math.reduce_sum(w * a))
        return w

    with pytest.raises(TraceError, match="train_step_lbn"):
        job(np.zeros(1, np.int64), np.ones(2, np.float32))


# -- static loss scale ---------------------------------------------------------------------
@pytest.mark.parametrize("how", ["factor", "policy"])
def test_static_power_of_two_scale_equals_the_unscaled_run(how):
    def make(scaled):
        kwargs = {}
        if scaled and how == "factor":
            kwargs["loss_scale_factor"] = 2.0 ** 40
        elif scaled:
            kwargs["loss_scale_policy"] = optim.loss_scale.static_loss_scale(2.0 ** 40)
        return lambda: optim.Adam(0.01, do_bias_correction=True, **kwargs)

    got = run_dense(make(True), 4)
    flow.clear_default_session()
    ref = run_dense(make(False), 4)
    assert not any(n.startswith("System-Train-DynamicLossScale") for n in got[-1])
    for t, (a, b) in enumerate(zip(got, ref)):
        assert set(a) == set(b)
        for n in a:
            np.testing.assert_array_equal(a[n], b[n], err_msg=f"step {t}: {n}")


def test_static_other_factor_rounds_but_agrees():
    got = run_dense(lambda: optim.SGD(0.01, momentum=0.9, loss_scale_factor=1000.0), 3)
    flow.clear_default_session()
    ref = run_dense(lambda: optim.SGD(0.01, momentum=0.9), 3)
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a["w"], b["w"], rtol=1e-6, atol=1e-7)


def test_static_scale_that_overflows_is_not_skipped():
    """OneFlow counts non-finite gradients only under a dynamic policy: a static factor
    whose scaled gradients overflow feeds inf into the update (the seed is scaled), while
    the same scale as a dynamic policy skips the step."""
    got = run_dense(lambda: optim.SGD(0.01, momentum=0, loss_scale_factor=2.0 ** 127), 1)[0]
    assert not np.all(np.isfinite(got["w"])) and not np.all(np.isfinite(got["b"]))
    assert got[STEP].tolist() == [1]
    flow.clear_default_session()
    got = run_dense(lambda: optim.SGD(0.01, momentum=0, loss_scale_policy=dynamic()), 1)[0]
    np.testing.assert_array_equal(got["w"], W0)
    assert got[STEP].tolist() == [0]


# -- watch_diff ----------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_watch_diff_shows_the_scaled_gradient(policy):
    """As OneFlow's add_lbi_diff_watcher (the backward's diff, before unscaling)."""
    p = (optim.loss_scale.static_loss_scale(2.0 ** 10) if policy == "static"
         else dynamic(2.0 ** 10, 100))
    seen, plain = [], []
    dense_job(lambda: optim.SGD(0.01, loss_scale_policy=p), watch=seen.append)(X, T)
    flow.clear_default_session()
    dense_job(lambda: optim.SGD(0.01), watch=plain.append)(X, T)
    assert np.all(plain[0] != 0)
    np.testing.assert_array_equal(seen[0], plain[0] * 2.0 ** 10)


# -- checkpoint ----------------------------------------------------------------------------
def test_checkpoint_restores_scale_and_counter(tmp_path):
    """Saved after 6 skips and 2 good steps (scale 2**121, counter 2): a fresh session
    that loads it continues exactly as the uninterrupted run (whose next good step doubles
    the scale, which then overflows), variables, slots, step, scale and counter."""
    make = lambda: optim.Adam(0.01, do_bias_correction=True,  # noqa: E731
                              loss_scale_policy=dynamic(2.0 ** 127, 3, 2.0))
    job = dense_job(make)
    for _ in range(8):
        job(X, T)
    saved = snapshot()
    assert saved[SCALE].tolist() == [2.0 ** 121] and saved[COUNTER].tolist() == [2]
    flow.checkpoint.save(str(tmp_path / "ckpt"))
    assert np.fromfile(tmp_path / "ckpt" / SCALE / "out", "<f4").tolist() == [2.0 ** 121]
    assert np.fromfile(tmp_path / "ckpt" / COUNTER / "out", "<i8").tolist() == [2]
    continued = []
    for _ in range(4):
        job(X, T)
        continued.append(snapshot())
    assert [c[SCALE][0] for c in continued] == [2.0 ** e for e in (122, 121, 121, 121)]

    flow.clear_default_session()
    job = dense_job(make)
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "ckpt")))
    for t, ref in enumerate(continued):
        job(X, T)
        got = snapshot()
        assert set(got) == set(ref)
        for n in ref:
            np.testing.assert_array_equal(got[n], ref[n], err_msg=f"step {t}: {n}")


# -- clipping, regularizers, several optimizers, indexed slices ------------------------------
def assert_same_runs(make_scaled, make_plain, steps=5, **kwargs):
    got = run_dense(make_scaled, steps, **kwargs)
    flow.clear_default_session()
    ref = run_dense(make_plain, steps, **kwargs)
    for t, (a, b) in enumerate(zip(got, ref)):
        for n in b:
            np.testing.assert_array_equal(a[n], b[n], err_msg=f"step {t}: {n}")
    return got


def test_clipping_and_regularizer_with_a_dynamic_scale_match_the_unscaled_run():
    """Unscaled before the l2 term and the clipping, as OneFlow: scaled or not, the same
    bits. The scale grows every 2 good steps."""
    clip = optim.grad_clipping.by_global_norm(1.0)
    got = assert_same_runs(
        lambda: optim.SGD(0.01, momentum=0.9, grad_clipping=clip,
                          loss_scale_policy=dynamic(2.0 ** 10, 2, 2.0)),
        lambda: optim.SGD(0.01, momentum=0.9, grad_clipping=clip), regularize=True)
    assert [g[SCALE][0] for g in got] == [2.0 ** e for e in (10, 11, 11, 12, 12)]
    assert [g[COUNTER][0] for g in got] == [1, 0, 1, 0, 1]


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_combined_optimizers_with_a_scale_match_the_unscaled_run(policy):
    def make(scaled):
        p = None
        if scaled:
            p = (optim.loss_scale.static_loss_scale(2.0 ** 20) if policy == "static"
                 else dynamic(2.0 ** 20, 3, 2.0))
        return lambda: optim.CombinedOptimizer(
            [optim.SGD(0.01, momentum=0.9, variables=["w"]),
             optim.Adam(0.01, do_bias_correction=True, variables=["b"],
                        grad_clipping=optim.grad_clipping.by_global_norm(0.5))],
            loss_scale_policy=p)

    assert_same_runs(make(True), make(False), regularize=True)


def test_indexed_slices_stay_sparse_under_a_static_scale():
    """OneFlow's rewrite pass lets the static scale's scalar_mul through."""
    got = train_embedding(lambda: optim.SGD(0.1, momentum=0.9, loss_scale_factor=256.0),
                          sparse_config())
    assert_sparse(got, sparse_reference(momentum()))


def test_indexed_slices_are_dense_under_a_dynamic_scale():
    """OneFlow's scalar_mul_by_tensor (and skip_if) break the pattern: a dense update."""
    got = train_embedding(lambda: optim.SGD(0.1, momentum=0.9, loss_scale_policy=dynamic(
        2.0 ** 8, 100)), sparse_config())
    ref = dense_reference(momentum())
    assert len(got) == len(IDS) and not np.array_equal(got[-1], TABLE0)
    for t, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7, err_msg=f"step {t + 1}")


def test_two_ranks_skip_the_steps_one_process_skips(tmp_path):
    """Data-parallel: the ranks' scaled gradients are summed before 1/elem_cnt and the
    unscaling, as OneFlow's all-reduce, so the whole batch's overflows decide the skips."""
    from test_distributed import run, trained, write_script
    script = write_script(tmp_path, "mlp", mean_loss=False)
    text = script.read_text().replace(
        "momentum=0.9)", "momentum=0.9, loss_scale_policy=flow.optimizer.loss_scale."
        "dynamic_loss_scale(2.0 ** 127, 2))").replace("range(3)", "range(8)")
    assert "dynamic_loss_scale" in text and "range(8)" in text
    script.write_text(text)
    for ranks, folder in [(2, "two"), (1, "one")]:
        result = run(script, ranks, tmp_path / folder)
        assert result.returncode == 0, result.stderr
    two, one = trained(tmp_path / "two"), trained(tmp_path / "one")
    assert 0 < one["System-Train-TrainStep-train_job"][0] < 8  # some steps were skipped
    for name in ["System-Train-TrainStep-train_job", "System-Train-DynamicLossScale-train_job-"
                 "LossScale", "System-Train-DynamicLossScale-train_job-GoodStepCounter"]:
        np.testing.assert_array_equal(two[name], one[name], err_msg=name)
    for name, value in one.items():
        np.testing.assert_allclose(two[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_cleared_session_frees_a_loss_scaled_job_s_trace():
    """The trace of a job with a loss scale (its graph, every Blob) is freed with its
    session: the scale's state was once kept in a table keyed by weak references to the
    builder, whose Blobs kept the builder alive (a program defining such jobs in a loop,
    e.g. one per test image, grew by the whole trace each time)."""
    import gc
    from onnxjob.graph.tracer import GraphBuilder

    def builders():
        gc.collect()
        # (type(), not isinstance: the latter reads __class__, which deprecated objects
        # of other libraries in the process warn about)
        return sum(type(o) is GraphBuilder for o in gc.get_objects())

    flow.clear_default_session()
    before = builders()
    for _ in range(2):
        job = dense_job(lambda: optim.SGD(optim.PiecewiseConstantScheduler([], [0.1]),
                                          loss_scale_policy=optim.DynamicLossScalePolicy()))
        job(X, T)
        flow.clear_default_session()
    del job
    assert builders() == before


def test_clipping_under_a_grown_dynamic_scale_takes_the_unscaled_norm():
    """OneFlow unscales the gradients before clipping by their global norm: a dynamic
    loss scale of 2^64 on float32 gradients (one that grew for ~68k steps) clips as 1 does;
    the norm of the scaled gradients, squared, would be infinite and the update 0."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 1), initializer=flow.constant_initializer(1.0))
        loss = flow.math.reduce_mean(flow.matmul(x, w))        # dL/dw = [2, 3]
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           grad_clipping=flow.optimizer.grad_clipping.by_global_norm(1.0),
                           loss_scale_policy=flow.optimizer.loss_scale.dynamic_loss_scale(
                               initial_loss_scale=2.0 ** 64)).minimize(loss)
        return loss

    job(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    g = np.array([2.0, 3.0])
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy().ravel(),
                               1.0 - 0.1 * g / np.linalg.norm(g), rtol=1e-6)
