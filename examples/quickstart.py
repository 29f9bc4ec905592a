"""Train the doc MLP on MNIST for one epoch, report test accuracy, export it to ONNX.

    python examples/quickstart.py [--epochs N] [--output mlp.onnx]
"""
import argparse
import time

import numpy as np

import oneflow_compat  # noqa: F401
import onnxjob as flow
import onnxjob.typing as tp
from mlp_net import mlp

BATCH_SIZE = 100


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
    loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


@flow.global_function(type="predict")
def predict_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
    return flow.nn.softmax(mlp(images))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--output", default="mlp_mnist.onnx")
    args = parser.parse_args()
    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE)
    step = [0]

    def print_loss(loss):
        if step[0] % 100 == 0:
            print(f"step {step[0]:5d}  loss {loss.mean():.6f}")
        step[0] += 1

    start = time.time()
    for epoch in range(args.epochs):
        for images, labels in zip(train_images, train_labels):
            train_job(images, labels)(print_loss)
    flow.sync_default_session()
    print(f"trained {step[0]} steps in {time.time() - start:.1f} s")
    correct = sum(int(np.sum(np.argmax(predict_job(x), 1) == y)) for x, y in zip(test_images, test_labels))
    print(f"test accuracy: {100.0 * correct / 10000:.2f}%")
    flow.export(predict_job, args.output)
    print(f"exported predict_job to {args.output}")


if __name__ == "__main__":
    main()
