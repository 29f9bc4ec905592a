"""The run order of a session: one FIFO worker for every job call (spec §3).

Synchronous calls run in the caller's thread when nothing is queued (no thread hop on
the hot path); otherwise every call goes through one worker thread, so jobs run and
callbacks fire in call order. The queue is bounded (back-pressure as OneFlow's queue of
2). An exception in a run or callback is printed when it happens and re-raised from the
next call, sync, checkpoint call, clear_default_session() or interpreter exit.
"""
import queue
import sys
import threading
import traceback

MAX_IN_FLIGHT = 2


class PendingResult:
    """The result of one async run; `register(cb)` may come before or after it arrives."""

    __slots__ = ("_lock", "_done", "_value", "_callback", "_executor", "_failed")

    def __init__(self, executor):
        self._lock = threading.Lock()
        self._done = False
        self._failed = False
        self._value = None
        self._callback = None
        self._executor = executor

    def register(self, callback):
        with self._lock:
            assert self._callback is None, "a callback is already registered for this result"
            self._callback = callback
            ready = self._done
        if ready and not self._failed:
            self._executor.invoke_callback(callback, self._value)
        self._executor.raise_pending()

    def deliver(self, value):
        with self._lock:
            self._value = value
            self._done = True
            callback = self._callback
        if callback is not None:
            self._executor.invoke_callback(callback, value)

    def fail(self):
        with self._lock:
            self._done = True
            self._failed = True


class Executor:
    def __init__(self):
        self._queue = queue.Queue(maxsize=MAX_IN_FLIGHT)
        self._cond = threading.Condition()
        self._in_flight = 0
        self._errors = []
        self._thread = None
        self._closed = False
        # Held while a run executes, by the worker or by a direct sync call: runs never
        # overlap even when jobs are called from several threads.
        self._run_lock = threading.Lock()

    # -- errors ---------------------------------------------------------------------------
    def _record(self, exc, what):
        print(f"onnxjob: exception in {what}:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        with self._cond:
            self._errors.append(exc)

    def raise_pending(self):
        if not self._errors:  # hot path: no lock when nothing failed
            return
        with self._cond:
            if not self._errors:
                return
            first = self._errors[0]
            count = len(self._errors)
            self._errors.clear()
        if count > 1:
            print(f"onnxjob: {count} exceptions happened in runs/callbacks; re-raising the first",
                  file=sys.stderr)
        raise first

    def invoke_callback(self, callback, value):
        try:
            callback(value)
        except BaseException as e:  # noqa: BLE001 - reported, then re-raised later
            self._record(e, f"callback {getattr(callback, '__name__', callback)!r}")

    # -- running --------------------------------------------------------------------------
    def _refuse_reentry(self):
        if threading.current_thread() is self._thread:
            raise RuntimeError("a job function was called from a callback or watch handler; "
                               "that would wait for itself. Collect the values in the callback "
                               "and call the job from the main program instead.")

    def run_sync(self, fn):
        """Run `fn()` after every earlier call; returns its value (errors raise here)."""
        self._refuse_reentry()
        self.raise_pending()
        # Fast path: nothing queued, so run here (no thread hop). The run lock keeps it from
        # overlapping a run that another thread queued meanwhile.
        if self._in_flight == 0:
            with self._run_lock:
                return fn()
        box = {}
        done = threading.Event()

        def task():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            finally:
                done.set()
        self._submit(task, None)
        done.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def run_async(self, fn, deliver):
        """Queue `fn()`; its value goes to `deliver(value)` in the worker. Returns at once."""
        self._refuse_reentry()
        self.raise_pending()
        pending = PendingResult(self)

        def task():
            try:
                value = fn()
            except BaseException as e:  # noqa: BLE001
                pending.fail()
                self._record(e, "an asynchronous job run")
                return
            deliver(pending, value)
        self._submit(task, pending)
        return pending

    def _submit(self, task, pending):
        with self._cond:
            self._in_flight += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="onnxjob-executor",
                                                daemon=True)
                self._thread.start()
        self._queue.put(task)

    def _work(self):
        while True:
            task = self._queue.get()
            if task is None:
                return
            try:
                with self._run_lock:
                    task()
            finally:
                with self._cond:
                    self._in_flight -= 1
                    self._cond.notify_all()

    def sync(self):
        """Wait until every queued run and its callback finished; re-raise errors."""
        with self._cond:
            while self._in_flight:
                self._cond.wait()
        self.raise_pending()

    def shutdown(self):
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._thread = None
