"""Callback jobs: order, errors never lost, sync, exit."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import JobArgumentError


def counter_jobs():
    @flow.global_function(type="train")
    def inc(x: tp.Numpy.Placeholder((1,))) -> tp.Callback[tp.Numpy]:
        w = flow.get_variable("w", (1,), initializer=flow.zeros_initializer())
        # loss = -w: one SGD step with lr 1 adds exactly 1 to w
        flow.optimizer.SGD(1.0, momentum=0).minimize(-w + x * 0)
        return w

    @flow.global_function()
    def read(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        return flow.get_variable("w", (1,), initializer=flow.zeros_initializer()) + x * 0
    return inc, read


def test_ten_thousand_callbacks_in_call_order():
    inc, _ = counter_jobs()
    got = []
    x = np.zeros(1, np.float32)
    for _ in range(10000):
        inc(x)(lambda v: got.append(float(v[0])))
    flow.sync_default_session()
    assert got == [float(i) for i in range(10000)]


def test_callback_exceptions_reported_and_first_reraised(capsys):
    inc, _ = counter_jobs()
    x = np.zeros(1, np.float32)
    calls = []

    def cb(v):
        calls.append(v)
        if len(calls) % 100 == 0:
            raise ValueError(f"boom {len(calls)}")

    with pytest.raises(ValueError, match="boom 100"):
        for _ in range(300):
            inc(x)(cb)
        flow.sync_default_session()
    flow.sync_default_session()  # everything reported once; the session goes on
    assert capsys.readouterr().err.count("ValueError: boom") >= 1


def test_mixing_sync_and_async_keeps_order():
    inc, read = counter_jobs()
    x = np.zeros(1, np.float32)
    for _ in range(50):
        inc(x)
    assert read(x)[0] == 50.0


def test_bad_arguments_raise_in_callers_thread():
    inc, _ = counter_jobs()
    with pytest.raises(JobArgumentError, match="test_async.py"):
        inc(np.zeros(2, np.float32))


def test_registering_twice_raises():
    inc, _ = counter_jobs()
    registrar = inc(np.zeros(1, np.float32))
    registrar(lambda v: None)
    with pytest.raises(AssertionError):
        registrar(lambda v: None)
    flow.sync_default_session()


def test_pending_callbacks_run_at_exit_and_errors_fail_the_process(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import sys, numpy as np
        import onnxjob as flow, onnxjob.typing as tp

        @flow.global_function()
        def job(x: tp.Numpy.Placeholder((3,))) -> tp.Callback[tp.Numpy]:
            return x * 2

        def last(v):
            print("last", v.sum())
            if sys.argv[1] == "fail":
                raise RuntimeError("callback failed")
        for i in range(20):
            job(np.ones(3, np.float32))(lambda v: None)
        job(np.ones(3, np.float32))(last)
    """))
    ok = subprocess.run([sys.executable, str(script), "ok"], capture_output=True, text=True)
    assert ok.returncode == 0 and "last 6.0" in ok.stdout
    bad = subprocess.run([sys.executable, str(script), "fail"], capture_output=True, text=True)
    assert bad.returncode != 0 and "callback failed" in bad.stderr


def test_a_closed_executor_takes_no_run_and_waits_for_one_going_on():
    """A session closes at the program's end (or clear_default_session) while a daemon
    thread may still call jobs: a run going on in that thread finishes first, and later
    calls raise in their thread, as OneFlow's closed session refuses LazyRun. Before, the
    closed executor started a new worker for the thread's next run, which was inside
    onnxruntime while Python finalized and aborted the process (or close's sync waited
    forever for the thread's queued runs)."""
    import threading
    import time
    from onnxjob.runtime.executor import Executor
    executor, finished, started = Executor(), [], threading.Event()

    def slow():
        started.set()
        time.sleep(0.3)
        finished.append(True)
        return 1

    thread = threading.Thread(target=executor.run_sync, args=(slow,), daemon=True)
    thread.start()
    assert started.wait(60)             # the thread is inside its inline run
    executor.close()
    assert finished == [True]           # close waited for it
    for call in (lambda: executor.run_sync(slow),
                 lambda: executor.run_async(slow, lambda value: None)):
        with pytest.raises(RuntimeError, match="session is closed"):
            call()
    assert executor._thread is None     # no worker started for them
    thread.join()


