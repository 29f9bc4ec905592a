"""`python -m onnxjob run --nproc N script.py`: N ranks of a data-parallel run on this
machine, as `torchrun --nproc-per-node N` would start them (runtime/distributed.py).

Each rank is `python -m onnxjob run script.py ARGS` with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. The launcher waits for all of them; when one fails, it
names every rank that failed within a few seconds, and every rank still running then as
stalled (its peers gave up waiting for it in a collective, after ONNXJOB_DIST_TIMEOUT), stops
those (no rank is left waiting), and exits with the first failed rank's status.
"""
import os
import socket
import subprocess
import sys
import time


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report_failure(ranks, grace=5.0):
    """Name every rank that failed, after giving the others `grace` seconds to end on
    their own (a rank whose peer died fails in its next collective, often before the
    peer's process has finished exiting); returns the first failed rank's status."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.poll() is None for p in ranks):
        time.sleep(0.05)
    failed = [(rank, p.poll()) for rank, p in enumerate(ranks) if p.poll() not in (None, 0)]
    for rank, code in failed:
        print(f"onnxjob: rank {rank} of {len(ranks)} exited with status {code}", file=sys.stderr)
    for rank, p in enumerate(ranks):
        if p.poll() is None:
            print(f"onnxjob: rank {rank} of {len(ranks)} is still running: stopping it (if the "
                  "failed ranks timed out in a collective, this rank stalled before reaching it)",
                  file=sys.stderr)
    return failed[0][1]


def launch(script, args, nproc):
    """Run `nproc` ranks of `script`; returns the exit status for the launcher."""
    port = str(_free_port())
    ranks = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        ranks.append(subprocess.Popen([sys.executable, "-m", "onnxjob", "run", script, *args],
                                      env=env))
    try:
        while True:
            codes = [p.poll() for p in ranks]
            if any(c not in (None, 0) for c in codes):
                return _report_failure(ranks)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.terminate()
        for p in ranks:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
