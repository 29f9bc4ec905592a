"""Where a GPU train step's time goes, kernel by kernel, as the GPU ran it (CUDA graphs
included), for ResNet50 or BERT-base.

    python bench/gpu_kernels.py [resnet50|bert] [--batch 64] [--amp] [--steps 5] [--top 30]
        [--cuda-graph on|off]

onnxruntime's own profiler times a node on the host (with CUDA_LAUNCH_BLOCKING=1, its
launch and a synchronization: ~20-40 us for a kernel that moves a few KiB on an H200, as
bench/profile_step.py showed for ResNet50's 107 per-channel ReduceMeans), and it sees
nothing inside a CUDA graph replay. Here PyTorch's profiler (CUPTI) records every kernel the
process's GPU work runs, onnxruntime's included, with its device start and end: the sum
per kernel name over `--steps` replayed steps, the step's wall time, and the GPU's busy
time (the union of kernel intervals) beside it, so that the gap between the two (launch
gaps, host work) is a number too. Kernel names are the CUDA symbols (onnxruntime's
`_PadKernel`, cuDNN's, cuBLAS's); `--by-family` groups them by a short family name.
Needs PyTorch with CUDA (the GPU machine has it) and onnxruntime-gpu; ResNet50 needs
../shared/clients/oneflow-benchmark beside the repository.
"""
import argparse
import collections
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def family(name):
    """A kernel's short family name: its symbol without templates, namespaces and
    arguments (`void onnxruntime::cuda::_PadKernel<__half, 2>(...)` -> `_PadKernel`)."""
    name = re.sub(r"\(.*", "", name)
    depth, plain = 0, []
    for ch in name:     # drop template arguments, nested ones too
        depth += ch == "<"
        if depth == 0:
            plain.append(ch)
        depth -= ch == ">"
    words = "".join(plain).replace("void ", "").split("::")
    return words[-1].strip() or name[:60]


def busy_time(intervals):
    """Length of the union of [start, end) intervals (the GPU's busy time)."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def summarize(kernels, steps, top, by_family):
    """Print the kernels [(name, start_us, end_us)] recorded over `steps` steps."""
    per = collections.Counter()
    count = collections.Counter()
    for name, start, end in kernels:
        key = family(name) if by_family else name
        per[key] += end - start
        count[key] += 1
    total = sum(per.values())
    busy = busy_time([(s, e) for _, s, e in kernels])
    print(f"  kernels per step {len(kernels) / steps:.0f}; kernel time per step "
          f"{total / steps / 1e3:.2f} ms, GPU busy {busy / steps / 1e3:.2f} ms")
    for key, us in per.most_common(top):
        print(f"  {us / steps / 1e3:8.3f} ms {100 * us / total:5.1f}% {count[key] / steps:6.0f}x"
              f"  {key[:110]}")


def _job(args, flow):
    config = flow.function_config()
    config.enable_cuda_graph(args.cuda_graph == "on")
    if args.model == "resnet50":
        from bench_gpu import resnet_train_job
        from common import resnet_batch
        return resnet_train_job(flow, config, args.batch, amp=args.amp), resnet_batch(args.batch)
    from bench_bert import amp_optimizer_args, define_amp_train_job, flag_config
    from bert_models import SMALL, synthetic_batch
    from types import SimpleNamespace
    ns = SimpleNamespace(layers=12, hidden=768, heads=12, seq=128, vocab=30522, rounds=1,
                         calls=1)
    bert_config = dict(SMALL, **flag_config(ns))
    flow.config.seed(0)
    job = define_amp_train_job(args.batch, bert_config, amp_optimizer_args())
    return job, synthetic_batch(args.batch, bert_config)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default="resnet50", choices=["resnet50", "bert"])
    p.add_argument("--batch", type=int, default=None, help="64 (ResNet50) or 32 (BERT)")
    p.add_argument("--amp", action="store_true", help="ResNet50 under mixed precision "
                   "(BERT's step is always its AMP one)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--by-family", action="store_true", help="group kernels by family name")
    p.add_argument("--cuda-graph", default="on", choices=("on", "off"))
    args = p.parse_args(argv)
    args.batch = args.batch or (64 if args.model == "resnet50" else 32)
    # (BERT's job makes its own function config: the setting reaches it too)
    os.environ["ONNXJOB_CUDA_GRAPH"] = "1" if args.cuda_graph == "on" else "0"
    import torch
    from torch.profiler import ProfilerActivity, profile
    if not torch.cuda.is_available():
        raise SystemExit("gpu_kernels.py needs a GPU (PyTorch's CUDA build and a device)")
    torch.zeros(1, device="cuda")       # the CUDA context, before onnxruntime's sessions
    import onnxjob as flow
    from bench_gpu import use_shared_in_checkout
    use_shared_in_checkout()
    job, feeds = _job(args, flow)
    for _ in range(args.warmup):
        job(*feeds)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(args.steps):
            job(*feeds)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / args.steps
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower()
               and "memset" not in e.name.lower()]
    label = f"{args.model} b{args.batch}{' AMP' if args.amp else ''}"
    print(f"{label} train step, CUDA graphs {args.cuda_graph}: {wall * 1e3:.2f} ms a step (wall)")
    summarize(kernels, args.steps, args.top, args.by_family)


if __name__ == "__main__":
    main()
