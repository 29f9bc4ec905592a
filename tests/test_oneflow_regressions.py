"""Defects found running OneFlow-Benchmark's programs, one regression test each."""
import inspect
import os
import re
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from gradcheck import vjp
from onnxjob.errors import TraceError


def _predict(fn, *arrays):
    """Run `fn` on placeholders of `arrays` in a fresh session's predict job."""
    flow.clear_default_session()
    specs = [tp.Numpy.Placeholder(a.shape, dtype=_flow_dtype(a)) for a in arrays]
    if len(arrays) == 1:
        @flow.global_function()
        def job(a: specs[0]) -> tp.Numpy:
            return fn(a)
    else:
        @flow.global_function()
        def job(a: specs[0], b: specs[1]) -> tp.Numpy:
            return fn(a, b)
    return job(*arrays)


def _flow_dtype(array):
    from onnxjob import dtypes
    return dtypes.from_numpy(array.dtype)


# -- flow.nn.conv2d: OneFlow 0.5's fifth argument is the bias --------------------------------

def _conv_inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((2, 3, 6, 6)).astype(np.float32),
            rng.standard_normal((4, 3, 3, 3)).astype(np.float32))


def test_conv2d_takes_onefow_05_positional_bias():
    torch = pytest.importorskip("torch")
    x, w = _conv_inputs()
    bias = np.arange(4, dtype=np.float32)

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder(x.shape), k: tp.Numpy.Placeholder(w.shape)) -> Tuple[tp.Numpy, tp.Numpy]:
        b = flow.constant(bias)
        # resnet_model.py:62 spells it nn.conv2d(input, weight, strides, padding, None, fmt, dil)
        plain = flow.nn.conv2d(a, k, 1, "SAME", None, "NCHW", 1, name="plain")
        biased = flow.nn.conv2d(a, k, 1, "SAME", b, "NCHW", 1)
        return plain, biased

    plain, biased = job(x, w)
    expected = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), padding=1).numpy()
    np.testing.assert_allclose(plain, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(biased, expected + bias.reshape(1, 4, 1, 1), rtol=1e-5, atol=1e-5)


def test_conv2d_still_takes_the_older_data_format_fifth():
    x, w = _conv_inputs()
    nchw = _predict(lambda a, k: flow.nn.conv2d(a, k, 1, "SAME", "NCHW", 1), x, w)
    nhwc = _predict(lambda a, k: flow.nn.conv2d(a, k, 1, "SAME", "NHWC"),
                    x.transpose(0, 2, 3, 1).copy(), w.transpose(0, 2, 3, 1).copy())
    np.testing.assert_allclose(nhwc.transpose(0, 3, 1, 2), nchw, rtol=1e-5, atol=1e-5)


# -- ops onnxruntime has no kernel for in the given dtype are lowered ----------------------

def test_one_hot_of_int32_indices():
    labels = np.array([3, 0, 9], np.int32)
    out = _predict(lambda a: flow.one_hot(a, depth=10, on_value=0.9, off_value=0.01), labels)
    expected = np.full((3, 10), 0.01, np.float32)
    expected[np.arange(3), labels] = 0.9
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_one_hot_values_of_other_dtypes(dtype):
    labels = np.array([1, 2], np.int64)
    out = _predict(lambda a: flow.one_hot(a, depth=3, dtype=_flow_dtype(np.zeros(1, dtype)),
                                          on_value=5, off_value=-1), labels)
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, [[-1, 5, -1], [-1, -1, 5]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_floor_mod_of_floats(dtype):
    a = np.array([5.5, -5.5, 7.0, -7.0], dtype)
    b = np.array([2.0, 2.0, -3.0, -3.0], dtype)
    np.testing.assert_allclose(_predict(flow.math.mod, a, b), np.mod(a, b), rtol=1e-6)
    np.testing.assert_allclose(_predict(lambda x, y: x % y, a, b), np.mod(a, b), rtol=1e-6)


def test_softplus_in_float64():
    x = np.array([-30.0, -1.0, 0.0, 2.0, 40.0])
    np.testing.assert_allclose(_predict(flow.math.softplus, x), np.logaddexp(0, x), rtol=1e-12)


# -- silent wrong results ------------------------------------------------------------------

def test_softmax_cross_entropy_gradient_is_onefows_rule_for_unnormalized_labels():
    """OneFlow's (and TensorFlow's) gradient is (softmax(logits) - labels) * dy, also when
    the label rows do not sum to 1 (here 3-D logits with arbitrary positive labels)."""
    rng = np.random.default_rng(0)
    labels = rng.uniform(0, 1, (2, 3, 5)).astype(np.float32)
    logits = rng.standard_normal((2, 3, 5)).astype(np.float32)
    run, shape = vjp(flow.nn.softmax_cross_entropy_with_logits, [labels, logits], [0, 1])
    ct = rng.standard_normal(shape).astype(np.float32)
    loss, (d_logits,) = run([labels, logits], ct)
    softmax = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(loss, -(labels * np.log(softmax)).sum(-1), rtol=1e-5)
    np.testing.assert_allclose(d_logits, (softmax - labels) * ct[..., None], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduce", ["reduce_sum", "reduce_max", "reduce_min", "reduce_prod"])
def test_reduction_over_no_axes_returns_the_input(reduce):
    """(reduce_mean over no axes divides by the element count, as OneFlow's reduce_mean.py:
    test_integer_means_and_quotients_by_a_number_are_oneflow_s)"""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = _predict(lambda a: getattr(flow.math, reduce)(a, axis=[]), x)
    np.testing.assert_array_equal(out, x)


# -- graphs that failed at session creation ------------------------------------------------

def test_placeholder_and_variable_may_share_a_name():
    @flow.global_function()
    def job(w: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        variable = flow.get_variable("w", (3,), initializer=flow.constant_initializer(2.0))
        return w * variable

    np.testing.assert_array_equal(job(np.ones(3, np.float32)), [2, 2, 2])


def test_job_returning_nothing_runs():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> None:
        flow.math.relu(x)

    assert job(np.ones(3, np.float32)) is None
    flow.sync_default_session()


@pytest.mark.parametrize("watched", ["placeholder", "cast placeholder",
                                     "placeholder plus an untrainable variable",
                                     "placeholder plus a trainable zero variable"])
def test_watch_diff_of_a_placeholder_needs_a_trainable_variable_before_it(watched, monkeypatch):
    """OneFlow's autograd makes diffs only for Blobs that descend from a trainable variable
    (MakePredicatorNeedBackwardOp; a placeholder's and an untrainable variable's outputs do
    not require grad): watching a placeholder calls no handler, with one warning here.
    OneFlow's own op tests add a trainable zero variable to the placeholder to watch it."""
    from onnxjob.graph import compiler
    monkeypatch.setattr(compiler, "_warned_at", set())     # (its warning is once per line)
    seen = []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        h = flow.cast(x, flow.float) if watched == "cast placeholder" else x
        if "variable" in watched:
            h = h + flow.get_variable("v", (2, 3), initializer=flow.zeros_initializer(),
                                      trainable="untrainable" not in watched)
        flow.watch_diff(h, lambda g: seen.append(g))
        w = flow.get_variable("w", (2, 3), initializer=flow.constant_initializer(3.0))
        loss = flow.math.reduce_sum(h * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    if watched == "placeholder plus a trainable zero variable":
        job(np.ones((2, 3), np.float32))
        flow.sync_default_session()
        np.testing.assert_allclose(seen[0], np.full((2, 3), 3.0))
        return
    with pytest.warns(UserWarning, match="has no gradient in job 'job'.*handler is not called"):
        job(np.ones((2, 3), np.float32))
    flow.sync_default_session()
    assert seen == []
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), 3.0 - 0.1)


# -- missing pieces ------------------------------------------------------------------------

def test_clip_by_value_and_concat_values_at_the_top_level():
    x = np.array([-2.0, 0.5, 9.0], np.float32)
    np.testing.assert_array_equal(_predict(lambda a: flow.clip_by_value(a, 0, 6), x), [0, 0.5, 6])
    out = _predict(lambda a: flow.concat(values=[a, a], axis=0), x)
    np.testing.assert_array_equal(out, np.concatenate([x, x]))


@pytest.mark.parametrize("training", [True, False])
def test_fused_batch_norm_layers_equal_their_unfused_forms(training):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    addend = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    kind = "train" if training else "predict"

    @flow.global_function(type=kind)
    def job(a: tp.Numpy.Placeholder(x.shape), b: tp.Numpy.Placeholder(x.shape)) -> Tuple[
            tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        kw = dict(axis=1, momentum=0.9, epsilon=1e-5)
        fused = flow.layers.batch_normalization_relu(a, name="r", **kw)
        plain = flow.nn.relu(flow.layers.batch_normalization(a, name="p", **kw))
        fused_add = flow.layers.batch_normalization_add_relu(a, b, name="ra", **kw)
        plain_add = flow.nn.relu(flow.layers.batch_normalization(a, name="pa", **kw) + b)
        if training:
            loss = flow.math.reduce_sum(fused + plain + fused_add + plain_add)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                               momentum=0).minimize(loss)
        return fused, plain, fused_add, plain_add

    fused, plain, fused_add, plain_add = job(x, addend)
    np.testing.assert_allclose(fused, plain, rtol=1e-6)
    np.testing.assert_allclose(fused_add, plain_add, rtol=1e-6)
    names = flow.get_all_variables()
    assert {"r-gamma", "r-beta", "r-moving_mean", "r-moving_variance", "ra-gamma"} <= set(names)


def test_batch_norm_with_moving_statistics_in_a_train_job_updates_gamma_and_beta():
    """A trainable batch norm with training=False normalizes with the moving statistics
    and its scale and offset still learn."""
    x = np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32)

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        y = flow.layers.batch_normalization(a, axis=1, training=False, epsilon=0.0, name="bn")
        loss = flow.math.reduce_sum(y * y) * 0.5
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return y

    y = job(x)
    np.testing.assert_allclose(y, x, rtol=1e-6)  # moving mean 0, variance 1
    values = flow.get_all_variables()
    # loss = 0.5 * sum(y^2), y = x * gamma + beta: d gamma = sum(y * x), d beta = sum(y)
    np.testing.assert_allclose(values["bn-gamma"].numpy(),
                               1 - 0.1 * (x * x).sum(axis=(0, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(values["bn-beta"].numpy(), -0.1 * x.sum(axis=(0, 2, 3)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(values["bn-moving_mean"].numpy(), [0, 0])


# batch_dims, index shape: OneFlow's batch axes are all but the last axis of the indices
# (pretrain.py:165 gathers (B, seq, hidden) at (B, P) positions with batch_dims=2); 1-D
# indices have none: rows of axis 0 (batch_gather_op.cpp takes any rank >= 1)
BATCH_GATHERS = [(1, (2, 2)), (2, (2, 3, 2)), (2, (2, 4)), (1, (3,))]


@pytest.mark.parametrize("batch_dims,index_shape", BATCH_GATHERS)
def test_gather_with_batch_dims(batch_dims, index_shape):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    params = rng.standard_normal((2, 3, 5, 4))
    b = len(index_shape) - 1
    indices = rng.integers(0, params.shape[b], index_shape).astype(np.int32)

    def ours(p):
        return flow.gather(p, flow.constant(indices, dtype=flow.int32), axis=batch_dims,
                           batch_dims=batch_dims)

    def reference(p):
        lead = p.shape[:b]
        flat = p.reshape((-1,) + p.shape[b:])
        idx = torch.tensor(indices.reshape(flat.shape[0], -1), dtype=torch.long)
        rows = torch.stack([flat[i][idx[i]] for i in range(flat.shape[0])])
        return rows.reshape(lead + indices.shape[b:] + p.shape[b + 1:])

    from gradcheck import check_case_against_pytorch, check_case_finite_differences, normal
    case = ("gather_batch_dims", ours, reference, [normal(params.shape)], [1], True)
    check_case_finite_differences(case)
    check_case_against_pytorch(case)


def test_top_k_with_k_above_one():
    x = np.array([[0.1, 0.9, 0.4, 0.7], [3.0, 1.0, 2.0, 0.0]], np.float32)
    out = _predict(lambda a: flow.math.top_k(a, k=3), x)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, [[1, 3, 2], [0, 2, 1]])


def test_piecewise_scaling_scheduler_takes_one_scale_per_boundary():
    # optimizer_util.py:94: boundaries=[30, 60, 80], scale=[0.1, 0.01, 0.001]
    from onnxjob.train.lr_schedules import PiecewiseScalingScheduler
    schedule = PiecewiseScalingScheduler(0.256, [30, 60, 80], [0.1, 0.01, 0.001])
    rates = [schedule.numpy_lr(t) for t in (0, 30, 31, 60, 61, 80, 81)]
    np.testing.assert_allclose(rates, [0.256, 0.256, 0.0256, 0.0256, 0.00256, 0.00256, 0.000256])
    scalar = PiecewiseScalingScheduler(1.0, [10, 20], 0.5)
    assert [scalar.numpy_lr(t) for t in (5, 15, 25)] == [1.0, 0.5, 0.5]


def test_two_dropouts_of_one_blob_draw_different_masks():
    """Two equal Dropout nodes must not be merged by common-subexpression elimination."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((1000,))) -> tp.Numpy:
        w = flow.get_variable("w", (1000,), initializer=flow.ones_initializer())
        a = flow.nn.dropout(x * w, 0.5)
        b = flow.nn.dropout(x * w, 0.5)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(flow.math.reduce_sum(a + b))
        return a - b

    differ = (job(np.ones(1000, np.float32)) != 0).mean()
    assert 0.4 < differ < 0.6  # independent masks with keep probability 0.5


def test_blob_comparisons_give_onefows_int8_like_flow_math():
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([2.0, 2.0, 2.0], np.float32)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> Tuple[
            tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        return x > y, flow.math.greater(x, y), x != y, x == 2.0

    ours, math_greater, not_equal, equal = job(a, b)
    assert ours.dtype == math_greater.dtype == not_equal.dtype == np.int8
    np.testing.assert_array_equal(ours, [0, 0, 1])
    np.testing.assert_array_equal(ours, math_greater)
    np.testing.assert_array_equal(not_equal, [1, 0, 1])
    np.testing.assert_array_equal(equal, [0, 1, 0])


def test_an_op_onnxruntime_cannot_run_is_reported_at_the_users_line(monkeypatch):
    """The safety net behind the per-op lowerings: onnxruntime's refusal of a node names
    the line of the job body that made it (here OneHot's int32 lowering is switched off)."""
    from onnxjob.errors import TraceError
    from onnxjob.graph.registry import get_primitive
    monkeypatch.setattr(get_primitive("OneHot"), "lower", None)

    @flow.global_function()
    def job(labels: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> tp.Numpy:
        return flow.one_hot(labels, depth=4)

    with pytest.raises(TraceError, match=r"test_oneflow_regressions.py:\d+: onnxruntime cannot "
                                         r"run OneHot on inputs \(.*INT32"):
        job(np.zeros(3, np.int32))


def test_trainable_is_each_jobs_own_choice():
    """A GAN's generator is trained by its own job and frozen in the discriminator's."""
    def net(x, trainable):
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer(),
                              trainable=trainable)
        return flow.math.reduce_sum(x * w)

    def sgd(loss):
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)

    @flow.global_function(type="train")
    def trains_w(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        loss = net(x, trainable=True)
        sgd(loss)
        return loss

    @flow.global_function(type="train")
    def freezes_w(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        other = flow.get_variable("b", (1,), initializer=flow.zeros_initializer())
        loss = net(x, trainable=False) + flow.math.reduce_sum(other)
        sgd(loss)
        return loss

    x = np.ones(3, np.float32)
    freezes_w(x)
    np.testing.assert_array_equal(flow.get_all_variables()["w"].numpy(), [1, 1, 1])
    trains_w(x)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), [0.9, 0.9, 0.9])


def test_fetched_blobs_of_unannotated_jobs_act_as_arrays():
    """dcgan.py indexes the fetched image batch: `results[i, 0, :, :] * 127.5`."""
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))):
        return x * 2, x

    doubled, same = job(np.arange(6, dtype=np.float32).reshape(2, 3)).get()
    np.testing.assert_array_equal(doubled[1, :] * 0.5, [3, 4, 5])
    assert len(same) == 2 and float(doubled.mean()) == 5.0
    np.testing.assert_array_equal(doubled - same, same)


# -- flow.nn.hardsigmoid's gradient at the ends in float16 (OneFlow's legacy op test) --------

def test_hardsigmoid_gradient_is_zero_at_plus_and_minus_three_in_float16():
    flow.clear_default_session()
    x = np.array([[-3.0, -2.999, 0.0, 2.998, 3.0, 3.5]], np.float32)
    grads = {}

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        v = flow.get_variable("v", shape=x.shape, initializer=flow.zeros_initializer())
        xv = a + v
        y = flow.cast(flow.nn.hardsigmoid(flow.cast(xv, flow.float16)), flow.float32)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.001]),
                           momentum=0).minimize(y)
        flow.watch_diff(xv, lambda g: grads.setdefault("x", g))
        return y

    job(x)
    sixth = np.float32(np.float16(1 / 6))
    np.testing.assert_allclose(grads["x"], [[0, sixth, sixth, sixth, 0, 0]], rtol=1e-3)


