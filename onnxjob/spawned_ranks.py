"""The ranks a script started for itself (frontend/ranks.py), watched from inside it:
the process the user started is one of the ranks, running the script in its main thread."""
import atexit
import os
import signal
import sys
import threading
import time

from onnxjob.launch import GRACE_S, STALLED, STOP_S, _say, _settle, report, sigint_raises, stop

STALLED_HERE = "it never reached the collective that timed out: it stalled"


def _in_collective(traceback):
    """True for an error raised in a collective (runtime/distributed.py)."""
    collectives = os.path.join("runtime", "distributed.py")
    while traceback is not None:
        if traceback.tb_frame.f_code.co_filename.endswith(collectives):
            return True
        traceback = traceback.tb_next
    return False


class SpawnedRanks:
    """The ranks this process started for itself, watched from inside it (it is rank
    `own_rank` of `world_size`, running the user's script in its main thread).

    - one of them fails: this process gets GRACE_S seconds to fail on its own (its next
      collective with the failed rank raises), then a KeyboardInterrupt in its main thread
      (it stalled), then, STOP_S seconds later, an exit; every rank is named, the others
      stopped, and the exit status is the failed rank's;
    - this process fails (an uncaught exception, Ctrl-C, SIGTERM): the other ranks get a
      second to end (GRACE_S where a collective failed: it lost a rank, which is ending),
      then are named and stopped; the exit status is this process's;
    - it ends normally: it waits for the others (Ctrl-C stops them), then exits with the
      first failed one's status, if any failed.
    """

    def __init__(self, children, own_rank, world_size):
        self.children = dict(children)          # {rank: Popen}
        self.own_rank, self.world_size = own_rank, world_size
        self._exiting = threading.Event()
        self._lock = threading.Lock()
        self._own_failure = None                # why this process is failing, if it is
        self._peer_lost = False                 # ... in a collective that lost a rank
        self._interrupted_by_us = False
        self._done = False
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_uncaught
        atexit.register(self._at_exit)
        sigint_raises()     # Ctrl-C, and the watcher's interrupt, reach the main thread
        self._catch_sigterm()
        threading.Thread(target=self._watch, name="onnxjob-ranks", daemon=True).start()

    def _catch_sigterm(self):
        """SIGTERM ends this process through its exit handlers (which stop the other
        ranks) rather than at once (or not at all, where it started with SIGTERM ignored),
        unless the script set its own handler."""
        if threading.current_thread() is not threading.main_thread() or \
                callable(signal.getsignal(signal.SIGTERM)):
            return

        def terminated(signum, frame):
            self._own_failure = "got SIGTERM"
            raise SystemExit(128 + signum)
        signal.signal(signal.SIGTERM, terminated)

    def _on_uncaught(self, kind, value, traceback):
        if self._interrupted_by_us and issubclass(kind, KeyboardInterrupt):
            _say(f"rank {self.own_rank} of {self.world_size} was still running when another "
                 "rank failed; it was stopped here:")
        elif issubclass(kind, KeyboardInterrupt):
            self._own_failure = "was interrupted"
        else:
            self._own_failure = f"failed ({kind.__name__})"
            self._peer_lost = _in_collective(traceback) and kind.__name__ != "StalledRankError"
        self._excepthook(kind, value, traceback)

    def _failed_child(self):
        return any(p.poll() not in (None, 0) for p in self.children.values())

    def _watch(self):
        """Wait for a started rank to fail, then stop this one if it has not ended."""
        while not self._failed_child():
            if all(p.poll() == 0 for p in self.children.values()):
                return
            time.sleep(0.05)
        if self._exiting.wait(GRACE_S):
            return
        self._interrupted_by_us = True
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # a real signal: it also ends a sleep or a blocking read
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        else:
            import _thread
            _thread.interrupt_main()
        if self._exiting.wait(STOP_S):
            return
        with self._lock:        # the main thread did not come back: exit from here
            status = self._finish_after_child_failure()
        os._exit(status)

    def _statuses(self, own):
        return {self.own_rank: own, **{r: p.poll() for r, p in self.children.items()}}

    def _finish_after_child_failure(self):
        _settle(list(self.children.values()), GRACE_S)
        status = report(self._statuses(None), self.world_size, STALLED)
        self._done = True
        stop(list(self.children.values()))
        return status or 1

    def _at_exit(self):
        self._exiting.set()
        with self._lock:
            if self._done:
                return
            children = list(self.children.values())
            if self._interrupted_by_us:
                status = self._finish_after_child_failure()
                sys.stdout.flush()
                os._exit(status)
            if self._own_failure is not None:
                # a collective that failed at once lost a rank: it is given time to end;
                # otherwise the others wait in a collective with this process, which is
                # alive until they are stopped
                _settle(children, GRACE_S if self._peer_lost else 1.0)
                statuses = self._statuses(0)
                report({r: c for r, c in statuses.items() if c not in (None, 0)},
                       self.world_size, "")
                _say(f"rank {self.own_rank} of {self.world_size} {self._own_failure}")
                stalled = "StalledRankError" in self._own_failure
                report({r: c for r, c in statuses.items() if c is None}, self.world_size,
                       STALLED_HERE if stalled else f"rank {self.own_rank} {self._own_failure}")
                self._done = True
                stop(children)
                return
            try:
                while any(p.poll() is None for p in children) and not self._failed_child():
                    time.sleep(0.05)
            except KeyboardInterrupt:
                _say(f"rank {self.own_rank} of {self.world_size} was interrupted")
                report(self._statuses(0), self.world_size, f"rank {self.own_rank} was interrupted")
                stop(children)
                self._done = True
                sys.stdout.flush()
                os._exit(130)
            if self._failed_child():
                status = self._finish_after_child_failure()
                sys.stdout.flush()
                os._exit(status)
            self._done = True
