"""Random ops (Dropout, ...): shape rules and gradient rules.

Random ops stay random in train graphs: sessions of train jobs disable onnxruntime's
EliminateDropout (see runtime/backend.py).
"""
import numpy as np

from onnxjob.graph.registry import const_value, register
from onnxjob.graph.tracer import as_blob, op


def _dropout_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    outs = [(x.shape, x.np_dtype)]
    if num_outputs > 1:
        outs.append((x.shape, np.dtype(bool)))
    return outs


def _dropout_grad(n, g, need):
    ratio = float(const_value(n.inputs[1]))
    mask = n.outputs[1]
    scaled = op("Mul", g[0], as_blob(1.0 / (1.0 - ratio), like=g[0]))
    return [op("Where", mask, scaled, as_blob(0, like=g[0])), None, None]


register("Dropout", _dropout_infer, _dropout_grad)
