"""flow.watch_diff: the gradient of the (summed) loss with respect to the logits, each step."""
import onnxjob as flow
import onnxjob.typing as tp
from mlp_net import mlp

BATCH_SIZE = 100


def watch_logits_diff(diff: tp.Numpy):
    print("logits diff:", diff.shape, diff.dtype, diff[0, :3])


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Numpy:
    with flow.scope.placement("cpu", "0:0"):
        logits = mlp(images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    flow.watch_diff(logits, watch_logits_diff)
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0).minimize(loss)
    return loss


if __name__ == "__main__":
    (train_images, train_labels), _ = flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE)
    for i, (images, labels) in enumerate(zip(train_images[:60], train_labels[:60])):
        loss = train_job(images, labels)
        if i % 20 == 0:
            print(loss.mean())
