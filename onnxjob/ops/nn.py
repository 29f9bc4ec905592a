"""flow.nn: convolution, pooling, activations, dropout and the losses."""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.ops import math as math_ops
from onnxjob.ops.array import reshape

relu = math_ops.relu
sigmoid = math_ops.sigmoid
softmax = math_ops.softmax
log_softmax = math_ops.log_softmax
leaky_relu = math_ops.leaky_relu
gelu = math_ops.gelu


def _pair(v, what):
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    if len(v) == 1:
        return [int(v[0])] * 2
    if len(v) != 2:
        raise TraceError(f"{what} must be an int or a pair, got {v}")
    return [int(d) for d in v]


def resolve_padding(padding, in_hw, kernel, strides, dilations):
    """Explicit ONNX pads [top, left, bottom, right] for OneFlow's padding argument.

    OneFlow's "SAME" is SAME_LOWER: the larger half of an odd total goes first.
    """
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [0, 0, 0, 0]
        if mode not in ("SAME", "SAME_LOWER", "SAME_UPPER"):
            raise TraceError(f"padding must be VALID, SAME, SAME_LOWER or SAME_UPPER, got {padding!r}")
        begin, end = [], []
        for size, k, s, d in zip(in_hw, kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            b, e = (small, large) if mode == "SAME_UPPER" else (large, small)
            begin.append(b)
            end.append(e)
        return begin + end
    pads = [list(p) for p in padding]
    if len(pads) == 4:
        pads = pads[2:]  # [[0,0],[0,0],[t,b],[l,r]] for NCHW
    return [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]


def _to_nchw(x, data_format):
    if data_format.upper() in ("NHWC", "CHANNELS_LAST"):
        return op("Transpose", x, perm=[0, 3, 1, 2]), True
    return x, False


def _from_nchw(y, was_nhwc):
    return op("Transpose", y, perm=[0, 2, 3, 1]) if was_nhwc else y


def conv2d(input, filters, strides=1, padding="VALID", data_format="NCHW", dilations=None,
           groups=1, name=None):
    """2-D convolution with an explicit weight blob (NCHW weight (out, in/groups, kh, kw))."""
    x, nhwc = _to_nchw(input, data_format)
    if nhwc:  # OneFlow's NHWC weight is (filters, kh, kw, in)
        filters = op("Transpose", filters, perm=[0, 3, 1, 2])
    kernel = list(filters.shape[2:])
    strides = _pair(strides, "strides")
    dil = _pair(dilations or 1, "dilations")
    pads = resolve_padding(padding, x.shape[2:], kernel, strides, dil)
    y = op("Conv", x, filters, strides=strides, pads=pads, dilations=dil, group=int(groups),
           kernel_shape=kernel, name=name)
    return _from_nchw(y, nhwc)


def _pool(op_type, input, ksize, strides, padding, data_format, ceil_mode, name):
    if data_format not in ("NCHW", "NHWC", "NCHW_VECT_C"):
        raise TraceError(f"data_format must be NCHW, NHWC or NCHW_VECT_C, got {data_format!r}")
    x, nhwc = _to_nchw(input, data_format)
    k = _pair(ksize, "ksize")
    s = _pair(strides, "strides")
    pads = resolve_padding(padding, x.shape[2:], k, s, [1, 1])
    attrs = dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=int(ceil_mode))
    builder = current_builder(op_type)
    if op_type == "MaxPool" and builder.is_train:
        # Train graphs keep the arg-max indices: the gradient routes through them.
        y, _ = op("MaxPool", x, num_outputs=2, name=name, **attrs)
    elif op_type == "MaxPool":
        y = op("MaxPool", x, name=name, **attrs)
    else:
        y = op("AveragePool", x, name=name, count_include_pad=0, **attrs)
    return _from_nchw(y, nhwc)


def max_pool2d(input, ksize, strides, padding, data_format="NCHW", ceil_mode=False, name=None):
    return _pool("MaxPool", input, ksize, strides, padding, data_format, ceil_mode, name)


def avg_pool2d(input, ksize, strides, padding, data_format="NCHW", ceil_mode=False, name=None):
    return _pool("AveragePool", input, ksize, strides, padding, data_format, ceil_mode, name)


def bias_add(value, bias, data_format=None, name=None):
    """value + bias along the channel axis (axis 1 for NCHW / rank > 2, else last)."""
    if len(value.shape) > 2 and (data_format is None or data_format.startswith("NC")):
        shape = [1, bias.shape[0]] + [1] * (len(value.shape) - 2)
        return op("Add", value, reshape(bias, shape), name=name)
    return op("Add", value, bias, name=name)


def dropout(x, rate, noise_shape=None, seed=None, name=None):
    """Inverted dropout in train jobs; identity in predict jobs and for rate 0."""
    assert 0.0 <= rate < 1.0, f"dropout rate must be in [0, 1), got {rate}"
    builder = current_builder("flow.nn.dropout")
    if not builder.is_train or rate == 0.0:
        return x
    ratio = as_blob(np.array(rate, dtype=x.np_dtype), like=x)
    training = as_blob(np.array(True), like=x, dtype=bool)
    y, _mask = op("Dropout", x, ratio, training, num_outputs=2, name=name,
                  seed=int(seed) if seed is not None else None)
    return y


def sparse_softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Per-example cross entropy of `logits` against integer `labels` (labels first)."""
    if len(labels.shape) == len(logits.shape) and labels.shape[-1] == 1:
        labels = reshape(labels, labels.shape[:-1])
    builder = current_builder("sparse_softmax_cross_entropy_with_logits")
    if builder.is_train:  # the log-prob output feeds the gradient (softmax - onehot)
        loss, _ = op("SoftmaxCrossEntropyLoss", logits, labels, reduction="none",
                     num_outputs=2, name=name)
        return loss
    return op("SoftmaxCrossEntropyLoss", logits, labels, reduction="none", name=name)


def softmax_cross_entropy_with_logits(labels, logits, name=None):
    """Cross entropy against a probability distribution `labels` of logits' shape."""
    if labels.shape != logits.shape:
        raise TraceError(f"labels {labels.shape} and logits {logits.shape} must have one shape")
    logp = op("LogSoftmax", logits, axis=-1)
    return op("Neg", math_ops.reduce_sum(op("Mul", labels, logp), axis=-1), name=name)


def sigmoid_cross_entropy_with_logits(labels, logits, name=None):
    """max(x, 0) - x * z + log(1 + exp(-|x|)), elementwise."""
    zero = as_blob(0, like=logits)
    return (op("Max", logits, zero) - logits * labels
            + op("Softplus", op("Neg", op("Abs", logits))))


def moments(x, axes, keepdims=False, name=None):
    mean = math_ops.reduce_mean(x, axis=axes, keepdims=True)
    var = math_ops.reduce_mean(math_ops.square(x - mean), axis=axes, keepdims=keepdims)
    if not keepdims:
        mean = math_ops.reduce_mean(x, axis=axes, keepdims=False)
    return mean, var
