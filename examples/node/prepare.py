"""Write what examples/node/train.mjs needs: the doc MLP's train step as plain ONNX and
MNIST as small binary files.

    python examples/node/prepare.py [--out examples/node/build] [--mnist path/to/mnist.npz]

Files written to --out:
  mlp_train_step.onnx   the train job exported with flow.export: forward, backward, SGD
                        with momentum; its metadata `onnxjob.train_step` lists the feeds,
                        outputs and (state input, next-state output) pairs (docs/train-anywhere.md)
  train-images.u8 / train-labels.u8 / test-images.u8 / test-labels.u8
                        raw uint8 arrays, 784 bytes per image, one byte per label
  initial/              the exported initial variables as a checkpoint (flow.checkpoint)
"""
import argparse
import os
import sys

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp

BATCH = 100
HERE = os.path.dirname(os.path.abspath(__file__))


def mlp(images):
    init = flow.truncated_normal(0.1)
    hidden = flow.layers.dense(images, 512, activation=flow.nn.relu, kernel_initializer=init,
                               name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=init, name="output")


def define_jobs():
    """The MLP train job (mean loss, SGD momentum 0.9) and its predict job."""
    @flow.global_function(type="train")
    def train_step(images: tp.Numpy.Placeholder((BATCH, 784), dtype=flow.float),
                   labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        loss = flow.math.reduce_mean(loss)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.05]),
                           momentum=0.9).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def predict(images: tp.Numpy.Placeholder((10000, 784), dtype=flow.float)) -> tp.Numpy:
        return mlp(images)

    return train_step, predict


def pixels(images_u8):
    """The float32 pixels train.mjs feeds: each byte / 255 (in float64, then rounded)."""
    return (images_u8.reshape(len(images_u8), 784) / 255.0).astype(np.float32)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(HERE, "build"))
    p.add_argument("--mnist", default=os.environ.get(
        "ONNXJOB_MNIST", os.path.join(HERE, "..", "..", "..", "shared", "data", "mnist.npz")))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    flow.config.seed(args.seed)
    train_step, _ = define_jobs()
    path = flow.export(train_step, os.path.join(args.out, "mlp_train_step.onnx"))
    initial = os.path.join(args.out, "initial")
    if not os.path.isdir(initial):
        flow.checkpoint.save(initial)
    with np.load(args.mnist) as data:
        for split in ("train", "test"):
            data[f"x_{split}"].astype(np.uint8).tofile(os.path.join(args.out, f"{split}-images.u8"))
            data[f"y_{split}"].astype(np.uint8).tofile(os.path.join(args.out, f"{split}-labels.u8"))
    print(f"wrote {path} and MNIST to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
