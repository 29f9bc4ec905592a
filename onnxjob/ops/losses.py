"""The loss functions of `flow.nn`, and the top-level flow.ctc_loss / flow.smooth_l1_loss
(not in `__all__`: flow.nn has neither). The cross entropies return the per-example loss;
the torch-style losses (MSELoss, ...) reduce as their `reduction` says ("mean" by default)."""
import numpy as np

from onnxjob import dtypes
from onnxjob.compat.zero_d_inputs import as_vector
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import as_blob, current_builder, int64_constant, op
from onnxjob.ops import math
from onnxjob.ops._array_common import indices_in_range
from onnxjob.ops.casts import cast
from onnxjob.ops.shapes import reshape

__all__ = ["BCELoss", "BCEWithLogitsLoss", "KLDivLoss", "L1Loss", "MSELoss",
           "MarginRankingLoss", "TripletMarginLoss", "ctc_greedy_decoder",
           "distributed_sparse_softmax_cross_entropy_with_logits",
           "sigmoid_cross_entropy_with_logits", "softmax_cross_entropy_with_logits",
           "sparse_cross_entropy", "sparse_softmax_cross_entropy_with_logits"]


_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _check_floating(api, *blobs, half=False):
    """The Blobs are all float32 or all float64 (the dtypes of OneFlow's CPU kernels), or
    all float16 where `half`: losses OneFlow builds from math ops, or whose GPU kernel,
    that take half precision."""
    allowed = _FLOATS + ((np.dtype(np.float16),) if half else ())
    for b in blobs:
        if b.np_dtype not in allowed:
            names = "float16, float32 or float64" if half else "float32 or float64"
            raise TraceError(f"{api} takes {names} Blobs, got {b.np_dtype}")
    if len({b.np_dtype for b in blobs}) > 1:
        raise TraceError(f"{api}: the inputs must share one dtype, got "
                         + ", ".join(str(b.np_dtype) for b in blobs))


def _check_same_shape(api, what, a, b):
    if a.shape != b.shape:
        raise TraceError(f"{api}: {what} {b.shape} must have the input's shape {a.shape}")


def _reduce(loss, reduction, name):
    """OneFlow's `reduction`: "none", "mean" (over every element) or "sum"."""
    if reduction == "none":
        return loss if name is None else op("Identity", loss, name=name)
    if reduction == "mean":
        return math.reduce_mean(loss, name=name)
    return math.reduce_sum(loss, name=name)


def _check_reduction(api, reduction):
    if reduction not in ("none", "mean", "sum"):
        raise TraceError(f"{api}: reduction must be one of 'none', 'mean', 'sum', got "
                         f"{reduction!r}")


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Per-example cross entropy of `logits` against integer `labels` (labels first).

    Classes are on the last axis of `logits`; `labels` has logits' shape without it (or
    with a trailing 1).
    """
    if logits.np_dtype == np.float16:
        # as OneFlow's GPU kernel takes half logits: computed in float32, rounded once
        wide = sparse_softmax_cross_entropy_with_logits(labels, cast(logits, dtypes.float32))
        return cast(wide, dtypes.float16, name=name)
    api = "flow.nn.sparse_softmax_cross_entropy_with_logits"
    _check_floating(api, logits)
    labels = _class_labels(labels, logits, api, "logits")   # before the transpose below
    if len(logits.shape) > 2:  # ONNX puts the classes on axis 1, OneFlow on the last axis
        perm = [0, len(logits.shape) - 1] + list(range(1, len(logits.shape) - 1))
        logits = op("Transpose", logits, perm=perm)
    builder = current_builder("sparse_softmax_cross_entropy_with_logits")
    # (graph/primitives/losses.py: the loss of each row at most -log(1e-20), as OneFlow's)
    if builder.is_train:  # the log-prob output feeds the gradient (softmax - onehot)
        loss, _ = op("onnxjob.SparseSoftmaxCrossEntropy", logits, labels, num_outputs=2)
    else:
        loss = op("onnxjob.SparseSoftmaxCrossEntropy", logits, labels)
    return loss if name is None else op("Identity", loss, name=name)


def softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Cross entropy against a distribution `labels` of logits' shape (classes last).

    As in OneFlow, the gradient to the logits is (softmax(logits) - labels) * dy, which
    assumes each row of `labels` sums to 1.
    """
    if logits.np_dtype == np.float16 and labels.np_dtype == np.float16:
        # as OneFlow's GPU kernel takes half logits: computed in float32, rounded once
        wide = softmax_cross_entropy_with_logits(cast(labels, dtypes.float32),
                                                 cast(logits, dtypes.float32))
        return cast(wide, dtypes.float16, name=name)
    _check_floating("flow.nn.softmax_cross_entropy_with_logits", logits)
    if labels.shape != logits.shape:
        raise TraceError(f"labels {labels.shape} and logits {logits.shape} must have one shape")
    if labels.np_dtype != logits.np_dtype:
        raise TraceError(f"labels ({labels.np_dtype}) and logits ({logits.np_dtype}) must "
                         "have one dtype")
    loss, _logp = op("onnxjob.SoftmaxCrossEntropy", labels, logits, num_outputs=2)
    return loss if name is None else op("Identity", loss, name=name)


