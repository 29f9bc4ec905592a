"""ResNet50 in PyTorch, keyed by the variable names of OneFlow-Benchmark's resnet_model.py.

The reference for onnxjob's numbers (tests/test_zoo.py, bench/bench_resnet.py): same
architecture, OneFlow's "SAME" = SAME_LOWER padding (the larger half first), batch
normalization with batch statistics in training (eps 1e-5, moving averages with momentum
0.9 and the unbiased variance, as cuDNN updates them), average pool 7, dense fc1001.
Weights come from onnxjob (`flow.get_all_variables()`), so both run the same numbers.
"""
import numpy as np
import torch
import torch.nn.functional as F

BLOCK_COUNTS = (3, 4, 6, 3)
PREFIX = "Resnet-"


def _same_lower(x, kernel, stride, pad_value=0.0):
    """Pad H and W as OneFlow's SAME: total = max(0, (ceil(n/s)-1)*s + k - n), larger half first."""
    pads = []
    for size in (x.shape[3], x.shape[2]):  # F.pad lists the last axis first
        total = max(0, (-(-size // stride) - 1) * stride + kernel - size)
        pads += [total - total // 2, total // 2]
    return F.pad(x, pads, value=pad_value) if any(pads) else x


class ResNet50Twin:
    """`forward(x, training)` -> logits; `moving` holds the updated moving statistics.

    `weights` maps onnxjob variable names to torch tensors (trainable ones with
    requires_grad). `fused` names the batch norms as the fused layers do
    (`<conv>_bn_relu` / `<conv>_bn_add_relu` instead of `<conv>_bn`).
    """

    def __init__(self, weights, fused=False):
        self.w = weights
        self.fused = fused
        self.moving = {}

    def _conv(self, name, x, kernel, stride):
        weight = self.w[PREFIX + name + "-weight"]
        if kernel > 1 or stride > 1:
            x = _same_lower(x, kernel, stride)
        return F.conv2d(x, weight, stride=stride)

    def _bn(self, name, x, training, kind):
        if self.fused and kind != "plain":
            name = name + ("_bn_relu" if kind == "relu" else "_bn_add_relu")
        else:
            name = name + "_bn"
        p = PREFIX + name + "-"
        mean = self.w[p + "moving_mean"].detach().clone()
        var = self.w[p + "moving_variance"].detach().clone()
        y = F.batch_norm(x, mean, var, self.w[p + "gamma"], self.w[p + "beta"],
                         training=training, momentum=0.1, eps=1e-5)
        if training:
            self.moving[p + "moving_mean"] = mean
            self.moving[p + "moving_variance"] = var
        return y

    def _block(self, x, name, stride, training, projection):
        shortcut = x
        if projection:
            shortcut = self._bn(name + "_branch1", self._conv(name + "_branch1", x, 1, stride),
                                training, "plain")
        a = F.relu(self._bn(name + "_branch2a", self._conv(name + "_branch2a", x, 1, 1),
                            training, "relu"))
        b = F.relu(self._bn(name + "_branch2b", self._conv(name + "_branch2b", a, 3, stride),
                            training, "relu"))
        c = self._conv(name + "_branch2c", b, 1, 1)
        return F.relu(self._bn(name + "_branch2c", c, training, "add_relu") + shortcut)

    def forward(self, x, training):
        self.moving = {}
        x = F.relu(self._bn("conv1", self._conv("conv1", x, 7, 2), training, "relu"))
        x = F.max_pool2d(_same_lower(x, 3, 2, pad_value=-np.inf), 3, 2)
        for stage, count in enumerate(BLOCK_COUNTS):
            for i in range(count):
                stride = (1 if stage == 0 else 2) if i == 0 else 1
                name = "res%d_%d" % (stage + 2, i)
                x = self._block(x, name, stride, training, projection=(i == 0))
        x = F.avg_pool2d(x, 7, 1).reshape(x.shape[0], -1)
        return F.linear(x, self.w[PREFIX + "fc1001-weight"], self.w[PREFIX + "fc1001-bias"])


def smoothed_softmax_ce(logits, labels, classes=1000, eta=0.1):
    """The upstream training loss: label smoothing, softmax cross entropy, batch mean."""
    target = torch.full_like(logits, eta / classes)
    target[torch.arange(len(labels)), labels.long()] = 1 - eta + eta / classes
    return -(target * torch.log_softmax(logits, -1)).sum(-1).mean()


def sgd_momentum_step(weights, trainable, lr, momentum, weight_decay, state=None):
    """OneFlow's SGD with an L2 regularizer on every trainable variable:
    m = momentum * m - lr * (g + wd * w); w += m. Returns the new momentum buffers."""
    state = dict(state or {})
    with torch.no_grad():
        for name in trainable:
            w = weights[name]
            g = w.grad + weight_decay * w
            m = momentum * state.get(name, torch.zeros_like(w)) - lr * g
            w += m
            state[name] = m
            w.grad = None
    return state
