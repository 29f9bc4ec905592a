"""Random ops (Dropout, RandomUniform, ...): shape rules and gradient rules.

Random ops stay random in train graphs: sessions of train jobs disable onnxruntime's
EliminateDropout (see runtime/backend.py).
"""
import numpy as np
from onnx_ir import DataType

from onnxjob.graph.registry import const_value, register
from onnxjob.graph.tracer import as_blob, op


def _dropout_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    outs = [(x.shape, x.np_dtype)]
    if num_outputs > 1:
        outs.append((x.shape, np.dtype(bool)))
    return outs


def dropout_scale(ratio):
    """OneFlow's scale of the kept values, float(1.0 / (1.0 - rate)) of the rate the program
    wrote (a Python float), from `ratio` as a graph holds it: the shortest decimal that is
    the same float32 recovers the program's rate (0.9, not 0.89999998). onnxruntime's
    Dropout scales by 1.0f / (1.0f - ratio) in float32 instead: 9.999998 at 0.9, where
    OneFlow has 10.0."""
    rate = float(str(np.float32(ratio)))
    return 1.0 / (1.0 - rate)


def _dropout_grad(n, g, need):
    mask = n.outputs[1]
    scale = dropout_scale(const_value(n.inputs[1]))
    scaled = op("Mul", g[0], as_blob(scale, like=g[0]))
    return [op("Where", mask, scaled, as_blob(0, like=g[0])), None, None]


register("Dropout", _dropout_infer, _dropout_grad)


def _random_infer(inputs, attrs, num_outputs):
    """RandomUniform / RandomNormal: shape and dtype from the attributes."""
    return [(tuple(int(d) for d in attrs["shape"]), DataType(attrs.get("dtype", 1)).numpy())]


def _random_like_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    dtype = DataType(attrs["dtype"]).numpy() if "dtype" in attrs else x.np_dtype
    return [(x.shape, dtype)]


# NOTE: onnxruntime does not constant-fold these four and onnx_ir's CSE does not merge
# them, so they draw fresh values on every run (tests/test_ops_array.py checks it).
# ONNX Bernoulli is on neither list (onnxruntime tries to fold it): it is not used.
for _op_type in ("RandomUniform", "RandomNormal"):
    register(_op_type, _random_infer, None, differentiable=False)
for _op_type in ("RandomUniformLike", "RandomNormalLike"):
    register(_op_type, _random_like_infer, None, differentiable=False)
