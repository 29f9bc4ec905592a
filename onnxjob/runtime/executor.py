"""The run order of a session: one FIFO worker for every job call (spec §3).

Synchronous calls run in the caller's thread when nothing is queued (no thread hop on
the hot path; `try_inline` is that path alone, for the job call's fast path); otherwise
every call goes through one worker thread, so jobs run and callbacks fire in call order.
The queue is bounded (back-pressure as OneFlow's queue of 2). An exception in a run or
callback is printed when it happens and re-raised from the next call, sync, checkpoint
call, clear_default_session() or interpreter exit.

Ctrl-C (KeyboardInterrupt, raised in the main thread between any two bytecodes) never
leaves the bookkeeping wrong: a run counts as in flight exactly while it sits in the
queue or runs, and it enters the queue with one `deque.append` (atomic for signals), so
an interrupted call either queued its run, which then finishes and delivers as usual, or
queued nothing. An interrupted wait for a queued synchronous run leaves the run to finish;
an error it raises is reported like an asynchronous run's. A Ctrl-C that cuts short the
notify after a queueing append can leave the worker unwoken: it looks at the queue every
WORKER_IDLE_WAKEUP_S anyway.
"""
import collections
import contextlib
import signal
import sys
import threading
import traceback

MAX_IN_FLIGHT = 2
# how often an idle worker looks at the queue without being notified
WORKER_IDLE_WAKEUP_S = 0.5
# how long closing waits for a run another thread is making in its own thread (a daemon
# thread still training when the program ends)
CLOSE_WAIT_S = 60.0

