"""Padding: flow.pad, pad_grad, constant_pad2d, zero_pad2d, reflection_pad2d,
replication_pad2d, same_padding.

Shape and gradient rules of Pad: onnxjob/graph/primitives/shape_ops.py.
"""
import numpy as np

from onnxjob.compat.zero_d_inputs import as_vector
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.ops.slicing import slice_v2

__all__ = ["constant_pad2d", "pad", "pad_grad", "reflection_pad2d", "replication_pad2d",
           "same_padding", "zero_pad2d"]


def _pad(x, before, after, mode, constant_value=0, name=None):
    if any(int(p) < 0 for p in list(before) + list(after)):
        raise TraceError(f"pad: paddings must be >= 0, got {list(before)} and {list(after)}")
    if not x.shape:   # a 0-d Blob has no axis to pad (onnxruntime's Pad needs rank >= 1)
        return op("Identity", x, name=name)
    pads = int64_constant(x, [int(p) for p in list(before) + list(after)])
    if mode != "constant":
        return op("Pad", x, pads, mode=mode, name=name)
    value = as_blob(np.array(constant_value, dtype=x.np_dtype), like=x)
    return op("Pad", x, pads, value, mode="constant", name=name)


def _pairs(paddings, x, api):
    if not isinstance(paddings, (list, tuple)) or len(paddings) != len(x.shape) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in paddings):
        raise TraceError(f"{api}: paddings must be {len(x.shape)} (before, after) pairs, got "
                         f"{paddings!r}")
    return [p[0] for p in paddings], [p[1] for p in paddings]


def pad(x, paddings, constant_value=0, name=None):
    """`x` padded with `constant_value`; paddings holds a (before, after) pair per axis (a
    0-d `x` with one pair is its one-element vector: compat/zero_d_inputs.py)."""
    x = as_vector(x, where=isinstance(paddings, (list, tuple)) and len(paddings) == 1)
    before, after = _pairs(paddings, x, "pad")
    return _pad(x, before, after, "constant", constant_value, name=name)


def pad_grad(x, paddings, constant_value=0, name=None):
    """The gradient of pad: `x` with the paddings cut off."""
    before, after = _pairs(paddings, x, "pad_grad")
    tuples = [(b, d - a, 1) for b, a, d in zip(before, after, x.shape)]
    return slice_v2(x, tuples, name=name)


def _pad2d(x, padding, api):
    """(before, after) of an NCHW Blob for `padding` = int or [left, right, top, bottom]."""
    if len(x.shape) != 4:
        raise TraceError(f"{api} takes an NCHW Blob, got shape {x.shape}")
    if isinstance(padding, int):
        padding = [padding] * 4
    if not isinstance(padding, (list, tuple)) or len(padding) != 4:
        raise TraceError(f"{api}: padding must be an int or [left, right, top, bottom]")
    left, right, top, bottom = (int(p) for p in padding)
    return [0, 0, top, left], [0, 0, bottom, right]


def constant_pad2d(x, padding, constant_value=0, name=None):
    """NCHW `x` padded with `constant_value` by [left, right, top, bottom] (or an int)."""
    before, after = _pad2d(x, padding, "constant_pad2d")
    return _pad(x, before, after, "constant", constant_value, name=name)


def zero_pad2d(x, padding, name=None):
    """constant_pad2d with zeros."""
    return constant_pad2d(x, padding, 0, name=name)


def reflection_pad2d(x, padding, name=None):
    """NCHW `x` padded with its reflection (the border itself is not repeated)."""
    before, after = _pad2d(x, padding, "reflection_pad2d")
    if before[2] >= x.shape[2] or after[2] >= x.shape[2] or before[3] >= x.shape[3] or \
            after[3] >= x.shape[3]:
        raise TraceError("reflection_pad2d: padding size should be less than the "
                         f"corresponding input dimension, got {padding} for {x.shape}")
    return _pad(x, before, after, "reflect", name=name)


def replication_pad2d(x, padding, name=None):
    """NCHW `x` padded by repeating its border."""
    before, after = _pad2d(x, padding, "replication_pad2d")
    return _pad(x, before, after, "edge", name=name)


def same_padding(x, padding, data_format, kernel_size, strides, dilation_rate, name=None):
    """Zero-pad the spatial axes so that a convolution keeps ceil(size / stride) outputs;
    SAME_UPPER puts the odd pixel at the end, SAME_LOWER at the start."""
    mode = str(padding).lower()
    if mode not in ("same_lower", "same_upper"):
        raise TraceError(f'same_padding: padding must be "SAME_LOWER" or "SAME_UPPER", '
                         f"got {padding!r}")
    n_spatial = len(x.shape) - 2
    if not all(isinstance(v, (list, tuple)) and len(v) == n_spatial
               for v in (kernel_size, strides, dilation_rate)):
        raise TraceError(f"same_padding: kernel_size, strides and dilation_rate must be "
                         f"lists of {n_spatial} ints")
    first = 2 if data_format.startswith("NC") else 1
    before, after = [0] * len(x.shape), [0] * len(x.shape)
    for i, (k, s, d) in enumerate(zip(kernel_size, strides, dilation_rate)):
        size = x.shape[first + i]
        needed = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = needed // 2, needed - needed // 2
        before[first + i], after[first + i] = (large, small) if mode == "same_lower" else (
            small, large)
    return _pad(x, before, after, "constant", name=name)
