"""Per-call time of a predict job with fewer rows than its placeholder: one graph with a
symbolic batch axis (what function_config.dynamic_batch builds) against one graph per row
count (the batch fixed to that count: what compiling once per distinct size would run).

    python bench/bench_dynamic_batch.py [--model lenet|mlp|resnet50] [--batch B]
                                        [--sizes 1,7,B] [--rounds 5] [--calls 10]

Both graphs are the job's exported graph (variables as constants, as a frozen predict job
runs it) in sessions made by onnxruntime the way onnxjob makes them
(runtime/backend.create_session, CPU unless ONNXJOB_DEVICE says otherwise); they run
interleaved round by round and the table gives the medians (ms per call) and the ratio
symbolic / per-size. The last column is each per-size graph's session creation, what the
per-size way pays once per new row count.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=5, calls=10)
    p.add_argument("--model", default="lenet", choices=["lenet", "mlp", "resnet50"])
    p.add_argument("--batch", type=int, default=None,
                   help="the placeholder's batch (default 100, resnet50: 8)")
    p.add_argument("--sizes", default=None, help="row counts to time, e.g. 1,7,100")
    return p.parse_args()


def build(model, batch):
    import onnxjob as flow
    import onnxjob.typing as tp
    if model == "resnet50":
        import zoo
        builder, args = zoo.model_builder("resnet50"), zoo.model_args()
        shape, net = (batch, 3, 224, 224), (lambda x: builder(x, args))
    else:
        import models
        shape, net = (batch, 1, 28, 28), getattr(models, model)

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder(shape, dtype=flow.float)) -> tp.Numpy:
        return net(x)
    return predict, shape


def main():
    args = parse()
    os.environ.setdefault("ONNXJOB_NUM_THREADS", str(args.threads))
    import onnx
    from onnxjob.graph import dynamic_batch
    from onnxjob.io.export import job_model_proto
    from onnxjob.runtime import backend

    batch = args.batch or (8 if args.model == "resnet50" else 100)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
        sorted({1, max(1, batch // 8), batch // 2, batch} - {0})
    job, shape = build(args.model, batch)
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    job(x)
    compiled = job.job
    proto = job_model_proto(job)
    from onnxjob.frontend.config import started_session
    runtime = started_session().runtimes[compiled.name].compiled
    dynamic_batch.make_batch_symbolic(proto, runtime.placeholder_names, compiled.name,
                                      row_outputs=runtime.output_names)
    device = started_session().device
    symbolic = backend.create_session(proto.SerializeToString(), device, False)
    name = symbolic.get_inputs()[0].name
    per_size, created = {}, {}
    for n in sizes:
        fixed = onnx.ModelProto()
        fixed.CopyFrom(proto)
        dynamic_batch.fix_batch(fixed, n)
        start = time.perf_counter()
        per_size[n] = backend.create_session(fixed.SerializeToString(), device, False)
        created[n] = time.perf_counter() - start

    def timed(session, feed):
        session.run(None, feed)     # warm: the first run of a shape plans its memory
        start = time.perf_counter()
        for _ in range(args.calls):
            session.run(None, feed)
        return (time.perf_counter() - start) / args.calls

    times = {n: ([], []) for n in sizes}
    for _ in range(args.rounds):
        for n in sizes:
            feed = {name: x[:n]}
            a, b = symbolic.run(None, feed)[0], per_size[n].run(None, feed)[0]
            assert np.allclose(a, b, rtol=1e-4, atol=1e-5), "the two graphs disagree"
            times[n][0].append(timed(symbolic, feed))
            times[n][1].append(timed(per_size[n], feed))
    print(f"{args.model}, placeholder batch {batch}, {device}, {args.threads} threads, "
          f"median of {args.rounds} rounds x {args.calls} calls (ms per call)")
    print(f"{'rows':>6} {'symbolic':>10} {'per-size':>10} {'sym/size':>9} {'size: create':>13}")
    for n in sizes:
        sym, fixed = (statistics.median(t) * 1e3 for t in times[n])
        print(f"{n:>6} {sym:>10.3f} {fixed:>10.3f} {sym / fixed:>9.3f} "
              f"{created[n] * 1e3:>11.0f}ms")


if __name__ == "__main__":
    main()