def test_layer_variables_named_explicitly_stay_inside_the_namespace():
    """weight_name= / gamma_name= and the like go to flow.get_variable, which prefixes the
    namespace stack (OneFlow's layers.py and get_variable.py): the variable of
    `weight_name="cw"` inside namespace "enc" is "enc-cw", the name a OneFlow checkpoint
    holds (a load by the bare name skipped it and left the initial weights)."""
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 1, 3, 3))) -> tp.Numpy:
        with flow.scope.namespace("enc"):
            y = flow.layers.conv2d(x, 1, 3, name="c", weight_name="cw", use_bias=False,
                                   kernel_initializer=flow.zeros_initializer())
            return flow.layers.batch_normalization(
                y, axis=1, training=False, name="bn", gamma_name="g", beta_name="b",
                moving_mean_name="mm", moving_variance_name="mv")

    x = np.ones((2, 1, 3, 3), np.float32)
    job(x)
    assert sorted(flow.get_all_variables()) == ["enc-b", "enc-cw", "enc-g", "enc-mm", "enc-mv"]
    flow.load_variables({"enc-cw": np.ones((1, 1, 3, 3), np.float32)})
    # (batch_normalization's default epsilon 0.001, moving variance 1)
    np.testing.assert_allclose(job(x).ravel(), [9.0 / np.sqrt(1 + 1e-3)] * 2, rtol=1e-5)


