"""onnxjob on onnxruntime's CUDA EP vs PyTorch CUDA in the same process, fp32 and mixed precision.

On the GPU machine (the device tool), from the repository root, with OneFlow-Benchmark's
files carried into the checkout (the device tool sends the checkout only, not ../shared:
copy /work/shared/clients/oneflow-benchmark and /work/shared/tools/ort-gpu-run.sh into an
ignored folder `shared/` of the checkout, with the onnxruntime-gpu wheel pieces already in
/tmp/gw, see ort-gpu-on-device.md), one call measures every row:

    ONNXJOB_DEVICE=cuda bash shared/tools/ort-gpu-run.sh python3 bench/bench_gpu.py --json $OUT/gpu.json

(`bench/gpu/checks.sh gpu-tests` runs these rows with its own setup. `bash ../shared/tools/ort-gpu-run.sh ...` where ../shared sits beside the repository, as on
the development machine; OneFlow-Benchmark is looked up at ../shared/clients/oneflow-benchmark
and then at shared/clients/oneflow-benchmark inside the checkout.) `--rows` picks rows
(default all, see ROWS), `--amp` only the mixed-precision ones; `--cuda-graph off` drops the
CUDA-graph repeats of the LeNet and ResNet50 rows when the 600 s of a device call are short. Each row is
printed as soon as it is measured, so a run cut short still shows what it finished. The suite
check on the same machine: `ONNXJOB_DEVICE=cuda bash shared/tools/ort-gpu-run.sh python3 -m
pytest -q tests` (tests/upstream.py looks only at ../shared: `ln -sfn "$PWD/shared" ../shared`
first, or the tests of the upstream programs skip). `--device cpu` runs every row on the CPU with small flags (a check of this
script where no GPU is), e.g. `python bench/bench_gpu.py --device cpu --batch 2 --rounds 1
--calls 1 --bert-layers 1 --bert-hidden 64 --bert-heads 2 --bert-seq 32 --bert-batch 2
--bert-vocab 1000`.

    [--rows lenet,resnet50,resnet50-amp,resnet50-amp-memory,resnet50-memory,bert-amp,
            bert-amp-memory | --amp]
    [--batch 64] [--rounds 5] [--calls 10] [--algo-search EXHAUSTIVE|HEURISTIC|DEFAULT]
    [--cuda-options prefer_nhwc=1,...]
    [--cuda-graph both|on|off] [--loss-scale 65536] [--memory-steps 5] [--memory-timeout 300]
    [--bert-layers 12 --bert-hidden 768 --bert-heads 12 --bert-seq 128 --bert-batch 32
     --bert-vocab 30522] [--json PATH]

Rows (ROWS):
- lenet: doc LeNet (batch 100, no dropout) train step and predict, with and without CUDA
  graphs (runtime/cuda_graph.py), interleaved with PyTorch eager on the same weights;
- resnet50: OneFlow-Benchmark's ResNet50 (upstream file, `--batch`) train step (SGD momentum
  0.875, L2 1/32768) and predict, fp32, vs PyTorch eager fp32 (tests/resnet_twin.py, same
  weights, bench_resnet.torch_side); with it the serving rows: the predict job at batch 1
  and `--batch` against plain onnxruntime (CUDA EP, NumPy in and out) on `flow.export`'s file;
- resnet50-amp: the same train step under automatic mixed precision, as OneFlow-Benchmark's
  --use_fp16 sets it up (optimizer_util.py: enable_auto_mixed_precision and
  dynamic_loss_scale(increment_period=2000); the initial scale is `--loss-scale`, 2**16 by
  default, upstream leaves OneFlow's 2**30, which only adds skipped steps at the start), vs
  the twin under torch.autocast("cuda", float16) + torch.amp.GradScaler with the same
  schedule (init_scale, x2 after 2000 good steps, /2 on an overflow);
- resnet50-amp-memory: the peak device memory of both AMP train steps (below);
- resnet50-memory: the same for the float32 train steps (SGD momentum, no loss scale, vs
  the twin in float32);
- bert-amp: OneFlow-Benchmark's BERT pretraining (pretrain.PreTrain, dropout 0 on both sides;
  base: hidden 768, 12 layers, 12 heads, seq 128, batch 32) train step under upstream's
  --use_fp16 settings (util.GetFunctionConfig, util.CreateOptimizer: LAMB, clipping, dynamic
  loss scale from 2**30) vs tests/bert_twin.py under autocast float16 + GradScaler (from
  2**30) with OneFlow's LAMB in eager ops (bench_bert.time_config). The twin's LAMB reads
  norms back to the host per variable, so its step is eager-optimizer bound; the note gives
  its forward + backward alone;
- bert-amp-memory: the peak device memory of both BERT AMP train steps.
Both AMP rows print each side's loss scale after the timing (the two should have skipped
about as many steps).

Peak memory. onnxruntime's CUDA arena never hands memory back, and it is not visible to
PyTorch's allocator statistics, so for onnxjob the number is the device memory its process
holds for it: in a fresh subprocess (`--memory-only onnxjob:MODEL`), before anything else
touches the GPU, PyTorch creates the CUDA context and `total - free` of
torch.cuda.mem_get_info() is read; then the AMP train job is built and run 1 + `--memory-steps`
steps and `total - free` is read again; onnxjob's memory = after - before - what PyTorch's
own caching allocator reserved in that process (torch.cuda.memory_reserved(), 0: the job is
fed NumPy). That counts everything the step needs on the device: the arena (weights,
optimizer state, activations, cuDNN workspaces, rounded up by the arena's power-of-two
growth), cuBLAS/cuDNN handles and the kernels loaded for the step; the CUDA context itself is
in `before`. PyTorch runs in another fresh subprocess (`--memory-only torch:MODEL`, the weights
the onnxjob subprocess saved): torch.cuda.reset_peak_memory_stats(), the same steps, and
torch.cuda.max_memory_reserved() (its allocator's peak: weights, grads, optimizer state,
activations, cuDNN benchmark workspaces), with the same `total - free` difference beside it
(which adds its library handles and loaded kernels), so both sides can be compared on the
same footing. The probes run first, one at a time, while the parent has not touched the GPU,
so no other allocation of this benchmark moves `free` under them. On the CPU the probes run
the same steps and report the growth of the peak RSS instead ("n/a on CPU" for the GPU
numbers).

Every step returns its result to the host on both sides (the loss, the logits), so the
GPU work is finished inside each timed call. PyTorch runs with cudnn.benchmark on (as
onnxruntime's default EXHAUSTIVE algorithm search) and its default TF32 convolutions
(onnxruntime's use_tf32 default). Ratios are onnxjob / reference (< 1: onnxjob faster).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

ROWS = ("lenet", "resnet50", "resnet50-amp", "resnet50-amp-memory", "resnet50-memory",
        "bert-amp",
        "bert-amp-memory")
AMP_ROWS = ("resnet50-amp", "resnet50-amp-memory", "bert-amp", "bert-amp-memory")


def parse(argv=None):
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=5, calls=10)
    p.add_argument("--rows", default=",".join(ROWS),
                   help="comma-separated rows to run, of " + ", ".join(ROWS))
    p.add_argument("--models", default=None, help="old name of --rows")
    p.add_argument("--amp", action="store_true", help="only the mixed-precision rows: "
                   + ",".join(AMP_ROWS))
    p.add_argument("--batch", type=int, default=64, help="ResNet50 batch")
    p.add_argument("--loss-scale", type=float, default=2.0 ** 16,
                   help="initial dynamic loss scale of the ResNet50 AMP rows (both sides)")
    p.add_argument("--memory-steps", type=int, default=5,
                   help="train steps after the first in each memory probe")
    p.add_argument("--memory-timeout", type=int, default=300,
                   help="seconds each memory probe (a subprocess) may take")
    p.add_argument("--bert-layers", type=int, default=12)
    p.add_argument("--bert-hidden", type=int, default=768)
    p.add_argument("--bert-heads", type=int, default=12)
    p.add_argument("--bert-seq", type=int, default=128)
    p.add_argument("--bert-batch", type=int, default=32)
    p.add_argument("--bert-vocab", type=int, default=30522)
    p.add_argument("--algo-search", default=None, help="cudnn_conv_algo_search for every job")
    p.add_argument("--cuda-options", default=None,
                   help="extra CUDA EP options for every job, k=v,k=v (e.g. prefer_nhwc=1)")
    p.add_argument("--cuda-graph", default="both", choices=("both", "on", "off"),
                   help="the fp32 runs with CUDA graphs, without, or both")
    p.add_argument("--device", default="cuda", help="cpu: the same comparison on the CPU "
                   "(a quick check of this script where no GPU is)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--memory-only", default=None, help=argparse.SUPPRESS)  # SIDE:MODEL
    p.add_argument("--weights", default=None, help=argparse.SUPPRESS)      # .npz path
    args = p.parse_args(argv)
    rows = (args.models or args.rows).split(",")
    if args.amp:
        rows = list(AMP_ROWS)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; choose among {', '.join(ROWS)}")
    args.rows = [r for r in ROWS if r in rows]
    return args


def job_config(flow, cuda_graph, args):
    """The function_config of every job: the device, CUDA graphs, --algo-search and
    --cuda-options (extra CUDA EP options, e.g. prefer_nhwc=1)."""
    config = flow.function_config()
    config.execution_provider(args.device)
    config.enable_cuda_graph(cuda_graph)
    if args.algo_search:
        config.cudnn_conv_algo_search(args.algo_search)
    if args.cuda_options:
        config.cuda_provider_options(dict(kv.split("=", 1) for kv in
                                          args.cuda_options.split(",")))
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
    config = job_config(flow, cuda_graph, args)

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


def resnet_train_job(flow, config, batch, amp=False, loss_scale=2.0 ** 16):
    """OneFlow-Benchmark's ResNet50 train job (label smoothing, softmax cross entropy, SGD
    momentum 0.875, the builder's L2 1/32768) in the default session; amp: under
    enable_auto_mixed_precision with dynamic_loss_scale(loss_scale, increment_period=2000),
    as of_cnn_train_val.py --use_fp16 (optimizer_util.py) sets it up."""
    import onnxjob.typing as tp
    from zoo import model_args, model_builder, smoothed_labels
    build, margs = model_builder("resnet50"), model_args()
    if amp:
        config.enable_auto_mixed_precision(True)
    policy = (flow.optimizer.loss_scale.dynamic_loss_scale(
        initial_loss_scale=loss_scale, increment_period=2000, multiplier=2.0) if amp else None)

    def train_job(images: tp.Numpy.Placeholder((batch, 3, 224, 224), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        logits = build(images, margs)
        loss = flow.nn.softmax_cross_entropy_with_logits(smoothed_labels(labels, logits), logits)
        loss = flow.math.reduce_mean(loss)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                           momentum=0.875, loss_scale_policy=policy).minimize(loss)
        return loss
    return flow.global_function(type="train", function_config=config)(
        named(train_job, "train_amp_job" if amp else "train_job"))


def bench_resnet(flow, torch, args, cuda_graph):
    import onnxjob.typing as tp
    from bench_resnet import torch_side
    from common import first_call, interleaved, resnet_batch
    from zoo import model_args, model_builder
    flow.clear_default_session()
    build, margs, batch = model_builder("resnet50"), model_args(), args.batch
    config = job_config(flow, cuda_graph, args)
    train_job = resnet_train_job(flow, config, batch)

    predict_jobs = {}
    for size in sorted({1, batch}):
        def predict(images: tp.Numpy.Placeholder((size, 3, 224, 224), dtype=flow.float)) -> tp.Numpy:
            return build(images, margs)
        predict_jobs[size] = flow.global_function(type="predict", function_config=config)(
            named(predict, f"predict_b{size}"))

    x, y = resnet_batch(batch)
    first = first_call(train_job, x, y, label=f"ResNet50 b{batch} first train call")
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


def loss_scale_of(flow):
    from bench_bert import loss_scale_of as scale
    return scale(flow)


def bench_resnet_amp(flow, torch, args, cuda_graph=False):
    """ResNet50 train step, onnxjob AMP + dynamic loss scale vs autocast + GradScaler:
    (row, first-call seconds, notes)."""
    from bench_resnet import torch_side
    from common import first_call, interleaved, resnet_batch
    flow.clear_default_session()
    batch = args.batch
    config = job_config(flow, cuda_graph, args)
    train_job = resnet_train_job(flow, config, batch, amp=True, loss_scale=args.loss_scale)
    x, y = resnet_batch(batch)
    first = first_call(train_job, x, y, label=f"ResNet50 b{batch} AMP first train call")
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    torch_train, _ = torch_side(torch, values, x, y, args.device, amp=True,
                                init_scale=args.loss_scale)
    train = interleaved({"onnxjob": lambda: train_job(x, y), "torch": torch_train},
                        args.rounds, max(1, args.calls // 2), warmup=3)
    notes = {"onnxjob loss scale": loss_scale_of(flow),
             "torch loss scale": float(torch_train.scaler.get_scale())}
    graphs = " (CUDA graphs)" if cuda_graph else ""
    return (f"ResNet50 b{batch} train AMP{graphs}", train["onnxjob"], train["torch"]), first, notes


def bert_settings(args):
    """(label, PreTrain config, batch, bench_bert-style args) of the --bert-* flags."""
    from bench_bert import flag_config
    ns = SimpleNamespace(layers=args.bert_layers, hidden=args.bert_hidden,
                         heads=args.bert_heads, seq=args.bert_seq, vocab=args.bert_vocab,
                         rounds=args.rounds, calls=max(1, args.calls // 2))
    label = (f"BERT L{args.bert_layers} H{args.bert_hidden} S{args.bert_seq} "
             f"B{args.bert_batch} AMP")
    return label, flag_config(ns), args.bert_batch, ns


def bench_bert_amp(flow, torch, args):
    """BERT pretraining train step, upstream --use_fp16 vs the twin under autocast +
    GradScaler (bench_bert.time_config): (row, first-call seconds, notes)."""
    from bench_bert import time_config
    label, config, batch, ns = bert_settings(args)
    row, first, forward_backward, notes = time_config(label, config, batch, ns, torch,
                                                      amp=True, device=args.device)
    notes["torch forward + backward ms"] = forward_backward * 1e3
    return row, first, notes


# -- peak memory, each side in a fresh process -----------------------------------------------

def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_probe(args):
    """The body of `--memory-only SIDE:MODEL` (a fresh process): run the AMP train step of
    MODEL (resnet50 or bert) 1 + --memory-steps times on SIDE (onnxjob or torch) and print
    one line `MEMORY {json}` (see the module docstring for what is measured)."""
    import torch
    torch.backends.cudnn.benchmark = True
    side, model = args.memory_only.split(":")
    cuda = args.device == "cuda"
    if cuda:
        free, total = torch.cuda.mem_get_info()   # creates the CUDA context first
        used_before = total - free
    else:
        torch.set_num_threads(args.threads)
        rss_before = _rss_bytes()
    result = {"side": side, "model": model, "device": args.device}
    if side == "onnxjob":
        import onnxjob as flow
        if model.startswith("resnet50"):
            from common import resnet_batch
            config = job_config(flow, False, args)
            job = resnet_train_job(flow, config, args.batch, amp=model == "resnet50",
                                   loss_scale=args.loss_scale)
            feeds = resnet_batch(args.batch)
        else:
            from bench_bert import amp_optimizer_args, define_amp_train_job
            from bert_models import SMALL, synthetic_batch
            _, config, batch, _ = bert_settings(args)
            config = dict(SMALL, **config)
            flow.config.seed(0)
            job = define_amp_train_job(batch, config, amp_optimizer_args())
            feeds = synthetic_batch(batch, config)
        job(*feeds)
        if cuda:    # what the first step left held, to tell a per-step growth from the rest
            free, total = torch.cuda.mem_get_info()
            result["after_first_step"] = total - free - used_before
        np.savez(args.weights, **{k: v.numpy() for k, v in flow.get_all_variables().items()})
        for _ in range(args.memory_steps):
            job(*feeds)
    else:
        values = dict(np.load(args.weights))
        if model.startswith("resnet50"):
            from bench_resnet import torch_side
            from common import resnet_batch
            x, y = resnet_batch(args.batch)
            step, _ = torch_side(torch, values, x, y, args.device, amp=model == "resnet50",
                                 init_scale=args.loss_scale)
        else:
            import onnxjob as flow
            from bench_bert import amp_optimizer_args, torch_side as bert_torch_side
            from bert_models import SMALL, synthetic_batch
            _, config, batch, _ = bert_settings(args)
            config = dict(SMALL, **config)
            init_scale = flow.optimizer.loss_scale.dynamic_loss_scale().initial_loss_scale
            step, _ = bert_torch_side(torch, values, config, synthetic_batch(batch, config),
                                      amp_optimizer_args(), device=args.device, amp=True,
                                      init_scale=init_scale)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        for _ in range(1 + args.memory_steps):
            step()
        if cuda:
            result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
            result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    if cuda:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        result["torch_reserved"] = torch.cuda.memory_reserved()
        result["device_delta"] = total - free - used_before
        if side == "onnxjob":
            result["held"] = result["device_delta"] - result["torch_reserved"]
    else:
        result["peak_rss_growth"] = _peak_rss_bytes() - rss_before
    print("MEMORY " + json.dumps(result), flush=True)


def _probe_argv(args, side, model, weights):
    argv = [sys.executable, os.path.abspath(__file__), "--memory-only", f"{side}:{model}",
            "--weights", weights, "--device", args.device, "--threads", str(args.threads),
            "--batch", str(args.batch), "--loss-scale", repr(args.loss_scale),
            "--memory-steps", str(args.memory_steps)]
    for flag in ("layers", "hidden", "heads", "seq", "batch", "vocab"):
        argv += [f"--bert-{flag}", str(getattr(args, "bert_" + flag))]
    if args.algo_search:
        argv += ["--algo-search", args.algo_search]
    if args.cuda_options:
        argv += ["--cuda-options", args.cuda_options]
    return argv


def measure_memory(args, model):
    """{side: probe result or {"error": ...}} of MODEL's AMP train step, onnxjob first."""
    results, timeout = {}, args.memory_timeout
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "weights.npz")
        for side in ("onnxjob", "torch"):
            if side == "torch" and "error" in results["onnxjob"]:
                results[side] = {"error": "no weights: the onnxjob probe failed"}
                continue
            try:
                done = subprocess.run(_probe_argv(args, side, model, weights),
                                      capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                results[side] = {"error": f"timed out after {timeout} s"}
                continue
            lines = [l for l in done.stdout.splitlines() if l.startswith("MEMORY ")]
            results[side] = (json.loads(lines[-1][len("MEMORY "):]) if lines else
                             {"error": f"exit {done.returncode}: "
                                       + (done.stdout + done.stderr)[-1500:]})
    return results


def memory_line(label, results):
    """One line: both sides' peak memory and the ratio (GPU), or the host RSS (CPU)."""
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    ours, ref = results["onnxjob"], results["torch"]
    if "error" in ours or "error" in ref:
        return (f"{label}: failed (onnxjob: {ours.get('error', 'ok')}; "
                f"torch: {ref.get('error', 'ok')})")
    if ours["device"] != "cuda":
        return (f"{label}: GPU memory n/a on CPU (peak RSS growth: onnxjob "
                f"{gib(ours['peak_rss_growth'])}, PyTorch {gib(ref['peak_rss_growth'])})")
    return (f"{label}: onnxjob {gib(ours['held'])} held (device total - free, after - before,"
            f" torch's allocator {gib(ours['torch_reserved'])} taken off) | PyTorch "
            f"max_memory_reserved {gib(ref['max_memory_reserved'])} (device total - free "
            f"{gib(ref['device_delta'])}) | ratio {ours['held'] / ref['max_memory_reserved']:.2f}"
            f" vs reserved, {ours['held'] / ref['device_delta']:.2f} vs device delta"
            f"; onnxjob after its first step {gib(ours['after_first_step'])}")


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


def use_shared_in_checkout():
    """Point tests/upstream.py at shared/clients/oneflow-benchmark inside the checkout when
    ../shared is not beside it (on the GPU machine only the checkout travels)."""
    import upstream
    inside = os.path.join(HERE, "..", "shared", "clients", "oneflow-benchmark")
    if not os.path.isdir(upstream.ROOT) and os.path.isdir(inside):
        upstream.ROOT = os.path.abspath(inside)


def main():
    args = parse()
    os.environ["ONNXJOB_DEVICE"] = args.device
    if args.device == "cpu":
        os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    use_shared_in_checkout()
    if args.memory_only:
        memory_probe(args)
        return
    started = time.perf_counter()
    # the memory probes first: fresh processes while this one has not touched the GPU
    memory = {}
    for model, row in (("resnet50", "resnet50-amp-memory"), ("resnet50-fp32", "resnet50-memory"),
                       ("bert", "bert-amp-memory")):
        if row in args.rows:
            label = (f"peak memory, ResNet50 b{args.batch} AMP train step" if model == "resnet50"
                     else f"peak memory, ResNet50 b{args.batch} float32 train step"
                     if model == "resnet50-fp32"
                     else f"peak memory, {bert_settings(args)[0]} train step")
            memory[label] = measure_memory(args, model)
            print(memory_line(label, memory[label]), flush=True)
    import torch
    torch.backends.cudnn.benchmark = True
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    import onnxjob as flow
    from common import dump_json, print_table
    assert args.device == "cpu" or torch.cuda.is_available(), "PyTorch sees no GPU"
    rows, serving, firsts, notes = [], [], [], {}

    def done(new_rows):
        for label, ours, ref in new_rows:
            print(f"{label}: onnxjob {ours * 1e3:.3f} ms, reference {ref * 1e3:.3f} ms, "
                  f"ratio {ours / ref:.2f}", flush=True)

    graph_settings = {"both": [True, False], "on": [True], "off": [False]}[args.cuda_graph]
    if args.device == "cpu":
        graph_settings = [False]
    for cuda_graph in graph_settings:
        graphs = " (graphs)" if cuda_graph else ""
        if "lenet" in args.rows:
            r, first = bench_lenet(flow, torch, args, cuda_graph)
            rows += r
            done(r)
            firsts.append((f"LeNet first train call{graphs}", first))
        if "resnet50" in args.rows:
            r, s, first = bench_resnet(flow, torch, args, cuda_graph)
            rows += r
            serving += s
            done(r + s)
            firsts.append((f"ResNet50 b{args.batch} first train call{graphs}", first))
    for cuda_graph in graph_settings if "resnet50-amp" in args.rows else []:
        row, first, note = bench_resnet_amp(flow, torch, args, cuda_graph)
        rows.append(row)
        done([row])
        graphs = " (graphs)" if cuda_graph else ""
        firsts.append((f"ResNet50 b{args.batch} AMP first train call{graphs}", first))
        notes[row[0]] = note
    if "bert-amp" in args.rows:
        row, first, note = bench_bert_amp(flow, torch, args)
        rows.append(row)
        done([row])
        firsts.append((f"{row[0]} first train call", first))
        notes[row[0]] = note

    from bench_resnet import autocast_dtype
    half = str(autocast_dtype(torch, args.device)).replace("torch.", "")
    device = torch.cuda.get_device_name() if args.device == "cuda" else "the CPU"
    title = (f"onnxjob ({'CUDA' if args.device == 'cuda' else 'CPU'} EP) vs PyTorch "
             f"{torch.__version__} on {device}: fp32 rows vs eager fp32, AMP rows (onnxjob AMP "
             f"+ dynamic loss scale) vs autocast {half} + GradScaler"
             f"{', cudnn search ' + args.algo_search if args.algo_search else ''}")
    if rows:
        print_table(rows, title)
    if serving:
        print_table(serving, "predict job vs plain onnxruntime on the exported .onnx")
    for label, results in memory.items():
        print(memory_line(label, results))
    for label, note in notes.items():
        print(f"{label}: " + ", ".join(f"{k} {v:g}" for k, v in note.items()))
    for label, seconds in firsts:
        print(f"{label}: {seconds:.2f} s")
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        dump_json(args.json, {"title": title, "device": device,
                              "rows": [{"case": l, "onnxjob_s": o, "reference_s": r,
                                        "ratio": o / r} for l, o, r in rows],
                              "serving": [{"case": l, "onnxjob_s": o, "raw_s": r}
                                          for l, o, r in serving],
                              "memory": memory, "notes": notes,
                              "first_calls_s": dict(firsts), "args": vars(args)})


if __name__ == "__main__":
    main()