# What `Executor.try_inline` returns when the run must take `run_sync`'s full path.
NOT_INLINE = object()


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
        self._tasks = collections.deque()   # queued runs, oldest first; None stops the worker
        self._running = False               # the worker is inside a task
        self._cond = threading.Condition()
        self._errors = []
        self._thread = None
        # Held while a run executes, by the worker or by a direct sync call: runs never
        # overlap even when jobs are called from several threads.
        self._run_lock = threading.Lock()
        # The thread running a synchronous call inline through run_sync (whose watch
        # handlers may call jobs), else None: such a call is refused, not deadlocked.
        self._inline_owner = None
        # set by close(): no run is taken from then on (the program is ending, or the
        # session was cleared), as OneFlow's closed session refuses LazyRun
        self._closed = False

    @property
    def in_flight(self):
        """How many runs are queued or running."""
        return len(self._tasks) + self._running

    # -- errors ---------------------------------------------------------------------------
    def _record(self, exc, what):
        print(f"onnxjob: exception in {what}:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        with self._cond:
            self._errors.append(exc)

    def raise_pending(self):
        """Re-raise the first error an earlier run or callback had (once)."""
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
        """Call `callback(value)`; its error is reported and re-raised later. A Ctrl-C in a
        callback that runs in the main thread (registered after its result arrived)
        propagates at once: it is the user stopping their loop."""
        try:
            callback(value)
        except BaseException as e:  # noqa: BLE001 - reported, then re-raised later
            if isinstance(e, KeyboardInterrupt) and (
                    threading.current_thread() is threading.main_thread()):
                raise
            self._record(e, f"callback {getattr(callback, '__name__', callback)!r}")

    # -- running --------------------------------------------------------------------------
    def _refuse_reentry(self):
        if threading.current_thread() is self._thread or (
                self._inline_owner == threading.get_ident()):
            raise RuntimeError("a job function was called from a callback or watch handler; "
                               "that would wait for itself. Collect the values in the callback "
                               "and call the job from the main program instead.")

    def _refuse_closed(self):
        if self._closed:
            raise RuntimeError("onnxjob: the session is closed (the program is ending, or "
                               "flow.clear_default_session() was called): this job run is "
                               "not made")

    def close(self):
        """Take no run from now on; a run another thread is making in its own thread
        finishes first (a daemon thread still calling jobs while the program ends: its run
        inside onnxruntime while Python finalizes aborted the process). The runs queued
        so far still run (sync, shutdown)."""
        with self._cond:
            self._closed = True
        me = threading.get_ident()
        worker = self._thread
        if self._run_lock.locked() and self._inline_owner != me and not (
                worker is not None and worker.ident == me):
            if self._run_lock.acquire(timeout=CLOSE_WAIT_S):
                self._run_lock.release()

    def run_sync(self, fn):
        """Run `fn()` after every earlier call; returns its value (errors raise here)."""
        self._refuse_reentry()
        self._refuse_closed()
        self.raise_pending()
        # Fast path: nothing queued, so run here (no thread hop). The run lock keeps it from
        # overlapping a run that another thread queued meanwhile.
        if not self._tasks and not self._running:
            with self._run_lock:
                self._refuse_closed()   # (closed while this thread waited for the lock)
                try:    # NOTE: inside the try, so that a Ctrl-C cannot leave it set
                    self._inline_owner = threading.get_ident()
                    return fn()
                finally:
                    self._inline_owner = None
        box = {}
        done = threading.Event()

        def task():
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            with self._cond:
                done.set()
                abandoned = "abandoned" in box
            if abandoned and "error" in box:
                self._record(box["error"], "a synchronous run whose caller was interrupted")
        self._submit(task)
        try:
            done.wait()
        except BaseException:
            # Interrupted: the run goes on in the worker; an error it has is reported there
            # (or here, when it already finished).
            with self._cond:
                box["abandoned"] = True
                finished = done.is_set()
            if finished and "error" in box:
                self._record(box["error"], "a synchronous run whose caller was interrupted")
            raise
        if "error" in box:
            raise box["error"]
        return box["value"]

    def try_inline(self, fn, arg):
        """`fn(arg)` run in the caller's thread, as `run_sync` runs a call when nothing is
        queued, or NOT_INLINE (nothing ran) where run_sync must decide: a run queued or
        running (order), an error to re-raise, or a run_sync call running inline (this
        thread's watch handler, to refuse; another thread's, to wait for). `fn` must not
        call user code (no watch handlers): nothing marks this run as inline."""
        if self._tasks or self._running or self._errors or self._inline_owner is not None \
                or self._closed:
            return NOT_INLINE
        with self._run_lock:
            if self._closed:
                return NOT_INLINE
            return fn(arg)

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
        self._submit(task)
        return pending

    def _submit(self, task):
        """Queue `task` once there is room (at most MAX_IN_FLIGHT waiting). A Ctrl-C while
        waiting for room queues nothing; the append that queues is one atomic step. A
        closed executor queues nothing (close)."""
        self._refuse_closed()
        if self._thread is None or not self._thread.is_alive():
            self._start_worker()
        with self._cond:
            while len(self._tasks) >= MAX_IN_FLIGHT:
                self._cond.wait()
            self._refuse_closed()
            self._tasks.append(task)
            self._cond.notify_all()

    def _start_worker(self):
        # NOTE: Thread.start() waits for the thread to run; a Ctrl-C in that wait would
        # leave a running worker that self._thread does not name (a second one would then
        # take runs out of order), so the interrupt is held back until it is recorded.
        with interrupt_deferred(), self._cond:
            self._refuse_closed()
            if self._thread is None or not self._thread.is_alive():
                thread = threading.Thread(target=self._work, name="onnxjob-executor",
                                          daemon=True)
                thread.start()
                self._thread = thread

    def _work(self):
        while True:
            with self._cond:
                while not self._tasks:
                    # (a bounded wait: a Ctrl-C in the main thread inside _submit's
                    # notify_all, after the append, can leave this wait unwoken with a task
                    # queued, and the next sync() would wait for it forever)
                    self._cond.wait(WORKER_IDLE_WAKEUP_S)
                task = self._tasks.popleft()
                self._running = task is not None
                self._cond.notify_all()     # room in the queue
            if task is None:
                return
            try:
                with self._run_lock:
                    task()
            finally:
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

    def sync(self):
        """Wait until every queued run and its callback finished; re-raise errors. A
        Ctrl-C here only stops the wait: the runs go on and a later sync waits for them."""
        with self._cond:
            while self._tasks or self._running:
                self._cond.wait()
        self.raise_pending()

    def shutdown(self):
        """Stop the worker after the runs queued so far (call sync() first to see their
        errors). Interrupted, it says how many runs were still waiting."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            with self._cond:
                self._tasks.append(None)
                self._cond.notify_all()
            try:
                thread.join()
            except BaseException:
                left = self.in_flight
                if left:
                    print(f"onnxjob: interrupted while {left} queued run(s) were still "
                          "pending; they are dropped", file=sys.stderr)
                raise
        self._thread = None


@contextlib.contextmanager
def interrupt_deferred():
    """Hold back a SIGINT that arrives inside the block and deliver it after (main thread
    only: other threads never get signals). Costs ~10 us: used off the hot path (and
    around a train step that writes variables in place: runtime/session.py)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    except (ValueError, TypeError):     # not settable here (e.g. an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[0])
            elif previous == signal.SIG_DFL:
                raise KeyboardInterrupt
