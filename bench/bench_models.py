"""onnxjob vs PyTorch eager on the doc LeNet and MLP (batch 100): train and predict steps.

    python bench/bench_models.py [--threads 2] [--rounds 7] [--json bench/results.json]

Both frameworks run in this process with the same thread count, interleaved round by
round; the table prints medians and the ratio onnxjob/PyTorch (< 1 means onnxjob is
faster). Also: onnxjob's per-call overhead over a raw onnxruntime run of a tiny graph, and
the session start (trace, autodiff, passes and onnxruntime sessions of the model's three
jobs, variable initialization; the session cache of runtime/session_cache.py as it is).
"""
import argparse
import os
import sys
import time

import numpy as np

from onnxjob.frontend.config import started_session
from onnxjob.runtime.session import default_session

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser())
    p.add_argument("--json", default=None)
    p.add_argument("--models", default="lenet,mlp")
    return p.parse_args()


def torch_model(torch, name, weights):
    from models import torch_lenet, torch_mlp
    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in weights.items()}
    forward = (torch_lenet if name == "lenet" else torch_mlp)(torch, params)
    opt = torch.optim.SGD(params.values(), lr=0.1, momentum=0)
    return forward, opt


def torch_train_step(torch, forward, opt, images, labels):
    """One PyTorch eager SGD step on the batch, returning the per-example loss like the job."""
    timg, tlab = torch.tensor(images), torch.tensor(labels).long()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(timg), tlab, reduction="none")
        loss.mean().backward()
        opt.step()
        return loss.detach().numpy()
    return step


def bench_model(name, args, torch, flow):
    from models import define_jobs, random_batch
    from common import bench_net, interleaved
    flow.clear_default_session()
    net, kwargs = bench_net(name)
    train_job, eval_job = define_jobs(net, kwargs)
    eval_fed = define_fed_predict_job(flow, net)
    images, labels = random_batch()
    t0 = time.perf_counter()
    started_session()  # compiles every job of the session
    compile_s = time.perf_counter() - t0
    eval_job(images)
    weights = {k: v.numpy() for k, v in flow.get_all_variables().items() if "System" not in k}
    forward, opt = torch_model(torch, name, weights)
    torch_train = torch_train_step(torch, forward, opt, images, labels)
    timg = torch.tensor(images)

    def torch_predict():
        with torch.no_grad():
            return forward(timg).numpy()

    train = interleaved({"onnxjob": lambda: train_job(images, labels), "torch": torch_train},
                        args.rounds, args.calls)
    predict = interleaved({"onnxjob": lambda: eval_job(images), "torch": torch_predict,
                           "onnxjob_fed": lambda: eval_fed(images)}, args.rounds, args.calls)
    nodes = len(list(default_session().runtimes["train_job"].compiled.model.graph))
    return {"train": train, "predict": predict, "compile_s": compile_s, "train_nodes": nodes}


def define_fed_predict_job(flow, net):
    """The predict job again, with its variables always fed as inputs (never frozen into
    constants, onnxjob/runtime/frozen.py): what a predict step costs right after training."""
    import onnxjob.typing as tp
    from models import BATCH
    config = flow.function_config()
    config.freeze_variables_after(0)

    @flow.global_function(type="predict", function_config=config)
    def eval_fed(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return net(images)
    return eval_fed


def bench_overhead(args, flow):
    """A tiny job vs the same ONNX graph run directly with onnxruntime."""
    import onnxruntime as ort
    import onnxjob.typing as tp
    from common import interleaved
    flow.clear_default_session()

    @flow.global_function()
    def tiny(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        return flow.math.relu(x)

    x = np.ones(4, np.float32)
    tiny(x)
    runtime = default_session().runtimes["tiny"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    raw = ort.InferenceSession(runtime.model_bytes, opts, providers=["CPUExecutionProvider"])
    res = interleaved({"onnxjob": lambda: tiny(x), "raw": lambda: raw.run(None, {"x": x})},
                      args.rounds, 2000)
    return res


def main():
    args = parse()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    import onnxjob as flow
    import onnxjob.runtime.session  # noqa: F401
    from common import dump_json, print_table
    results = {"threads": args.threads, "torch": torch.__version__}
    rows_train, rows_predict = [], []
    for name in args.models.split(","):
        r = bench_model(name, args, torch, flow)
        results[name] = r
        rows_train.append((f"{name} train step", r["train"]["onnxjob"], r["train"]["torch"]))
        rows_predict.append((f"{name} predict", r["predict"]["onnxjob"], r["predict"]["torch"]))
        rows_predict.append((f"{name} predict, variables fed", r["predict"]["onnxjob_fed"],
                             r["predict"]["torch"]))
    overhead = bench_overhead(args, flow)
    results["overhead"] = overhead
    print_table(rows_train + rows_predict, f"batch 100, {args.threads} threads, medians "
                f"(ratio = onnxjob / PyTorch {torch.__version__} eager)")
    print(f"\nper-call overhead over raw onnxruntime (tiny graph): "
          f"{(overhead['onnxjob'] - overhead['raw']) * 1e6:.1f} us "
          f"(onnxjob {overhead['onnxjob'] * 1e6:.1f} us, raw {overhead['raw'] * 1e6:.1f} us)")
    for name in args.models.split(","):
        print(f"{name}: session start (3 jobs: trace + autodiff + passes + sessions) "
              f"{results[name]['compile_s']:.3f} s, train graph {results[name]['train_nodes']} nodes")
    if args.json:
        dump_json(args.json, results)


if __name__ == "__main__":
    main()
