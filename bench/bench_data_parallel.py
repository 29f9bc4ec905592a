"""Data-parallel scaling on the CPU: 2 ranks x 1 thread against 1 process x 2 threads.

    python bench/bench_data_parallel.py [--steps 30]

The doc LeNet train step on a global batch of 100 (each rank computes half of it,
runtime/distributed.py) through `python -m onnxjob run --nproc 2`, against the same script
in one process with two intra-op threads. Each run times its steps after 5 warm-up steps
(median); the ratio is two ranks / one process (< 1: the ranks are faster).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import json, os, statistics, sys, time
sys.path.insert(0, {tests!r})
from models import define_jobs, lenet, random_batch

STEPS = {steps}
train_job, _ = define_jobs(lenet)       # the doc LeNet, SGD 0.1
x, y = random_batch()
times = []
for step in range(5 + STEPS):
    start = time.perf_counter()
    train_job(x, y)
    times.append(time.perf_counter() - start)
if os.environ.get("RANK", "0") == "0":
    print(json.dumps(statistics.median(times[5:])))
"""


def timed(script, nproc, threads):
    command = [sys.executable, "-m", "onnxjob", "run"] + \
        (["--nproc", str(nproc)] if nproc > 1 else []) + [script]
    env = {**os.environ, "ONNXJOB_NUM_THREADS": str(threads), "ONNXJOB_DEVICE": "cpu",
           "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "lenet_dp.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(SCRIPT).format(tests=os.path.join(HERE, "..", "tests"),
                                                   steps=args.steps))
        one = timed(script, 1, 2)
        two = timed(script, 2, 1)
    print(f"doc LeNet train step, global batch 100, median of {args.steps} steps")
    print(f"  1 process x 2 threads  {one * 1e3:8.1f} ms")
    print(f"  2 ranks   x 1 thread   {two * 1e3:8.1f} ms   ratio {two / one:.2f}")


if __name__ == "__main__":
    main()
