"""Composites of OneFlow's legacy ops whose gradient is OneFlow's own rule (see
onnxjob/ops/legacy.py for the user functions)."""
import numpy as np

from onnxjob.graph.registry import register_composite
from onnxjob.graph.tracer import as_blob, int64_constant, op

# -- combined_margin_loss (ArcFace / CosFace) ------------------------------------------------
# x (N, C) of cosines, label (N,). Only x[i, label_i] changes: cos(m1 * acos(x) + m2) - m3.

def _margin_columns(x, label):
    """(label as an (N, 1) int64 column clamped into range, (N, 1) bool: label in range)."""
    classes = x.shape[1]
    lab = label if label.np_dtype == np.int64 else op("Cast", label, to=7)
    lab = op("Unsqueeze", lab, int64_constant(lab, [1]))
    valid = op("And", op("GreaterOrEqual", lab, int64_constant(lab, 0)),
               op("Less", lab, int64_constant(lab, classes)))
    return op("Where", valid, lab, int64_constant(lab, 0)), valid


def _margin_expand(inputs, attrs, num_outputs):
    """Outputs (y (N, C), theta (N,)): theta = acos(x[i, label_i]), 0 for labels outside
    [0, C) (whose rows pass through unchanged), as in OneFlow's CPU kernel."""
    x, label = inputs
    m1, m2, m3 = attrs["m1"], attrs["m2"], attrs["m3"]
    col, valid = _margin_columns(x, label)
    picked = op("GatherElements", x, col, axis=1)
    theta = op("Acos", picked)
    angle = op("Add", op("Mul", theta, as_blob(m1, like=theta)), as_blob(m2, like=theta))
    margin = op("Sub", op("Cos", angle), as_blob(m3, like=theta))
    y = op("ScatterElements", x, col, op("Where", valid, margin, picked), axis=1)
    theta = op("Where", valid, theta, as_blob(0, like=theta))
    return [y, op("Squeeze", theta, int64_constant(theta, [1]))]


def _margin_grad(n, g, need):
    """OneFlow's rule: dx = dy, but dy * m1 * sin(m1 theta + m2) / sin(theta) at the label."""
    if len(g) > 1 and g[1] is not None:
        raise NotImplementedError("gradient through the theta output of combined_margin_loss")
    x, label = n.inputs
    m1, m2 = n.attrs["m1"], n.attrs["m2"]
    theta = op("Unsqueeze", n.outputs[1], int64_constant(n.outputs[1], [1]))
    col, valid = _margin_columns(x, label)
    dy = g[0]
    picked = op("GatherElements", dy, col, axis=1)
    angle = op("Add", op("Mul", theta, as_blob(m1, like=theta)), as_blob(m2, like=theta))
    factor = op("Div", op("Mul", op("Sin", angle), as_blob(m1, like=theta)), op("Sin", theta))
    scaled = op("Where", valid, op("Mul", picked, factor), picked)
    return [op("ScatterElements", dy, col, scaled, axis=1), None]


register_composite("onnxjob.CombinedMarginLoss", _margin_expand, _margin_grad)


# -- SSP's stale variable read (function_config.enable_ssp) -----------------------------------
# (var, stale) -> stale: the forward and backward read a value of the variable from earlier
# runs, and the gradient taken at it updates the variable itself, as after OneFlow's
# AddSspVariableProxy pass (the ops outside the optimizer read the proxy's `value`, the
# optimizer its `ref`).

def _stale_read_expand(inputs, attrs, num_outputs):
    return [op("Identity", inputs[1])]


register_composite("onnxjob.SspStaleRead", _stale_read_expand,
                   lambda n, g, need: [g[0], None])
