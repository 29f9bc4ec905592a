"""Losses: shape rules and gradient rules (ONNX's SoftmaxCrossEntropyLoss, and composites
whose gradient is OneFlow's rather than the autodiff of their parts)."""
import numpy as np

from onnxjob.graph.primitives.shape_ops import reshape_to, zeros_of
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
    """d loss_i / d logits_ij = (softmax_ij - onehot_ij) * dy_i (the log-prob output gives
    softmax; a loss traced without it, before minimize() made its job a train job,
    computes it), written as p * dy with each label's entry replaced by (p - 1) * dy: the
    same numbers as OneFlow's kernel, without a one-hot tensor of the logits' size and
    its subtraction (BERT's masked-LM head, (160, 30522) on 2 CPU threads: 23 -> 7 ms)."""
    logits, labels = n.inputs[:2]
    if len(n.outputs) > 1 and g[1] is not None:
        raise NotImplementedError("gradient through SoftmaxCrossEntropyLoss's log_prob output")
    axis = int64_constant(labels, [1])
    gy = op("Unsqueeze", g[0], axis)
    probs = op("Exp", n.outputs[1]) if len(n.outputs) > 1 else op("Softmax", logits, axis=1)
    column = op("Unsqueeze", labels, axis)
    one = as_blob(np.array(1, dtype=logits.np_dtype), like=logits)
    at_labels = op("Mul", op("Sub", op("GatherElements", probs, column, axis=1), one), gy)
    return [op("ScatterElements", op("Mul", probs, gy), column, at_labels, axis=1), None]


register("SoftmaxCrossEntropyLoss", _sce_infer, _sce_grad)


def _log_floor(like):
    """log(1e-20) in `like`'s dtype: OneFlow's softmax cross entropies take
    -log(max(p, 1e-20)) (SafeLog), so no loss term exceeds 46.05."""
    return as_blob(np.log(np.float32(_LOG_THRESHOLD)).astype(like.np_dtype), like=like)


def _sparse_sce_expand(inputs, attrs, num_outputs):
    """OneFlow's sparse softmax cross entropy: SoftmaxCrossEntropyLoss's -log p[label],
    at most -log(1e-20); its log-probabilities (the gradient's) kept as they are."""
    logits, labels = inputs
    outs = op("SoftmaxCrossEntropyLoss", logits, labels, reduction="none",
              num_outputs=num_outputs)
    loss = outs[0] if num_outputs > 1 else outs
    capped = op("Min", loss, op("Neg", _log_floor(loss)))
    return [capped, outs[1]] if num_outputs > 1 else [capped]


# (the gradient is SoftmaxCrossEntropyLoss's, softmax - onehot, also where the loss is
# capped: OneFlow's ComputeDiffWithSoftmax does not look at the floor)
register_composite("onnxjob.SparseSoftmaxCrossEntropy", _sparse_sce_expand, _sce_grad)


def _softmax_ce_expand(inputs, attrs, num_outputs):
    """loss = -sum(labels * max(log_softmax(logits), log(1e-20))) over the last axis (as
    OneFlow's kernel: -label * logf(max(prob, 1e-20))); log-probs kept, unfloored."""
    labels, logits = inputs
    logp = op("LogSoftmax", logits, axis=-1)
    floored = op("Max", logp, _log_floor(logp))
    loss = op("Neg", op("ReduceSum", op("Mul", labels, floored), int64_constant(logp, [-1]),
                        keepdims=0))
    return [loss, logp]


def _softmax_ce_grad(n, g, need):
    """OneFlow's (and TensorFlow's) rule: d logits = (softmax - labels) * dy, which is the
    derivative of the loss only when each row of labels sums to 1; the labels get none
    (softmax_cross_entropy_op.cpp's gradient is the prediction's alone: soft labels made
    from variables do not train them)."""
    labels, _ = n.inputs
    logp = n.outputs[1]
    if g[1] is not None:
        raise NotImplementedError("gradient through the log-probabilities of a softmax cross "
                                  "entropy")
    gy = op("Unsqueeze", g[0], int64_constant(g[0], [-1]))
    d_logits = op("Mul", op("Sub", op("Exp", logp), labels), gy) if need[1] else None
    return [None, d_logits]


register_composite("onnxjob.SoftmaxCrossEntropy", _softmax_ce_expand, _softmax_ce_grad)


# -- sigmoid cross entropy --------------------------------------------------------------------

def _sigmoid_ce_expand(inputs, attrs, num_outputs):
    """max(x, 0) - x * z + log(1 + exp(-|x|)) (OneFlow's sigmoid_cross_entropy kernel)."""
    labels, logits = inputs
    zero = as_blob(0, like=logits)
    return [op("Add", op("Sub", op("Max", logits, zero), op("Mul", logits, labels)),
               op("Softplus", op("Neg", op("Abs", logits))))]