def test_get_variable_again_in_a_job_returns_its_variable_as_oneflow_does():
    """OneFlow's get_variable returns the job's variable of that name as it is, whatever
    shape is asked for the second time (it asserts only across jobs): the same here, with
    a warning at the line; another job asking another shape is refused."""
    from onnxjob.errors import TraceError
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        first = flow.get_variable("v", shape=(2,), initializer=flow.ones_initializer())
        again = flow.get_variable("v", shape=(3,), initializer=flow.zeros_initializer())
        return first + again

    with pytest.warns(UserWarning, match=r"this job already has it as \(2,\) float32"):
        np.testing.assert_array_equal(job(), [2.0, 2.0])
    flow.clear_default_session()

    @flow.global_function()
    def one() -> tp.Numpy:
        return flow.get_variable("w", shape=(2,), initializer=flow.ones_initializer())

    @flow.global_function()
    def other() -> tp.Numpy:
        return flow.get_variable("w", shape=(3,), initializer=flow.ones_initializer())

    with pytest.raises(TraceError, match="already exists with shape"):
        one()


def test_softmax_cross_entropies_floor_the_probability_at_1e_20_as_oneflow():
    """OneFlow's kernels take -log(max(p, 1e-20)): a confidently wrong row's loss is
    46.0517, not 100; the gradient stays softmax - labels (ComputeDiffWithSoftmax), also
    for that row."""
    flow.clear_default_session()
    start = np.array([[0.0, 100.0, -3.0], [1.0, 2.0, 3.0]], np.float32)
    labels = np.array([0, 2], np.int32)

    @flow.global_function(type="train")
    def job(label: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
        logits = flow.get_variable("logits", (2, 3), initializer=flow.zeros_initializer())
        sparse = flow.nn.sparse_softmax_cross_entropy_with_logits(label, logits)
        dense = flow.nn.softmax_cross_entropy_with_logits(
            flow.one_hot(label, 3, dtype=flow.float32), logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                           momentum=0).minimize(sparse)
        return sparse, dense

    flow.load_variables({"logits": start})
    sparse, dense = job(labels)
    np.testing.assert_allclose(sparse, [46.0517, 0.407606], rtol=1e-5)
    np.testing.assert_allclose(dense, [46.0517, 0.407606], rtol=1e-5)
    softmax = np.exp(start - start.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    onehot = np.eye(3, dtype=np.float32)[labels]
    np.testing.assert_allclose(flow.get_all_variables()["logits"].numpy(),
                               start - (softmax - onehot) / 2, rtol=1e-5, atol=1e-6)


def test_a_maximum_or_minimum_tie_sends_the_gradient_to_y_as_oneflow():
    """OneFlow's elementwise_maximum / minimum (two Blobs of one shape): x's gradient where
    x is strictly larger (smaller), y's elsewhere, ties included."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job() -> tp.Numpy:
        a, b, c, d = [flow.get_variable(n, shape=(2,), initializer=flow.zeros_initializer())
                      for n in "abcd"]
        loss = flow.math.reduce_sum(flow.math.maximum(a, b) - flow.math.minimum(c, d))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                           momentum=0).minimize(loss)
        return loss

    job()
    variables = {k: v.numpy().tolist() for k, v in flow.get_all_variables().items()}
    assert [variables[n] for n in "abcd"] == [[0, 0], [-1, -1], [0, 0], [1, 1]]


def test_integer_means_and_quotients_by_a_number_are_oneflow_s():
    """OneFlow divides by a number, and takes a mean, as a multiplication by the
    reciprocal, which its scalar_mul casts to an integer Blob's dtype: 0 for x / 2 and for
    the mean of more than one element (with a warning); reduce_mean over no axis divides
    by the element count."""
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,), dtype=flow.int32),
            f: tp.Numpy.Placeholder((2, 3))) -> Tuple[tp.Numpy, tp.Numpy]:
        ints = flow.concat([x / 2, flow.math.divide(x, 4), x / 1, x * 2.5,
                            flow.reshape(flow.math.reduce_mean(x), (1,))], axis=0)
        return ints, flow.math.reduce_mean(f, axis=[])

    with pytest.warns(UserWarning) as caught:
        ints, mean = job(np.array([4, 8, 12, 16], np.int32),
                         np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(ints, [0] * 8 + [4, 8, 12, 16, 8, 16, 24, 32, 0])
    np.testing.assert_allclose(mean, np.arange(6).reshape(2, 3) / 6, rtol=1e-6)
    said = " ".join(str(w.message) for w in caught)
    assert "multiplies by int(0.5) = 0" in said and "divides by the element count 6" in said


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_gather_gives_zero_rows_for_indices_outside_the_axis(axis, index_dtype):
    """OneFlow's gather kernels copy a row only for 0 <= index < size and write zeros
    otherwise (user/kernels/gather_kernel_util.cpp, .cu): a padding id equal to the
    vocabulary size looks up zeros; ONNX's Gather would wrap -1 and fail the run at 4."""
    params = np.arange(1, 13, dtype=np.float32).reshape(4, 3)
    size = params.shape[axis]
    indices = np.array([[0, size], [-1, size - 1]], index_dtype)
    got = _predict(lambda p, i: flow.gather(p, i, axis=axis), params, indices)
    inside = (indices >= 0) & (indices < size)
    expected = np.take(params, np.where(inside, indices, 0), axis=axis)
    mask = inside.reshape((1,) * axis + inside.shape + (1,) * (1 - axis))
    np.testing.assert_array_equal(got, np.where(mask, expected, 0))


def _rows_of_table():
    """A function_config naming "table" for indexed-slices (row-sparse) updates."""
    config = flow.function_config()
    config.indexed_slices_optimizer_conf(dict(include_op_names=dict(op_name=["table"])))
    return config


def _table_after_one_step(optimizer, ids):
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=_rows_of_table())
    def job(i: tp.Numpy.Placeholder(ids.shape, dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("table", (6, 2), initializer=flow.constant_initializer(1.5))
        rows = flow.gather(table, i)
        loss = flow.math.reduce_sum(rows * rows)
        optimizer(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    loss = job(ids)
    return float(loss), flow.get_all_variables()["table"].numpy().copy()


@pytest.mark.parametrize("optimizer", ["SGD", "LazyAdam"])
def test_ids_outside_a_table_neither_read_nor_train_a_row(optimizer):
    """Looked-up ids 6 and -1 of a 6-row table read zeros and add no gradient: the table
    trains as for the ids inside alone, and under LazyAdam (an indexed-slices update of
    the looked-up rows, indexed_slices_optimizer_conf) no other row moves."""
    make = {"SGD": lambda lr: flow.optimizer.SGD(lr, momentum=0),
            "LazyAdam": flow.optimizer.LazyAdam}[optimizer]
    loss, table = _table_after_one_step(make, np.int32([2, 6, 4, -1]))
    alone_loss, alone = _table_after_one_step(make, np.int32([2, 4]))
    assert loss == pytest.approx(alone_loss) == 2 * 2 * 1.5 ** 2
    np.testing.assert_array_equal(table, alone)
    assert not np.array_equal(table[2], [1.5, 1.5])
    np.testing.assert_array_equal(np.delete(table, [2, 4], axis=0), 1.5)


def test_a_lazy_update_leaves_row_zero_alone_when_an_id_falls_outside():
    """Row 0 has LazyAdam moments from the first step; in the second, an id outside the
    table must not make the indexed-slices update touch row 0 (its moments would carry
    it on), as OneFlow's sparse update skips ids outside the table."""
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=_rows_of_table())
    def job(i: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        table = flow.get_variable("table", (6, 2), initializer=flow.constant_initializer(1.5))
        loss = flow.math.reduce_sum(flow.math.square(flow.gather(table, i)))
        flow.optimizer.LazyAdam(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(
            loss)
        return loss

    job(np.int32([0, 2]))
    first = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    job(np.int32([2, 6]))
    second = flow.get_all_variables()
    tables = [name for name, value in first.items() if value.shape == (6, 2)]
    assert len(tables) == 3     # the table and its two moments
    for name in tables:
        np.testing.assert_array_equal(second[name].numpy()[0], first[name][0], err_msg=name)
    assert not np.array_equal(second["table"].numpy()[2], first["table"][2])


def test_dividing_a_blob_by_a_number_is_oneflows_divide():
    """`/` is flow.math.divide in OneFlow (blob_trait.py): x / c multiplies by float32(1 /
    c) (0 for c == 0), c / x multiplies reciprocal_no_nan(x) (0, and a 0 gradient, at x ==
    0); both as flow.math.divide computes them, to the last bit."""
    x = np.array([0.0, 1.3, 2.7, 200.1], np.float32)
    got = _predict(lambda a: flow.concat([a / 255.0, 2.0 / a, a / 0, a / 3], axis=0), x)
    safe = np.where(x == 0, 1, x)
    expected = np.concatenate([x * np.float32(1 / 255.0),
                               np.where(x == 0, 0, np.float32(1) / safe) * np.float32(2),
                               x * np.float32(0), x * np.float32(1 / 3)])
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(x[1:] * np.float32(1 / 3), x[1:] / np.float32(3))   # (it tells)
    run, _ = vjp(lambda a: 1.0 / a, [x], [1])
    gradient = run([x], np.ones(4, np.float32))[1][0]
    np.testing.assert_allclose(gradient, np.where(x == 0, 0, -1 / safe ** 2), rtol=1e-6)


def _after_one_sgd_step(loss_of, x, initial):
    """The variable `v` (initial values `initial`) after one SGD step (lr 1) on the loss
    `loss_of(x, v)` summed; x a float32 array."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        v = flow.get_variable("v", shape=initial.shape,
                              initializer=flow.constant_initializer(0.0))
        loss = flow.math.reduce_sum(loss_of(a, v + initial))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                           momentum=0).minimize(loss)
        return loss

    job(x)
    return flow.get_all_variables()["v"].numpy() + initial


def test_cross_entropies_train_their_logits_alone():
    """OneFlow's softmax and sigmoid cross entropies bind a gradient to the prediction
    only (softmax_cross_entropy_op.cpp, sigmoid_cross_entropy_op.cpp): soft labels made
    from a variable leave it as it was."""
    x = np.array([[1, 2, 3], [0, -1, 4]], np.float32)
    labels = np.full((2, 3), 0.5, np.float32)
    for loss in (lambda a, t: flow.nn.softmax_cross_entropy_with_logits(
                     labels=flow.nn.softmax(t * a), logits=a),
                 lambda a, t: flow.nn.sigmoid_cross_entropy_with_logits(
                     labels=flow.math.sigmoid(t), logits=a)):
        np.testing.assert_array_equal(_after_one_sgd_step(loss, x, labels), labels)


def test_sigmoid_cross_entropy_gradient_at_a_zero_logit():
    """d logits = sigmoid(x) - z, 0.5 - z at x == 0 (sigmoid_cross_entropy_kernel.h), where
    max(x, 0) - x z + softplus(-|x|) differentiated by parts gives 1 - z."""
    z = np.array([1, 0, 1], np.float32)
    after = _after_one_sgd_step(lambda a, x: flow.nn.sigmoid_cross_entropy_with_logits(
        labels=a, logits=x), z, np.zeros(3, np.float32))
    np.testing.assert_allclose(after, -(0.5 - z), rtol=1e-6)


def test_mod_passes_its_gradient_to_x():
    """broadcast_floor_mod's gradient is dz for x (broadcast_ops_grad.cpp), none for y."""
    period = np.array([2.5, 3.0, 5.0], np.float32)
    after = _after_one_sgd_step(lambda p, v: flow.math.mod(v, p), period,
                                np.full(3, 4.0, np.float32))
    np.testing.assert_array_equal(after, [3.0, 3.0, 3.0])


def test_clip_hardtanh_and_abs_pass_a_nan_inputs_gradient_as_oneflow():
    """OneFlow's masks compare (x < min, y != max, x < 0), so a NaN input's gradient is dy:
    3 for clip + hardtanh + abs at NaN."""
    x = np.array([np.nan, 0.5, -3.0], np.float32)
    grads = {}
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        a = a + flow.get_variable("w", shape=(3,), initializer=flow.zeros_initializer())
        flow.watch_diff(a, lambda d: grads.setdefault("dx", d.numpy()))
        y = flow.math.clip_by_value(a, -1.0, 1.0) + flow.nn.hardtanh(a) + flow.math.abs(a)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]),
                           momentum=0).minimize(flow.math.reduce_sum(y))
        return y

    job(x)
    np.testing.assert_array_equal(grads["dx"], [3.0, 3.0, -1.0])


def test_variables_without_an_initializer_take_the_jobs_default_initializer_conf():
    """function_config.default_initializer_conf(dict(...)) is OneFlow's initializer of the
    variables created without one (set_default_variable_conf.cpp)."""
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.default_initializer_conf(dict(constant_conf=dict(value=0.5)))

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return x * flow.get_variable("w", shape=(3,))

    np.testing.assert_array_equal(job(np.ones((2, 3), np.float32)), np.full((2, 3), 0.5))


def test_a_layer_activation_that_is_not_a_function_is_ignored_as_oneflow():
    """OneFlow's layers apply `activation` only if it is callable: "relu" is no activation
    (a warning says so)."""
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.layers.dense(x, 2, activation="relu",
                                 kernel_initializer=flow.constant_initializer(-1.0))

    with pytest.warns(UserWarning, match="no activation is applied"):
        np.testing.assert_array_equal(job(np.ones((2, 3), np.float32)), np.full((2, 2), -3.0))


def test_initializer_and_scheduler_arguments_as_oneflow_reads_them():
    """variance_scaling_initializer lower-cases its mode and distribution; a NumPy scalar
    scale of PiecewiseScalingScheduler scales every boundary (OneFlow repeats any
    non-sequence)."""
    from onnxjob.frontend.initializers import variance_scaling_initializer
    init = variance_scaling_initializer(2.0, "FAN_OUT", "Random_Normal")
    assert init.params == variance_scaling_initializer(2.0, "fan_out", "random_normal").params
    with pytest.raises(ValueError, match="Invalid random_distribution"):
        variance_scaling_initializer(distribution="normal")
    schedule = flow.optimizer.PiecewiseScalingScheduler(0.1, [10, 20], np.float32(0.1))
    assert schedule.scales == pytest.approx([1.0, 0.1, 0.1])


def test_a_batch_norm_placed_on_cpus_keeps_the_biased_moving_variance():
    """Under flow.scope.placement("cpu", ...) OneFlow builds batch norm from flow.nn.moments
    and assigns (its CPU layer): the moving variance takes the batch's biased variance;
    its GPU op, what a program that says nothing ran on, the unbiased one."""
    x = np.array([[0, 0], [1, 2], [2, 4], [3, 6]], np.float32)

    def moving_variance(on_cpu):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job(a: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
            with flow.scope.placement("cpu" if on_cpu else "gpu", "0:0"):
                y = flow.layers.batch_normalization(a, axis=1, momentum=0.5, name="bn")
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                               momentum=0).minimize(y)
            return y

        job(x)
        return flow.get_all_variables()["bn-moving_variance"].numpy()

    np.testing.assert_allclose(moving_variance(True), 0.5 + 0.5 * x.var(axis=0), rtol=1e-6)
    np.testing.assert_allclose(moving_variance(False), 0.5 + 0.5 * x.var(axis=0, ddof=1),
                               rtol=1e-6)


def _pool_gradient_every_tie(x, gy, k, s, pads_begin):
    """OneFlow's CPU max-pool gradient (pool_cpu_kernel.cpp): each input equal to its
    window's maximum adds the window's gradient."""
    gx = np.zeros_like(x)
    for index in np.ndindex(*gy.shape):
        n, c, *o = index
        starts = [q * st - p for q, st, p in zip(o, s, pads_begin)]
        box = tuple(slice(max(b, 0), max(b + kk, 0)) for b, kk in zip(starts, k))
        window = x[(n, c) + box]
        gx[(n, c) + box] += (window == window.max()) * gy[index]
    return gx


@pytest.mark.parametrize("nd,size,k,s,padding,data_format", [
    (2, 5, 2, 2, "VALID", "NCHW"), (2, 4, 2, 2, "VALID", "NHWC"), (2, 5, 3, 1, "VALID", "NHWC"),
    (2, 5, 3, 2, "SAME", "NCHW"), (3, 5, 2, 1, "VALID", "NCDHW")])
def test_a_max_pool_placed_on_cpus_gives_every_tied_maximum_the_gradient(
        nd, size, k, s, padding, data_format):
    """OneFlow's CPU max-pool gradient adds dy to every input equal to the window's
    maximum (clipped or saturated images, ReLU zeros); its GPU kernel (cuDNN), what a
    program that names no placement ran on, routes it to one of them."""
    rng = np.random.default_rng(0)
    shape = (2, 3) + (size,) * nd
    x = rng.integers(0, 3, shape).astype(np.float32)         # many ties
    channels_last = data_format == "NHWC"
    fed = np.moveaxis(x, 1, -1).copy() if channels_last else x
    pool = {2: flow.nn.max_pool2d, 3: flow.nn.max_pool3d}[nd]
    got = {}

    def gradient(on_cpu):
        flow.clear_default_session()

        @flow.global_function(type="train")
        def job() -> tp.Numpy:
            with flow.scope.placement("cpu" if on_cpu else "gpu", "0:0"):
                v = flow.get_variable("x", shape=fed.shape, initializer=flow.zeros_initializer())
                flow.watch_diff(v, lambda d: got.update(g=d.copy()))
                y = pool(v, ksize=k, strides=s, padding=padding, data_format=data_format)
                weights = np.arange(1, 1 + np.prod(y.shape), dtype=np.float32)
                loss = flow.math.reduce_sum(y * weights.reshape(y.shape))
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                               momentum=0).minimize(loss)
            return y

        flow.load_variables({"x": fed})
        y = job()
        g, gy = got["g"], np.arange(1, 1 + y.size, dtype=np.float32).reshape(y.shape)
        if channels_last:
            g, gy = np.moveaxis(g, -1, 1), np.moveaxis(gy, -1, 1)
        return g, gy

    g_cpu, gy = gradient(True)
    out = gy.shape[2:]
    pads = [max((o - 1) * s + k - size, 0) // 2 for o in out] if padding == "SAME" else [0] * nd
    np.testing.assert_array_equal(g_cpu, _pool_gradient_every_tie(x, gy, [k] * nd, [s] * nd,
                                                                  pads))
    g_gpu, _ = gradient(False)
    assert g_gpu.sum() == gy.sum()                # one input per window takes its gradient
    assert g_cpu.sum() > g_gpu.sum()


@pytest.mark.parametrize("second", ["assign", "slice_assign", "optimizer", "batch_norm"])
def test_a_variable_has_one_writer_per_job(second):
    """OneFlow compiles a variable with one mutable consumer per job (job_completer.cpp,
    SetCtrlInOpName4VariableOp): a flow.assign beside another assign, a logical slice
    assign, the optimizer's update or a batch norm's moving average of the same variable
    stops its compiler. Here one of the two writes was silently lost; the error names the
    assign's line."""
    flow.clear_default_session()
    lines = {}

    @flow.global_function(type="train" if second in ("optimizer", "batch_norm") else "predict")
    def job(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 2), initializer=flow.ones_initializer())
        y = flow.matmul(x, w)
        if second == "batch_norm":
            y = flow.layers.batch_normalization(y, axis=1, name="bn")
            w = flow.get_variable("bn-moving_mean", (2,), initializer=flow.zeros_initializer(),
                                  trainable=False)
        lines["assign"] = inspect.currentframe().f_lineno + 1
        flow.assign(w, flow.zeros_like(w))
        if second == "assign":
            flow.assign(w, flow.ones_like(w))
        elif second == "slice_assign":
            flow.experimental.logical_slice_assign(w, flow.constant(2.0, shape=(1, 2)),
                                                   [(0, 1, 1), (0, 2, 1)])
        else:
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                               momentum=0).minimize(flow.math.reduce_sum(y))
        return y

    other = {"assign": "the flow.assign at", "slice_assign": "the flow.assign at",
             "optimizer": "SGD's update", "batch_norm": "moving average"}[second]
    with pytest.raises(TraceError, match=rf"{re.escape(os.path.basename(__file__))}:\d+: "
                                         rf"flow.assign writes variable '.*', which .*"
                                         rf"{re.escape(other)}.*one writer per job") as caught:
        job(np.ones((4, 2), np.float32))
    where = f"{os.path.basename(__file__)}:{lines['assign']}"
    if second in ("optimizer", "batch_norm"):
        assert f"{where}: flow.assign writes" in str(caught.value)      # the assign's line
    else:
        assert f"{where} also writes" in str(caught.value)     # the first one, named


