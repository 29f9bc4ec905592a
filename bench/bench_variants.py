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
    p.add_argument("--model", default="lenet", choices=["lenet", "mlp", "resnet50"],
                   help="resnet50: OneFlow-Benchmark's at batch 8, against the first variant "
                        "(no PyTorch step)")
    return p.parse_args()


def parse_variant(text):
    name, _, settings = text.partition("=")
    env = dict(s.split("=", 1) for s in settings.split(",") if s)
    return name, env


def compile_train_step(flow, model, env):
    """(onnxruntime run closure, feeds) of the model's train job compiled under `env`."""
    from common import compiled_train_job
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        flow.clear_default_session()
        runtime, feeds = compiled_train_job(model)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    return device_resident_runner(runtime.ort_session, feeds), feeds


def device_resident_runner(ort_session, feeds):
    """A closure running one step. On the CUDA EP the feeds are copied to the GPU once and
    the outputs stay there (IOBinding), so the timing is the step's own GPU work and not
    ~100 MB of weights crossing PCIe each call; on the CPU a plain run."""
    if ort_session.get_providers()[0] != "CUDAExecutionProvider":
        return lambda: ort_session.run(None, dict(feeds))
    import onnxruntime as ort
    binding = ort_session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for output in ort_session.get_outputs():
        binding.bind_output(output.name, "cuda")
    return lambda: ort_session.run_with_iobinding(binding)


def torch_train(torch, model, feeds):
    """bench_models.py's PyTorch eager step, from the same weights and batch."""
    from bench_models import torch_model, torch_train_step
    weights = {k: v for k, v in feeds.items()
               if k not in ("images", "labels") and v.dtype == np.float32 and "System" not in k}
    forward, opt = torch_model(torch, model, weights)
    return torch_train_step(torch, forward, opt, feeds["images"], feeds["labels"])


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
    first = next(iter(candidates))
    if args.model == "resnet50":
        reference, label = first, f"the variant {first!r}"
    else:
        candidates["torch"] = torch_train(torch, args.model, feeds)
        reference, label = "torch", f"PyTorch {torch.__version__} eager"
    medians = interleaved(candidates, args.rounds, args.calls)
    rows = [(f"{args.model} train: {name}", medians[name], medians[reference])
            for name in candidates if name != "torch"]
    print_table(rows, f"{args.threads} threads, medians (ratio = variant / {label})")


if __name__ == "__main__":
    main()