def _sigmoid_ce_grad(n, g, need):
    """OneFlow's rule: d logits = (sigmoid(x) - z) * dy (0.5 - z at x == 0, where the parts'
    subgradients would give 1 - z); the labels get none (sigmoid_cross_entropy_op.cpp)."""
    labels, logits = n.inputs
    d_logits = op("Mul", op("Sub", op("Sigmoid", logits), labels), g[0]) if need[1] else None
    return [None, d_logits]


register_composite("onnxjob.SigmoidCrossEntropy", _sigmoid_ce_expand, _sigmoid_ce_grad)


def _as_int64(blob):
    return blob if blob.np_dtype == np.int64 else op("Cast", blob, to=7)


# -- sparse cross entropy (of probabilities) --------------------------------------------------

_LOG_THRESHOLD = 1e-20  # OneFlow's SafeLog / MaxWithLogThreshold floor


def _picked_probability(prediction, labels):
    """max(prediction[..., label], 1e-20), with the class axis kept (size 1)."""
    idx = op("Unsqueeze", _as_int64(labels), int64_constant(labels, [-1]))
    picked = op("GatherElements", prediction, idx, axis=-1)
    return idx, op("Max", picked, as_blob(_LOG_THRESHOLD, like=picked))


def _sparse_ce_expand(inputs, attrs, num_outputs):
    """-log(max(prediction[..., label], 1e-20))."""
    prediction, labels = inputs
    _, picked = _picked_probability(prediction, labels)
    return [op("Neg", op("Log", reshape_to(picked, labels.shape)))]


def _sparse_ce_grad(n, g, need):
    """OneFlow's rule: d prediction[..., label] = -dy / max(prediction[..., label], 1e-20)."""
    prediction, labels = n.inputs
    idx, picked = _picked_probability(prediction, labels)
    gy = op("Unsqueeze", g[0], int64_constant(g[0], [-1]))
    zeros = zeros_of(prediction, prediction.shape, prediction.np_dtype)
    dp = op("ScatterElements", zeros, idx, op("Neg", op("Div", gy, picked)), axis=-1)
    return [dp, None]


register_composite("onnxjob.SparseCrossEntropy", _sparse_ce_expand, _sparse_ce_grad)


# -- smooth L1 ----------------------------------------------------------------------------

def _smooth_l1_expand(inputs, attrs, num_outputs):
    """0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere (d = prediction - label)."""
    prediction, label = inputs
    beta = attrs["beta"]
    ad = op("Abs", op("Sub", prediction, label))
    if beta == 0:
        return [ad]
    quad = op("Mul", op("Mul", ad, ad), as_blob(0.5 / beta, like=ad))
    lin = op("Sub", ad, as_blob(0.5 * beta, like=ad))
    return [op("Where", op("Less", ad, as_blob(beta, like=ad)), quad, lin)]


def _smooth_l1_grad(n, g, need):
    """OneFlow's rule: d / beta where |d| < beta, sign(d) elsewhere; the label gets none."""
    prediction, label = n.inputs
    beta = n.attrs["beta"]
    d = op("Sub", prediction, label)
    slope = op("Sign", d)
    if beta > 0:
        slope = op("Where", op("Less", op("Abs", d), as_blob(beta, like=d)),
                   op("Div", d, as_blob(beta, like=d)), slope)
    return [op("Mul", slope, g[0]), None]


register_composite("onnxjob.SmoothL1Loss", _smooth_l1_expand, _smooth_l1_grad)


# -- CTC loss ------------------------------------------------------------------------------
# The alpha (forward) and beta (backward) recursions of Graves et al. (2006) in log space,
# unrolled over the static time axis. Blob shapes: log_probs (T, N, C), targets (N, S),
# lengths (N,); l' = the targets with blanks around and between them, of length L = 2S + 1.

def _neg_inf(like, shape=()):
    return as_blob(np.full(shape, -np.inf, like.np_dtype), like=like)


def _log_add(*terms):
    """log(sum(exp(terms))), elementwise, -inf where every term is -inf."""
    top = terms[0]
    for t in terms[1:]:
        top = op("Max", top, t)
    top = op("Where", op("Equal", top, _neg_inf(top)), as_blob(0, like=top), top)
    total = op("Exp", op("Sub", terms[0], top))
    for t in terms[1:]:
        total = op("Add", total, op("Exp", op("Sub", t, top)))
    return op("Add", op("Log", total), top)


def _shift(a, k):
    """a (N, L) moved k places along axis 1 (right for k > 0, left for k < 0); the
    vacated places hold -inf."""
    n, length = a.shape
    fill = _neg_inf(a, (n, abs(k)))
    if k > 0:
        kept = op("Slice", a, int64_constant(a, [0]), int64_constant(a, [length - k]),
                  int64_constant(a, [1]))
        return op("Concat", fill, kept, axis=1)
    kept = op("Slice", a, int64_constant(a, [-k]), int64_constant(a, [length]),
              int64_constant(a, [1]))
    return op("Concat", kept, fill, axis=1)


