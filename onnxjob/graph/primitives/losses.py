"""Losses: shape rules and gradient rules (ONNX's SoftmaxCrossEntropyLoss, and composites
whose gradient is OneFlow's rather than the autodiff of their parts)."""
import numpy as np

from onnxjob.graph.registry import register, register_composite
from onnxjob.graph.tracer import as_blob, int64_constant, op


def _sce_infer(inputs, attrs, num_outputs):
    logits, labels = inputs[:2]
    if labels.shape != logits.shape[:1] + logits.shape[2:]:
        raise ValueError(f"labels of shape {labels.shape} do not fit logits of shape "
                         f"{logits.shape} (expected {logits.shape[:1] + logits.shape[2:]})")
    if labels.np_dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise ValueError(f"labels must be int32 or int64, got {labels.np_dtype}")
    outs = [(labels.shape, logits.np_dtype)]
    if num_outputs > 1:
        outs.append((logits.shape, logits.np_dtype))
    return outs


def _sce_grad(n, g, need):
    """d loss_i / d logits_ij = softmax_ij - onehot_ij (the log-prob output gives softmax)."""
    if len(n.outputs) < 2:
        raise NotImplementedError("SoftmaxCrossEntropyLoss needs its log_prob output for a gradient")
    logits, labels = n.inputs[:2]
    if g[1] is not None:
        raise NotImplementedError("gradient through SoftmaxCrossEntropyLoss's log_prob output")
    depth = logits.shape[1]
    if labels.np_dtype != np.int64:  # onnxruntime's OneHot kernels take int64 indices
        labels = op("Cast", labels, to=7)
    onehot = op("OneHot", labels, int64_constant(labels, [depth]),
                as_blob(np.array([0, 1], dtype=logits.np_dtype), like=logits), axis=1)
    gy = op("Unsqueeze", g[0], int64_constant(g[0], [1]))
    return [op("Mul", op("Sub", op("Exp", n.outputs[1]), onehot), gy), None]


register("SoftmaxCrossEntropyLoss", _sce_infer, _sce_grad)


def _softmax_ce_expand(inputs, attrs, num_outputs):
    """loss = -sum(labels * log_softmax(logits)) over the last axis; log-probs kept."""
    labels, logits = inputs
    logp = op("LogSoftmax", logits, axis=-1)
    loss = op("Neg", op("ReduceSum", op("Mul", labels, logp), int64_constant(logp, [-1]),
                        keepdims=0))
    return [loss, logp]


def _softmax_ce_grad(n, g, need):
    """OneFlow's (and TensorFlow's) rule: d logits = (softmax - labels) * dy, which is the
    derivative of the loss only when each row of labels sums to 1; d labels = -log p * dy."""
    labels, _ = n.inputs
    logp = n.outputs[1]
    if g[1] is not None:
        raise NotImplementedError("gradient through the log-probabilities of a softmax cross "
                                  "entropy")
    gy = op("Unsqueeze", g[0], int64_constant(g[0], [-1]))
    d_logits = op("Mul", op("Sub", op("Exp", logp), labels), gy) if need[1] else None
    d_labels = op("Neg", op("Mul", logp, gy)) if need[0] else None
    return [d_labels, d_logits]


register_composite("onnxjob.SoftmaxCrossEntropy", _softmax_ce_expand, _softmax_ce_grad)
