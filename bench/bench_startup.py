"""First call of a job in a fresh process, with an empty and with a filled session cache.

    python bench/bench_startup.py [resnet50|lenet] [--batch 8] [--runs 2] [--amp]

Each start runs in its own child process (imports, trace, autodiff, passes, onnxruntime
sessions for every job of the session, variable initialization, first step), first with
an empty ONNXJOB_CACHE_DIR (runtime/session_cache.py and graph/pass_cache.py fill it), then
`--runs` times with the filled one. Prints the seconds of each, split into the jobs'
compile, their onnxruntime sessions and the rest (imports, variables, the first run: on
CUDA cuDNN's algorithm search and the CUDA graph's capture), and the time a later step
alone takes. The jobs run where ONNXJOB_DEVICE says (the GPU when there is one).
Needs ../shared/clients/oneflow-benchmark beside the repository for resnet50.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def child(model, batch, amp):
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    sys.path.insert(0, HERE)
    start = time.perf_counter()
    from common import compiled_train_job, phases
    with phases() as spent:
        runtime, feeds = compiled_train_job(model, batch, amp)  # defines the jobs, one step
    first = time.perf_counter() - start
    step = time.perf_counter()
    runtime.run(dict(feeds))
    print(json.dumps({"first_call": first, "step": time.perf_counter() - step, **spent,
                      "device": runtime.device}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="resnet50")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--amp", action="store_true", help="mixed precision (resnet50)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.model, args.batch, args.amp)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "ONNXJOB_CACHE_DIR": cache}
        results = []
        for run in range(1 + args.runs):
            out = subprocess.run([sys.executable, __file__, args.model, "--batch", str(args.batch),
                                  "--child"] + ["--amp"] * args.amp, env=env,
                                 capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.model} (batch {args.batch}{', AMP' if args.amp else ''}, "
          f"{results[0]['device']}): first call in a fresh process")
    for run, r in enumerate(results):
        label = "empty cache" if run == 0 else "filled cache"
        rest = r["first_call"] - r["compile"] - r["sessions"]
        print(f"  {label:13s} {r['first_call']:6.2f} s = compile {r['compile']:.2f} s + sessions "
              f"{r['sessions']:.2f} s + the rest {rest:.2f} s   (a later step alone: "
              f"{r['step']:.2f} s)")


if __name__ == "__main__":
    main()