def test_clear_default_session_waits_and_reraises():
    inc, _ = counter_jobs()
    got = []

    def cb(v):
        got.append(v)
        raise KeyError("late")

    inc(np.zeros(1, np.float32))(cb)
    with pytest.raises(KeyError, match="late"):
        flow.clear_default_session()
    assert len(got) == 1


def test_calls_from_several_threads_never_overlap_runs():
    import threading
    inc, read = counter_jobs()
    x = np.zeros(1, np.float32)

    def worker(n):
        for i in range(n):
            if i % 2:
                inc(x)(lambda v: None)
            else:
                read(x)
    threads = [threading.Thread(target=worker, args=(200,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flow.sync_default_session()
    assert read(x)[0] == 400.0  # every one of the 400 increments applied exactly once


def test_calling_a_job_from_a_handler_is_refused_not_deadlocked():
    @flow.global_function()
    def read(x: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        return x + 1

    @flow.global_function()
    def launcher(x: tp.Numpy.Placeholder((1,))) -> tp.Callback[tp.Numpy]:
        # a Callback job always runs in the worker, and so do its watch handlers
        flow.watch(x, lambda v: read(v.numpy()))
        return x

    launcher(np.zeros(1, np.float32))
    with pytest.raises(RuntimeError, match="called from a callback"):
        flow.sync_default_session()


def test_an_async_run_that_fails_is_reported_and_reraised(capsys):
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def job(x: tp.ListNumpy.Placeholder((4, 3))) -> tp.Callback[tp.ListNumpy]:
        return flow.reshape(x, [12])  # traced with the maximum shape

    got = []
    job([np.zeros((4, 3), np.float32)])(got.append)
    flow.sync_default_session()
    assert len(got) == 1
    job([np.zeros((2, 3), np.float32)])(got.append)  # 6 elements cannot become 12
    with pytest.raises(Exception, match="(?i)reshape"):
        flow.sync_default_session()
    assert "asynchronous job run" in capsys.readouterr().err
    assert len(got) == 1, "no callback for the failed run"


def test_idle_onnxruntime_threads_spin_briefly(monkeypatch):
    """Idle intra-op threads sleep after ONNXJOB_SPIN_US (default 100) us, rather than
    spinning on the cores the caller's next work needs (bench/bench_spin.py measures it)."""
    from onnxjob.runtime import backend
    key = "session.intra_op.spin_duration_us"
    assert backend.session_options(is_train=True).get_session_config_entry(key) == "100"
    monkeypatch.setenv("ONNXJOB_SPIN_US", "0")
    assert backend.session_options(is_train=False).get_session_config_entry(key) == "0"


def test_a_ctrl_c_during_the_session_start_is_raised_once_it_is_done(monkeypatch):
    """Ctrl-C while the first call starts the session: raised after the start, which
    completes (a KeyboardInterrupt inside a module's first import could leave Python's
    import lock held while the thread drawing the initial values imported: a hang)."""
    import os
    import signal
    from onnxjob.runtime.session import Session, default_session
    inc, _ = counter_jobs()
    draw = Session._init_variables

    def interrupted_draw(self, seed):
        os.kill(os.getpid(), signal.SIGINT)     # (the handler runs in the main thread)
        return draw(self, seed)

    monkeypatch.setattr(Session, "_init_variables", interrupted_draw)
    with pytest.raises(KeyboardInterrupt):
        inc(np.zeros(1, np.float32))
    monkeypatch.setattr(Session, "_init_variables", draw)
    assert default_session().is_running
    flow.sync_default_session()
