"""The doc architectures (LeNet, MLP) in onnxjob and in PyTorch with shared weights."""
import numpy as np

import onnxjob as flow
import onnxjob.typing as tp

BATCH = 100


def lenet(data, train=False):
    initializer = flow.truncated_normal(0.1)
    conv1 = flow.layers.conv2d(data, 32, 5, padding="SAME", activation=flow.nn.relu,
                               name="conv1", kernel_initializer=initializer)
    pool1 = flow.nn.max_pool2d(conv1, ksize=2, strides=2, padding="SAME", name="pool1")
    conv2 = flow.layers.conv2d(pool1, 64, 5, padding="SAME", activation=flow.nn.relu,
                               name="conv2", kernel_initializer=initializer)
    pool2 = flow.nn.max_pool2d(conv2, ksize=2, strides=2, padding="SAME", name="pool2")
    reshape = flow.reshape(pool2, [pool2.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu,
                               kernel_initializer=initializer, name="dense1")
    if train:
        hidden = flow.nn.dropout(hidden, rate=0.5, name="dropout")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="dense2")


def mlp(data):
    initializer = flow.truncated_normal(0.1)
    reshape = flow.reshape(data, [data.shape[0], -1])
    hidden = flow.layers.dense(reshape, 512, activation=flow.nn.relu,
                               kernel_initializer=initializer, name="hidden")
    return flow.layers.dense(hidden, 10, kernel_initializer=initializer, name="output")


def define_jobs(net, train_kwargs=None, optimizer="sgd"):
    @flow.global_function(type="train")
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        logits = net(images, **(train_kwargs or {}))
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
        lr = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
        flow.optimizer.SGD(lr, momentum=0).minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def eval_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return net(images)

    return train_job, eval_job


def torch_lenet(torch, weights):
    F = torch.nn.functional

    def forward(x):
        x = F.max_pool2d(F.relu(F.conv2d(x, weights["conv1-weight"], weights["conv1-bias"], padding=2)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, weights["conv2-weight"], weights["conv2-bias"], padding=2)), 2)
        x = F.relu(F.linear(x.reshape(x.shape[0], -1), weights["dense1-weight"], weights["dense1-bias"]))
        return F.linear(x, weights["dense2-weight"], weights["dense2-bias"])
    return forward


def torch_mlp(torch, weights):
    F = torch.nn.functional

    def forward(x):
        x = F.relu(F.linear(x.reshape(x.shape[0], -1), weights["hidden-weight"], weights["hidden-bias"]))
        return F.linear(x, weights["output-weight"], weights["output-bias"])
    return forward


def random_batch(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((BATCH, 1, 28, 28), dtype=np.float32),
            rng.integers(0, 10, BATCH).astype(np.int32))


def lenet_training(steps=3, seed=3):
    """LeNet's train job, in a fresh default session seeded with `seed`, run `steps` times
    on one random batch: (its losses, the train job's graph as onnxruntime loads it)."""
    from onnxjob.runtime.session import default_session
    flow.clear_default_session()
    flow.config.seed(seed)
    train_job, _ = define_jobs(lenet)
    images, labels = random_batch()
    losses = [train_job(images, labels) for _ in range(steps)]
    return losses, default_session().runtimes["train_job"].model_bytes
