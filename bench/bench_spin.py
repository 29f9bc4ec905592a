"""What onnxruntime's idle threads cost the caller's next work: PyTorch's doc MLP train step
timed alone, then its first calls right after a block of onnxjob steps.

    python bench/bench_spin.py [--threads 2]
    ONNXJOB_SPIN_US=<default spinning> python bench/bench_spin.py   # (unset: 100 us)

After a run, idle intra-op threads spin for `session.intra_op.spin_duration_us` before they
sleep; onnxjob sets 100 us (ONNXJOB_SPIN_US). Run once with the default and once with
ONNXJOB_SPIN_US=10000 (spinning for 10 ms) to see the difference; the ratio printed is
PyTorch's first 5 calls after onnxjob / PyTorch alone (1.0: no interference).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import statistics
    import torch
    torch.set_num_threads(args.threads)
    import onnxjob as flow
    from bench_models import torch_model, torch_train_step
    from common import time_calls
    from models import define_jobs, mlp, random_batch
    train_job, _ = define_jobs(mlp)
    images, labels = random_batch()
    train_job(images, labels)
    weights = {k: v.numpy() for k, v in flow.get_all_variables().items() if "System" not in k}
    forward, opt = torch_model(torch, "mlp", weights)
    torch_step = torch_train_step(torch, forward, opt, images, labels)
    time_calls(torch_step, 20)
    alone, after, ours = [], [], []
    for _ in range(args.rounds):
        alone.append(time_calls(torch_step, 100))
        ours.append(time_calls(lambda: train_job(images, labels), 100))
        after.append(time_calls(torch_step, 5))
    spin = os.environ.get("ONNXJOB_SPIN_US", "100")
    print(f"doc MLP train step, {args.threads} threads, spin {spin} us, medians of {args.rounds}")
    print(f"  onnxjob                          {statistics.median(ours) * 1e3:7.2f} ms")
    print(f"  PyTorch alone                    {statistics.median(alone) * 1e3:7.2f} ms")
    print(f"  PyTorch, 5 calls after onnxjob   {statistics.median(after) * 1e3:7.2f} ms   "
          f"ratio {statistics.median(after) / statistics.median(alone):.2f}")


if __name__ == "__main__":
    main()
