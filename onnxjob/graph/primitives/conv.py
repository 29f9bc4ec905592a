"""Conv and ConvTranspose: shape and gradient rules (the weight gradient's formulations
are in conv_weight_grad.py).

Channels first, 1-3 spatial axes, explicit pads (windows.py). onnxruntime's CPU kernels
for Conv and ConvTranspose take float32 only, OneFlow's take float64 too: float64 nodes
are lowered to exact float64 formulations (window Gathers and MatMuls), whose gradients
come from their parts.
"""
import numpy as np

from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.primitives.conv_weight_grad import conv_weight_grad, weight_grad
from onnxjob.graph.primitives.windows import (
    checked_lowering, flipped_transposed, gather_windows, geometry, pad_or_crop, pad_spatial,
    spatial_axes, text, window_out)
from onnxjob.graph.registry import register
from onnxjob.graph.tracer import int64_constant, op


# -- Conv -------------------------------------------------------------------------------

def _check_operands(x, w, op_type, weight_layout):
    """x (N, C, *spatial) and a weight of the same rank and dtype; returns the spatial rank."""
    nd = len(x.shape) - 2
    if nd < 1 or len(w.shape) != nd + 2:
        raise ValueError(f"{op_type} takes an (N, C, *spatial) input and a {weight_layout} "
                         "weight of the same rank")
    if w.np_dtype != x.np_dtype:
        raise ValueError(f"the weight's dtype {w.np_dtype} differs from the input's "
                         f"{x.np_dtype}")
    return nd


def _conv_infer(inputs, attrs, num_outputs):
    x, w = inputs[:2]
    nd = _check_operands(x, w, "Conv", "(M, C/group, *kernel)")
    group = int(attrs.get("group", 1))
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise ValueError(f"input has {x.shape[1]} channels but the weight {w.shape} with "
                         f"group {group} expects {w.shape[1] * group}")
    strides, dil, pads = geometry(attrs, x)
    out = [window_out(x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], pads[i],
                       pads[nd + i]) for i in range(nd)]
    if len(inputs) > 2 and inputs[2] is not None and inputs[2].shape != (w.shape[0],):
        raise ValueError(f"bias shape {inputs[2].shape} != ({w.shape[0]},)")
    return [((x.shape[0], w.shape[0], *out), x.np_dtype)]


def conv_input_grad(gy, w, x_shape, strides, dil, pads, group):
    """dL/dx of a Conv: the ConvTranspose of gy with the same weight.

    For stride 1 that equals a plain Conv of gy with the kernel flipped and its channel
    axes swapped (within each group), which onnxruntime's CPU kernels run faster, unless
    dx has few channels and the kernel is wider than 1x1: the Conv's Gemm then has only
    C rows. Measured (ms, Conv vs ConvTranspose, 2 threads): 64 -> 32 channels 5x5 at
    100x14x14: 22.6 / 19.6; 64 -> 16: 18.6 / 11.3; 64 -> 32 3x3 at 8x28x28: 2.44 / 2.35;
    128 -> 128 3x3: 12.6 / 13.9; 1x1 kernels: Conv faster at every width tried.
    """
    nd = len(x_shape) - 2
    full = [dil[i] * (w.shape[2 + i] - 1) for i in range(nd)]
    conv_pads = [full[i] - pads[i] for i in range(nd)] + \
        [full[i] - pads[nd + i] for i in range(nd)]
    few_channels = group == 1 and w.shape[1] <= 32 and int(np.prod(w.shape[2:])) > 1
    if all(s == 1 for s in strides) and min(conv_pads) >= 0 and not few_channels:
        return op("Conv", gy, flipped_transposed(w, group), pads=conv_pads,
                  dilations=list(dil), strides=[1] * nd, group=group)
    out_pad = []
    for i in range(nd):
        natural = strides[i] * (gy.shape[2 + i] - 1) + full[i] + 1 - pads[i] - pads[nd + i]
        out_pad.append(x_shape[2 + i] - natural)
    return op("ConvTranspose", gy, w, strides=list(strides), dilations=list(dil),
              pads=list(pads), group=group, output_padding=out_pad if any(out_pad) else None)


def _dynamic_input_grad(gy, w, x, strides, dil, pads, group):
    """dL/dx of a Conv whose x is known at run time only (a mirrored blob fed smaller than
    its placeholder): the ConvTranspose without cropping its end (its end pads and
    output_padding, fixed from the placeholder's sizes, would be wrong for the run's),
    then padded or cut at the end of each spatial axis to x's run-time size: the rows
    past it are the forward's end padding, the rows missing are the ones no window
    reached (a negative Pad crops)."""
    nd = len(x.shape) - 2
    dx = op("ConvTranspose", gy, w, strides=list(strides), dilations=list(dil),
            pads=list(pads[:nd]) + [0] * nd, group=group)
    missing = op("Sub", op("Shape", x, start=2), op("Shape", dx, start=2))
    zeros = int64_constant(gy, [0] * (nd + 2))
    return op("Pad", dx, op("Concat", zeros, int64_constant(gy, [0, 0]), missing, axis=0))