def test_one_assign_per_variable_and_job_still_runs():
    """An EMA of the weights written by flow.assign after the optimizer's update of the
    weights themselves: different variables, as OneFlow programs do it."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 2), initializer=flow.ones_initializer())
        ema = flow.get_variable("ema", (2, 2), initializer=flow.zeros_initializer(),
                                trainable=False)
        flow.assign(ema, ema * 0.5 + w * 0.5)
        loss = flow.math.reduce_sum(flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    job(np.ones((4, 2), np.float32))
    np.testing.assert_allclose(flow.get_all_variables()["ema"].numpy(), 0.5)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), 1.0 - 0.1 * 4)


def test_an_optimizers_variables_of_no_variable_here_are_dropped():
    """variables=[...] naming a variable this job does not have: OneFlow drops the name
    (FilterCurModelLbi2ModelDiffLbiByName) and trains the others."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job() -> tp.Numpy:
        x = flow.get_variable("x", shape=(1,), initializer=flow.zeros_initializer())
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0]), momentum=0,
                           variables=["other_job_var", "x"]).minimize(flow.math.reduce_sum(x))
        return x

    assert [float(job()[0]), float(job()[0])] == [0.0, -1.0]


def test_oneflow_adams_max_v_slots_load_strictly():
    """OneFlow 0.5's Adam keeps a `-max_v` slot (zeros without amsgrad) that onnxjob's does
    without: a checkpoint of it loads with ignore_mismatch=False; other names still fail."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job() -> tp.Numpy:
        x = flow.get_variable("x", shape=(1,), initializer=flow.zeros_initializer())
        flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [1.0])).minimize(
            flow.math.reduce_sum(x))
        return x

    job()
    values = {k: np.full(1, 2.0, np.float32) for k in ("x", "x-m", "x-v", "x-max_v")}
    flow.load_variables(values, ignore_mismatch=False)
    assert float(flow.get_all_variables()["x"].numpy()[0]) == 2.0
    with pytest.raises(RuntimeError, match="not a variable name"):
        flow.load_variables({"x-other": np.zeros(1, np.float32)}, ignore_mismatch=False)


def test_batch_norm_of_a_program_on_several_gpus_normalizes_each_devices_rows():
    """flow.config.gpu_device_num(2), run in one process: OneFlow's normalization op splits
    x over the GPUs, so each device's rows are normalized by their own statistics and the
    moving variance is device 0's rows' unbiased one (normalization_op.cpp)."""
    import warnings
    flow.clear_default_session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # (one device for this process, it says)
        flow.config.gpu_device_num(2)

    @flow.global_function(type="train")
    def job(a: tp.Numpy.Placeholder((5, 1))) -> tp.Numpy:
        y = flow.layers.batch_normalization(a, axis=1, momentum=0.0, epsilon=1e-5, name="bn")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(flow.math.reduce_mean(y))
        return y

    x = np.array([[0], [2], [4], [10], [14]], np.float32)
    parts = [x[:3], x[3:]]      # OneFlow's balanced split: the first device a row more
    expected = np.concatenate([(p - p.mean()) / np.sqrt(p.var() + 1e-5) for p in parts])
    np.testing.assert_allclose(job(x), expected, rtol=1e-5)
    np.testing.assert_allclose(flow.get_all_variables()["bn-moving_variance"].numpy(),
                               [x[:3].var(ddof=1)], rtol=1e-6)


def test_distribute_ops_span_the_default_placement():
    """Without a placement scope, flow.advanced.distribute_* span OneFlow's default
    placement (gpu_device_num's GPUs): a clone added back is 2x on 2 devices."""
    import warnings
    flow.clear_default_session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flow.config.gpu_device_num(2)
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    got = _predict(lambda a: flow.advanced.distribute_add(flow.advanced.distribute_clone(a)), x)
    np.testing.assert_array_equal(got, 2 * x)


def test_a_float_range_is_start_plus_i_times_delta():
    """OneFlow's range kernel computes out[i] = start + i * delta in the dtype (onnxruntime's
    Range adds delta up: 0.90000004 for 0.9 in float32)."""
    for dtype, np_dtype in ((flow.float32, np.float32), (flow.float64, np.float64)):
        got = _predict(lambda a: flow.range(0, 20, 0.1, dtype=dtype), np.zeros(1, np_dtype))
        delta = np_dtype(0.1)
        np.testing.assert_array_equal(got, np.arange(200).astype(np_dtype) * delta)


def test_a_float32_sigmoid_keeps_its_relative_precision_in_the_tail():
    """OneFlow's sigmoid is 1 / (1 + exp(-x)); onnxruntime's CPU kernel approximates it (0
    from x = -18 down: a binary cross entropy of it is inf)."""
    x = np.array([-15, -18, -20, -80], np.float32)
    got = _predict(flow.math.sigmoid, x)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)


