"""Convolutions and pooling of `flow.nn` (weights passed in as Blobs).

Layouts: OneFlow's "NCHW"-style formats map directly to ONNX; channels-last inputs
("NHWC", "NWC", "NDHWC") are transposed to channels-first around the ONNX op, and their
channels-last weights (out, *kernel, in) too.

Padding: "VALID", "SAME" (= OneFlow's SAME_LOWER: the larger half of an odd total goes
first), "SAME_LOWER", "SAME_UPPER" (any case), or one entry per input axis in the data
layout's order, each an int or a (before, after) pair, e.g. [[0, 0], [0, 0], [1, 1],
[1, 1]] for NCHW. Everything is resolved to explicit ONNX pads here.
"""
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import Blob, current_builder, op
from onnxjob.ops.array import reshape

__all__ = ["bias_add", "conv2d", "max_pool2d", "avg_pool2d"]


def spatial_tuple(value, ndims, what):
    """An int or a sequence of 1 or `ndims` ints, as a list of `ndims` ints."""
    if isinstance(value, int):
        return [value] * ndims
    values = [int(v) for v in value]
    if len(values) == 1:
        return values * ndims
    if len(values) != ndims:
        raise TraceError(f"{what} must be an int or {ndims} ints, got {list(value)}")
    return values


def is_channels_last(data_format):
    fmt = (data_format or "").upper()
    return fmt in ("CHANNELS_LAST",) or (fmt.startswith("N") and fmt.endswith("C") and len(fmt) > 2)


def resolve_padding(padding, in_spatial, kernel, strides, dilations, channels_last=False):
    """Explicit ONNX pads [begin per axis..., end per axis...] for OneFlow's `padding`."""
    ndims = len(in_spatial)
    if isinstance(padding, str):
        mode = padding.upper()
        if mode == "VALID":
            return [0] * (2 * ndims)
        if mode not in ("SAME", "SAME_LOWER", "SAME_UPPER"):
            raise TraceError(f"padding must be VALID, SAME, SAME_LOWER or SAME_UPPER, "
                             f"got {padding!r}")
        begin, end = [], []
        for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, large = total // 2, total - total // 2
            b, e = (small, large) if mode == "SAME_UPPER" else (large, small)
            begin.append(b)
            end.append(e)
        return begin + end
    pads = [[p, p] if isinstance(p, int) else [int(q) for q in p] for p in padding]
    if len(pads) == ndims + 2:  # one entry per input axis: drop batch and channels
        non_spatial = [pads[0], pads[-1]] if channels_last else pads[:2]
        if any(p != [0, 0] for p in non_spatial):
            raise TraceError(f"padding {list(padding)} pads the batch or channel axis; only "
                             "spatial axes can be padded by a convolution or pool")
        pads = pads[1:-1] if channels_last else pads[2:]
    if len(pads) != ndims or any(len(p) != 2 for p in pads):
        raise TraceError(f"padding must be a string or {ndims + 2} (before, after) pairs, "
                         f"got {padding!r}")
    return [p[0] for p in pads] + [p[1] for p in pads]


def to_channels_first(x, channels_last):
    if not channels_last:
        return x
    rank = len(x.shape)
    return op("Transpose", x, perm=[0, rank - 1] + list(range(1, rank - 1)))


def from_channels_first(y, channels_last):
    if not channels_last:
        return y
    rank = len(y.shape)
    return op("Transpose", y, perm=[0] + list(range(2, rank)) + [1])


def convolution(x, filters, strides, padding, data_format, dilations, groups, bias, name, ndims):
    """An N-d convolution in OneFlow's terms, emitted as one ONNX Conv (+ layout moves)."""
    if len(x.shape) != ndims + 2:
        raise TraceError(f"a {ndims}-D convolution needs a {ndims + 2}-D input, got {x.shape}")
    channels_last = is_channels_last(data_format)
    x = to_channels_first(x, channels_last)
    if channels_last:  # OneFlow's channels-last weight is (out, *kernel, in)
        filters = to_channels_first(filters, True)
    kernel = list(filters.shape[2:])
    strides = spatial_tuple(strides, ndims, "strides")
    dils = spatial_tuple(1 if dilations is None else dilations, ndims, "dilations")
    pads = resolve_padding(padding, x.shape[2:], kernel, strides, dils, channels_last)
    inputs = [x, filters] + ([bias] if bias is not None else [])
    y = op("Conv", *inputs, strides=strides, pads=pads, dilations=dils, group=int(groups),
           kernel_shape=kernel, name=name)
    return from_channels_first(y, channels_last)


