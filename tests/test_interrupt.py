"""Ctrl-C (SIGINT) during a training loop: nothing hangs, nothing is lost, the user's
`except KeyboardInterrupt` handler can still save a checkpoint."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import onnxjob as flow
from onnxjob.runtime import executor as executor_module
from onnxjob.runtime.executor import Executor


def _finishes(fn, timeout=10.0):
    """Whether `fn()` returns within `timeout` seconds (run in a daemon thread, so a hang
    fails the test instead of blocking it)."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive()


class _InterruptedOnce(type(threading.Condition())):
    """A Condition whose next wait() raises KeyboardInterrupt, as a Ctrl-C there would."""
    interrupt = False

    def wait(self, timeout=None):
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        return super().wait(timeout)


def test_interrupt_while_waiting_for_room_queues_nothing_and_sync_returns():
    ex = Executor()
    ex._cond = _InterruptedOnce()
    gate = threading.Event()
    delivered = []
    for i in range(1 + executor_module.MAX_IN_FLIGHT):   # one running, the queue full
        ex.run_async(lambda i=i: (gate.wait(), i)[1], lambda p, v: p.deliver(v)).register(
            delivered.append)
    while not ex._running:
        time.sleep(0.001)
    before = ex.in_flight
    ex._cond.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        ex.run_async(lambda: 99, lambda p, v: p.deliver(v))
    assert ex.in_flight == before == 1 + executor_module.MAX_IN_FLIGHT
    gate.set()
    assert _finishes(ex.sync), "sync() hung after an interrupted submit"
    assert ex.in_flight == 0
    assert delivered == [0, 1, 2], "every queued run delivered, the interrupted one never ran"
    ex.shutdown()


class _NotifyInterruptedOnce(type(threading.Condition())):
    """A Condition whose next notify_all() raises KeyboardInterrupt before it wakes anyone,
    as a Ctrl-C arriving at its first bytecode would."""
    interrupt = False

    def notify_all(self):
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        super().notify_all()


def test_interrupt_in_the_notify_after_queueing_loses_no_run():
    """The run was queued but the idle worker never notified: it still runs, delivers, and
    sync() returns (the worker looks at the queue without a notify, WORKER_IDLE_WAKEUP_S)."""
    ex = Executor()
    ex._cond = _NotifyInterruptedOnce()
    ex.run_sync(lambda: None)
    ex.run_async(lambda: 0, lambda p, v: p.deliver(v)).register(lambda v: None)
    ex.sync()       # the worker is started and now idle, waiting for a task
    ran, delivered = [], []
    ex._cond.interrupt = True
    with pytest.raises(KeyboardInterrupt):
        ex.run_async(lambda: ran.append(7), lambda p, v: p.deliver(v))
    assert _finishes(ex.sync), "sync() hung: the queued run was never taken"
    assert ran == [7] and ex.in_flight == 0
    ex.run_async(lambda: 8, lambda p, v: p.deliver(v)).register(delivered.append)
    ex.sync()
    assert delivered == [8]
    ex.shutdown()


def test_interrupted_wait_for_a_queued_sync_run_lets_it_finish_and_reports_its_error(
        monkeypatch, capsys):
    ex = Executor()
    gate = threading.Event()
    ex.run_async(gate.wait, lambda p, v: None)          # keeps the sync call off the fast path
    ran = []

    class InterruptedEvent(threading.Event):
        def wait(self, timeout=None):
            raise KeyboardInterrupt

    def failing_run():
        ran.append(True)
        raise ValueError("the abandoned run failed")

    monkeypatch.setattr(executor_module.threading, "Event", InterruptedEvent)
    with pytest.raises(KeyboardInterrupt):
        ex.run_sync(failing_run)
    monkeypatch.undo()
    gate.set()
    assert _finishes(lambda: _wait_idle(ex)), "the abandoned run never finished"
    with pytest.raises(ValueError, match="abandoned run failed"):
        ex.sync()
    assert ran == [True]
    assert "caller was interrupted" in capsys.readouterr().err
    ex.shutdown()