def _unstack(x, axis):
    """The slices of x along `axis`, each without that axis."""
    size = x.shape[axis]
    parts = [x] if size == 1 else op("Split", x, axis=axis, num_outputs=size)
    shape = x.shape[:axis] + x.shape[axis + 1:]
    return [reshape_to(p, shape) for p in parts]


def _stack(parts, axis):
    return op("Concat", *[op("Unsqueeze", p, int64_constant(p, [axis])) for p in parts],
              axis=axis)


def _column(blob):
    """An (N,) length Blob as int64 (N, 1)."""
    return reshape_to(_as_int64(blob), (blob.shape[0], 1))


def _ctc_setup(log_probs, targets, target_lengths, blank):
    """(l' (N, L) int64, log_probs as (N, T, C), log_probs at l' (N, T, L)). Targets past
    their length read as blanks."""
    t_len, n, _ = log_probs.shape
    s = targets.shape[1]
    blanks = int64_constant(targets, np.full((n, s), blank))
    in_range = op("Less", int64_constant(targets, np.arange(s)[None, :]),
                  _column(target_lengths))
    labels = op("Where", in_range, _as_int64(targets), blanks)
    pairs = op("Concat", op("Unsqueeze", blanks, int64_constant(blanks, [2])),
               op("Unsqueeze", labels, int64_constant(labels, [2])), axis=2)
    ext = op("Concat", reshape_to(pairs, (n, 2 * s)),
             int64_constant(targets, np.full((n, 1), blank)), axis=1)
    by_batch = op("Transpose", log_probs, perm=[1, 0, 2])
    idx = op("Expand", op("Unsqueeze", ext, int64_constant(ext, [1])),
             int64_constant(ext, [n, t_len, 2 * s + 1]))
    return ext, by_batch, op("GatherElements", by_batch, idx, axis=2)


def _skip_masks(ext):
    """(l'[s] != l'[s - 2], l'[s] != l'[s + 2]), False where s -+ 2 is outside l'."""
    n, length = ext.shape
    head = op("Slice", ext, int64_constant(ext, [0]), int64_constant(ext, [length - 2]),
              int64_constant(ext, [1]))
    tail = op("Slice", ext, int64_constant(ext, [2]), int64_constant(ext, [length]),
              int64_constant(ext, [1]))
    differ = op("Not", op("Equal", head, tail))
    edge = as_blob(np.zeros((n, 2), bool), like=ext, dtype=bool)
    return op("Concat", edge, differ, axis=1), op("Concat", differ, edge, axis=1)


def _end_positions(target_lengths):
    """(tl, 2 tl, max(2 tl - 1, 0)), (N, 1) int64: a sample's target length and the
    places in l' of its final blank and of its last label."""
    tl = _column(target_lengths)
    two_tl = op("Mul", tl, int64_constant(tl, 2))
    last = op("Max", op("Sub", two_tl, int64_constant(tl, 1)), int64_constant(tl, 0))
    return tl, two_tl, last


def _ctc_expand(inputs, attrs, num_outputs):
    """Outputs (loss (N,), alpha (N, T, L)): alpha_t(s) = log P(l'[:s+1] at step t)."""
    log_probs, targets, input_lengths, target_lengths = inputs
    t_len, n, _ = log_probs.shape
    length = 2 * targets.shape[1] + 1
    ext, _, emit = _ctc_setup(log_probs, targets, target_lengths, attrs["blank"])
    emits = _unstack(emit, 1)
    skip_prev, _ = _skip_masks(ext)
    in_len = _column(input_lengths)
    neg = _neg_inf(log_probs)
    alpha = op("Where", as_blob(np.arange(length) <= 1, like=ext, dtype=bool), emits[0], neg)
    alphas = [alpha]
    for t in range(1, t_len):
        step = op("Add", _log_add(alpha, _shift(alpha, 1),
                                  op("Where", skip_prev, _shift(alpha, 2), neg)), emits[t])
        running = op("Less", int64_constant(in_len, t), in_len)
        alpha = op("Where", running, step, alpha)  # past its length a sample keeps alpha
        alphas.append(alpha)
    tl, two_tl, last = _end_positions(target_lengths)
    ends = op("GatherElements", alpha, op("Concat", two_tl, last, axis=1), axis=1)
    end_blank, end_label = _unstack(reshape_to(ends, (n, 2, 1)), 1)
    end_label = op("Where", op("Greater", tl, int64_constant(tl, 0)), end_label, neg)
    loss = op("Neg", _log_add(end_blank, end_label))
    return [reshape_to(loss, (n,)), _stack(alphas, 1)]


