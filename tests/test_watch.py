"""flow.watch / watch_diff semantics (spec §3.2) and the watch example's output."""
import os
import subprocess
import sys

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")


def test_watch_diff_of_logits_is_unscaled_softmax_minus_onehot():
    seen = []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((8, 5)),
            labels: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        w = flow.get_variable("w", (5, 5), initializer=flow.random_normal_initializer())
        logits = flow.matmul(x, w)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.watch_diff(logits, lambda d: seen.append(d))
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return logits

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    labels = rng.integers(0, 5, 8).astype(np.int32)
    logits = job(x, labels)
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(8), labels] -= 1
    np.testing.assert_allclose(seen[0], p, rtol=1e-5, atol=1e-6)


def test_watch_diff_of_a_variable_minimised_directly_is_ones():
    seen = []

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((10,))) -> tp.Numpy:
        w = flow.get_variable("w", (10,), initializer=flow.zeros_initializer())
        loss = w + x
        flow.watch_diff(loss, lambda d: seen.append(d))
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    job(np.zeros(10, np.float32))
    assert np.array_equal(seen[0], np.ones(10, np.float32))


def test_watch_handler_must_take_one_parameter():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        flow.watch(x, lambda a, b: None)
        return x

    with pytest.raises(AssertionError, match="only one parameter"):
        job(np.zeros(2, np.float32))


def test_watch_example_prints_relu_at_exit():
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "test_watch.py")],
                         capture_output=True, text=True, check=True).stdout
    # (NumPy wraps an array past 75 characters, as a tiny value's scientific notation may
    # make it, and prints at most 8 decimals, the digits chosen per array)
    assert out.startswith("in:") and out.count("out:") == 1
    printed_in, printed_out = out[3:].split("out:")
    xin = np.array(printed_in.replace("[", " ").replace("]", " ").split(), dtype=np.float32)
    xout = np.array(printed_out.replace("[", " ").replace("]", " ").split(), dtype=np.float32)
    assert xin.shape == xout.shape == (5,)
    np.testing.assert_allclose(xout, np.maximum(xin, 0), rtol=1e-6, atol=1e-8)


def test_watch_diff_sees_onefows_unscaled_diffs_exactly():
    """OneFlow's watched diffs are the backward's own (seed ones): integer counts here,
    equal to the bit even where the loss has a non-power-of-two element count."""
    flow.clear_default_session()
    rng = np.random.default_rng(3)
    params = rng.random((3, 150, 5)).astype(np.float32)
    idx = rng.integers(0, 150, (20, 15, 45)).astype(np.int32)
    got = {}

    @flow.global_function(type="train")
    def job(p: tp.Numpy.Placeholder(params.shape),
            i: tp.Numpy.Placeholder(idx.shape, dtype=flow.int32)) -> tp.Numpy:
        v = flow.get_variable("v", shape=params.shape, initializer=flow.constant_initializer(0))
        x = v + p
        y = flow.gather(x, i, axis=1)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                           momentum=0).minimize(y)
        flow.watch_diff(x, lambda g: got.setdefault("g", g))
        return y

    job(params, idx)
    counts = np.zeros(150, np.float32)
    np.add.at(counts, idx.ravel(), 1)
    np.testing.assert_array_equal(got["g"], np.broadcast_to(counts[None, :, None], params.shape))
    # the update still uses the mean over the loss's elements
    v = flow.get_all_variables()["v"].numpy()
    np.testing.assert_allclose(v, -0.5 * got["g"] / (3 * 20 * 15 * 45 * 5), rtol=1e-6)


def test_watch_diff_without_a_gradient_is_skipped_as_oneflow_does():
    """Model code shared by a train and a predict job watches a weight's diff: OneFlow's
    add_lbi_diff_watcher serves the train job and skips the predict job's (and a blob off
    the loss's path), calling no handler; onnxjob warns once at the line."""
    seen = []

    def model(x):
        w = flow.get_variable("w", (4, 2), initializer=flow.ones_initializer())
        flow.watch_diff(w, lambda d: seen.append(("w", d)))
        y = flow.matmul(x, w)
        flow.watch_diff(flow.math.reduce_max(y), lambda d: seen.append(("max", d)))
        return y

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        loss = flow.math.reduce_mean(model(x))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return model(x)

    x = np.ones((3, 4), np.float32)
    with pytest.warns(UserWarning, match="has no gradient in job") as caught:
        train(x)
        out = predict(x)
    assert {str(w.filename) for w in caught} == {__file__} and len(caught) == 2
    assert out.shape == (3, 2)
    assert [name for name, _ in seen] == ["w"]
    np.testing.assert_allclose(seen[0][1], np.full((4, 2), 3.0 / 6))


def test_default_printer_prints_the_prompt_given_and_a_dynamic_blob_as_a_list(capsys):
    """OneFlow's handler without one given (ops/watch.py): `if prompt is not None:
    print(str(prompt))`, then the value, a dynamic Blob's as its ListNumpy list."""
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def mirrored(x: tp.ListNumpy.Placeholder((2, 2))) -> None:
        flow.watch(x * 2.0)

    @flow.global_function()
    def consistent(x: tp.Numpy.Placeholder((1, 2))) -> None:
        flow.watch(x, "")

    a = np.ones((1, 2), np.float32)
    mirrored([a])
    consistent(a)
    flow.sync_default_session()
    assert capsys.readouterr().out == str([a * 2]) + "\n" + "\n" + str(a) + "\n"