_UNSET = object()


def conv2d(input, filters, strides, padding, bias=None, data_format=_UNSET, dilations=_UNSET,
           groups=_UNSET, name=_UNSET):
    """2-D convolution with an explicit weight Blob (OneFlow's `flow.nn.conv2d`).

    Both API generations are accepted, told apart by the fifth positional argument:
    OneFlow 0.5 `(input, filters, strides, padding, bias=None, data_format="NCHW",
    dilations=None, groups=1, name=None)` and OneFlow <= 0.4, where the fifth place is
    the `data_format` string: `(input, filters, strides, padding, data_format="NCHW",
    dilations=None, groups=1, name=None)`.
    """
    if isinstance(bias, str):  # the <= 0.4 signature: positions shifted by one
        if name is not _UNSET:
            raise TraceError("flow.nn.conv2d takes at most 8 arguments in OneFlow <= 0.4: "
                             "(input, filters, strides, padding, data_format, dilations, "
                             "groups, name)")
        bias, data_format, dilations, groups, name = None, bias, data_format, dilations, groups
    elif bias is not None and not isinstance(bias, Blob):
        raise TraceError(f"flow.nn.conv2d: the fifth argument is the bias Blob (OneFlow 0.5) "
                         f"or the data_format string (OneFlow <= 0.4), got {bias!r}")
    data_format = "NCHW" if data_format is _UNSET else data_format
    dilations = None if dilations is _UNSET else dilations
    groups = 1 if groups is _UNSET else groups
    name = None if name is _UNSET else name
    y = convolution(input, filters, strides, padding, data_format, dilations, groups, None,
                    name, 2)
    return y if bias is None else bias_add(y, bias, data_format)


def bias_add(value, bias, data_format=None, name=None):
    """value + bias along the channel axis: axis 1 for channels-first inputs of rank > 2
    (the default), the last axis for rank 2 or channels-last formats."""
    if len(value.shape) > 2 and not is_channels_last(data_format):
        shape = [1, bias.shape[0]] + [1] * (len(value.shape) - 2)
        return op("Add", value, reshape(bias, shape), name=name)
    return op("Add", value, bias, name=name)


def pooling(op_type, x, ksize, strides, padding, data_format, ceil_mode, name, ndims):
    """An N-d max or average pool in OneFlow's terms (average excludes the padding)."""
    if len(x.shape) != ndims + 2:
        raise TraceError(f"a {ndims}-D pool needs a {ndims + 2}-D input, got {x.shape}")
    channels_last = is_channels_last(data_format)
    x = to_channels_first(x, channels_last)
    k = spatial_tuple(ksize, ndims, "ksize")
    s = spatial_tuple(strides, ndims, "strides")
    pads = resolve_padding(padding, x.shape[2:], k, s, [1] * ndims, channels_last)
    attrs = dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=int(bool(ceil_mode)))
    builder = current_builder(op_type)
    if op_type == "MaxPool" and builder.is_train:
        # Train graphs keep the arg-max indices: the gradient routes through them.
        y, _ = op("MaxPool", x, num_outputs=2, name=name, **attrs)
    elif op_type == "MaxPool":
        y = op("MaxPool", x, name=name, **attrs)
    else:
        y = op("AveragePool", x, name=name, count_include_pad=0, **attrs)
    return from_channels_first(y, channels_last)


def _check_2d_format(data_format):
    if data_format not in ("NCHW", "NHWC", "NCHW_VECT_C"):
        raise TraceError(f"data_format must be NCHW, NHWC or NCHW_VECT_C, got {data_format!r}")


def max_pool2d(input, ksize, strides, padding, data_format="NCHW", ceil_mode=False, name=None):
    """2-D max pooling (padding positions never win the max)."""
    _check_2d_format(data_format)
    return pooling("MaxPool", input, ksize, strides, padding, data_format, ceil_mode, name, 2)


def avg_pool2d(input, ksize, strides, padding, data_format="NCHW", ceil_mode=False, name=None):
    """2-D average pooling; padded positions are not counted."""
    _check_2d_format(data_format)
    return pooling("AveragePool", input, ksize, strides, padding, data_format, ceil_mode,
                   name, 2)
