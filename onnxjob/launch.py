"""`python -m onnxjob run --nproc N script.py`: N ranks of a data-parallel run on this
machine, as `torchrun --nproc-per-node N` would start them (runtime/distributed.py).

Each rank is `python -m onnxjob run script.py ARGS` with RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set. The launcher waits for all of them; when one fails, it
stops the others at once (no rank is left waiting in a collective), says which rank
failed, and exits with that rank's status.
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
            failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank, code = failed[0]
                print(f"onnxjob: rank {rank} of {nproc} exited with status {code}; "
                      "stopping the other ranks", file=sys.stderr)
                return code
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
