"""Eager tensors (flow.Tensor, onnxjob/eager/) against PyTorch eager, in one process.

    python bench/bench_eager.py [--batch 64] [--hidden 128] [--seconds 1.0] [--rounds 3]

A two-layer MLP on MNIST-sized inputs trained with Adam: each side's step (forward,
backward, update) is timed in blocks of about `--seconds`, alternating onnxjob and PyTorch
for `--rounds` rounds; the median per-step times and their ratio are printed. Both run on
the CPU with the same initial weights; their first losses are printed to show they
compute the same model (later ones differ a little: OneFlow's eager Adam has no bias
correction, PyTorch's has).
"""
import argparse
import statistics
import time

import numpy as np


def onnxjob_step(flow, x, labels, params, opt):
    def step():
        logits = flow.matmul(flow.math.relu(flow.matmul(x, params[0])), params[1])
        loss = flow.math.reduce_mean(
            flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def torch_step(torch, x, labels, params, opt):
    def step():
        loss = torch.nn.functional.cross_entropy(torch.relu(x @ params[0]) @ params[1], labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def timed(step, seconds):
    """Seconds per step over a block of about `seconds`."""
    count, start = 0, time.perf_counter()
    while True:
        step()
        count += 1
        spent = time.perf_counter() - start
        if spent >= seconds:
            return spent / count


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import onnxjob as flow
    import torch
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, 784)).astype(np.float32)
    labels = rng.integers(0, 10, args.batch)
    weights = [rng.standard_normal((784, args.hidden)).astype(np.float32) * 0.05,
               rng.standard_normal((args.hidden, 10)).astype(np.float32) * 0.05]
    ours = [flow.nn.Parameter(flow.Tensor(w)) for w in weights]
    theirs = [torch.tensor(w, requires_grad=True) for w in weights]
    steps = {
        "onnxjob": onnxjob_step(flow, flow.Tensor(x), flow.Tensor(labels, dtype=flow.int32),
                                ours, flow.experimental.optim.Adam(ours, lr=1e-3)),
        "pytorch": torch_step(torch, torch.tensor(x), torch.tensor(labels), theirs,
                              torch.optim.Adam(theirs, lr=1e-3, eps=1e-8)),
    }
    losses = {name: [step() for _ in range(3)] for name, step in steps.items()}
    times = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            times[name].append(timed(step, args.seconds))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"MLP 784-{args.hidden}-10, batch {args.batch}, Adam; first losses "
          f"onnxjob {losses['onnxjob'][0]:.4f} pytorch {losses['pytorch'][0]:.4f}")
    print(f"step: onnxjob {med['onnxjob'] * 1e3:.2f} ms, pytorch {med['pytorch'] * 1e3:.2f} ms, "
          f"ratio {med['onnxjob'] / med['pytorch']:.2f}")


if __name__ == "__main__":
    main()