def test_an_ofrecord_reader_on_two_devices_reads_each_devices_part_files(tmp_path):
    """On a placement of 2 devices, OneFlow's reader gives each device half the part files
    and half the batch (ofrecord_dataset.h's BalancedSplitter); the batch is device 0's
    records, then device 1's."""
    from onnxjob.io import ofrecord
    ofrecord.write_dataset(str(tmp_path), [{"i": np.float32(i)} for i in range(16)], 2)
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0-1"):
            records = flow.data.ofrecord_reader(str(tmp_path), batch_size=8, data_part_num=2,
                                                part_name_suffix_length=5)
            return flow.data.OFRecordRawDecoder(records, "i", shape=(1,), dtype=flow.float)

    np.testing.assert_array_equal(job().ravel(), [0, 1, 2, 3, 8, 9, 10, 11])
    np.testing.assert_array_equal(job().ravel(), [4, 5, 6, 7, 12, 13, 14, 15])


def test_flow_load_and_save_of_given_values_start_no_session(tmp_path):
    """OneFlow's flow.load (check_point_v2.Load) and flow.save(values, dir) are file work:
    jobs may still be defined after them (defining one once the session runs is refused)."""
    flow.clear_default_session()
    flow.save({"w": np.full((2, 1), 3.0, np.float32)}, str(tmp_path / "ck"))
    params = flow.load(str(tmp_path / "ck"))

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        return flow.matmul(x, flow.get_variable("w", shape=(2, 1),
                                                initializer=flow.zeros_initializer()))

    flow.load_variables(params)
    np.testing.assert_array_equal(predict(np.ones((4, 2), np.float32)).ravel(), [6.0] * 4)