def _dynamic_weight_grad(x, gy, w_shape, strides, dil, pads, group):
    """dL/dW of a Conv whose x is known at run time only: the batch-transposed Conv
    (conv_weight_grad.conv_weight_grad), which takes any run-time size, per group."""
    if group == 1:
        return conv_weight_grad(x, gy, w_shape, strides, dil, pads)
    per_group = (w_shape[0] // group,) + tuple(w_shape[1:])
    xs = op("Split", x, int64_constant(x, [x.shape[1] // group] * group), axis=1,
            num_outputs=group)
    gys = op("Split", gy, int64_constant(gy, [per_group[0]] * group), axis=1,
             num_outputs=group)
    return op("Concat", *(conv_weight_grad(xi, gi, per_group, strides, dil, pads)
                          for xi, gi in zip(xs, gys)), axis=0)


def _conv_grad(n, g, need):
    x, w = n.inputs[:2]
    strides, dil, pads = geometry(n.attrs, x)
    group = int(n.attrs.get("group", 1))
    gy = g[0]
    if x.is_dynamic or gy.is_dynamic:     # sizes known at run time only
        grads = [_dynamic_input_grad(gy, w, x, strides, dil, pads, group) if need[0]
                 else None,
                 _dynamic_weight_grad(x, gy, w.shape, strides, dil, pads, group) if need[1]
                 else None]
    else:
        grads = [conv_input_grad(gy, w, x.shape, strides, dil, pads, group)
                 if need[0] else None,
                 weight_grad(x, gy, w.shape, strides, dil, pads, group) if need[1] else None]
    if len(n.inputs) > 2:
        grads.append(op("ReduceSum", gy, int64_constant(gy, [0] + spatial_axes(len(x.shape))),
                        keepdims=0) if need[2] else None)
    return grads


def _add_channel_bias(y, bias):
    if bias is None:
        return y
    return op("Add", y, reshape_to(bias, [1, bias.shape[0]] + [1] * (len(y.shape) - 2)))


def _conv_float64(inputs, attrs, num_outputs):
    """Conv as window Gather + MatMul: (g, M/g, C/g*K) x (N, g, C/g*K, Q)."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    nd = len(x.shape) - 2
    strides, dil, pads = geometry(attrs, x)
    group = int(attrs.get("group", 1))
    (out_shape, _), = _conv_infer(inputs, attrs, num_outputs)
    n, c, m, kernel = x.shape[0], x.shape[1], w.shape[0], list(w.shape[2:])
    xp = pad_spatial(x, pads[:nd], pads[nd:])
    padded = list(xp.shape[2:])
    flat = reshape_to(xp, [n, c, int(np.prod(padded))])
    cols = gather_windows(flat, padded, kernel, out_shape[2:], strides, dil, axis=2)
    k, q = int(np.prod(kernel)), int(np.prod(out_shape[2:]))
    cols = reshape_to(cols, [n, group, c // group * k, q])
    wm = reshape_to(w, [group, m // group, c // group * k])
    y = reshape_to(op("MatMul", wm, cols), out_shape)
    return [_add_channel_bias(y, bias)]


register("Conv", _conv_infer, _conv_grad,
         lower=checked_lowering("Conv", _conv_infer, _conv_float64))


# -- ConvTranspose ------------------------------------------------------------------------

def _conv_transpose_geometry(attrs, x, w):
    """(strides, dilations, pads, output_padding, output spatial shape) of a ConvTranspose,
    with pads derived from `output_shape` / `auto_pad` as the ONNX spec says."""
    nd = len(x.shape) - 2
    strides = [int(v) for v in attrs.get("strides", [1] * nd)]
    dil = [int(v) for v in attrs.get("dilations", [1] * nd)]
    pads = [int(v) for v in attrs.get("pads", [0] * (2 * nd))]
    out_pad = [int(v) for v in attrs.get("output_padding", [0] * nd)]
    if not len(strides) == len(dil) == len(out_pad) == nd or len(pads) != 2 * nd:
        raise ValueError(f"strides, dilations, output_padding and pads must have {nd}, {nd}, "
                         f"{nd} and {2 * nd} entries for a {nd + 2}-D input")
    # NOTE: ONNX allows output_padding < max(stride, dilation), onnxruntime only < stride.
    if any(p < 0 or p >= s for p, s in zip(out_pad, strides)):
        raise ValueError(f"output_padding {out_pad} must be >= 0 and less than the strides "
                         f"{strides}")
    natural = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + dil[i] * (w.shape[2 + i] - 1)
               + 1 for i in range(nd)]
    auto_pad = text(attrs.get("auto_pad", "NOTSET"))
    if auto_pad != "NOTSET" and "pads" in attrs:
        raise ValueError("pads cannot be given together with auto_pad")
    target = attrs.get("output_shape")
    if target is None and auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [x.shape[2 + i] * strides[i] for i in range(nd)]
    if target is not None:
        target = [int(v) for v in target][-nd:]
        total = [natural[i] - target[i] for i in range(nd)]
        if min(total) < 0:
            raise ValueError(f"output_shape {target} is larger than the full transposed "
                             f"convolution {natural}")
        upper = auto_pad == "SAME_UPPER"
        pads = ([t // 2 if upper else t - t // 2 for t in total]
                + [t - t // 2 if upper else t // 2 for t in total])
    elif auto_pad == "VALID":
        pads = [0] * (2 * nd)
    out = [natural[i] - pads[i] - pads[nd + i] for i in range(nd)]
    if min(out) < 1:
        raise ValueError(f"pads {pads} leave an empty output")
    return strides, dil, pads, out_pad, out


def _conv_transpose_infer(inputs, attrs, num_outputs):
    x, w = inputs[:2]
    _check_operands(x, w, "ConvTranspose", "(C, M/group, *kernel)")
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"input has {x.shape[1]} channels but the weight {w.shape} expects "
                         f"{w.shape[0]}")
    group = int(attrs.get("group", 1))
    *_, out = _conv_transpose_geometry(attrs, x, w)
    m = w.shape[1] * group
    if len(inputs) > 2 and inputs[2] is not None and inputs[2].shape != (m,):
        raise ValueError(f"bias shape {inputs[2].shape} != ({m},)")
    return [((x.shape[0], m, *out), x.np_dtype)]


def _conv_transpose_grad(n, g, need):
    """ConvTranspose is the adjoint of a Conv with the same weight: its input gradient
    is that Conv of gy, its weight gradient that Conv's weight gradient with the roles of
    input and output swapped."""
    x, w = n.inputs[:2]
    strides, dil, pads, _, _ = _conv_transpose_geometry(n.attrs, x, w)
    group = int(n.attrs.get("group", 1))
    gy = g[0]
    nd = len(x.shape) - 2
    # output_padding < stride: the Conv of gy has exactly x's shape
    # (sizes known at run time only: the weight gradient that does not build windows)
    weight_grad_of = _dynamic_weight_grad if x.is_dynamic or gy.is_dynamic else weight_grad
    grads = [op("Conv", gy, w, strides=strides, dilations=dil, pads=pads, group=group)
             if need[0] else None,
             weight_grad_of(gy, x, w.shape, strides, dil, pads, group) if need[1] else None]
    if len(n.inputs) > 2:
        grads.append(op("ReduceSum", gy, int64_constant(gy, [0] + spatial_axes(nd + 2)),
                        keepdims=0) if need[2] else None)
    return grads


def _dilate(x, strides):
    """Insert strides-1 zeros after every spatial element: (N, C, *((S - 1) * s + 1))."""
    if all(s == 1 for s in strides):
        return x
    n, c, spatial = x.shape[0], x.shape[1], list(x.shape[2:])
    nd = len(spatial)
    spread = reshape_to(x, [n, c] + [d for size in spatial for d in (size, 1)])
    ends = [0, 0] + [d for s in strides for d in (0, s - 1)]
    spread = op("Pad", spread, int64_constant(spread, [0] * (2 * nd + 2) + ends))
    spread = reshape_to(spread, [n, c] + [size * s for size, s in zip(spatial, strides)])
    return pad_or_crop(spread, [0] * nd, [1 - s for s in strides])


def _conv_transpose_float64(inputs, attrs, num_outputs):
    """ConvTranspose as a stride-1 Conv of the zero-dilated, padded input with the flipped
    kernel (itself lowered to float64 Gather + MatMul)."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    strides, dil, pads, out_pad, _ = _conv_transpose_geometry(attrs, x, w)
    group = int(attrs.get("group", 1))
    nd = len(x.shape) - 2
    full = [dil[i] * (w.shape[2 + i] - 1) for i in range(nd)]
    spread = pad_or_crop(_dilate(x, strides), [full[i] - pads[i] for i in range(nd)],
                          [full[i] - pads[nd + i] + out_pad[i] for i in range(nd)])
    y = op("Conv", spread, flipped_transposed(w, group), dilations=dil, group=group)
    return [_add_channel_bias(y, bias)]


register("ConvTranspose", _conv_transpose_infer, _conv_transpose_grad,
         lower=checked_lowering("ConvTranspose", _conv_transpose_infer,
                                 _conv_transpose_float64))
