"""How a data-parallel step with synchronized batch norm runs its stages (runtime/staged.py).

    python bench/bench_stages.py [--model resnet50|conv_bn] [--rounds N] [--nproc N]
                                 [--device cpu|cuda] [--schedules serial,sink,...]

OneFlow-Benchmark's ResNet50 on a global batch of 8 (224x224) as 2 ranks x 1 thread
(`python -m onnxjob run --nproc 2`), or with `--device cuda` as 2 ranks on the GPUs (sharing
them where there are fewer: gloo's CUDA tensors; runtime/value_paths.py). Inside the same
ranks, the same step runs with each schedule of its stages asked for (all four by default),
one step each in turn for `--rounds` rounds (each step is seconds long on the CPU; taking
turns spreads the machine's drift over all of them):

- serial: one onnxruntime session a stage, its collectives after it, waited for at once
  (the schedule before the two changes below);
- sink: serial, with each node moved into the session that reads its outputs (the default
  over NCCL);
- overlap: two sessions a stage, the second running while the stage's collectives travel;
- overlap + sink: both (the default over gloo: CPU ranks, ranks sharing a GPU).

Per schedule: the step's median time (ratio to the first schedule asked for), the time
spent in onnxruntime's runs and waiting for the batch-norm collectives (rank 0's medians),
and the sessions a step runs. The stage count is the same for all: one per collective depth.
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
    "resnet50": """
import zoo
train_job, _ = zoo.define_jobs(zoo.model_builder("resnet50"), zoo.model_args(), 224, 0.01, 8)
x = np.random.default_rng(0).random((8, 3, 224, 224), dtype=np.float32)
y = np.arange(8, dtype=np.int32)""",
    "conv_bn": """
import onnxjob as flow
import onnxjob.typing as tp

@flow.global_function(type="train")
def train_job(x: tp.Numpy.Placeholder((8, 3, 32, 32)),
              y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    h = x
    for i in range(4):
        h = flow.layers.conv2d(h, 32, 3, padding="SAME", name=f"conv{i}")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name=f"bn{i}"))
    logits = flow.layers.dense(flow.reshape(h, (8, -1)), 10, name="fc")
    loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01])).minimize(loss)
    return loss
x = np.random.default_rng(0).random((8, 3, 32, 32), dtype=np.float32)
y = np.arange(8, dtype=np.int32)""",
}

SCRIPT = """
import json, os, statistics, sys, time
import numpy as np
sys.path.insert(0, {tests!r})
from onnxjob.runtime import data_parallel, staged, value_paths

made = {{}}                     # the step and its StagedSession's arguments
init_step, init_staged = data_parallel.DataParallelStep.__init__, staged.StagedSession.__init__

def record_step(self, *args, **kwargs):
    made["step"] = self
    init_step(self, *args, **kwargs)

def record_staged(self, *args, **kwargs):
    made.setdefault("staged", (args, kwargs))
    init_staged(self, *args, **kwargs)

data_parallel.DataParallelStep.__init__ = record_step
staged.StagedSession.__init__ = record_staged
clock = {{"runs": 0.0, "waits": 0.0, "sessions": 0}}
run_session = staged.StagedSession._run

def timed_run(self, run, values):
    start = time.perf_counter()
    run_session(self, run, values)
    clock["runs"] += time.perf_counter() - start
    clock["sessions"] += run.session is not None

def timed_start(start):
    def started(values):
        wait = start(values)
        def timed_wait():
            begin = time.perf_counter()
            out = wait()
            clock["waits"] += time.perf_counter() - begin
            return out
        return timed_wait
    return started

staged.StagedSession._run = timed_run
for path in (value_paths.HostPath, value_paths.DevicePath):
    path.start_collective = {{kind: timed_start(start)
                             for kind, start in path.start_collective.items()}}
{job}
for _ in range(2):                      # warm-up: the session starts, memory settles
    train_job(x, y)
args, kwargs = made["staged"]
made["step"]._a = None                  # (its sessions' GPU memory and handles go)
schedules = {{"serial": (False, False), "sink": (False, True), "overlap": (True, False),
             "overlap + sink": (True, True)}}
sessions = {{name: staged.StagedSession(*args, **kwargs, overlap=o, sink=s)
            for name, (o, s) in schedules.items() if name in {schedules!r}}}
for session in sessions.values():       # each schedule's first run
    made["step"]._a = session
    train_job(x, y)
times = {{name: [] for name in sessions}}
for _ in range({rounds}):
    for name, session in sessions.items():
        made["step"]._a = session
        clock.update(runs=0.0, waits=0.0, sessions=0)
        start = time.perf_counter()
        train_job(x, y)
        times[name].append((time.perf_counter() - start, clock["runs"], clock["waits"],
                            clock["sessions"]))
report = {{name: {{"step_s": statistics.median(t[0] for t in rows),
                 "runs_s": statistics.median(t[1] for t in rows),
                 "waits_s": statistics.median(t[2] for t in rows),
                 "sessions": rows[-1][3], "stages": sessions[name].stage_count}}
          for name, rows in times.items()}}
if os.environ.get("RANK", "0") == "0":
    print(json.dumps(report))
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(JOBS), default="resnet50")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--schedules", default="serial,sink,overlap,overlap + sink",
                   help="which of the four, comma-separated (on one GPU shared by the ranks, "
                        "the sessions of all four may not fit: cuDNN's handles fail)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "stages.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(SCRIPT).format(
                tests=os.path.join(HERE, "..", "tests"), job=JOBS[args.model],
                rounds=args.rounds, schedules=args.schedules.split(",")))
        command = [sys.executable, "-m", "onnxjob", "run", "--nproc", str(args.nproc), script]
        # (synchronized batch norm on any device: on CUDA ranks the default is each rank's
        # own statistics, OneFlow's GPU batch norm, with no stage to schedule)
        env = {**os.environ, "ONNXJOB_DEVICE": args.device, "ONNXJOB_SYNC_BATCH_NORM": "1"}
        if args.device == "cpu":
            env.update(ONNXJOB_NUM_THREADS="1", OMP_NUM_THREADS="1")
        out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{out.stderr}")
    report = json.loads(out.stdout.strip().splitlines()[-1])
    serial = next(iter(report.values()))["step_s"]
    ranks = f"{args.nproc} ranks x 1 thread" if args.device == "cpu" else \
        f"{args.nproc} ranks on CUDA"
    print(f"{args.model} train step, {ranks}, batch norm synchronized: "
          f"{next(iter(report.values()))['stages']} stages; median of {args.rounds} steps each, "
          "schedules taking turns")
    print(f"  {'schedule':16s} {'step':>9s} {'ratio':>6s} {'in onnxruntime':>15s} "
          f"{'collective waits':>17s} {'sessions':>9s}")
    for name, row in report.items():
        print(f"  {name:16s} {row['step_s'] * 1e3:6.0f} ms {row['step_s'] / serial:6.2f} "
              f"{row['runs_s'] * 1e3:12.0f} ms {row['waits_s'] * 1e3:14.0f} ms "
              f"{row['sessions']:9d}")


if __name__ == "__main__":
    main()
