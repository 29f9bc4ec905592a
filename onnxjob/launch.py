"""Starting and watching the ranks of a data-parallel run on this machine.

`python -m onnxjob run --nproc N script.py` (`launch`): N ranks, each
`python -m onnxjob run script.py ARGS`, as `torchrun --nproc-per-node N` would start them
(runtime/distributed.py). A script that asks for several devices itself
(`flow.config.cpu_device_num(n)` in a plain `python script.py`: frontend/ranks.py) is rank
0 of its own run and starts the other ranks with `start_rank`; spawned_ranks.py watches them
from inside it with the same reporting (`report`, `stop`).

Each rank has RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. When one fails,
every rank that failed within a few seconds is named, and every rank still running then as
stalled (its peers gave up waiting for it in a collective, after ONNXJOB_DIST_TIMEOUT); those
are stopped (no rank is left waiting), and the run exits with the first failed rank's status.
Ctrl-C or SIGTERM on the launcher stops every rank, named, whatever signal dispositions the
launcher inherited (`_stop_signals_raise`).
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

GRACE_S = 5.0       # how long failed ranks' peers get to end on their own
STOP_S = 10.0       # how long a stopped rank gets between SIGTERM and SIGKILL


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank, local_rank, world_size, addr, port, node_rank=0, local_size=None):
    """The variables that make a process rank `rank` of `world_size` (torchrun's names)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(local_size or world_size), "GROUP_RANK": str(node_rank),
            "NODE_RANK": str(node_rank), "MASTER_ADDR": str(addr), "MASTER_PORT": str(port)}


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread of a process that stops its ranks on it."""


def sigint_raises():
    """Make Ctrl-C (SIGINT) raise KeyboardInterrupt in this process's main thread, whatever
    disposition it inherited: a job started in the background (`cmd &` in a script, some
    job schedulers) starts with SIGINT ignored, and a process that started ranks must still
    stop them on it. A handler the program installed itself is kept. Main thread only
    (elsewhere it does nothing)."""
    if threading.current_thread() is threading.main_thread() and \
            not callable(signal.getsignal(signal.SIGINT)):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stop_signals_raise():
    """The launcher's own dispositions: Ctrl-C raises KeyboardInterrupt and SIGTERM
    _Terminated in its main thread (whatever it inherited), so that both stop its ranks."""
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def terminated(signum, frame):
        raise _Terminated
    signal.signal(signal.SIGTERM, terminated)


def _as_a_rank():
    """In a started rank, before it runs (Linux): SIGINT and SIGTERM at their defaults, as
    in a foreground process, whatever the starting process inherited (an ignored SIGINT
    would survive exec); and SIGTERM when the thread that started it ends, so that a rank
    whose parent was killed (SIGKILL: no clean-up ran) does not live on alone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_rank(command, env, quiet=False, cwd=None):
    """Start one rank: `command` with `env`; `quiet` sends its stdout to /dev/null (a rank
    started by the script itself prints what rank 0 prints) and gives it no stdin."""
    linked = sys.platform.startswith("linux") and \
        threading.current_thread() is threading.main_thread()
    return subprocess.Popen(command, env=env, cwd=cwd,
                            stdout=subprocess.DEVNULL if quiet else None,
                            stdin=subprocess.DEVNULL if quiet else None,
                            preexec_fn=_as_a_rank if linked else None)


def _say(message):
    print(f"onnxjob: {message}", file=sys.stderr, flush=True)


def _how_it_ended(code):
    """"exited with status 1", "was killed by signal 9 (SIGKILL)"."""
    if code < 0:
        try:
            name = f" ({signal.Signals(-code).name})"
        except ValueError:
            name = ""
        return f"was killed by signal {-code}{name}"
    return f"exited with status {code}"


def report(statuses, world_size, running_reason, first=()):
    """Name every rank of {rank: exit status or None (still running)} that failed, the
    ranks in `first` (those seen failing before the others) first, and every one still
    running (`running_reason` says why it is stopped); returns the exit status for the
    first failed rank named (128 + the signal for a killed one, as a shell gives), or None
    when none failed."""
    failed = sorted(((rank, code) for rank, code in statuses.items() if code not in (None, 0)),
                    key=lambda item: (item[0] not in first, item[0]))
    for rank, code in failed:
        cause = " first" if first and rank in first and len(failed) > 1 else ""
        _say(f"rank {rank} of {world_size} {_how_it_ended(code)}{cause}")
    for rank, code in sorted(statuses.items()):
        if code is None:
            _say(f"rank {rank} of {world_size} is still running: stopping it ({running_reason})")
    if not failed:
        return None
    code = failed[0][1]
    return 128 - code if code < 0 else code


STALLED = ("if the failed ranks timed out in a collective, this rank stalled before "
           "reaching it")


def _settle(processes, grace):
    """Give the ranks still running `grace` seconds to end on their own."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        time.sleep(0.05)


def stop(processes):
    """SIGTERM every rank still running, SIGKILL those still there after STOP_S."""
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(run_args, nproc):
    """Run `nproc` ranks of `python -m onnxjob run *run_args` (a script and its arguments,
    or `-m`, a module and its arguments); returns the exit status for the launcher."""
    _stop_signals_raise()
    port = free_port()
    ranks = [start_rank([sys.executable, "-m", "onnxjob", "run", *run_args],
                        {**os.environ, **rank_environment(rank, rank, nproc, "127.0.0.1", port)})
             for rank in range(nproc)]
    try:
        while True:
            codes = [p.poll() for p in ranks]
            if any(c not in (None, 0) for c in codes):
                first = {rank for rank, c in enumerate(codes) if c not in (None, 0)}
                _settle(ranks, GRACE_S)
                return report(dict(enumerate(p.poll() for p in ranks)), nproc, STALLED,
                              first)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    except (KeyboardInterrupt, _Terminated) as stopped:
        how, status = ("interrupted", 130) if isinstance(stopped, KeyboardInterrupt) else \
            ("terminated (SIGTERM)", 128 + signal.SIGTERM)
        _say(how)
        report(dict(enumerate(p.poll() for p in ranks)), nproc, f"the launcher was {how}")
        return status
    finally:
        stop(ranks)
