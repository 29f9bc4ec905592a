"""The loss functions of `flow.nn`. Each returns the per-example loss (no reduction)
unless its OneFlow counterpart reduces."""
from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.ops.array import cast, reshape

__all__ = ["sigmoid_cross_entropy_with_logits", "softmax_cross_entropy_with_logits",
           "sparse_softmax_cross_entropy_with_logits"]


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Per-example cross entropy of `logits` against integer `labels` (labels first).

    Classes are on the last axis of `logits`; `labels` has logits' shape without it (or
    with a trailing 1).
    """
    if len(labels.shape) == len(logits.shape) and labels.shape[-1] == 1:
        labels = reshape(labels, labels.shape[:-1])
    if len(logits.shape) > 2:  # ONNX puts the classes on axis 1, OneFlow on the last axis
        perm = [0, len(logits.shape) - 1] + list(range(1, len(logits.shape) - 1))
        logits = op("Transpose", logits, perm=perm)
    builder = current_builder("sparse_softmax_cross_entropy_with_logits")
    if builder.is_train:  # the log-prob output feeds the gradient (softmax - onehot)
        loss, _ = op("SoftmaxCrossEntropyLoss", logits, labels, reduction="none",
                     num_outputs=2, name=name)
        return loss
    return op("SoftmaxCrossEntropyLoss", logits, labels, reduction="none", name=name)


def softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Cross entropy against a distribution `labels` of logits' shape (classes last).

    As in OneFlow, the gradient to the logits is (softmax(logits) - labels) * dy, which
    assumes each row of `labels` sums to 1.
    """
    if labels.shape != logits.shape:
        raise TraceError(f"labels {labels.shape} and logits {logits.shape} must have one shape")
    if labels.np_dtype != logits.np_dtype:
        raise TraceError(f"labels ({labels.np_dtype}) and logits ({logits.np_dtype}) must "
                         "have one dtype")
    loss, _logp = op("onnxjob.SoftmaxCrossEntropy", labels, logits, num_outputs=2)
    return loss if name is None else op("Identity", loss, name=name)


def sigmoid_cross_entropy_with_logits(labels, logits, name=None):
    """max(x, 0) - x * z + log(1 + exp(-|x|)), elementwise; integer labels are cast to the
    logits' dtype."""
    if labels.np_dtype != logits.np_dtype:
        labels = cast(labels, dtypes.from_numpy(logits.np_dtype))
    zero = as_blob(0, like=logits)
    loss = (op("Max", logits, zero) - logits * labels
            + op("Softplus", op("Neg", op("Abs", logits))))
    return loss if name is None else op("Identity", loss, name=name)
