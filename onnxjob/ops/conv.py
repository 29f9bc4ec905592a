"""Convolutions and pooling of `flow.nn` (weights passed in as Blobs).

Layouts: OneFlow's "NCHW"-style formats map directly to ONNX; channels-last inputs
("NHWC", "NWC", "NDHWC") are transposed to channels-first around the ONNX op, and their
channels-last weights (out, *kernel, in) too.

Padding: "VALID", "SAME" (= OneFlow's SAME_LOWER: the larger half of an odd total goes
first), "SAME_LOWER", "SAME_UPPER" (any case), or one entry per input axis in the data
layout's order, each an int or a (before, after) pair, e.g. [[0, 0], [0, 0], [1, 1],
[1, 1]] for NCHW. Everything is resolved to explicit ONNX pads here.

Dtypes: float32 and float64, as OneFlow's CPU kernels (float64 runs as exact float64
formulations, see graph/primitives/conv.py and pooling.py); other dtypes raise TraceError.
"""
import numbers
import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob.errors import TraceError
from onnxjob.frontend import scope
from onnxjob.graph.tracer import Blob, as_blob, current_builder, op
from onnxjob.ops import qat
from onnxjob.ops.shapes import reshape, transpose
from onnxjob.source_info import warn_at_user_line

# NOTE: `upsample` is not listed: OneFlow has no flow.nn.upsample, it is
# flow.layers.upsample_2d, which ops/layers.py wires to it.
__all__ = ["bias_add", "conv1d", "conv2d", "conv3d", "compat_conv2d", "conv2d_transpose",
           "torch_conv2d_transpose", "max_pool1d", "avg_pool1d", "max_pool2d", "avg_pool2d",
           "max_pool3d", "avg_pool3d", "PixelShuffle", "PixelShufflev2"]


def spatial_tuple(value, ndims, what):
    """An int or a sequence of 1 or `ndims` ints, as a list of `ndims` ints; None is 1 (as
    OneFlow's `_GetSequence` reads the pools' ksize and strides)."""
    if value is None:
        value = 1
    if isinstance(value, numbers.Integral):
        return [int(value)] * ndims
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise TraceError(f"{what} must be an int or {ndims} ints, got {value!r}")
    values = [int(v) for v in value]
    if len(values) == 1:
        return values * ndims
    if len(values) != ndims:
        raise TraceError(f"{what} must be an int or {ndims} ints, got {list(value)}")
    return values


def check_float(x, api, half=False):
    """TraceError unless `x` is float32 or float64 (the dtypes of OneFlow's CPU kernels),
    or float16 where `half`: ops whose OneFlow GPU (cuDNN) kernels take half precision."""
    allowed = (np.float32, np.float64) + ((np.float16,) if half else ())
    if x.np_dtype not in allowed:
        names = "float16, float32 or float64" if half else "float32 or float64"
        raise TraceError(f"{api} takes {names} input, got {x.dtype.__name__} ({x.name})")


def check_format(data_format, allowed, api):
    if not isinstance(data_format, str) or data_format.upper() not in allowed:
        raise TraceError(f"{api}: data_format must be one of {', '.join(allowed)}, "
                         f"got {data_format!r}")


def is_channels_last(data_format):
    """True for "NWC", "NHWC", "NDHWC" (and "channels_last"); "NC..." formats, including
    "NCHW_VECT_C", are channels-first."""
    fmt = (data_format or "").upper()
    return fmt == "CHANNELS_LAST" or (fmt.startswith("N") and not fmt.startswith("NC")
                                      and fmt.endswith("C"))


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
    for what, value in (("input", x), ("filters", filters)):
        if not isinstance(value, Blob):    # (flow.layers.conv*d takes a filter count)
            raise TraceError(f"a {ndims}-D convolution (flow.nn.conv{ndims}d) takes the "
                             f"{what} as a Blob, got {value!r}")
    if len(x.shape) != ndims + 2 or len(filters.shape) != ndims + 2:
        raise TraceError(f"a {ndims}-D convolution needs a {ndims + 2}-D input and weight, "
                         f"got {x.shape} and {filters.shape}")
    check_float(x, f"a {ndims}-D convolution", half=True)
    channels_last = is_channels_last(data_format)
    # OneFlow's channels-last weight is (out, *kernel, in)
    kernel = list(filters.shape[1:-1] if channels_last else filters.shape[2:])
    strides = spatial_tuple(strides, ndims, "strides")
    dils = spatial_tuple(1 if dilations is None else dilations, ndims, "dilations")
    in_spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    pads = resolve_padding(padding, in_spatial, kernel, strides, dils, channels_last)
    site = None
    tracer = qat.active() if ndims == 2 else None
    if tracer is not None and "conv2d" in tracer.s.int8_ops:
        x, pads = _pad_op_for_qat(x, pads, in_spatial, kernel, strides, dils, channels_last)
        site = tracer.int8("conv2d", [x, filters, bias], ["in", "weight", "bias"])
        x, filters, bias = site.inputs
    x = to_channels_first(x, channels_last)
    filters = to_channels_first(filters, channels_last)
    inputs = [x, filters] + ([bias] if bias is not None else [])
    y = op("Conv", *inputs, strides=strides, pads=pads, dilations=dils, group=int(groups),
           kernel_shape=kernel, name=name)
    return qat.done(site, from_channels_first(y, channels_last))


