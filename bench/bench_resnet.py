"""onnxjob vs PyTorch eager on OneFlow-Benchmark's ResNet50 (upstream model file, unchanged).

    python bench/bench_resnet.py [--batch 8] [--threads 2] [--rounds 3] [--fused]

The train step is the upstream recipe (label smoothing, softmax cross entropy, SGD momentum
0.875 with L2 1/32768); PyTorch runs tests/resnet_twin.py with the same weights and
torch.optim.SGD (momentum, weight decay). Both in this process, same thread count,
interleaved; medians and the ratio onnxjob/PyTorch (< 1: onnxjob faster). Also printed:
the first call of the train job (trace, autodiff, passes, onnxruntime session, first step)
and the predict step (fed variables, and frozen: variables baked in as constants).
Needs ../shared/clients/oneflow-benchmark beside the repository.
"""
import argparse
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=3, calls=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--fused", action="store_true", help="fused BN+ReLU layers (fuse_bn_relu)")
    return p.parse_args()


def autocast_dtype(torch, device):
    """The half type PyTorch's autocast uses on `device`: float16 on CUDA (what onnxjob's
    AMP computes in), bfloat16 on the CPU (PyTorch's CPU autocast type)."""
    return torch.float16 if device.startswith("cuda") else torch.bfloat16


def torch_side(torch, values, x, y, device="cpu", amp=False, init_scale=2.0 ** 16):
    """PyTorch's train step and predict on tests/resnet_twin.py with the job's `values`,
    on `device`; predict(batch) copies a host batch in (default: `x`, already there).

    amp: the train step's forward and loss under torch.autocast (autocast_dtype) with a
    torch.amp.GradScaler (init_scale, growth every 2000 good steps, factor 2: OneFlow's
    dynamic_loss_scale); train_step.scaler is the scaler."""
    from resnet_twin import ResNet50Twin, smoothed_softmax_ce
    weights = {k: torch.tensor(v, device=device, requires_grad=k.rsplit("-", 1)[1] in
                               ("weight", "bias", "gamma", "beta"))
               for k, v in values.items() if k.startswith("Resnet-")}
    twin = ResNet50Twin(weights)
    trainable = [w for w in weights.values() if w.requires_grad]
    opt = torch.optim.SGD(trainable, lr=0.01, momentum=0.875, weight_decay=1.0 / 32768)
    tx, ty = torch.tensor(x, device=device), torch.tensor(y, device=device)
    device_type = torch.device(device).type
    scaler = (torch.amp.GradScaler(device_type, init_scale=init_scale, growth_factor=2.0,
                                   backoff_factor=0.5, growth_interval=2000) if amp else None)

    def train_step():
        opt.zero_grad(set_to_none=True)
        if not amp:
            loss = smoothed_softmax_ce(twin.forward(tx, training=True), ty)
            loss.backward()
            opt.step()
            return loss.item()
        with torch.autocast(device_type, dtype=autocast_dtype(torch, device)):
            loss = smoothed_softmax_ce(twin.forward(tx, training=True), ty)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.item()
    train_step.scaler = scaler

    def predict(batch=None):
        with torch.no_grad():
            inputs = tx if batch is None else torch.from_numpy(batch).to(device)
            return twin.forward(inputs, training=False).cpu().numpy()
    return train_step, predict


def main():
    args = parse()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import torch
    torch.set_num_threads(args.threads)
    import onnxjob as flow
    from common import first_call, interleaved, page_faults, print_table, resnet_batch
    from zoo import define_jobs, model_args, model_builder

    batch = args.batch
    train_job, predict_job = define_jobs(model_builder("resnet50"), model_args(args.fused),
                                         224, 0.01, batch)
    x, y = resnet_batch(batch)
    first = first_call(train_job, x, y)
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    torch_train, torch_predict = torch_side(torch, values, x, y)

    train = interleaved({"onnxjob": lambda: train_job(x, y), "torch": torch_train},
                        args.rounds, args.calls, warmup=1)
    fed = interleaved({"onnxjob": lambda: predict_job(x), "torch": torch_predict},
                      args.rounds, max(args.calls, 3), warmup=1)
    for _ in range(8):  # the default freeze threshold: later calls use the frozen session
        predict_job(x)
    frozen = interleaved({"onnxjob": lambda: predict_job(x), "torch": torch_predict},
                         args.rounds, max(args.calls, 3), warmup=1)
    label = f"ResNet50{' fused' if args.fused else ''} batch {batch}"
    print_table([(f"{label} train step", train["onnxjob"], train["torch"]),
                 (f"{label} predict (fed)", fed["onnxjob"], fed["torch"]),
                 (f"{label} predict (frozen)", frozen["onnxjob"], frozen["torch"])],
                f"onnxjob vs PyTorch {torch.__version__} eager, {args.threads} threads")
    print(f"first train call (trace + autodiff + passes + session + step): {first:.2f} s")
    for name, step in (("onnxjob", lambda: train_job(x, y)), ("PyTorch", torch_train)):
        touched, system = page_faults(step)
        print(f"{name} train step: {touched:.0f} MB page-faulted in, {system * 1e3:.0f} ms of "
              "system time per step")


if __name__ == "__main__":
    main()