def sigmoid_cross_entropy_with_logits(labels, logits, name=None):
    """max(x, 0) - x * z + log(1 + exp(-|x|)), elementwise; integer labels are cast to the
    logits' dtype. Gradient (graph/primitives/losses.py): the logits' only."""
    api = "flow.nn.sigmoid_cross_entropy_with_logits"
    _check_floating(api, logits)
    _check_same_shape(api, "labels", logits, labels)   # as OneFlow's shape rule
    if labels.np_dtype != logits.np_dtype:
        labels = cast(labels, dtypes.from_numpy(logits.np_dtype))
    loss = op("onnxjob.SigmoidCrossEntropy", labels, logits)
    return loss if name is None else op("Identity", loss, name=name)


def distributed_sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """On one device, sparse_softmax_cross_entropy_with_logits."""
    return sparse_softmax_cross_entropy_with_logits(labels, logits, name=name)


def _class_labels(labels, prediction, api, what="prediction"):
    """Integer `labels` of prediction's shape without its last axis (a trailing 1 is
    dropped; a 0-d label for a batch of one is that batch's (1,) label, as OneFlow <= 0.4's
    squeeze of a (1,) label left it: compat/zero_d_inputs.py); `what` names `prediction`
    in the error."""
    if labels.np_dtype not in (np.int32, np.int64):
        raise TraceError(f"{api}: labels must be int32 or int64, got {labels.np_dtype}")
    labels = as_vector(labels, where=tuple(prediction.shape[:-1]) == (1,))
    if len(labels.shape) == len(prediction.shape) and labels.shape[-1] == 1:
        labels = reshape(labels, labels.shape[:-1])
    if labels.shape != prediction.shape[:-1]:
        raise TraceError(f"{api}: labels {labels.shape} do not fit {what} "
                         f"{prediction.shape} (expected {prediction.shape[:-1]})")
    return indices_in_range(labels, prediction.shape[-1], f"{api}: a label is")


def sparse_cross_entropy(labels, prediction, name=None):
    """-log(prediction[..., label]) of probabilities (classes last), floored at 1e-20 as in
    OneFlow."""
    _check_floating("flow.nn.sparse_cross_entropy", prediction)
    labels = _class_labels(labels, prediction, "flow.nn.sparse_cross_entropy")
    return op("onnxjob.SparseCrossEntropy", prediction, labels, name=name)


# -- the torch-style losses ------------------------------------------------------------------

def mse_loss(input, target, reduction="mean", name=None):
    """(target - input)^2, reduced."""
    api = "flow.nn.MSELoss"
    _check_floating(api, input, target, half=True)
    _check_same_shape(api, "target", input, target)
    _check_reduction(api, reduction)
    diff = target - input
    return _reduce(diff * diff, reduction, name)


def l1_loss(input, target, reduction="mean", name=None):
    """|target - input|, reduced."""
    api = "flow.nn.L1Loss"
    _check_floating(api, input, target, half=True)
    _check_same_shape(api, "target", input, target)
    _check_reduction(api, reduction)
    return _reduce(math.abs(target - input), reduction, name)


def bce_loss(input, target, weight=None, reduction="mean", name=None):
    """-weight * (target * log(input) + (1 - target) * log(1 - input)), reduced; `input`
    holds probabilities (no clamping of the logs, as in OneFlow)."""
    api = "flow.nn.BCELoss"
    _check_floating(api, input, target, *([weight] if weight is not None else []), half=True)
    _check_same_shape(api, "target", input, target)
    _check_reduction(api, reduction)
    one = as_blob(1, like=input)
    loss = -(target * math.log(input) + (one - target) * math.log(one - input))
    if weight is not None:
        _check_same_shape(api, "weight", input, weight)
        loss = weight * loss
    return _reduce(loss, reduction, name)