def _wait_idle(ex):
    while ex.in_flight:
        time.sleep(0.001)


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt in this process, as in a terminal's foreground,
    whatever it inherited (a job a script starts in the background has SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _sigint_default():
    """In a started script, before it runs: SIGINT at its default (KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_sigint_inside_the_worker_start_is_delivered_after_it(sigint_raises):
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with executor_module.interrupt_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)        # the handler would have run here, between bytecodes
            reached_the_end = True
    assert reached_the_end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


_TRAIN_FOREVER = """
import signal, sys
import numpy as np
import onnxjob as flow, onnxjob.typing as tp

@flow.global_function(type="train")
def train(x: tp.Numpy.Placeholder((8, 16)),
          y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
    hidden = flow.layers.dense(x, 32, activation=flow.nn.relu, name="hidden")
    logits = flow.layers.dense(hidden, 4, name="out")
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits, name="loss")
    flow.optimizer.SGD(0.01, momentum=0.9).minimize(loss)
    return loss

rng = np.random.default_rng(0)
x = rng.standard_normal((8, 16)).astype(np.float32)
y = rng.integers(0, 4, 8).astype(np.int32)
losses = []
calls = registered = 0
try:
    while True:
        calls += 1                      # before the call: counts one that was interrupted
        train(x, y)(lambda loss: losses.append(float(loss.mean())))
        registered += 1
        if registered == int(sys.argv[2]):
            print("ready", flush=True)
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("interrupted", flush=True)
    flow.checkpoint.save(sys.argv[1])
    finite = all(np.isfinite(losses))
    print(f"saved {calls} {registered} {len(losses)} {finite}", flush=True)
    sys.exit(3)
"""


def _interrupt_run(script, path, ready_after, delay):
    """Run `script` until it says ready, wait `delay` s, then SIGINT it (again every 0.5 s
    until its handler says it got one). Returns (exit code, stdout lines, stderr)."""
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(ready_after)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    try:
        while not any("ready" in line for line in lines):
            assert proc.poll() is None, f"the script ended early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the script never got ready"
            time.sleep(0.01)
        time.sleep(delay)
        for _ in range(20):
            proc.send_signal(signal.SIGINT)
            waited = time.monotonic() + 0.5
            while time.monotonic() < waited and not any("interrupted" in x for x in lines):
                time.sleep(0.005)
            if any("interrupted" in line for line in lines):
                break
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the interrupted script hung; its output: {lines}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    return code, lines, proc.stderr.read()


def test_sigint_in_an_async_train_loop_saves_a_checkpoint_and_exits(tmp_path):
    script = tmp_path / "train_forever.py"
    script.write_text(textwrap.dedent(_TRAIN_FOREVER))
    # a few interrupts at different moments of the loop: right away, mid-step, later; the
    # delays change from run to run, and a failure's captured output names the seed that
    # INTERRUPT_TEST_SEED=<seed> gives again
    seed = int(os.environ.get("INTERRUPT_TEST_SEED") or time.time_ns() % 2 ** 32)
    chance = random.Random(seed)
    for run, delay in enumerate([0.0, chance.uniform(0, 0.05), chance.uniform(0.05, 0.3),
                                 chance.uniform(0, 0.01)]):
        print(f"run {run}: SIGINT {delay:.4f} s after ready (INTERRUPT_TEST_SEED={seed})")
        path = tmp_path / f"ckpt{run}"
        code, lines, err = _interrupt_run(script, path, ready_after=5 + 7 * run, delay=delay)
        assert code == 3, f"exit {code}; stdout {lines}; stderr {err}"
        saved = [line.split() for line in lines if line.startswith("saved")]
        assert len(saved) == 1, lines
        calls, registered, callbacks = (int(v) for v in saved[0][1:4])
        assert saved[0][4] == "True", "a callback saw a non-finite loss"
        flow.clear_default_session()
        _define_same_job()
        loaded = flow.checkpoint.get(str(path))
        steps = int(loaded["System-Train-TrainStep-train"].numpy()[0])
        # every registered callback fired; no run was lost or run twice
        assert registered <= callbacks <= steps <= calls, (registered, callbacks, steps, calls)
        for name in ("hidden-weight", "hidden-bias", "out-weight", "hidden-weight-momentum"):
            assert np.isfinite(loaded[name].numpy()).all(), name
        flow.load_variables(loaded)
        values = flow.get_all_variables()
        assert np.array_equal(values["out-weight"].numpy(), loaded["out-weight"].numpy())
        flow.clear_default_session()


def _define_same_job():
    import onnxjob.typing as tp

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((8, 16)),
              y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
        hidden = flow.layers.dense(x, 32, activation=flow.nn.relu, name="hidden")
        logits = flow.layers.dense(hidden, 4, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits, name="loss")
        flow.optimizer.SGD(0.01, momentum=0.9).minimize(loss)
        return loss
    return train
