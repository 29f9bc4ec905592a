"""One model's train step compiled under several environment settings, timed in one process.

    python bench/bench_variants.py default= im2col=ONNXJOB_CONV_WGRAD=im2col \
        nomask=ONNXJOB_SKIP_PASSES=MaskBeforeMaxUnpool [--model lenet] [--rounds 9]

Each VARIANT is `name=` followed by `ENV=value` settings joined by `,`; they are in force
only while that variant's job is traced, differentiated and compiled (gradient
formulations and passes are chosen then). The onnxruntime sessions of all variants and a
PyTorch eager step then run interleaved, round by round, so the machine's drift hits every
variant alike; the table gives medians and the ratio to PyTorch.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=9, calls=3)
    p.add_argument("variants", nargs="+", metavar="NAME=ENV=value,...")
    p.add_argument("--model", default="lenet", choices=["lenet", "mlp"])
    return p.parse_args()


def parse_variant(text):
    name, _, settings = text.partition("=")
    env = dict(s.split("=", 1) for s in settings.split(",") if s)
    return name, env


def compile_train_step(flow, model, env):
    """(onnxruntime run closure, feeds) of the model's train job compiled under `env`."""
    from models import define_jobs, lenet, mlp, random_batch
    from onnxjob.session import default_session
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        flow.clear_default_session()
        net, kwargs = (lenet, {"train": False}) if model == "lenet" else (mlp, {})
        train_job, _ = define_jobs(net, kwargs)
        images, labels = random_batch()
        train_job(images, labels)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    session = default_session()
    runtime = session.runtimes["train_job"]
    feeds = {"images": images, "labels": labels}
    for name in runtime.compiled.variable_names:
        feeds[name] = session.variable_numpy(name)
    ort_session = runtime.ort_session
    return (lambda: ort_session.run(None, dict(feeds))), feeds


def torch_train_step(torch, model, feeds):
    from models import torch_lenet, torch_mlp
    params = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in feeds.items()
              if k not in ("images", "labels") and v.dtype == np.float32 and "System" not in k}
    forward = (torch_lenet if model == "lenet" else torch_mlp)(torch, params)
    opt = torch.optim.SGD(params.values(), lr=0.1, momentum=0)
    images, labels = torch.tensor(feeds["images"]), torch.tensor(feeds["labels"]).long()

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(forward(images), labels).backward()
        opt.step()
    return step


def main():
    args = parse()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    import onnxjob as flow
    from common import interleaved, print_table
    candidates, feeds = {}, None
    for text in args.variants:
        name, env = parse_variant(text)
        candidates[name], feeds = compile_train_step(flow, args.model, env)
    candidates["torch"] = torch_train_step(torch, args.model, feeds)
    medians = interleaved(candidates, args.rounds, args.calls)
    rows = [(f"{args.model} train: {name}", medians[name], medians["torch"])
            for name in candidates if name != "torch"]
    print_table(rows, f"{args.threads} threads, medians (ratio = variant / PyTorch "
                f"{torch.__version__} eager)")


if __name__ == "__main__":
    main()
