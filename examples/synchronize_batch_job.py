"""Evaluate ./lenet_models_1 with a synchronous job returning a (labels, logits) tuple."""
from typing import Tuple

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from lenet_train import lenet

BATCH_SIZE = 100


@flow.global_function(type="predict")
def eval_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)
             ) -> Tuple[tp.Numpy, tp.Numpy]:
    with flow.scope.placement("cpu", "0:0"):
        logits = lenet(images, train=False)
    return (labels, logits)


if __name__ == "__main__":
    flow.load_variables(flow.checkpoint.get("./lenet_models_1"))
    _, (test_images, test_labels) = flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE)
    total, correct = 0, 0
    for images, labels in zip(test_images, test_labels):
        labels_out, logits = eval_job(images, labels)
        correct += int(np.sum(np.argmax(logits, 1) == labels_out))
        total += labels_out.shape[0]
    print("accuracy: {0:.1f}%".format(correct * 100 / total))
