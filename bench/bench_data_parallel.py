"""Data-parallel scaling on the CPU: 2 ranks x 1 thread against 1 process x 2 threads.

    python bench/bench_data_parallel.py [--model lenet|resnet50] [--steps N]

The doc LeNet train step on a global batch of 100, or OneFlow-Benchmark's ResNet50 on a
global batch of 8 (224x224; its batch norms synchronized across ranks, and again with
ONNXJOB_SYNC_BATCH_NORM=0), each rank computing half of it (runtime/distributed.py), through
`python -m onnxjob run --nproc 2`, against the same script in one process with two intra-op
threads. Each run times its steps after the warm-up steps (median); the ratio is two ranks /
one process (< 1: the ranks are faster).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

JOBS = {
    "lenet": """
from models import define_jobs, lenet, random_batch
train_job, _ = define_jobs(lenet)       # the doc LeNet, SGD 0.1
x, y = random_batch()
WARM_UP = 5""",
    "resnet50": """
import numpy as np
import zoo
train_job, _ = zoo.define_jobs(zoo.model_builder("resnet50"), zoo.model_args(), 224, 0.01, 8)
x = np.random.default_rng(0).random((8, 3, 224, 224), dtype=np.float32)
y = np.arange(8, dtype=np.int32)
WARM_UP = 2""",
}
STEPS = {"lenet": 30, "resnet50": 5}

SCRIPT = """
import json, os, statistics, sys, time
sys.path.insert(0, {tests!r})
{job}
STEPS = {steps}
times = []
for step in range(WARM_UP + STEPS):
    start = time.perf_counter()
    train_job(x, y)
    times.append(time.perf_counter() - start)
if os.environ.get("RANK", "0") == "0":
    print(json.dumps(statistics.median(times[WARM_UP:])))
"""


def timed(script, nproc, threads, **extra_env):
    command = [sys.executable, "-m", "onnxjob", "run"] + \
        (["--nproc", str(nproc)] if nproc > 1 else []) + [script]
    env = {**os.environ, "ONNXJOB_NUM_THREADS": str(threads), "ONNXJOB_DEVICE": "cpu",
           "OMP_NUM_THREADS": str(threads), **extra_env}
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(JOBS), default="lenet")
    p.add_argument("--steps", type=int)
    args = p.parse_args()
    steps = args.steps or STEPS[args.model]
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, f"{args.model}_dp.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(SCRIPT).format(tests=os.path.join(HERE, "..", "tests"),
                                                   job=JOBS[args.model], steps=steps))
        one = timed(script, 1, 2)
        two = timed(script, 2, 1)
        unsynced = timed(script, 2, 1, ONNXJOB_SYNC_BATCH_NORM="0") \
            if args.model == "resnet50" else None
    print(f"{args.model} train step, median of {steps} steps")
    print(f"  1 process x 2 threads  {one * 1e3:8.1f} ms")
    print(f"  2 ranks   x 1 thread   {two * 1e3:8.1f} ms   ratio {two / one:.2f}")
    if unsynced is not None:
        print(f"  2 ranks, batch norm per rank (ONNXJOB_SYNC_BATCH_NORM=0) "
              f"{unsynced * 1e3:8.1f} ms   ratio {unsynced / one:.2f}")


if __name__ == "__main__":
    main()