def bce_with_logits_loss(input, target, weight=None, pos_weight=None, reduction="mean",
                         name=None):
    """BCELoss of sigmoid(input) in the overflow-free form; `pos_weight` (one per class,
    the last axis) weighs the positive term, `weight` (input's shape) the whole loss."""
    api = "flow.nn.BCEWithLogitsLoss"
    extra = [w for w in (weight, pos_weight) if w is not None]
    _check_floating(api, input, target, *extra, half=True)
    _check_same_shape(api, "target", input, target)
    _check_reduction(api, reduction)
    one = as_blob(1, like=input)
    # log(1 + exp(-x)) = log(exp(-m) + exp(-x - m)) + m, with m = max(-x, 0)
    m = op("Max", -input, as_blob(0, like=input))
    log_term = math.log(math.exp(-m) + math.exp(-input - m)) + m
    if pos_weight is not None:
        if len(pos_weight.shape) != 1 or pos_weight.shape[0] != input.shape[-1]:
            raise TraceError(f"{api}: pos_weight {pos_weight.shape} must hold one value per "
                             f"class ({input.shape[-1]},)")
        log_term = ((pos_weight - one) * target + one) * log_term
    loss = (one - target) * input + log_term
    if weight is not None:
        _check_same_shape(api, "weight", input, weight)
        loss = weight * loss
    return _reduce(loss, reduction, name)


def kldivloss(input, target, log_target=False, reduction="mean", name=None):
    """Kullback-Leibler divergence of log-probabilities `input` from `target`:
    target * (log(target) - input), 0 where round(target + 0.5) is 0 (OneFlow's test, i.e.
    target <= 0 for probabilities); exp(target) * (target - input) if `log_target`."""
    api = "flow.nn.KLDivLoss"
    _check_floating(api, input, target, half=True)
    _check_reduction(api, reduction)
    if log_target:
        loss = math.exp(target) * (target - input)
    else:
        loss = target * (math.log(target) - input)
        keep = op("Not", op("Equal", op("Round", target + as_blob(0.5, like=target)),
                            as_blob(0, like=target)))
        loss = op("Where", keep, loss, as_blob(0, like=loss))
    return _reduce(loss, reduction, name)


def margin_ranking_loss(input1, input2, target, margin=0.0, reduction="mean", name=None):
    """max(0, -target * (input1 - input2) + margin), reduced."""
    api = "flow.nn.MarginRankingLoss"
    _check_floating(api, input1, input2, target)
    _check_same_shape(api, "input2", input1, input2)
    _check_reduction(api, reduction)
    loss = as_blob(margin, like=input1) - target * (input1 - input2)
    return _reduce(math.clip_by_value(loss, min_value=0.0), reduction, name)


def _p_norm(x, p):
    """(sum over axis 1 of |x|^p)^(1/p)."""
    if p == 2.0:
        return math.sqrt(math.reduce_sum(math.square(x), axis=1))
    powered = op("Pow", math.abs(x), as_blob(p, like=x))
    return op("Pow", math.reduce_sum(powered, axis=1), as_blob(1.0 / p, like=x))


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2.0, eps=1e-06, swap=False,
                        reduction="mean", name=None):
    """max(|a - pos + eps|_p - |a - neg + eps|_p + margin, 0) over the rows (norms along
    axis 1), reduced. With `swap` the negative distance is the smaller of |a - neg| and
    |pos - neg| (OneFlow 0.5 refuses swap=True; this is the paper's and PyTorch's rule)."""
    api = "flow.nn.TripletMarginLoss"
    _check_floating(api, anchor, positive, negative)
    _check_same_shape(api, "positive", anchor, positive)
    _check_same_shape(api, "negative", anchor, negative)
    _check_reduction(api, reduction)
    if len(anchor.shape) < 2:
        raise TraceError(f"{api} takes (N, D) inputs, got {anchor.shape}")
    e = as_blob(eps, like=anchor)
    d_pos = _p_norm(anchor - positive + e, p)
    d_neg = _p_norm(anchor - negative + e, p)
    if swap:
        d_neg = op("Min", d_neg, _p_norm(positive - negative + e, p))
    loss = math.clip_by_value(as_blob(margin, like=d_pos) + d_pos - d_neg, min_value=0.0)
    return _reduce(loss, reduction, name)


MSELoss = mse_loss
L1Loss = l1_loss
BCELoss = bce_loss
BCEWithLogitsLoss = bce_with_logits_loss
KLDivLoss = kldivloss
MarginRankingLoss = margin_ranking_loss
TripletMarginLoss = triplet_margin_loss


# -- top-level losses (flow.smooth_l1_loss, flow.ctc_loss) ------------------------------------

def smooth_l1_loss(prediction, label, beta=1.0, name=None):
    """Elementwise 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d =
    prediction - label); the label gets no gradient, as in OneFlow."""
    api = "flow.smooth_l1_loss"
    _check_floating(api, prediction, label)
    _check_same_shape(api, "label", prediction, label)
    if beta < 0:
        raise TraceError(f"{api}: beta must be >= 0, got {beta}")
    return op("onnxjob.SmoothL1Loss", prediction, label, beta=float(beta), name=name)


