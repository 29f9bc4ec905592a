"""Train the doc MLP on MNIST, report test accuracy, export the predict job to ONNX.

    python examples/quickstart.py [--data auto|full|subset] [--epochs N] [--steps N]
                                  [--output mlp_mnist.onnx]

`--data auto` (the default) uses the full MNIST when ./mnist.npz or $ONNXJOB_MNIST is there
or the download works, and otherwise the 6,000-image subset shipped with onnxjob.
"""
import argparse
import time

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from mlp_net import mlp
from onnxjob.io.mnist import MNISTDownloadError

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


def load_data(which):
    """(train, test) batches and whether they are the full data set."""
    if which != "subset":
        try:
            return flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE), True
        except MNISTDownloadError as e:
            if which == "full":
                raise SystemExit(f"quickstart: {e}")
            print(f"quickstart: {e}")
    print("quickstart: using the MNIST subset shipped with onnxjob (6,000 train / 1,000 test "
          "images); for the full set, go online or set ONNXJOB_MNIST=path/to/mnist.npz")
    return flow.data.load_mnist_subset(BATCH_SIZE, BATCH_SIZE), False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", choices=["auto", "full", "subset"], default="auto")
    parser.add_argument("--epochs", type=int,
                        help="passes over the training set (default: 1 on the full set, 10 on "
                             "the subset)")
    parser.add_argument("--steps", type=int, help="stop after this many steps")
    parser.add_argument("--output", default="mlp_mnist.onnx")
    args = parser.parse_args()
    ((train_images, train_labels), (test_images, test_labels)), full = load_data(args.data)
    epochs = args.epochs or (1 if full else 10)
    steps = min(args.steps or epochs * len(train_images), epochs * len(train_images))
    step = [0]

    def print_loss(loss):
        if step[0] % 100 == 0:
            print(f"step {step[0]:5d}  loss {loss.mean():.6f}")
        step[0] += 1

    start = time.time()
    for i in range(steps):
        batch = i % len(train_images)
        train_job(train_images[batch], train_labels[batch])(print_loss)
    flow.sync_default_session()
    print(f"trained {step[0]} steps in {time.time() - start:.1f} s")
    correct = sum(int(np.sum(np.argmax(predict_job(x), 1) == y)) for x, y in zip(test_images, test_labels))
    print(f"test accuracy: {100.0 * correct / test_labels.size:.2f}%")
    flow.export(predict_job, args.output)
    print(f"exported predict_job to {args.output}")


if __name__ == "__main__":
    main()
