"""Peak resident memory of OneFlow-Benchmark's ResNet50 train step: onnxjob vs PyTorch eager.

    python bench/bench_memory.py [--batch 32] [--steps 2] [--threads 2]

Each side runs in its own child process (so neither sees the other's allocations): build
the model, take `--steps` train steps, report the process's peak RSS (ru_maxrss, which
includes onnxjob's compile) and its RSS before the first step (weights, libraries, and for
onnxjob the compiled sessions). PyTorch runs tests/resnet_twin.py from the same initial
weights (written by the onnxjob side) with SGD momentum and weight decay.
Needs ../shared/clients/oneflow-benchmark beside the repository.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def rss_mib():
    """Current resident set size of this process, MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def batch_of(size):
    rng = np.random.default_rng(0)
    return (rng.random((size, 3, 224, 224), dtype=np.float32),
            rng.integers(0, 1000, size).astype(np.int32))


def run_onnxjob(args):
    import onnxjob as flow
    from zoo import define_jobs, model_args, model_builder
    train_job, _ = define_jobs(model_builder("resnet50"), model_args(), 224, 0.01, args.batch)
    x, y = batch_of(args.batch)
    # the initial weights, for the PyTorch side (starts the session: compiles the jobs)
    np.savez(args.weights, **{k: v.numpy() for k, v in flow.get_all_variables().items()
                              if k.startswith("Resnet-")})
    before = rss_mib()
    for _ in range(args.steps):
        train_job(x, y)
    return before


def run_torch(args):
    import torch
    from resnet_twin import ResNet50Twin, smoothed_softmax_ce
    torch.set_num_threads(args.threads)
    with np.load(args.weights) as saved:
        weights = {k: torch.from_numpy(saved[k]).requires_grad_(
            k.rsplit("-", 1)[1] in ("weight", "bias", "gamma", "beta")) for k in saved.files}
    twin = ResNet50Twin(weights)
    opt = torch.optim.SGD([w for w in weights.values() if w.requires_grad], lr=0.01,
                          momentum=0.875, weight_decay=1.0 / 32768)
    x, y = (torch.tensor(a) for a in batch_of(args.batch))
    before = rss_mib()
    for _ in range(args.steps):
        opt.zero_grad(set_to_none=True)
        smoothed_softmax_ce(twin.forward(x, training=True), y).backward()
        opt.step()
    return before


def child(args):
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    before = (run_onnxjob if args.side == "onnxjob" else run_torch)(args)
    print(json.dumps({"before_steps_mib": before, "peak_mib": peak_mib()}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--side", choices=["onnxjob", "torch"], help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        return child(args)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "resnet50_init.npz")
        for side in ("onnxjob", "torch"):  # (onnxjob first: it writes the weights)
            out = subprocess.run([sys.executable, __file__, "--side", side, "--weights",
                                  weights, "--batch", str(args.batch), "--steps",
                                  str(args.steps), "--threads", str(args.threads)],
                                 capture_output=True, text=True, check=True)
            results[side] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nResNet50 train, batch {args.batch}, {args.steps} steps, peak RSS (MiB)")
    print(f"{'side':10s} {'before steps':>13s} {'peak':>9s}")
    for side, r in results.items():
        print(f"{side:10s} {r['before_steps_mib']:13.0f} {r['peak_mib']:9.0f}")
    print(f"ratio onnxjob / PyTorch peak: "
          f"{results['onnxjob']['peak_mib'] / results['torch']['peak_mib']:.2f}")


if __name__ == "__main__":
    main()
