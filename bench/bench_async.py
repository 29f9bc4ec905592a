"""Sync vs Callback job calls in a data-loader-bound MNIST training loop.

    python bench/bench_async.py [--steps 200] [--rounds 5] [--threads 1]

The loader does NumPy augmentation (random shifts, noise, normalisation) costing about
as much as one MLP train step. In the sync form each step waits for the job; in the
Callback form the next batch is prepared while onnxjob's worker runs the current step.
Both forms run interleaved in this process; the ratio is sync time / callback time.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def make_loader(images, labels, work):
    rng = np.random.default_rng(0)

    def load(i):
        x = images[i % len(images)]
        for _ in range(work):  # augmentation: shift, jitter, renormalise
            shift = rng.integers(-2, 3, size=2)
            x = np.roll(x, tuple(shift), axis=(2, 3))
            x = np.clip(x + rng.normal(0, 0.01, x.shape).astype(np.float32), 0, 1)
            x = (x - x.mean()) / (x.std() + 1e-6) * 0.3 + 0.13
        return x.astype(np.float32), labels[i % len(labels)]
    return load


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=int, default=0, help="augmentation passes (0: calibrate)")
    args = p.parse_args()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import onnxjob as flow
    import onnxjob.typing as tp
    from models import BATCH, mlp
    from conftest import MNIST

    (train_images, train_labels), _ = flow.data.load_mnist(BATCH, BATCH, hash_check=None,
                                                           out_dir=os.path.dirname(MNIST))

    @flow.global_function(type="train")
    def sync_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28)),
                 labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    @flow.global_function(type="train")
    def async_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28)),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    x0, y0 = train_images[0], train_labels[0]
    for _ in range(20):
        sync_job(x0, y0)
    step_s = min(timeit(lambda: sync_job(x0, y0), 50) for _ in range(3))
    work = args.work
    if work == 0:  # calibrate the loader to cost about one step
        work = 1
        while timeit(lambda: make_loader(train_images, train_labels, work)(0), 20) < step_s and work < 64:
            work += 1
    load = make_loader(train_images, train_labels, work)
    load_s = timeit(lambda: load(0), 50)
    losses = []

    def run_sync():
        for i in range(args.steps):
            x, y = load(i)
            losses.append(sync_job(x, y).mean())

    def run_async():
        for i in range(args.steps):
            x, y = load(i)
            async_job(x, y)(lambda loss: losses.append(loss.mean()))
        flow.sync_default_session()

    times = {"sync": [], "callback": []}
    for _ in range(args.rounds):
        for name, fn in (("sync", run_sync), ("callback", run_async)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    sync_t, async_t = statistics.median(times["sync"]), statistics.median(times["callback"])
    print(f"MLP train step {step_s * 1e3:.2f} ms, loader {load_s * 1e3:.2f} ms per batch "
          f"({work} augmentation passes), {args.steps} steps, {args.threads} onnxruntime thread(s), "
          f"{os.cpu_count()} cores")
    print(f"sync loop     {sync_t * 1e3 / args.steps:7.2f} ms/step")
    print(f"callback loop {async_t * 1e3 / args.steps:7.2f} ms/step")
    print(f"speed-up (sync / callback): {sync_t / async_t:.2f}x")


def timeit(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n


if __name__ == "__main__":
    main()
