"""The activation functions of `flow.nn` (elementwise, or softmax over an axis).

Names, signatures, defaults and formulas follow OneFlow 0.5's ops/nn_ops.py.
"""
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.elementwise import FLOATS
from onnxjob.graph.primitives.reductions import softmax_backward
from onnxjob.graph.tracer import Blob, as_blob, op
from onnxjob.ops.math import gelu, named_op, relu, sigmoid  # noqa: F401  (flow.nn's too)

__all__ = ["elu", "gelu", "hardsigmoid", "hardswish", "hardtanh", "leaky_relu", "log_softmax",
           "logsoftmax", "mish", "relu", "relu6", "sigmoid", "softmax", "softmax_grad", "swish"]


def _floating(x, api):
    if not isinstance(x, Blob) or x.np_dtype not in FLOATS:
        got = x.np_dtype if isinstance(x, Blob) else type(x).__name__
        raise TraceError(f"{api} takes float16, float32 or float64 Blobs, got {got}")
    return x


def _softmax_axis(x, axis, api):
    axis = -1 if axis is None else axis
    if not -len(x.shape) <= axis < len(x.shape):
        raise TraceError(f"{api}: axis {axis} is out of range for a Blob of rank {len(x.shape)}")
    return axis % len(x.shape)


def softmax(logits, axis=None, name=None):
    """exp(x) / sum(exp(x)) along `axis` (the last by default)."""
    _floating(logits, "flow.nn.softmax")
    return op("Softmax", logits, axis=_softmax_axis(logits, axis, "flow.nn.softmax"), name=name)


def logsoftmax(logits, axis=None, name=None):
    """log(softmax(x)) along `axis` (the last by default), computed without overflow."""
    _floating(logits, "flow.nn.logsoftmax")
    return op("LogSoftmax", logits, axis=_softmax_axis(logits, axis, "flow.nn.logsoftmax"),
              name=name)


log_softmax = logsoftmax


def softmax_grad(y, dy, axis=None, name=None):
    """dx of y = softmax(x): y * (dy - sum(dy * y)) along `axis` (the last by default)."""
    _floating(y, "flow.nn.softmax_grad")
    dx = softmax_backward(y, dy, _softmax_axis(y, axis, "flow.nn.softmax_grad"))
    return dx if name is None else op("Identity", dx, name=name)


def leaky_relu(x, alpha=0.2, name=None):
    """x for x > 0, alpha * x otherwise."""
    _floating(x, "flow.nn.leaky_relu")
    return named_op("LeakyRelu", x, alpha=float(alpha), name=name)


def elu(x, alpha=1.0, name=None):
    """x for x > 0, alpha * (exp(x) - 1) otherwise."""
    _floating(x, "flow.nn.elu")
    return named_op("Elu", x, alpha=float(alpha), name=name)


def hardsigmoid(x, name=None):
    """0 for x <= -3, 1 for x >= 3, x / 6 + 1/2 between."""
    _floating(x, "flow.nn.hardsigmoid")
    return named_op("HardSigmoid", x, alpha=1 / 6, beta=0.5, name=name)


def hardswish(x, name=None):
    """0 for x <= -3, x for x >= 3, x (x + 3) / 6 between."""
    _floating(x, "flow.nn.hardswish")
    return named_op("HardSwish", x, name=name)


def hardtanh(x, min_val=-1.0, max_val=1.0, name=None):
    """x clamped to [min_val, max_val]; the gradient is 0 at the bounds too."""
    _floating(x, "flow.nn.hardtanh")
    if not float(min_val) < float(max_val):
        raise TraceError(f"flow.nn.hardtanh: max_val ({max_val}) must be larger than "
                         f"min_val ({min_val})")
    y = op("onnxjob.Hardtanh", x, min_val=float(min_val), max_val=float(max_val))
    return y if name is None else op("Identity", y, name=name)


def relu6(x, name=None):
    """min(max(x, 0), 6): hardtanh with bounds 0 and 6."""
    return hardtanh(x, min_val=0.0, max_val=6.0, name=name)


def mish(x, name=None):
    """x * tanh(softplus(x))."""
    _floating(x, "flow.nn.mish")
    return op("Mul", x, op("Tanh", op("Softplus", x)), name=name)


def swish(x, beta=1.0, name=None):
    """x * sigmoid(beta * x)."""
    _floating(x, "flow.nn.swish")
    return op("Mul", x, op("Sigmoid", op("Mul", x, as_blob(float(beta), like=x))), name=name)