def _pad_op_for_qat(x, pads, in_spatial, kernel, strides, dilations, channels_last):
    """(x, pads) as OneFlow's conv2d sees them: where cuDNN cannot take the pads
    (calc_conv_padding: unequal ones that change the output size), OneFlow pads with a
    pad op first, whose output QAT then observes (zeros included)."""
    nd = len(in_spatial)
    fits = all(_cudnn_takes(size, pads[i], pads[nd + i], k, s, d, x.is_dynamic)
               for i, (size, k, s, d) in enumerate(zip(in_spatial, kernel, strides, dilations)))
    if fits:
        return x, pads
    first = 1 if channels_last else 2
    full = [0] * (2 * len(x.shape))
    for i in range(nd):
        full[first + i], full[len(x.shape) + first + i] = pads[i], pads[nd + i]
    return op("Pad", x, as_blob(np.asarray(full, np.int64), like=x, dtype=np.int64)), [0] * (2 * nd)


def _cudnn_takes(size, begin, end, kernel, stride, dilation, dynamic):
    """OneFlow's check_conv_cudnn_padding_support."""
    if begin == end:
        return True
    if dynamic or begin < end or begin - end > 1:
        return False
    span = (kernel - 1) * dilation + 1
    return ((size + 2 * begin - span + stride) // stride
            == (size + begin + end - span + stride) // stride)


@two_generations(("input", "filters", "strides", "padding", "data_format", "dilations",
                  "groups", "name"), positional_is(4, str))
def conv2d(input, filters, strides, padding, bias=None, data_format="NCHW", dilations=None,
           groups=1, name=None):
    """2-D convolution with an explicit weight Blob (OneFlow's `flow.nn.conv2d`).

    Both API generations are accepted (compat/generations.py), told apart by the fifth
    positional argument: OneFlow 0.5 `(input, filters, strides, padding, bias=None,
    data_format="NCHW", dilations=None, groups=1, name=None)` and OneFlow <= 0.4, where
    the fifth place is the `data_format` string: `(input, filters, strides, padding,
    data_format="NCHW", dilations=None, groups=1, name=None)`.
    """
    if bias is not None and not isinstance(bias, Blob):
        raise TraceError(f"flow.nn.conv2d: the fifth argument is the bias Blob (OneFlow 0.5) "
                         f"or the data_format string (OneFlow <= 0.4), got {bias!r}")
    if bias is not None and qat.active() is not None:
        # OneFlow's conv2d op takes the bias as an input, which QAT quantizes as a bias
        return convolution(input, filters, strides, padding, data_format, dilations, groups,
                           bias, name, 2)
    y = convolution(input, filters, strides, padding, data_format, dilations, groups, None,
                    name, 2)
    return y if bias is None else add_bias(y, bias, data_format)


def bias_add(value, bias, data_format=None, name=None):
    """value + bias along the channel axis: axis 1 for channels-first inputs of rank > 2
    (the default), the last axis for rank 2 or channels-last formats. (Under QAT, the
    bias_add of a convolution chain: ops/qat.py.)"""
    site = qat.chain("bias_add", value, bias)
    out = add_bias(value, bias if site is None else site.bias, data_format, name)
    return qat.done(site, out)


def add_bias(value, bias, data_format=None, name=None):
    """bias_add as a part of other ops (fused forms), which QAT does not see."""
    channels = value.shape[-1] if len(value.shape) <= 2 or is_channels_last(data_format) \
        else value.shape[1]
    if len(value.shape) < 2 or bias.shape != (channels,):
        raise TraceError(f"bias_add: bias must have shape ({channels},) for value "
                         f"{value.shape} with data_format {data_format!r}, got {bias.shape}")
    if len(value.shape) > 2 and not is_channels_last(data_format):
        shape = [1, bias.shape[0]] + [1] * (len(value.shape) - 2)
        return op("Add", value, reshape(bias, shape), name=name)
    return op("Add", value, bias, name=name)


def _ceil_mode_pads(in_spatial, kernel, strides, pads):
    """Pads that give ceil_mode's output size without ceil_mode: the last window's
    overhang becomes end padding, which neither max nor average pooling counts."""
    nd = len(in_spatial)
    end = list(pads[nd:])
    for i, (size, k, s) in enumerate(zip(in_spatial, kernel, strides)):
        span = size + pads[i] + end[i] - k
        if span < 0:
            continue  # the shape rule reports it
        out = -(-span // s) + 1
        # NOTE: a last window that starts in the end padding (padding only) is dropped,
        # as in onnxruntime and PyTorch; OneFlow would keep it.
        if (out - 1) * s >= size + pads[i]:
            out -= 1
        end[i] += max(0, (out - 1) * s + k - (size + pads[i] + end[i]))
    return list(pads[:nd]) + end


def pooling(op_type, x, ksize, strides, padding, data_format, ceil_mode, name, ndims):
    """An N-d max or average pool in OneFlow's terms (average excludes the padding)."""
    if len(x.shape) != ndims + 2:
        raise TraceError(f"a {ndims}-D pool needs a {ndims + 2}-D input, got {x.shape}")
    check_float(x, f"a {ndims}-D pool", half=True)
    channels_last = is_channels_last(data_format)
    x = to_channels_first(x, channels_last)
    k = spatial_tuple(ksize, ndims, "ksize")
    s = spatial_tuple(strides, ndims, "strides")
    pads = resolve_padding(padding, x.shape[2:], k, s, [1] * ndims, channels_last)
    if ceil_mode and not isinstance(padding, str):
        # as OneFlow's GetWindowedOutputSize: ceil_mode counts with explicit ("customized")
        # pads only; "VALID" and "SAME" sizes are their own
        pads = _ceil_mode_pads(x.shape[2:], k, s, pads)
    attrs = dict(kernel_shape=k, strides=s, pads=pads)
    builder = current_builder(op_type)
    if op_type == "MaxPool" and not x.is_dynamic and scope.oneflow_places_on_cpu(builder):
        # OneFlow's CPU kernel gives every tied maximum the gradient (its GPU's cuDNN one)
        y = op("onnxjob.MaxPoolEveryTie", x, name=name, **attrs)
    elif op_type == "MaxPool" and builder.is_train:
        # Train graphs keep the arg-max indices: the gradient routes through them.
        y, _ = op("MaxPool", x, num_outputs=2, name=name, **attrs)
    elif op_type == "MaxPool":
        y = op("MaxPool", x, name=name, **attrs)
    else:
        y = op("AveragePool", x, name=name, count_include_pad=0, **attrs)
    return from_channels_first(y, channels_last)


_POOL_2D_FORMATS = ("NCHW", "NHWC", "NCHW_VECT_C")


def max_pool2d(input, ksize, strides, padding, data_format="NCHW", ceil_mode=False, name=None):
    """2-D max pooling (padding positions never win the max)."""
    check_format(data_format, _POOL_2D_FORMATS, "flow.nn.max_pool2d")
    return qat.int8_op("max_pool_2d", lambda x: pooling("MaxPool", x, ksize, strides, padding,
                                                        data_format, ceil_mode, name, 2), input)


def avg_pool2d(input, ksize, strides, padding, data_format="NCHW", ceil_mode=False, name=None):
    """2-D average pooling; padded positions are not counted."""
    check_format(data_format, _POOL_2D_FORMATS, "flow.nn.avg_pool2d")
    return qat.int8_op("avg_pool_2d", lambda x: pooling("AveragePool", x, ksize, strides,
                                                        padding, data_format, ceil_mode, name,
                                                        2), input)


# NOTE: OneFlow 0.5 declares max_pool1d / avg_pool1d (these signatures and defaults,
# NWC for max, NCW for avg) but raises NotImplementedError; onnxjob runs them.
def max_pool1d(input, ksize, strides, padding, data_format="NWC", name=None):
    """1-D max pooling; note OneFlow's default layout here is channels-last (NWC)."""
    check_format(data_format, ("NWC", "NCW"), "flow.nn.max_pool1d")
    return pooling("MaxPool", input, ksize, strides, padding, data_format, False, name, 1)


def avg_pool1d(input, ksize, strides, padding, data_format="NCW", name=None):
    """1-D average pooling; padded positions are not counted."""
    check_format(data_format, ("NWC", "NCW"), "flow.nn.avg_pool1d")
    return pooling("AveragePool", input, ksize, strides, padding, data_format, False, name, 1)


def max_pool3d(input, ksize, strides, padding, data_format="NCDHW", ceil_mode=False,
               name=None):
    """3-D max pooling (padding positions never win the max)."""
    check_format(data_format, ("NCDHW", "NDHWC"), "flow.nn.max_pool3d")
    return pooling("MaxPool", input, ksize, strides, padding, data_format, ceil_mode, name, 3)


def avg_pool3d(input, ksize, strides, padding, data_format="NCDHW", ceil_mode=False,
               name=None):
    """3-D average pooling; padded positions are not counted."""
    check_format(data_format, ("NCDHW", "NDHWC"), "flow.nn.avg_pool3d")
    return pooling("AveragePool", input, ksize, strides, padding, data_format, ceil_mode,
                   name, 3)


# -- convolutions of other ranks and layouts -------------------------------------------------

def conv1d(input, filters, strides, padding, data_format="NCW", dilations=None, groups=1,
           name=None):
    """1-D convolution with an explicit weight Blob: (out, in/groups, k) for NCW,
    (out, k, in) for NWC (no bias argument, as in OneFlow)."""
    check_format(data_format, ("NCW", "NWC"), "flow.nn.conv1d")
    if is_channels_last(data_format) and groups != 1:
        raise TraceError("flow.nn.conv1d: data_format NWC does not support groups > 1")
    return convolution(input, filters, strides, padding, data_format, dilations, groups, None,
                       name, 1)


def oneflow_ndhwc_pads(padding, data_format):
    """The pads OneFlow applies for a 3-D channels-last convolution given an explicit
    per-axis list [N, D, H, W, C] (nn_ops.conv3d and layers.conv3d of v0.4/v0.5): it
    transposes the input to NCDHW and swaps only entries 1 and 4, so its D, H and W take
    the pads written for H, W and D. Returned in the NDHWC order onnxjob's convolution
    reads; a trap where they differ, so said once."""
    if not is_channels_last(data_format) or not isinstance(padding, (list, tuple)) or \
            len(padding) != 5:
        return padding
    moved = [padding[0], padding[2], padding[3], padding[1], padding[4]]
    if list(moved) != list(padding):
        warn_at_user_line(
            f"conv3d with data_format='NDHWC' and padding={list(padding)}: as OneFlow, the "
            f"depth, height and width take the pads written for height, width and depth "
            f"({moved}: it swaps only the entries of axes 1 and 4 when it transposes to NCDHW)")
    return moved


def conv3d(input, filters, strides, padding, data_format="NCDHW", dilations=None, groups=1,
           name=None):
    """3-D convolution with an explicit weight Blob: (out, in/groups, kd, kh, kw) for
    NCDHW, (out, kd, kh, kw, in/groups) for NDHWC (no bias argument, as in OneFlow)."""
    check_format(data_format, ("NCDHW", "NDHWC"), "flow.nn.conv3d")
    padding = oneflow_ndhwc_pads(padding, data_format)
    return convolution(input, filters, strides, padding, data_format, dilations, groups, None,
                       name, 3)


def compat_conv2d(input, filters, strides, padding, data_format="NCHW", dilations=None,
                  groups=1, name=None):
    """2-D convolution with TensorFlow's "SAME" (= SAME_UPPER: the larger half of an odd
    padding goes last); OneFlow's `tf_conv2d`."""
    if isinstance(padding, str) and padding.upper() == "SAME":
        padding = "SAME_UPPER"
    return conv2d(input, filters, strides, padding, None, data_format, dilations, groups, name)


# -- transposed convolutions -----------------------------------------------------------------

def _one_of(first, second, names, api):
    if (first is None) == (second is None):
        raise TraceError(f"{api}: give exactly one of `{names[0]}` and `{names[1]}`")
    return first if first is not None else second


def _deconv_operands(value, filter, input, filters, data_format, dilations, api):
    """(input, weight) channels-first, the layout flag and the dilations of a deconv2d."""
    x = _one_of(value, input, ("value", "input"), api)
    w = _one_of(filter, filters, ("filter", "filters"), api)
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise TraceError(f"{api} takes a 4-D input and a 4-D weight, got {x.shape} and "
                         f"{w.shape}")
    check_format(data_format, ("NCHW", "NHWC"), api)
    check_float(x, api)
    channels_last = data_format.upper() == "NHWC"
    dils = spatial_tuple(1 if dilations is None else dilations, 2, "dilations")
    if channels_last and dils != [1, 1]:
        raise TraceError(f"{api}: dilations must be 1 when data_format is NHWC")
    # the weight is (in, out, kh, kw) for NCHW, (in, kh, kw, out) for NHWC
    return to_channels_first(x, channels_last), to_channels_first(w, channels_last), \
        channels_last, dils


def _deconv_strides(strides, api):
    if strides is None:
        raise TraceError(f"{api}: strides must be an int or a list of 2 ints")
    return spatial_tuple(strides, 2, "strides")


def conv_transpose(x, w, strides, pads, output_padding, dilations, name):
    """A transposed convolution of channels-first x with weight (in, out, *kernel),
    emitted as one ONNX ConvTranspose with explicit pads."""
    return op("ConvTranspose", x, w, strides=list(strides), pads=list(pads),
              dilations=list(dilations), kernel_shape=list(w.shape[2:]),
              output_padding=list(output_padding) if any(output_padding) else None, name=name)


def conv2d_transpose(value=None, filter=None, output_shape=None, strides=None, padding="VALID",
                     data_format="NCHW", name=None, input=None, filters=None, dilations=None):
    """2-D transposed convolution to `output_shape` (OneFlow's `deconv2d`): the output
    positions [pad_before, pad_before + output size) of the full transposed convolution,
    "VALID" with no padding (the output may be up to stride-1 longer than the full one),
    "SAME" with the input size = ceil(output size / stride), the smaller half of the
    padding first. The weight is (in, out, kh, kw) for NCHW, (in, kh, kw, out) for NHWC."""
    api = "flow.nn.conv2d_transpose"
    x, w, channels_last, dils = _deconv_operands(value, filter, input, filters, data_format,
                                                 dilations, api)
    strides = _deconv_strides(strides, api)
    if output_shape is None or len(output_shape) != 4:
        raise TraceError(f"{api}: output_shape must be the 4 ints of the output's shape, "
                         f"got {output_shape!r}")
    out_hw = output_shape[1:3] if channels_last else output_shape[2:4]
    # NOTE: OneFlow asserts that output_shape's channel entry equals the weight's output
    # channels, but only uses its batch and spatial entries; OneFlow-Benchmark's DCGAN
    # (Generative/layers.py) passes the input's channel count there, so that entry is not
    # checked: the weight decides the output channels.
    if output_shape[0] != x.shape[0]:
        raise TraceError(f"{api}: output_shape {list(output_shape)} must have the input's "
                         f"batch {x.shape[0]}")
    if not isinstance(padding, str) or padding.upper() not in ("VALID", "SAME"):
        raise TraceError(f'{api}: padding must be "SAME" or "VALID", got {padding!r}')
    begin, end, out_pad = [], [], []
    for size, out, k, s, d in zip(x.shape[2:], out_hw, w.shape[2:], strides, dils):
        effective = (k - 1) * d + 1
        full = (size - 1) * s + effective
        if padding.upper() == "VALID":
            fits, needed = (out + s - effective) // s == size, 0
        else:
            fits, needed = (out + s - 1) // s == size, max(0, full - out)
        if not fits:
            raise TraceError(f"{api}: output size {out} does not fit input size {size} with "
                             f"kernel {k}, stride {s} and {padding} padding")
        begin.append(needed // 2)
        end.append(needed - needed // 2)
        out_pad.append(out - (full - needed))
    y = conv_transpose(x, w, strides, begin + end, out_pad, dils, name)
    return from_channels_first(y, channels_last)


def torch_conv2d_transpose(value=None, filter=None, output_padding=None, strides=None,
                           padding_needed=None, data_format="NCHW", name=None, input=None,
                           filters=None, dilations=None):
    """2-D transposed convolution in PyTorch's terms (OneFlow's `deconv2d_torch`): each
    even `padding_needed` is cropped half before and half after, `output_padding` rows
    are added at the end."""
    api = "flow.nn.torch_conv2d_transpose"
    x, w, channels_last, dils = _deconv_operands(value, filter, input, filters, data_format,
                                                 dilations, api)
    strides = _deconv_strides(strides, api)
    if padding_needed is None or len(padding_needed) != 2 or any(p % 2 for p in padding_needed):
        raise TraceError(f"{api}: padding_needed must be 2 even ints, got {padding_needed!r}")
    half = [int(p) // 2 for p in padding_needed]
    out_pad = [0, 0] if output_padding is None else spatial_tuple(output_padding, 2,
                                                                   "output_padding")
    y = conv_transpose(x, w, strides, half + half, out_pad, dils, name)
    return from_channels_first(y, channels_last)


# -- rearranging and resizing ----------------------------------------------------------------

def PixelShufflev2(input, h_upscale_factor, w_upscale_factor, name=None):
    """(N, C*h*w, H, W) -> (N, C, H*h, W*w): channel c*h*w + i*w + j goes to row offset i,
    column offset j (sub-pixel convolution)."""
    if h_upscale_factor <= 0 or w_upscale_factor <= 0:
        raise TraceError("flow.nn.PixelShufflev2: the upscale factors must be > 0")
    if len(input.shape) != 4 or input.shape[1] % (h_upscale_factor * w_upscale_factor):
        raise TraceError(f"flow.nn.PixelShufflev2 takes an (N, C, H, W) input with C "
                         f"divisible by {h_upscale_factor * w_upscale_factor}, got "
                         f"{input.shape}")
    if h_upscale_factor == w_upscale_factor:
        return op("DepthToSpace", input, blocksize=int(h_upscale_factor), mode="CRD",
                  name=name)
    n, c, h, w = input.shape
    c //= h_upscale_factor * w_upscale_factor
    split = reshape(input, [n, c, h_upscale_factor, w_upscale_factor, h, w])
    moved = transpose(split, [0, 1, 4, 2, 5, 3])
    return reshape(moved, [n, c, h * h_upscale_factor, w * w_upscale_factor], name=name)


def PixelShuffle(input, upscale_factor, name=None):
    """(N, C*r*r, H, W) -> (N, C, H*r, W*r) (OneFlow's `pixel_shuffle`)."""
    return PixelShufflev2(input, upscale_factor, upscale_factor, name=name)


@two_generations(("x", "size", "data_format", "interpolation", "name"), positional_is(2, str))
def upsample(x, size=(2, 2), align_corners=False, data_format="NCHW", interpolation="nearest",
             name="Upsample2D"):
    """Upsampling of H and W by the factors `size` (OneFlow's flow.layers.upsample_2d):
    output size int(factor * input size); "nearest" takes input floor(out / factor),
    "bilinear" interpolates at (out + 0.5) / factor - 0.5 clamped to >= 0, or at
    out * (in - 1) / (out_size - 1) with align_corners. OneFlow <= 0.4's order (no
    align_corners) is accepted too, told apart by a string third argument."""
    api = "flow.layers.upsample_2d"
    if isinstance(size, (int, float)):
        scales = [float(size)] * 2
    elif isinstance(size, (list, tuple)) and len(size) == 2:
        scales = [float(v) for v in size]
    else:
        raise TraceError(f"{api}: size must be an int or 2 ints, got {size!r}")
    if interpolation not in ("nearest", "bilinear"):
        raise TraceError(f'{api}: interpolation must be "nearest" or "bilinear", got '
                         f'{interpolation!r}')
    if interpolation == "nearest" and align_corners:
        raise TraceError(f'{api}: interpolation "nearest" does not support align_corners')
    check_format(data_format, ("NCHW", "NHWC"), api)
    if len(x.shape) != 4:
        raise TraceError(f"{api} takes a 4-D input, got {x.shape}")
    check_float(x, api)
    channels_last = is_channels_last(data_format)
    x = to_channels_first(x, channels_last)
    if interpolation == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
    else:
        attrs = dict(mode="linear", coordinate_transformation_mode="align_corners"
                     if align_corners else "half_pixel")
    scales = as_blob(np.array([1.0, 1.0] + scales, np.float32), like=x, dtype=np.float32)
    y = op("Resize", x, None, scales, name=name, **attrs)
    return from_channels_first(y, channels_last)