def test_job_function_forms_oneflow_runs():
    """flow.env.current_resource is flow.current_resource (a proto with fields); one function
    decorated twice runs its last definition from either wrapper (OneFlow keys jobs by
    name); a functools.partial without a return annotation is a job."""
    import functools
    flow.clear_default_session()
    assert flow.env.current_resource().gpu_device_num == flow.current_resource().gpu_device_num

    def twice(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x * 2
    first = flow.global_function()(twice)
    second = flow.global_function(function_config=flow.FunctionConfig())(twice)

    def add(k, x: tp.Numpy.Placeholder((2,))):
        return x + k
    plus_two = functools.partial(add, 2.0)
    plus_two.__name__ = "plus_two"
    plus = flow.global_function()(plus_two)
    ones = np.ones(2, np.float32)
    np.testing.assert_array_equal(second(ones), [2.0, 2.0])
    np.testing.assert_array_equal(first(ones), [2.0, 2.0])
    np.testing.assert_array_equal(plus(ones).get().numpy(), [3.0, 3.0])


def test_a_blob_s_lbi_reads_as_methods_and_its_mirrored_parts_are_itself():
    """OneFlow 0.5's `blob.lbi.op_name()` (a cfg message's methods; 0.4's plain fields read
    too) and a mirrored blob's `sub_consistent_blob_list` (one device: the blob)."""
    flow.clear_default_session()
    seen = {}
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def job(x: tp.ListNumpy.Placeholder((2, 3))) -> tp.ListNumpy:
        r = flow.math.relu(x, name="r")
        seen["names"] = (r.lbi.op_name(), r.lbi.op_name, r.lbi.blob_name())
        seen["parts"] = [p.shape for p in r.sub_consistent_blob_list]
        return r

    job([np.ones((2, 3), np.float32)])
    assert seen["names"][0] == seen["names"][1] == "r" and seen["names"][2]
    assert seen["parts"] == [(2, 3)]


def test_a_sign_as_the_loss_has_zero_gradient_and_get_variable_keeps_oneflows_name():
    """OneFlow registers sign's gradient (zero: math_unary_elementwise_func.h), so a train
    job whose loss is a sign runs and leaves the variables as they were; and its
    get_variable is `api_get_variable`, the name oneflow_convert's code generator reads."""
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(1,), initializer=flow.ones_initializer())
        y = flow.math.sign(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(y)
        return y
    x = np.array([[-2, 0, 3], [1, -1, 0.5]], np.float32)
    np.testing.assert_array_equal(job(x), np.sign(x))
    job(x)
    assert flow.get_all_variables()["w"].numpy().tolist() == [1.0]
    assert flow.get_variable.__name__ == "api_get_variable"
    assert str(flow.get_variable).split()[1] == "api_get_variable"


@pytest.mark.parametrize("rate", [0.1, 0.6, 0.9])
def test_dropout_scales_kept_values_by_oneflows_float_of_one_over_one_minus_rate(rate):
    """OneFlow's wrapper stores float(1.0 / (1.0 - rate)), computed in double (10.0 at
    0.9); onnxruntime's Dropout computes 1.0f / (1.0f - ratio) in float32 (9.999998)."""
    flow.clear_default_session()
    got = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((400,))) -> tp.Numpy:
        v = flow.get_variable("v", (400,), initializer=flow.zeros_initializer())
        y = flow.nn.dropout(x + v, rate=rate)
        flow.watch_diff(v, lambda d: got.setdefault("dx", d))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(flow.math.reduce_sum(y))
        return y
    y = job(np.ones(400, np.float32))
    kept = y != 0
    assert 0 < kept.sum() < 400
    scale = np.float32(1.0 / (1.0 - rate))
    assert set(y[kept].tolist()) == {scale} and set(got["dx"][kept].tolist()) == {scale}
    assert not got["dx"][~kept].any()