def _check_lengths(api, what, blob, batch):
    if blob.np_dtype not in (np.int32, np.int64) or blob.shape != (batch,):
        raise TraceError(f"{api}: {what} must be int32 or int64 of shape ({batch},), got "
                         f"{blob.shape} {blob.np_dtype}")


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
             zero_infinity=False, name=None):
    """Connectionist temporal classification loss of log_probs (T, N, C) against padded
    targets (N, S); per sample, or "mean" (divided by the target lengths, then averaged)
    or "sum". zero_infinity replaces infinite losses (and their gradients) by 0."""
    api = "flow.ctc_loss"
    _check_floating(api, log_probs)
    if len(log_probs.shape) != 3:
        raise TraceError(f"{api}: log_probs must be (T, N, C), got {log_probs.shape}")
    batch, classes = log_probs.shape[1:]
    if (len(targets.shape) != 2 or targets.shape[0] != batch or targets.shape[1] < 1
            or targets.np_dtype not in (np.int32, np.int64)):
        raise TraceError(f"{api}: targets must be int32 or int64 of shape ({batch}, S >= 1), "
                         f"got {targets.shape} {targets.np_dtype}")
    _check_lengths(api, "input_lengths", input_lengths, batch)
    _check_lengths(api, "target_lengths", target_lengths, batch)
    if not 0 <= blank < classes:
        raise TraceError(f"{api}: blank={blank} must be a class index in [0, {classes})")
    _check_reduction(api, reduction)
    loss, _alpha = op("onnxjob.CTCLoss", log_probs, targets, input_lengths, target_lengths,
                      blank=int(blank), zero_infinity=int(bool(zero_infinity)), num_outputs=2)
    if zero_infinity:
        infinite = op("Equal", loss, as_blob(np.inf, like=loss))
        loss = op("Where", infinite, as_blob(0, like=loss), loss)
    if reduction == "mean":
        lengths = cast(math.clip_by_value(target_lengths, min_value=1),
                       dtypes.from_numpy(loss.np_dtype))
        loss = loss / lengths
    return _reduce(loss, reduction, name)


def ctc_greedy_decoder(log_probs, input_lengths, merge_repeated=True, name=None):
    """Best-path decoding of log_probs (T, N, C): per step the most likely class, repeats
    merged (if `merge_repeated`), the blank (the last class, as in OneFlow) dropped.
    Returns (decoded (N, T) int64, left-aligned and padded with 0; neg_sum_logits (N, 1):
    minus the sum of the chosen log-probabilities)."""
    api = "flow.nn.ctc_greedy_decoder"
    _check_floating(api, log_probs)
    if len(log_probs.shape) != 3:
        raise TraceError(f"{api}: log_probs must be (T, N, C), got {log_probs.shape}")
    t_len, batch, classes = log_probs.shape
    _check_lengths(api, "input_lengths", input_lengths, batch)
    by_batch = op("Transpose", log_probs, perm=[1, 0, 2])
    best = op("ArgMax", by_batch, axis=2, keepdims=0)
    lengths = reshape(cast(input_lengths, dtypes.int64), (batch, 1))
    running = op("Less", int64_constant(lengths, np.arange(t_len)[None, :]), lengths)
    top = math.reduce_max(by_batch, axis=[2])
    neg_sum = -math.reduce_sum(op("Where", running, top, as_blob(0, like=top)), axis=[1],
                               keepdims=True)
    keep = op("And", running, op("Not", op("Equal", best, as_blob(classes - 1, like=best))))
    if merge_repeated:
        before = op("Concat", int64_constant(best, np.full((batch, 1), -1)),
                    op("Slice", best, int64_constant(best, [0]), int64_constant(best, [t_len - 1]),
                       int64_constant(best, [1])), axis=1)
        keep = op("And", keep, op("Not", op("Equal", best, before)))
    if name is not None:
        neg_sum = op("Identity", neg_sum, name=name)
    return _left_align(best, keep), neg_sum


def _left_align(values, keep):
    """The kept entries of each row of `values` (N, T) moved to the row's front in order,
    the rest of the row 0."""
    batch, t_len = values.shape
    # position of each kept entry = number of kept entries before it (a running count,
    # as a product with a triangular matrix: exact in float32 for any realistic T)
    counts = op("MatMul", cast(keep, dtypes.float32),
                as_blob(np.triu(np.ones((t_len, t_len), np.float32), 1), like=values,
                        dtype=np.float32))
    # entries not kept go to an extra last column, dropped afterwards
    target = op("Where", keep, cast(counts, dtypes.int64), as_blob(t_len, like=values))
    zeros = as_blob(np.zeros((batch, t_len + 1), np.int64), like=values)
    placed = op("ScatterElements", zeros, target, op("Where", keep, values,
                                                     as_blob(0, like=values)),
                axis=1, reduction="add")
    return op("Slice", placed, int64_constant(values, [0]), int64_constant(values, [t_len]),
              int64_constant(values, [1]))
