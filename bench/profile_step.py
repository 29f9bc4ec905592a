"""Per-op-type time of one job's onnxruntime session (onnxruntime's own profiler).

    python bench/profile_step.py [lenet|mlp|resnet50|bert] [--steps 20] [--top 8] [--batch 8]
        [--device cuda] [--job train|predict]

`--job predict` profiles the predict job with its variables as constants (the frozen
session a served predict job runs, runtime/frozen.py). Convolution nodes also show their
rate in GFLOP/s (2 flops per multiply-add), to set against the cores' peak.

On CUDA the profiler times each node's launch, not its kernel: run it with
CUDA_LAUNCH_BLOCKING=1 so that a node's time includes its kernels. `--amp` compiles
resnet50 under enable_auto_mixed_precision. The nodes each execution provider ran are
counted, and on CUDA the op types onnxruntime placed on the CPU are listed (each such
node copies its inputs and outputs between the devices and keeps the step out of CUDA
graphs).
"""
import argparse
import collections
import json
import math
import os
import sys

import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def conv_flops(op, inputs, outputs):
    """Flops of a Conv (also onnxruntime's fused and NCHWc forms) or ConvTranspose node
    from its profiled shapes, else 0. A grouped weight's shape already counts the
    channels per group."""
    if op not in ("Conv", "FusedConv", "ConvTranspose") or len(inputs) < 2 or not outputs:
        return 0
    w = inputs[1]
    if op == "ConvTranspose":   # every input value meets a (C_out/g, *k) slab
        return 2 * math.prod(inputs[0]) * math.prod(w[1:])
    return 2 * math.prod(outputs[0]) * math.prod(w[1:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="lenet")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=8, help="how many of the slowest nodes to list")
    p.add_argument("--batch", type=int, default=8, help="resnet50's batch size")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the job is compiled for it)")
    p.add_argument("--warmup", type=int, default=2,
                   help="first runs left out (allocations, cuDNN's algorithm search)")
    p.add_argument("--job", choices=["train", "predict"], default="train")
    p.add_argument("--amp", action="store_true", help="resnet50 under mixed precision")
    args = p.parse_args()
    os.environ["ONNXJOB_DEVICE"] = args.device
    from common import compiled_train_job, frozen_predict_job
    if args.job == "train":
        rt, feeds = compiled_train_job(args.model, args.batch, args.amp)
        model_bytes, is_train = rt.model_bytes, True
    else:
        model_bytes, feeds = frozen_predict_job(args.model, args.batch)
        is_train = False
    from onnxjob.runtime.backend import disabled_transformers, session_options
    # the options and transformers a job's own session gets (runtime/backend.py)
    opts = session_options(is_train, threads=args.threads, device=args.device)
    opts.enable_profiling = True
    opts.profile_file_prefix = "/tmp/onnxjob_profile"
    providers = ["CUDAExecutionProvider"] if args.device == "cuda" else []
    sess = ort.InferenceSession(model_bytes, opts,
                                providers=providers + ["CPUExecutionProvider"],
                                disabled_optimizers=disabled_transformers(is_train, args.device))
    for _ in range(args.warmup + args.steps):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    per_op = collections.Counter()
    per_node = collections.Counter()
    placed = collections.defaultdict(set)     # provider -> {(op type, node name)}
    shapes, outputs = {}, {}
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    counted_from = runs[args.warmup] if args.warmup else 0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and \
                e["ts"] >= counted_from:
            per_op[e["args"]["op_name"]] += e["dur"]
            key = (e["args"]["op_name"], e["name"][:-12])
            placed[e["args"].get("provider", "?")].add(key)
            per_node[key] += e["dur"]
            shapes[key] = [list(d.values())[0] for d in e["args"].get("input_type_shape", [])]
            outputs[key] = [list(d.values())[0] for d in e["args"].get("output_type_shape", [])]
    for provider, nodes in sorted(placed.items()):
        print(f"{provider}: {len(nodes)} nodes")
        if args.device == "cuda" and provider != "CUDAExecutionProvider":
            kinds = collections.Counter(op for op, _ in nodes)
            print("  " + ", ".join(f"{op} x{n}" for op, n in kinds.most_common()))
    total = sum(per_op.values())
    print(f"{args.model} {args.job} step: {total / args.steps / 1000:.2f} ms of kernel time "
          "per step")
    for op, us in per_op.most_common(args.top + 4):
        print(f"  {op:22s} {us / args.steps / 1000:8.2f} ms  {100 * us / total:5.1f}%")
    conv = [(conv_flops(op, shapes[(op, n)], outputs[(op, n)]), us)
            for (op, n), us in per_node.items()]
    conv = [(f, us) for f, us in conv if f]
    if conv:
        flops, us = sum(f for f, _ in conv), sum(us for _, us in conv) / args.steps
        print(f"  convolutions: {flops / 1e9:.1f} GFLOP in {us / 1000:.1f} ms, "
              f"{flops / us / 1e3:.0f} GFLOP/s")
    print("top nodes:")
    for (op, node), us in per_node.most_common(args.top):
        flops = conv_flops(op, shapes[(op, node)], outputs[(op, node)])
        rate = f"{flops * args.steps / us / 1e3:6.0f} GFLOP/s  " if flops else ""
        print(f"  {op:18s} {node[:40]:40s} {us / args.steps / 1000:8.2f} ms  {rate}"
              f"{shapes[(op, node)]}")
    os.remove(path)


if __name__ == "__main__":
    main()
