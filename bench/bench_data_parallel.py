"""Data-parallel scaling, and the gradient all-reduce's time per step.

    python bench/bench_data_parallel.py [--model lenet|resnet50] [--steps N]
                                        [--device cpu|cuda] [--nproc N]

The doc LeNet train step on a global batch of 100, or OneFlow-Benchmark's ResNet50 on a
global batch of 8 (224x224; its batch norms synchronized across ranks, and again with
ONNXJOB_SYNC_BATCH_NORM=0), each rank computing its share of it (runtime/distributed.py),
through `python -m onnxjob run --nproc N` (2 by default), against the same script in one
process. On the CPU (the default): N ranks x 1 thread against 1 process x 2 threads. With
`--device cuda`: N ranks with a GPU each (LOCAL_RANK's; ranks share the GPUs where there
are fewer than N, over gloo's CUDA tensors instead of NCCL) against one process on one GPU;
the gradients stay on the GPUs (runtime/value_paths.py). Each run times its steps after
the warm-up steps (median); the ratio is ranks / one process (< 1: the ranks are faster).
The ranks' run also reports the gradient all-reduce per step (allreduce_timing.py): its
size, its time alone, and the time the step still waited for it after the backward.
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
sys.path.insert(0, {bench!r})
import allreduce_timing
from onnxjob.runtime import distributed
allreduce_timing.install()
{job}
STEPS = {steps}
times = []
for step in range(WARM_UP + STEPS):
    start = time.perf_counter()
    train_job(x, y)
    times.append(time.perf_counter() - start)
    allreduce_timing.step_done()
report = {{"step_s": statistics.median(times[WARM_UP:])}}
if distributed.enabled():
    report["allreduce"] = allreduce_timing.report(WARM_UP)
if os.environ.get("RANK", "0") == "0":
    print(json.dumps(report))
"""


def timed(script, nproc, device, threads=None, **extra_env):
    """The rank-0 report of `script` run as `nproc` ranks on `device`."""
    command = [sys.executable, "-m", "onnxjob", "run"] + \
        (["--nproc", str(nproc)] if nproc > 1 else []) + [script]
    env = {**os.environ, "ONNXJOB_DEVICE": device, **extra_env}
    if threads is not None:
        env.update(ONNXJOB_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def allreduce_line(report):
    a = report["allreduce"]
    return (f"      all-reduce per step: {a['bytes'] / 2 ** 20:.2f} MiB in {a['buckets']} "
            f"bucket(s) over {a['backend']}: {a['alone_s'] * 1e3:.2f} ms alone, "
            f"{a['exposed_s'] * 1e3:.2f} ms waited for after the backward")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(JOBS), default="lenet")
    p.add_argument("--steps", type=int)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args()
    if args.nproc < 2:
        p.error("--nproc must be at least 2 (the ranks are compared with one process)")
    steps = args.steps or STEPS[args.model]
    cpu = args.device == "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, f"{args.model}_dp.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(SCRIPT).format(
                tests=os.path.join(HERE, "..", "tests"), bench=HERE, job=JOBS[args.model],
                steps=steps))
        one = timed(script, 1, args.device, 2 if cpu else None)
        # (synchronized batch norm on any device, as labelled; CUDA ranks default to each
        # rank's own statistics, as OneFlow's GPU batch norm: the row after it)
        many = timed(script, args.nproc, args.device, 1 if cpu else None,
                     ONNXJOB_SYNC_BATCH_NORM="1")
        unsynced = timed(script, args.nproc, args.device, 1 if cpu else None,
                         ONNXJOB_SYNC_BATCH_NORM="0") if args.model == "resnet50" else None
    one_label = "1 process x 2 threads" if cpu else "1 process, 1 GPU"
    many_label = f"{args.nproc} ranks x 1 thread" if cpu else f"{args.nproc} ranks on CUDA"
    print(f"{args.model} train step on {args.device}, median of {steps} steps")
    print(f"  {one_label:24s} {one['step_s'] * 1e3:8.1f} ms")
    print(f"  {many_label:24s} {many['step_s'] * 1e3:8.1f} ms   ratio "
          f"{many['step_s'] / one['step_s']:.2f}")
    print(allreduce_line(many))
    if unsynced is not None:
        print(f"  {args.nproc} ranks, batch norm per rank (ONNXJOB_SYNC_BATCH_NORM=0) "
              f"{unsynced['step_s'] * 1e3:8.1f} ms   ratio "
              f"{unsynced['step_s'] / one['step_s']:.2f}")
        print(allreduce_line(unsynced))


if __name__ == "__main__":
    main()