def _ctc_betas(emits, ext, input_lengths, target_lengths):
    """beta_t(s) = log P(l'[s:] from step t on), -inf from the sample's length on."""
    n, length = ext.shape
    t_len = len(emits)
    _, skip_next = _skip_masks(ext)
    in_len = _column(input_lengths)
    two_tl = op("Mul", _column(target_lengths), int64_constant(ext, 2))
    s_range = int64_constant(ext, np.arange(length)[None, :])
    at_end = op("Or", op("Equal", s_range, two_tl),
                op("Equal", s_range, op("Sub", two_tl, int64_constant(ext, 1))))
    neg = _neg_inf(emits[0])
    beta = None
    betas = [None] * t_len
    for t in reversed(range(t_len)):
        start = op("Where", at_end, emits[t], neg)  # the sample's last step
        after = int64_constant(in_len, t + 1)
        beta_t = op("Where", op("Equal", in_len, after), start, neg)
        if beta is not None:
            step = op("Add", _log_add(beta, _shift(beta, -1),
                                      op("Where", skip_next, _shift(beta, -2), neg)), emits[t])
            beta_t = op("Where", op("Greater", in_len, after), step, beta_t)
        beta = betas[t] = beta_t
    return _stack(betas, 1)


def _drop_final_blank_when_last_label_is_blank(posterior, ext, input_lengths,
                                               target_lengths, blank):
    """OneFlow's kernel (as PyTorch's) starts the gradient at a sample's last step by
    *assigning* the term of l'[2 tl - 1] after that of the final blank l'[2 tl]: when the
    last label is the blank itself (a target OneFlow accepts), the final blank's share is
    dropped. Kept here so that gradients equal OneFlow's for such targets too."""
    batch, t_len, length = posterior.shape
    tl, two_tl, last = _end_positions(target_lengths)
    last_label = op("GatherElements", ext, last, axis=1)
    clash = op("And", op("Greater", tl, int64_constant(tl, 0)),
               op("Equal", last_label, int64_constant(tl, blank)))            # (N, 1)
    last_step = op("Equal", int64_constant(ext, np.arange(t_len)[None, :, None]),
                   op("Sub", reshape_to(_as_int64(input_lengths), (batch, 1, 1)),
                      int64_constant(ext, 1)))                                # (N, T, 1)
    final_blank = op("Equal", int64_constant(ext, np.arange(length)[None, None, :]),
                     reshape_to(two_tl, (batch, 1, 1)))                       # (N, 1, L)
    drop = op("And", op("And", last_step, final_blank), reshape_to(clash, (batch, 1, 1)))
    return op("Where", drop, as_blob(0, like=posterior), posterior)


def _ctc_grad(n, g, need):
    """OneFlow's (and PyTorch's) rule: d log_probs[t, n, c] = (exp(lp) - sum over s with
    l'(s) = c of exp(alpha + beta + nll - lp)) * dy for t < input length, else 0. It is the
    gradient through a log_softmax that produced log_probs."""
    if g[1] is not None:
        raise NotImplementedError("gradient through the alpha output of the CTC loss")
    log_probs, targets, input_lengths, target_lengths = n.inputs
    loss, alpha = n.outputs
    t_len, batch, classes = log_probs.shape
    ext, by_batch, emit = _ctc_setup(log_probs, targets, target_lengths, n.attrs["blank"])
    beta = _ctc_betas(_unstack(emit, 1), ext, input_lengths, target_lengths)
    nll = reshape_to(loss, (batch, 1, 1))
    posterior = op("Exp", op("Sub", op("Add", op("Add", alpha, beta), nll), emit))
    posterior = _drop_final_blank_when_last_label_is_blank(posterior, ext, input_lengths,
                                                           target_lengths, n.attrs["blank"])
    onehot = op("OneHot", ext, int64_constant(ext, [classes]),
                as_blob(np.array([0, 1], log_probs.np_dtype), like=log_probs), axis=-1)
    per_class = op("MatMul", posterior, onehot)
    grad = op("Mul", op("Sub", op("Exp", by_batch), per_class), reshape_to(g[0], (batch, 1, 1)))
    running = op("Less", int64_constant(ext, np.arange(t_len)[None, :, None]),
                 reshape_to(_as_int64(input_lengths), (batch, 1, 1)))
    zero = as_blob(0, like=grad)
    grad = op("Where", running, grad, zero)
    if n.attrs["zero_infinity"]:
        grad = op("Where", op("Equal", nll, as_blob(np.inf, like=nll)), zero, grad)
    return [op("Transpose", grad, perm=[1, 0, 2]), None, None, None]


register_composite("onnxjob.CTCLoss", _ctc_expand, _ctc_grad)
