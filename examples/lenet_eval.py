import numpy as np
import onnxjob as flow
import onnxjob.typing as tp
from lenet_train import lenet

BATCH_SIZE = 100


@flow.global_function(type="predict")
def eval_job(
    images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
    labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32),
) -> tp.Numpy:
    with flow.scope.placement("gpu", "0:0"):
        logits = lenet(images, train=False)
    return logits


if __name__ == "__main__":
    flow.load_variables(flow.checkpoint.get("./lenet_models_1"))
    (train_images, train_labels), (test_images, test_labels) = flow.data.load_mnist(
        BATCH_SIZE, BATCH_SIZE
    )
    g_total, g_correct = 0, 0
    for i, (images, labels) in enumerate(zip(test_images, test_labels)):
        logits = eval_job(images, labels)
        predictions = np.argmax(logits, 1)
        g_correct += np.sum(predictions == labels)
        g_total += labels.shape[0]
    print("accuracy: {:.1f}%".format(g_correct * 100 / g_total))
