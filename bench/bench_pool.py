"""A train step through a large-window average pool, onnxjob vs PyTorch eager in the same
process: MobileNetV3's squeeze-excite pool as oneflow_vision_model writes it,
`flow.nn.avg_pool2d(x, ksize=[H, W], strides=None, padding="SAME")` (stride 1: an output
per pixel, each the mean of the image's part the window covers), then a square loss.
passes/separable_average_pools.py and pooling._window_sums are what this measures;
ONNXJOB_SKIP_PASSES=SeparableAveragePools shows the pass's share.

    python bench/bench_pool.py [--batch 4 --channels 16 --size 112] [--rounds 5 --calls 3]
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import add_timing_args, interleaved, print_table  # noqa: E402


def onnxjob_step(args, x):
    import onnxjob as flow
    import onnxjob.typing as tp
    flow.config.cpu_device_num(1)
    shape = (args.batch, args.channels, args.size, args.size)

    @flow.global_function(type="train")
    def pool_step(images: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        w = flow.get_variable("w", (1,), initializer=flow.ones_initializer())
        pooled = flow.nn.avg_pool2d(images * w, ksize=[args.size, args.size], strides=None,
                                    padding="SAME")
        loss = flow.math.reduce_mean(pooled * pooled)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1e-3]),
                           momentum=0).minimize(loss)
        return loss
    return lambda: pool_step(x)


def torch_step(args, x):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    k = args.size
    # "SAME" at stride 1: k - 1 padding, the odd one before (OneFlow's split), not counted
    before, after = k // 2, (k - 1) // 2
    pads = (before, after, before, after)
    images = torch.from_numpy(x)
    counts = F.avg_pool2d(F.pad(torch.ones_like(images[:1, :1]), pads), k, 1)
    w = torch.ones(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=True)
        pooled = F.avg_pool2d(F.pad(images * w, pads), k, 1) / counts
        loss = (pooled * pooled).mean()
        loss.backward()
        opt.step()
        return float(loss)
    return step


def main():
    p = add_timing_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]),
                        rounds=5, calls=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--size", type=int, default=112)
    args = p.parse_args()
    os.environ.setdefault("ONNXJOB_NUM_THREADS", str(args.threads))
    x = np.random.default_rng(0).random((args.batch, args.channels, args.size, args.size),
                                        dtype=np.float32)
    ours, theirs = onnxjob_step(args, x), torch_step(args, x)
    loss, reference = float(ours()), theirs()
    assert abs(loss - reference) <= 1e-4 * abs(reference), (loss, reference)
    medians = interleaved({"onnxjob": ours, "torch": theirs}, args.rounds, args.calls)
    print_table([(f"avg_pool2d {args.size}x{args.size} SAME, b{args.batch} c{args.channels}",
                  medians["onnxjob"], medians["torch"])],
                "whole-image average pool train step, onnxjob vs PyTorch eager (CPU)")


if __name__ == "__main__":
    main()
