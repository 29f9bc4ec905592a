"""onnxjob on onnxruntime's CUDA EP vs PyTorch CUDA eager, and vs plain onnxruntime.

    ONNXJOB_DEVICE=cuda python bench/bench_gpu.py [--models lenet,resnet50] [--batch 64]
        [--rounds 5] [--algo-search EXHAUSTIVE|HEURISTIC|DEFAULT] [--cuda-graph both|on|off]

- doc LeNet (batch 100, no dropout) train step and predict, with and without CUDA graphs
  (runtime/cuda_graph.py), each phase interleaved with PyTorch eager on the same weights;
- OneFlow-Benchmark's ResNet50 (upstream file, `--batch`) train step (SGD momentum) and
  predict, same;
- serving: the ResNet50 predict job at batch 1 and `--batch` against plain onnxruntime
  (CUDA EP, NumPy in and out) on the job exported with `flow.export`.

Every step returns its result to the host on both sides (the loss, the logits), so the
GPU work is finished inside each timed call. PyTorch runs with cudnn.benchmark on (as
onnxruntime's default EXHAUSTIVE algorithm search) and its default TF32 convolutions
(onnxruntime's use_tf32 default). Ratios are onnxjob / reference (< 1: onnxjob faster).
ResNet50 needs ../shared/clients/oneflow-benchmark beside the repository.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=5, calls=10)
    p.add_argument("--models", default="lenet,resnet50")
    p.add_argument("--batch", type=int, default=64, help="ResNet50 batch")
    p.add_argument("--algo-search", default=None, help="cudnn_conv_algo_search for every job")
    p.add_argument("--cuda-graph", default="both", choices=("both", "on", "off"),
                   help="the runs with CUDA graphs, without, or both")
    p.add_argument("--device", default="cuda", help="cpu: the same comparison on the CPU "
                   "(a quick check of this script where no GPU is)")
    return p.parse_args()


def job_config(flow, cuda_graph, algo_search, device):
    config = flow.function_config()
    config.execution_provider(device)
    config.enable_cuda_graph(cuda_graph)
    if algo_search:
        config.cudnn_conv_algo_search(algo_search)
    return config


def named(fn, name):
    """`fn` under the job name `name` (a job is named after its function)."""
    fn.__name__ = fn.__qualname__ = name
    return fn


def bench_lenet(flow, torch, args, cuda_graph):
    import onnxjob.typing as tp
    from common import interleaved
    from models import BATCH, lenet, random_batch, torch_lenet
    flow.clear_default_session()
    config = job_config(flow, cuda_graph, args.algo_search, args.device)

    @flow.global_function(type="train", function_config=config)
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, lenet(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    @flow.global_function(type="predict", function_config=config)
    def eval_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return lenet(images)

    images, labels = random_batch()
    start = time.perf_counter()
    train_job(images, labels)
    first = time.perf_counter() - start
    weights = {k: torch.nn.Parameter(torch.tensor(v.numpy(), device=args.device))
               for k, v in flow.get_all_variables().items() if "System" not in k}
    forward = torch_lenet(torch, weights)
    opt = torch.optim.SGD(weights.values(), lr=0.1, momentum=0)
    timg, tlab = torch.tensor(images, device=args.device), torch.tensor(labels, device=args.device).long()

    def torch_train():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(forward(timg), tlab, reduction="none")
        loss.mean().backward()
        opt.step()
        return loss.detach().cpu().numpy()

    def torch_predict():
        with torch.no_grad():
            return forward(torch.from_numpy(images).to(args.device)).cpu().numpy()

    train = interleaved({"onnxjob": lambda: train_job(images, labels), "torch": torch_train},
                        args.rounds, args.calls)
    predict = interleaved({"onnxjob": lambda: eval_job(images), "torch": torch_predict},
                          args.rounds, args.calls)
    graphs = " (CUDA graphs)" if cuda_graph else ""
    return [(f"LeNet b{BATCH} train{graphs}", train["onnxjob"], train["torch"]),
            (f"LeNet b{BATCH} predict{graphs}", predict["onnxjob"], predict["torch"])], first


def bench_resnet(flow, torch, args, cuda_graph):
    import onnxjob.typing as tp
    from common import interleaved
    from bench_resnet import torch_side
    from common import first_call, resnet_batch
    from zoo import model_args, model_builder, smoothed_labels
    flow.clear_default_session()
    build, margs, batch = model_builder("resnet50"), model_args(), args.batch
    config = job_config(flow, cuda_graph, args.algo_search, args.device)

    @flow.global_function(type="train", function_config=config)
    def train_job(images: tp.Numpy.Placeholder((batch, 3, 224, 224), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        logits = build(images, margs)
        loss = flow.nn.softmax_cross_entropy_with_logits(smoothed_labels(labels, logits), logits)
        loss = flow.math.reduce_mean(loss)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                           momentum=0.875).minimize(loss)
        return loss

    predict_jobs = {}
    for size in sorted({1, batch}):
        def predict(images: tp.Numpy.Placeholder((size, 3, 224, 224), dtype=flow.float)) -> tp.Numpy:
            return build(images, margs)
        predict_jobs[size] = flow.global_function(type="predict", function_config=config)(
            named(predict, f"predict_b{size}"))

    x, y = resnet_batch(batch)
    first = first_call(train_job, x, y)
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    torch_train, torch_predict = torch_side(torch, values, x, y, args.device)

    calls = max(1, args.calls // 2)
    train = interleaved({"onnxjob": lambda: train_job(x, y), "torch": torch_train},
                        args.rounds, calls, warmup=2)
    predict = interleaved({"onnxjob": lambda: predict_jobs[batch](x),
                           "torch": lambda: torch_predict(x)}, args.rounds, calls, warmup=2)
    graphs = " (CUDA graphs)" if cuda_graph else ""
    rows = [(f"ResNet50 b{batch} train{graphs}", train["onnxjob"], train["torch"]),
            (f"ResNet50 b{batch} predict{graphs}", predict["onnxjob"], predict["torch"])]
    serving = bench_serving(flow, predict_jobs, x, args, graphs)
    return rows, serving, first


def bench_serving(flow, predict_jobs, x, args, graphs):
    """Each predict job against plain onnxruntime on its exported .onnx file."""
    import onnxruntime as ort
    from common import interleaved
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size, job in predict_jobs.items():
            batch_x = np.ascontiguousarray(x[:size])
            path = flow.export(job, os.path.join(tmp, f"predict_b{size}.onnx"))
            provider = "CUDAExecutionProvider" if args.device == "cuda" else "CPUExecutionProvider"
            raw = ort.InferenceSession(path, providers=[provider])
            name = raw.get_inputs()[0].name
            np.testing.assert_allclose(job(batch_x), raw.run(None, {name: batch_x})[0],
                                       rtol=1e-2, atol=1e-2)
            calls = args.calls * (5 if size == 1 else 1)
            res = interleaved({"onnxjob": lambda: job(batch_x),
                               "raw": lambda: raw.run(None, {name: batch_x})},
                              args.rounds, calls, warmup=3)
            rows.append((f"serve ResNet50 b{size}{graphs}", res["onnxjob"], res["raw"]))
    return rows


def main():
    args = parse()
    os.environ["ONNXJOB_DEVICE"] = args.device
    import torch
    torch.backends.cudnn.benchmark = True
    import onnxjob as flow
    from common import print_table
    assert args.device == "cpu" or torch.cuda.is_available(), "PyTorch sees no GPU"
    rows, serving, firsts = [], [], []
    graph_settings = {"both": [True, False], "on": [True], "off": [False]}[args.cuda_graph]
    if args.device == "cpu":
        graph_settings = [False]
    for cuda_graph in graph_settings:
        if "lenet" in args.models:
            r, first = bench_lenet(flow, torch, args, cuda_graph)
            rows += r
            firsts.append((f"LeNet first train call{' (graphs)' if cuda_graph else ''}", first))
        if "resnet50" in args.models:
            r, s, first = bench_resnet(flow, torch, args, cuda_graph)
            rows += r
            serving += s
            firsts.append((f"ResNet50 b{args.batch} first train call"
                           f"{' (graphs)' if cuda_graph else ''}", first))
    device = torch.cuda.get_device_name() if args.device == "cuda" else "the CPU"
    print_table(rows, f"onnxjob (CUDA EP) vs PyTorch {torch.__version__} CUDA eager on {device}"
                      f"{', cudnn search ' + args.algo_search if args.algo_search else ''}")
    if serving:
        print_table(serving, "predict job vs plain onnxruntime on the exported .onnx")
    for label, seconds in firsts:
        print(f"{label}: {seconds:.2f} s")


if __name__ == "__main__":
    main()
