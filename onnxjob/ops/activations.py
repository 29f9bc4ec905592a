"""The activation functions of `flow.nn` (elementwise, or softmax over an axis)."""
from onnxjob.ops import math

__all__ = ["gelu", "leaky_relu", "log_softmax", "logsoftmax", "relu", "sigmoid", "softmax"]

relu = math.relu
sigmoid = math.sigmoid
softmax = math.softmax
log_softmax = logsoftmax = math.log_softmax
leaky_relu = math.leaky_relu
gelu = math.gelu
