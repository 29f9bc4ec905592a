"""The fast path of synchronous job calls (frontend/fast_call.py): the same results,
errors, ordering and exclusion as the full path. Its speed is measured in
bench/bench_serving.py, not here."""
import os
import threading
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import JobArgumentError
from onnxjob.frontend.job_function import JobFunction
from onnxjob.runtime.session import JobRuntime, default_session

THIS_FILE = os.path.basename(__file__)


def counter_jobs():
    """`inc` adds 1 to the variable w (async, through the worker); `read` returns w + x."""
    @flow.global_function(type="train")
    def inc(x: tp.Numpy.Placeholder((1,))) -> tp.Callback[tp.Numpy]:
        w = flow.get_variable("w", (1,), initializer=flow.zeros_initializer())
        flow.optimizer.SGD(1.0, momentum=0).minimize(-w + x * 0)
        return w

    @flow.global_function()
    def read(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        return flow.get_variable("w", (1,), initializer=flow.zeros_initializer()) + x
    return inc, read


def affine_job():
    @flow.global_function()
    def affine(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return x * 2 + 1
    return affine


def full_path_calls(monkeypatch):
    """A list that gets one entry per call that takes the full path."""
    calls = []
    full = JobFunction._call

    def counted(self, args, kwargs):
        calls.append(self.name)
        return full(self, args, kwargs)
    monkeypatch.setattr(JobFunction, "_call", counted)
    return calls


def test_later_calls_take_the_fast_path_with_the_same_results(monkeypatch):
    affine = affine_job()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    first = affine(x)
    assert default_session().fast_calls[affine.job] is not None
    calls = full_path_calls(monkeypatch)
    for _ in range(20):     # past the switch to the frozen session (none here: no variable)
        np.testing.assert_array_equal(affine(x), first)
    assert calls == []


def test_several_placeholders_and_a_tuple_result(monkeypatch):
    @flow.global_function()
    def pair(a: tp.Numpy.Placeholder((2,)),
             b: tp.Numpy.Placeholder((3,), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
        return a + 1, b * 2

    a, b = np.arange(2, dtype=np.float32), np.arange(3, dtype=np.int32)
    pair(a, b)
    calls = full_path_calls(monkeypatch)
    for _ in range(3):
        got = pair(a, b)
        assert isinstance(got, tuple)
        np.testing.assert_array_equal(got[0], a + 1)
        np.testing.assert_array_equal(got[1], b * 2)
    assert calls == []
    with pytest.raises(JobArgumentError) as e:
        pair(a, np.arange(4, dtype=np.int32))
    assert "'b'" in str(e.value) and f"{THIS_FILE}:" in str(e.value)
    np.testing.assert_array_equal(pair(a, b.astype(np.int64))[1], b * 2)   # converted
    assert calls == ["pair", "pair"]


def test_jobs_without_a_fast_path():
    @flow.global_function()
    def callback(x: tp.Numpy.Placeholder((1,))) -> tp.Callback[tp.Numpy]:
        return x + 1

    @flow.global_function()
    def watched(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        flow.watch(x, lambda v: None)
        return x + 1

    @flow.global_function()
    def mirrored(x: tp.ListNumpy.Placeholder((1,))) -> tp.ListNumpy:
        return x + 1

    x = np.zeros(1, np.float32)
    callback(x)(lambda v: None)
    watched(x)
    mirrored([x])
    flow.sync_default_session()
    fast_calls = default_session().fast_calls
    assert fast_calls[callback.job] is None
    assert fast_calls[watched.job] is None, "a watch handler is user code inside the run"
    assert mirrored.job not in fast_calls or fast_calls[mirrored.job] is None


def test_bad_arguments_after_fast_calls_raise_the_full_paths_errors():
    affine = affine_job()
    good = np.zeros((2, 3), np.float32)
    affine(good)
    affine(good)
    with pytest.raises(JobArgumentError) as e:
        affine(np.zeros((3, 3), np.float32))
    assert "(3, 3)" in str(e.value) and f"{THIS_FILE}:" in str(e.value)
    with pytest.raises(AssertionError, match="numpy.ndarray"):
        affine(good.tolist())
    with pytest.raises(AssertionError, match="dtype"):
        affine(np.full((2, 3), "a"))
    with pytest.raises(AssertionError, match="takes 1 argument"):
        affine(good, good)
    with pytest.raises(TypeError, match="keywords"):
        affine(x=good)


def test_arguments_the_full_path_converts_still_work():
    affine = affine_job()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = x * 2 + 1
    np.testing.assert_array_equal(affine(x), expected)
    np.testing.assert_array_equal(affine(x.astype(np.float64)), expected)
    np.testing.assert_array_equal(affine(x.astype(np.int32)), expected)  # (OneFlow casts)
    view = np.arange(12, dtype=np.float32).reshape(3, 4)[:2, 1:]     # not C-contiguous
    np.testing.assert_array_equal(affine(view), view * 2 + 1)
    equal_dtype = x.view(np.dtype(np.float32).newbyteorder("="))     # equal, not identical
    assert equal_dtype.dtype == np.float32 and equal_dtype.dtype is not x.dtype
    np.testing.assert_array_equal(affine(equal_dtype), expected)
    np.testing.assert_array_equal(affine(np.asfortranarray(x)), expected)


def test_a_sync_call_sees_every_async_call_queued_before_it():
    inc, read = counter_jobs()
    x = np.zeros(1, np.float32)
    read(x)
    assert default_session().fast_calls[read.job] is not None
    for i in range(1, 101):
        inc(x)(lambda v: None)
        assert read(x)[0] == i, "a synchronous call ran before the queued increment"


def test_a_fast_call_raises_an_earlier_async_error_first():
    inc, read = counter_jobs()
    x = np.zeros(1, np.float32)
    read(x)

    def fail(value):
        raise ValueError("callback failed")
    inc(x)(fail)
    raised = []
    for _ in range(2):      # the first waits for the run; the error is raised once, by
        try:                # whichever call first finds it recorded
            read(x)
        except ValueError as e:
            raised.append(str(e))
    assert raised == ["callback failed"]
    assert read(x)[0] == 1.0


def test_runs_never_overlap_when_threads_call_the_fast_path(monkeypatch):
    inside, overlaps = [0], []
    run = JobRuntime.run

    def checked_run(self, feeds):
        inside[0] += 1
        if inside[0] > 1:
            overlaps.append(self.job.name)
        try:
            return run(self, feeds)
        finally:
            inside[0] -= 1
    monkeypatch.setattr(JobRuntime, "run", checked_run)
    inc, read = counter_jobs()
    x = np.zeros(1, np.float32)
    read(x)
    errors = []

    def caller(n, increments):
        try:
            for i in range(n):
                if increments and i % 2:
                    inc(x)(lambda v: None)
                else:
                    assert read(x).shape == (1,)
        except BaseException as e:  # noqa: BLE001 - the assertion below reports it
            errors.append(e)
    threads = [threading.Thread(target=caller, args=(300, i < 2)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flow.sync_default_session()
    assert errors == [] and overlaps == []
    assert read(x)[0] == 300.0


def test_a_job_called_from_a_sync_jobs_watch_handler_is_refused_not_deadlocked():
    affine = affine_job()
    seen = []

    @flow.global_function()
    def outer(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        flow.watch(x, lambda v: seen.append(affine(v.numpy())))
        return x

    x = np.zeros((2, 3), np.float32)
    affine(x)       # its fast path exists
    outcome = []

    def call():
        try:
            outer(x)
        except RuntimeError as e:
            outcome.append(str(e))
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the call deadlocked"
    assert len(outcome) == 1 and "called from a callback or watch handler" in outcome[0]
    assert seen == []
    np.testing.assert_array_equal(affine(x), x * 2 + 1)     # the session goes on


def test_an_interrupted_fast_call_leaves_the_session_usable(monkeypatch):
    run = JobRuntime.run
    interrupt = [False]

    def interrupted_once(self, feeds):      # a Ctrl-C inside onnxruntime's run
        if interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt
        return run(self, feeds)
    monkeypatch.setattr(JobRuntime, "run", interrupted_once)
    affine = affine_job()
    x = np.ones((2, 3), np.float32)
    affine(x)
    calls = full_path_calls(monkeypatch)
    interrupt[0] = True
    with pytest.raises(KeyboardInterrupt):
        affine(x)
    np.testing.assert_array_equal(affine(x), x * 2 + 1)
    assert calls == [], "both calls took the fast path"
    assert not default_session().executor._run_lock.locked()


def test_a_cleared_session_keeps_no_fast_call_and_old_wrappers_still_run():
    affine = affine_job()
    x = np.ones((2, 3), np.float32)
    affine(x)
    old = default_session()
    flow.clear_default_session()
    assert default_session() is not old
    again = affine_job()
    np.testing.assert_array_equal(again(x), x * 2 + 1)
    np.testing.assert_array_equal(affine(x), x * 2 + 1)  # the current session's job of its name


def test_unannotated_jobs_return_a_future_on_the_fast_path(monkeypatch):
    @flow.global_function()
    def old_style(x=flow.FixedTensorDef((2, 3))):
        return x + 1

    x = np.zeros((2, 3), np.float32)
    assert np.array_equal(old_style(x).get().numpy(), x + 1)
    calls = full_path_calls(monkeypatch)
    assert np.array_equal(old_style(x).get().numpy(), x + 1)
    assert calls == []


def test_run_function_matches_session_run_and_still_checks_inputs():
    import onnxruntime as ort
    from onnx import TensorProto, helper
    from onnxjob.runtime import backend
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "ab"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("y", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = ort.InferenceSession(model.SerializeToString(), providers=[backend.CPU])
    run = backend.run_function(session, ["z", "y"])
    feeds = {"a": np.array([1, -3], np.float32), "b": np.array([1, 1], np.float32)}
    for got, want in zip(run(feeds), session.run(["z", "y"], feeds)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(Exception, match="Missing Input: b"):
        run({"a": feeds["a"]})
