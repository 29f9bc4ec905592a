"""Node count and train-step time with the default pass pipeline on vs off, in one run.

    python bench/bench_passes.py [--threads 2] [--rounds 7]

Both versions of each job live in one session (they share the weights by name) and are
timed interleaved; ratio = on / off (< 1: the passes make the step faster).
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def main():
    from common import add_timing_args
    args = add_timing_args(argparse.ArgumentParser()).parse_args()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    import onnxjob as flow
    import onnxjob.typing as tp
    from onnxjob.runtime.session import default_session
    from common import interleaved
    from models import BATCH, lenet, mlp, random_batch

    print(f"{'graph':14s} {'nodes off':>9s} {'nodes on':>9s} {'off ms':>8s} {'on ms':>8s} {'on/off':>7s}")
    def matmul_mlp(images):
        """The MLP written with get_variable + flow.matmul (older OneFlow docs' style)."""
        x = flow.reshape(images, [images.shape[0], -1])
        init = flow.truncated_normal(0.1)
        w1 = flow.get_variable("mm-w1", (784, 512), initializer=init)
        w2 = flow.get_variable("mm-w2", (10, 512), initializer=init)
        h = flow.math.relu(flow.matmul(x, w1))
        return flow.matmul(h, w2, transpose_b=True)

    for name, net, kwargs in (("lenet", lenet, {"train": False}), ("mlp", mlp, {}),
                              ("matmul-mlp", matmul_mlp, {})):
        flow.clear_default_session()
        jobs = {}
        for mode in ("off", "on"):
            config = flow.function_config()
            config.disable_passes(mode == "off")

            def body(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28)),
                     labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
                loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, net(images, **kwargs))
                flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
                return loss
            body.__name__ = f"{name}_train_passes_{mode}"
            jobs[mode] = flow.global_function(type="train", function_config=config)(body)
        images, labels = random_batch()
        jobs["on"](images, labels)
        times = interleaved({m: (lambda j=j: j(images, labels)) for m, j in jobs.items()},
                            args.rounds, args.calls)
        nodes = {m: len(list(default_session().runtimes[j.job.name].compiled.model.graph))
                 for m, j in jobs.items()}
        print(f"{name + ' train':14s} {nodes['off']:9d} {nodes['on']:9d} {times['off'] * 1e3:8.2f} "
              f"{times['on'] * 1e3:8.2f} {times['on'] / times['off']:7.3f}")


if __name__ == "__main__":
    main()
