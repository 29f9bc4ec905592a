"""Per-op-type time of one job's onnxruntime session (onnxruntime's own profiler).

    python bench/profile_step.py [lenet|mlp|resnet50] [--steps 20] [--top 8] [--batch 8]
"""
import argparse
import collections
import json
import os
import sys

import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="lenet")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=8, help="how many of the slowest nodes to list")
    p.add_argument("--batch", type=int, default=8, help="resnet50's batch size")
    args = p.parse_args()
    from common import compiled_train_job
    rt, feeds = compiled_train_job(args.model, args.batch)
    opts = ort.SessionOptions()
    opts.enable_profiling = True
    opts.intra_op_num_threads = args.threads
    opts.profile_file_prefix = "/tmp/onnxjob_profile"
    sess = ort.InferenceSession(rt.model_bytes, opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=["EliminateDropout"])
    for _ in range(args.steps):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    per_op = collections.Counter()
    per_node = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
            per_node[(e["args"]["op_name"], e["name"][:-12])] += e["dur"]
    total = sum(per_op.values())
    print(f"{args.model} train step: {total / args.steps / 1000:.2f} ms of kernel time per step")
    for op, us in per_op.most_common(args.top + 4):
        print(f"  {op:22s} {us / args.steps / 1000:8.2f} ms  {100 * us / total:5.1f}%")
    print("top nodes:")
    for (op, node), us in per_node.most_common(args.top):
        print(f"  {op:18s} {node[:50]:50s} {us / args.steps / 1000:8.2f} ms")
    os.remove(path)


if __name__ == "__main__":
    main()