@pytest.mark.parametrize("case", ["label -1", "label 3", "one_hot -1", "one_hot 3",
                                  "batch_gather 3"])
def test_an_index_outside_its_range_stops_the_run_naming_it_as_oneflow_checks_it(case):
    """OneFlow's CPU kernels CHECK labels (sparse_cross_entropy_kernel_util.cpp), one_hot
    indices (one_hot_kernel.cpp) and batch_gather indices (batch_gather_kernel_util.cpp);
    ONNX's ops wrapped -1 silently (the last class, trained on) or failed with onnxruntime's
    own words. The run stops at the user's line, naming what is out of range."""
    from onnxjob.errors import JobRunError
    flow.clear_default_session()
    kind, value = case.split()
    index = tp.Numpy.Placeholder((2,), dtype=flow.int32)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3)), i: index) -> tp.Numpy:
        if kind == "label":
            return flow.nn.sparse_softmax_cross_entropy_with_logits(labels=i, logits=x)
        if kind == "one_hot":
            return flow.one_hot(i, depth=3)
        return flow.gather(x, flow.reshape(i, (2, 1)), batch_dims=1)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert job(x, np.array([2, 0], np.int32)).shape[0] == 2
    what = {"label": "a label is", "one_hot": "an index is", "batch_gather": "an index is"}
    with pytest.raises(JobRunError, match=f"{what[kind]} outside \\[0, 3\\)") as e:
        job(x, np.array([1, int(value)], np.int32))
    assert "test_oneflow_regressions.py:" in str(e.value)


