"""Serving latency at batch 1: a predict job's call against plain onnxruntime on the
file `flow.export` wrote for it, with the inputs bound once.

    python bench/bench_serving.py [--models lenet,mlp,resnet50] [--calls 1000]
        [--resnet-calls 1000] [--block-ms 300] [--rounds 6] [--device cpu|cuda]
        [--threads 2] [--profile mlp]

Both sides return the logits as a NumPy array each call. The job side is the user's call
(`job(x)`: argument checks, the job's session, its frozen session once the variables have
stayed the same for a few calls, runtime/frozen.py; the job is warmed past that point).
The raw side is `InferenceSession.run_with_iobinding` on the exported file, its input
bound once and its output bound to the CPU (`--device cuda`: input and output OrtValues
on the GPU bound once, the run captured as a CUDA graph, the input copied to the GPU and
the output to the host each call: a request arrives in host memory). Each side's calls
are timed one by one, in blocks of at least --block-ms, one block per side per round, the
side that goes first alternating round by round
(common.alternating_latencies), for at least --rounds rounds and --calls calls per side.
p50 and p99 over all calls, the job's overhead over the raw side, and the range of the
per-round p50 overheads are printed.

Models: the doc LeNet (no dropout) and MLP (tests/models.py) and OneFlow-Benchmark's
ResNet50 (needs ../shared/clients/oneflow-benchmark beside the repository).
`--profile NAME`: after NAME's timing, cProfile of NAME's job calls (the hot spots of the call path).
"""
import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))    # this checkout's onnxjob, before an installed one


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="lenet,mlp,resnet50")
    p.add_argument("--calls", type=int, default=1000, help="timed calls per side and model")
    p.add_argument("--resnet-calls", type=int, default=1000, help="the same for ResNet50")
    p.add_argument("--block-ms", type=float, default=300,
                   help="each side's block of calls lasts at least this long")
    p.add_argument("--rounds", type=int, default=6,
                   help="at least this many rounds (the side that goes first alternates)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both sides")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--profile", default=None, help="cProfile this model's job calls")
    p.add_argument("--profile-calls", type=int, default=2000)
    return p.parse_args()


def define_predict_job(flow, name, device):
    """The batch-1 predict job of `name` and its input shape."""
    import onnxjob.typing as tp
    config = flow.function_config()
    config.execution_provider(device)
    if name == "resnet50":
        from zoo import model_args, model_builder
        build, margs, shape = model_builder("resnet50"), model_args(), (1, 3, 224, 224)

        def net(images):
            return build(images, margs)
    else:
        from common import bench_net
        fn, kwargs = bench_net(name)
        shape = (1, 1, 28, 28)

        def net(images):
            return fn(images, **kwargs)

    @flow.global_function(type="predict", function_config=config)
    def predict_job(images: tp.Numpy.Placeholder(shape, dtype=flow.float)) -> tp.Numpy:
        return net(images)
    return predict_job, shape


def raw_runner(path, x, device, threads):
    """() -> logits (NumPy) on plain onnxruntime with `x` bound once."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    if device == "cuda":
        providers = [("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
    else:
        providers = ["CPUExecutionProvider"]
    session = ort.InferenceSession(path, opts, providers=providers)
    binding = session.io_binding()
    input_name, output = session.get_inputs()[0].name, session.get_outputs()[0]
    if device == "cuda":
        x_dev = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
        shape = [d if isinstance(d, int) else x.shape[0] for d in output.shape]
        y_dev = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cuda", 0)
        binding.bind_ortvalue_input(input_name, x_dev)
        binding.bind_ortvalue_output(output.name, y_dev)

        def run():
            # a server's request arrives in host memory: copied in each call, as the job does
            x_dev.update_inplace(x)
            session.run_with_iobinding(binding)
            return y_dev.numpy()
        run.keep = (x_dev, y_dev)
    else:
        binding.bind_cpu_input(input_name, x)
        binding.bind_output(output.name, "cpu")

        def run():
            session.run_with_iobinding(binding)
            return binding.get_outputs()[0].numpy()
    return run


def bench_model(flow, name, args, tmp):
    from common import alternating_latencies
    flow.clear_default_session()
    job, shape = define_predict_job(flow, name, args.device)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    for _ in range(20):         # past the switch to the frozen session (runtime/frozen.py)
        expected = job(x)
    path = flow.export(job, os.path.join(tmp, f"{name}.onnx"))
    raw = raw_runner(path, x, args.device, args.threads)
    np.testing.assert_allclose(raw(), expected, rtol=1e-3, atol=1e-4)
    calls = args.resnet_calls if name == "resnet50" else args.calls
    return job, x, alternating_latencies({"job": lambda: job(x), "raw": raw}, calls,
                                         args.block_ms / 1e3, args.rounds)


def profile(job, x, calls):
    import cProfile
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        job(x)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(18)
    stats.sort_stats("cumulative").print_stats(25)


def main():
    args = parse()
    os.environ["ONNXJOB_DEVICE"] = args.device
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import onnxjob as flow
    import onnxruntime as ort
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            job, x, times = bench_model(flow, name, args, tmp)
            rows.append((name, times))
            if name == args.profile:
                profile(job, x, args.profile_calls)
    side = "CUDA EP, CUDA graph, IOBinding" if args.device == "cuda" else "CPU EP, IOBinding"
    print(f"\nbatch-1 latency, onnxruntime {ort.__version__}, {args.threads} intra-op threads, "
          f"{args.device}; raw = exported file ({side})")
    print(f"{'model':10s} {'calls':>7s} {'job p50 ms':>11s} {'raw p50 ms':>11s} {'p50 +%':>7s} "
          f"{'job p99 ms':>11s} {'raw p99 ms':>11s} {'p99 +%':>7s} {'job-raw p50 us':>15s} "
          f"{'rounds: p50 +%':>20s}")
    for name, rounds in rows:
        times = {side: np.concatenate(blocks) for side, blocks in rounds.items()}
        job50, job99 = np.percentile(times["job"], [50, 99]) * 1e3
        raw50, raw99 = np.percentile(times["raw"], [50, 99]) * 1e3
        per_round = [100 * (np.median(j) / np.median(r) - 1)
                     for j, r in zip(rounds["job"], rounds["raw"])]
        spread = f"{min(per_round):.1f} .. {max(per_round):.1f} ({len(per_round)})"
        print(f"{name:10s} {len(times['job']):7d} {job50:11.3f} {raw50:11.3f} "
              f"{100 * (job50 / raw50 - 1):7.1f} {job99:11.3f} {raw99:11.3f} "
              f"{100 * (job99 / raw99 - 1):7.1f} {1e3 * (job50 - raw50):15.1f} {spread:>20s}")


if __name__ == "__main__":
    main()
