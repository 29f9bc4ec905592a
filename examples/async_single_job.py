"""MLP training whose losses reach a callback (tp.Callback): data preparation of the next
step overlaps the run of this one. Saves the model to ./mlp_models_1."""
import onnxjob as flow
import onnxjob.typing as tp
from mlp_net import mlp

BATCH_SIZE = 100
EPOCHS = 20


@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((BATCH_SIZE, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((BATCH_SIZE,), dtype=flow.int32)) -> tp.Callback[tp.Numpy]:
    with flow.scope.placement("cpu", "0:0"):
        logits = mlp(images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="softmax_loss")
    lr_scheduler = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    flow.optimizer.SGD(lr_scheduler, momentum=0).minimize(loss)
    return loss


calls = 0


def print_loss(loss: tp.Numpy):
    global calls
    if calls % 20 == 0:
        print(loss.mean())
    calls += 1


if __name__ == "__main__":
    (train_images, train_labels), _ = flow.data.load_mnist(BATCH_SIZE, BATCH_SIZE)
    for epoch in range(EPOCHS):
        for images, labels in zip(train_images, train_labels):
            train_job(images, labels)(print_loss)
    flow.checkpoint.save("./mlp_models_1")  # the target must not exist yet
    print("model saved")