def test_one_hot_refuses_float_indices_as_oneflow_does():
    from onnxjob.errors import TraceError
    flow.clear_default_session()

    @flow.global_function()
    def job(i: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.one_hot(i, depth=3)
    with pytest.raises(TraceError, match="one_hot: indices must be int32 or int64"):
        job(np.array([1.0, 2.0, 0.0], np.float32))


@pytest.mark.parametrize("fn,array,expected", [
    # a multiplicative hash of int32 ids: OneFlow's scalar_mul casts its int64 operand
    (lambda a: a * 2654435761, np.int32([1, 2, 3]),
     (np.int64([1, 2, 3]) * 2654435761).astype(np.int32)),
    (lambda a: a * 255, np.int8([0, 1, -1]), np.int8([0, -1, 1])),
    (lambda a: flow.math.add(a, 2 ** 32 + 5), np.int32([1, -1]), np.int32([6, 4])),
    (lambda a: a + flow.constant(300, dtype=flow.int8, shape=(2,)), np.int8([0, 1]),
     np.int8([44, 45])),
    (lambda a: flow.constant_like(a, 1000), np.int8([0, 1]), np.int8([-24, -24])),
])
def test_an_integer_outside_an_integer_blob_s_range_wraps(fn, array, expected):
    """OneFlow's kernels static_cast the int64 operand or value to the Blob's dtype
    (scalar_mul/scalar_add/constant kernels); NumPy 2 refused such a Python int."""
    out = _predict(fn, array)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


def _jobs_declaring(name, initializers):
    """A fresh session with one predict job per initializer, each declaring `name`."""
    flow.clear_default_session()
    def job(i, initializer):
        def body() -> tp.Numpy:
            return flow.get_variable(name, (3,), initializer=initializer) + 0
        body.__name__ = f"job_{i}"
        return flow.global_function()(body)
    return [job(i, initializer) for i, initializer in enumerate(initializers)]


def test_a_variable_takes_the_initializer_of_the_last_job_declaring_it():
    """OneFlow 0.3-0.5 initializes a variable from the conf of the last job that declares
    it (Session.UpdateInfo4InterfaceOp fills its table in job order; check_point_v2.Init
    reads it): an EMA job re-declaring the weights with a placeholder initializer sets
    them; a declaration without initializer changes nothing. A value loaded before the
    jobs run stays."""
    train_like, _, _ = _jobs_declaring("w", [flow.ones_initializer(), flow.zeros_initializer(),
                                             None])
    np.testing.assert_array_equal(train_like(), [0, 0, 0])
    first, _ = _jobs_declaring("v", [flow.ones_initializer(), flow.zeros_initializer()])
    flow.load_variables({"v": np.array([3, 4, 5], np.float32)})
    np.testing.assert_array_equal(first(), [3, 4, 5])


def test_decode_random_gives_its_job_one_batch_for_every_run():
    """OneFlow's DecodeRandomKernel fills its one output register at the first run only
    (decode_random_kernel.cpp: is_init_): a synthetic-data job trains on one fixed batch;
    another job's decode_random has a batch of its own."""
    flow.clear_default_session()

    def make(name):
        def synth() -> tp.Numpy:
            return flow.data.decode_random(shape=(4,), dtype=flow.float, batch_size=2,
                                           initializer=flow.random_uniform_initializer(-1, 1))
        synth.__name__ = name
        return flow.global_function()(synth)

    first, second = make("first"), make("second")
    a = first()
    np.testing.assert_array_equal(first(), a)
    np.testing.assert_array_equal(first(), a)
    assert not np.array_equal(second(), a)
    assert a.min() >= -1 and a.max() <= 1 and a.std() > 0


def test_add_loss_in_a_predict_typed_job_is_refused_as_oneflow():
    """global_function(type="predict") (its default, also with function_config= by
    keyword) takes the config's predict_conf, clearing the train settings the old API set
    on it: OneFlow's add_loss then stops (job has no TrainConf). The positional
    global_function(config) of that API keeps them and trains."""
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.train.primary_lr(0.1)
    config.train.model_update_conf(dict(naive_conf={}))

    def body(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.losses.add_loss(loss)
        return loss

    keyword = flow.global_function(function_config=config)(body)
    with pytest.raises(TraceError, match=r"add_loss in job 'body', which has no train "
                                         r"configuration.*type=\"train\""):
        keyword(np.ones((2, 3), np.float32))
    flow.clear_default_session()
    positional = flow.global_function(config)(body)
    positional(np.ones((2, 3), np.float32))
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), 1 - 0.1 * 2)


def test_a_0d_and_a_1_element_blob_combine_as_oneflow_0_5_shapes_them():
    """OneFlow 0.5 takes a (1,) Blob as the scalar of scalar_<op>_by_tensor, whose output
    has the other operand's shape: loss + lam * reg of 0-d losses and a (1,) variable is
    0-d (its f-string formats); broadcasting ((1,) - 0-d, Python numbers) keeps (1,)."""
    flow.clear_default_session()
    shapes = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        z0 = flow.math.reduce_sum(x)
        c1 = flow.constant(2.0, dtype=flow.float, shape=(1,))
        for key, value in {"z0 + c1": z0 + c1, "c1 * z0": c1 * z0, "z0 - c1": z0 - c1,
                           "z0 / c1": z0 / c1, "add": flow.math.add(c1, z0),
                           "c1 - z0": c1 - z0, "c1 / z0": c1 / z0, "c1 + 1": c1 + 1.0,
                           "1 - c1": 1.0 - c1}.items():
            shapes[key] = value.shape
        return z0 + c1 * z0

    loss = job(np.ones((4, 3), np.float32))
    assert f"{loss:.1f}" == "36.0"
    assert shapes == {"z0 + c1": (), "c1 * z0": (), "z0 - c1": (), "z0 / c1": (), "add": (),
                      "c1 - z0": (1,), "c1 / z0": (1,), "c1 + 1": (1,), "1 - c1": (1,)}
