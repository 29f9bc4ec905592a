"""Evaluate ./mlp_models_1 with a Callback of a (labels, logits) tuple."""
from typing import Tuple

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from mlp_net import mlp

BATCH_SIZE = 100


def eval_config():
    config = flow.function_config()
    config.default_data_type(flow.float)
    return config


@flow.global_function(eval_config())  # the deprecated config-only form: a predict job
def eval_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
             labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)
             ) -> tp.Callback[Tuple[tp.Numpy, tp.Numpy]]:
    with flow.scope.placement("cpu", "0:0"):
        logits = mlp(images)
    return (labels, logits)


total, correct = 0, 0


def count(result: Tuple[tp.Numpy, tp.Numpy]):
    global total, correct
    labels, logits = result
    correct += int(np.sum(np.argmax(logits, 1) == labels))
    total += labels.shape[0]


if __name__ == "__main__":
    flow.train.CheckPoint().load("./mlp_models_1")
    _, (test_images, test_labels) = flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE)
    for images, labels in zip(test_images, test_labels):
        eval_job(images, labels)(count)
    flow.sync_default_session()  # wait for the last callbacks before reading the totals
    print("accuracy: {0:.1f}%".format(correct * 100 / total))
