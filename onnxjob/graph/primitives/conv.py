"""Convolution and pooling: shape rules and gradient rules.

Pads are always explicit `[top, left, bottom, right]` here: the API layer resolves
OneFlow's "SAME" (= SAME_LOWER) and "VALID" before emitting.
"""
import os

import numpy as np

from onnxjob.graph.registry import const_value, register
from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.graph.primitives.shape_ops import reshape_to


def _window_out(size, k, s, d, p0, p1, ceil_mode=False):
    span = (size + p0 + p1 - d * (k - 1) - 1)
    if span < 0:
        raise ValueError(f"window {k} (dilation {d}) is larger than the padded input "
                         f"{size + p0 + p1}")
    out = (-(-span // s) if ceil_mode else span // s) + 1
    return out


def _spatial(attrs, x, kernel):
    nd = len(x.shape) - 2
    strides = attrs.get("strides", [1] * nd)
    dil = attrs.get("dilations", [1] * nd)
    pads = attrs.get("pads", [0] * (2 * nd))
    return strides, dil, pads


def _conv_infer(inputs, attrs, num_outputs):
    x, w = inputs[:2]
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ValueError("conv2d takes 4-D input (N, C, H, W) and 4-D weight")
    group = attrs.get("group", 1)
    if x.shape[1] != w.shape[1] * group:
        raise ValueError(f"input has {x.shape[1]} channels but the weight {w.shape} expects "
                         f"{w.shape[1] * group}")
    strides, dil, pads = _spatial(attrs, x, w.shape[2:])
    hw = [_window_out(x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], pads[i], pads[i + 2])
          for i in range(2)]
    if len(inputs) > 2 and inputs[2] is not None and inputs[2].shape != (w.shape[0],):
        raise ValueError(f"bias shape {inputs[2].shape} != ({w.shape[0]},)")
    return [((x.shape[0], w.shape[0], *hw), x.np_dtype)]


def conv_input_grad(gy, w, x_shape, strides, dil, pads, group):
    """dL/dx of a Conv: the ConvTranspose of gy with the same weight.

    For stride 1 and group 1 that equals a plain Conv of gy with the kernel flipped and
    its channel axes swapped, which onnxruntime's CPU kernels run faster.
    """
    full = [dil[i] * (w.shape[2 + i] - 1) for i in range(2)]
    conv_pads = [full[0] - pads[0], full[1] - pads[1], full[0] - pads[2], full[1] - pads[3]]
    if list(strides) == [1, 1] and group == 1 and min(conv_pads) >= 0:
        flipped = op("Slice", w, *(int64_constant(w, v) for v in (
            [-1, -1], [np.iinfo(np.int64).min] * 2, [2, 3], [-1, -1])))
        kernel = op("Transpose", flipped, perm=[1, 0, 2, 3])
        return op("Conv", gy, kernel, pads=conv_pads, dilations=list(dil), strides=[1, 1])
    out_pad = []
    for i in range(2):
        natural = strides[i] * (gy.shape[2 + i] - 1) + dil[i] * (w.shape[2 + i] - 1) + 1 \
            - pads[i] - pads[i + 2]
        out_pad.append(x_shape[2 + i] - natural)
    return op("ConvTranspose", gy, w, strides=strides, dilations=dil, pads=pads, group=group,
              output_padding=out_pad if any(out_pad) else None)


def conv_weight_grad(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a Conv with group 1: a Conv over batch-transposed tensors.

    x^T (C, N, H, W) convolved with gy^T (M, N, Ho, Wo) as the kernel, stride and
    dilation swapped, gives (C, M, kh', kw') with kh' >= kh; the extra rows come from
    input rows no output window used and are cut off.
    """
    xt = op("Transpose", x, perm=[1, 0, 2, 3])
    gt = op("Transpose", gy, perm=[1, 0, 2, 3])
    gw = op("Conv", xt, gt, strides=dil, dilations=strides, pads=pads)
    if gw.shape[2:] != tuple(w_shape[2:]):
        gw = op("Slice", gw, *(int64_constant(gw, v) for v in ([0, 0], list(w_shape[2:]), [2, 3])))
    return op("Transpose", gw, perm=[1, 0, 2, 3])


def conv_weight_grad_im2col(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a Conv with group 1 as one Gemm over explicit im2col columns.

    The columns are built from x^T (C, N, H, W): one strided Slice per kernel offset,
    each (C, N, Ho, Wo), concatenated to (C*kh*kw, N*Ho*Wo); gy^T is (M, N*Ho*Wo); so the
    sum over the batch happens inside the Gemm's K dimension and nothing large is
    transposed.
    """
    c, kh, kw = w_shape[1], w_shape[2], w_shape[3]
    n, m, ho, wo = gy.shape
    xt = op("Transpose", x, perm=[1, 0, 2, 3])
    if any(pads):
        xt = op("Pad", xt, int64_constant(xt, [0, 0, pads[0], pads[1], 0, 0, pads[2], pads[3]]))
    cols = []
    for i in range(kh):
        for j in range(kw):
            top, left = i * dil[0], j * dil[1]
            patch = op("Slice", xt, int64_constant(xt, [top, left]),
                       int64_constant(xt, [top + strides[0] * (ho - 1) + 1,
                                           left + strides[1] * (wo - 1) + 1]),
                       int64_constant(xt, [2, 3]), int64_constant(xt, strides))
            cols.append(patch)
    # (C, kh*kw*N, Ho, Wo) has the memory layout of (C*kh*kw, N*Ho*Wo): no per-patch reshape
    columns = reshape_to(op("Concat", *cols, axis=1), [c * kh * kw, n * ho * wo])
    gy_t = reshape_to(op("Transpose", gy, perm=[1, 0, 2, 3]), [m, n * ho * wo])
    return reshape_to(op("Gemm", gy_t, columns, transB=1), w_shape)


def conv_weight_grad_gather(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a Conv with group 1 as one Gemm over im2col columns built by one Gather.

    With x batch-last and flattened, (C, Hp*Wp, N), the columns of kernel offset (i, j)
    and output pixel (h, w) are the rows at (h*s + i*d) * Wp + (w*s + j*d): one Gather
    with a constant (kh*kw, Ho*Wo) index gives (C, kh*kw, Ho*Wo, N) = (C*kh*kw, Ho*Wo*N),
    copying runs of N values, with no per-offset Slice and no Concat. gy batch-last is
    (M, Ho*Wo*N), so the Gemm sums over pixels and images at once and its (M, C*kh*kw)
    result is already the weight's layout.
    """
    m, c, kh, kw = w_shape
    n, _, ho, wo = gy.shape
    xt = op("Transpose", x, perm=[1, 2, 3, 0])
    if any(pads):
        xt = op("Pad", xt, int64_constant(xt, [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]))
    hp, wp = xt.shape[1], xt.shape[2]
    rows = np.arange(kh)[:, None] * dil[0] + np.arange(ho)[None, :] * strides[0]  # (kh, Ho)
    cols = np.arange(kw)[:, None] * dil[1] + np.arange(wo)[None, :] * strides[1]  # (kw, Wo)
    index = rows[:, None, :, None] * wp + cols[None, :, None, :]                  # (kh, kw, Ho, Wo)
    index = index.reshape(kh * kw, ho * wo).astype(np.int32 if hp * wp < 2 ** 31 else np.int64)
    index = as_blob(index, like=xt, dtype=index.dtype)
    patches = op("Gather", reshape_to(xt, [c, hp * wp, n]), index, axis=1)
    columns = reshape_to(patches, [c * kh * kw, ho * wo * n])
    gy_t = reshape_to(op("Transpose", gy, perm=[1, 2, 3, 0]), [m, ho * wo * n])
    return reshape_to(op("Gemm", gy_t, columns, transB=1), w_shape)


def _conv_grad(n, g, need):
    x, w = n.inputs[:2]
    strides, dil, pads = _spatial(n.attrs, x, w.shape[2:])
    group = n.attrs.get("group", 1)
    gy = g[0]
    gx = conv_input_grad(gy, w, x.shape, strides, dil, pads, group) if need[0] else None
    gw = None
    if need[1]:
        if group != 1:
            raise NotImplementedError("weight gradient of a grouped convolution")
        gw = _WEIGHT_GRAD[_weight_grad_choice()](x, gy, w.shape, strides, dil, pads)
    grads = [gx, gw]
    if len(n.inputs) > 2:
        grads.append(op("ReduceSum", gy, int64_constant(gy, [0, 2, 3]), keepdims=0)
                     if need[2] else None)
    return grads


_WEIGHT_GRAD = {"gather": conv_weight_grad_gather, "im2col": conv_weight_grad_im2col,
                "conv": conv_weight_grad}


def _weight_grad_choice():
    # NOTE: on the doc LeNet train step (2 threads) the Gather columns measured 87 ms
    # against 97 ms for the per-offset Slice + Concat columns (im2col) and ~140 ms for the
    # batch-transposed Conv; ONNXJOB_CONV_WGRAD=im2col|conv selects the others.
    choice = os.environ.get("ONNXJOB_CONV_WGRAD", "gather")
    if choice not in _WEIGHT_GRAD:
        raise ValueError(f"ONNXJOB_CONV_WGRAD must be one of {sorted(_WEIGHT_GRAD)}, "
                         f"got {choice!r}")
    return choice


register("Conv", _conv_infer, _conv_grad)


def _conv_transpose_infer(inputs, attrs, num_outputs):
    x, w = inputs[:2]
    strides, dil, pads = _spatial(attrs, x, w.shape[2:])
    out_pad = attrs.get("output_padding", [0, 0])
    group = attrs.get("group", 1)
    hw = [strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + dil[i] * (w.shape[2 + i] - 1) + 1
          - pads[i] - pads[i + 2] for i in range(2)]
    return [((x.shape[0], w.shape[1] * group, *hw), x.np_dtype)]


register("ConvTranspose", _conv_transpose_infer, None)


def _pool_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    if len(x.shape) != 4:
        raise ValueError("pool2d takes a 4-D input (N, C, H, W)")
    k = attrs["kernel_shape"]
    strides, dil, pads = _spatial(attrs, x, k)
    hw = [_window_out(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + 2],
                      attrs.get("ceil_mode", 0)) for i in range(2)]
    shape = (x.shape[0], x.shape[1], *hw)
    outs = [(shape, x.np_dtype)]
    if num_outputs > 1:
        outs.append((shape, np.dtype(np.int64)))
    return outs


def _max_pool_grad(n, g, need):
    """Route gy to the arg-max positions recorded in MaxPool's Indices output."""
    if len(n.outputs) < 2:
        raise NotImplementedError("MaxPool without its Indices output has no gradient rule")
    x = n.inputs[0]
    y, idx = n.outputs
    k = n.attrs["kernel_shape"]
    strides, dil, pads = _spatial(n.attrs, x, k)
    non_overlapping = list(strides) == list(k) and not any(pads) and list(dil) == [1, 1]
    if non_overlapping and not n.attrs.get("ceil_mode", 0):
        # NOTE: MaxUnpool measured as fast as ScatterElements with 8 fewer nodes; it
        # overwrites rather than adds, which is exact only when windows do not overlap.
        return [op("MaxUnpool", g[0], idx, int64_constant(g[0], x.shape), kernel_shape=k,
                   strides=strides)]
    size = int(np.prod(x.shape))
    zeros = op("ConstantOfShape", int64_constant(g[0], [size]), value=np.zeros(1, x.np_dtype))
    flat = op("ScatterElements", zeros, reshape_to(idx, [int(np.prod(idx.shape))]),
              reshape_to(g[0], [int(np.prod(y.shape))]), axis=0, reduction="add")
    return [reshape_to(flat, x.shape)]


register("MaxPool", _pool_infer, _max_pool_grad)


def _max_unpool_infer(inputs, attrs, num_outputs):
    return [(tuple(int(d) for d in const_value(inputs[2])), inputs[0].np_dtype)]


register("MaxUnpool", _max_unpool_infer, None)


def _avg_pool_counts(x_shape, k, strides, pads, count_include_pad):
    """How many input elements each output window averages (static shapes)."""
    ones = np.ones(x_shape[2:], np.float64)
    padded = np.pad(ones, ((pads[0], pads[2]), (pads[1], pads[3])),
                    constant_values=1.0 if count_include_pad else 0.0)
    ho = (padded.shape[0] - k[0]) // strides[0] + 1
    wo = (padded.shape[1] - k[1]) // strides[1] + 1
    counts = np.empty((ho, wo))
    for i in range(ho):
        for j in range(wo):
            counts[i, j] = padded[i * strides[0]:i * strides[0] + k[0],
                                  j * strides[1]:j * strides[1] + k[1]].sum()
    return counts


def _avg_pool_grad(n, g, need):
    """Spread gy / count over each window: a per-channel ConvTranspose with a ones kernel."""
    x = n.inputs[0]
    k = n.attrs["kernel_shape"]
    strides, _, pads = _spatial(n.attrs, x, k)
    if n.attrs.get("ceil_mode", 0):
        raise NotImplementedError("gradient of AveragePool with ceil_mode")
    counts = _avg_pool_counts(x.shape, k, strides, pads, n.attrs.get("count_include_pad", 0))
    gy = g[0]
    if np.all(counts == counts.flat[0]):
        scaled = op("Mul", gy, as_blob(1.0 / counts.flat[0], like=gy))
    else:
        scaled = op("Div", gy, as_blob(counts.astype(x.np_dtype), like=gy))
    nc = x.shape[0] * x.shape[1]
    per_channel = reshape_to(scaled, [nc, 1, *gy.shape[2:]])
    kernel = as_blob(np.ones((1, 1, *k), x.np_dtype), like=gy)
    spread = conv_input_grad(per_channel, kernel, (nc, 1, *x.shape[2:]), strides, [1, 1], pads, 1)
    return [reshape_to(spread, x.shape)]


register("AveragePool", _pool_infer, _avg_pool_grad)


def _global_avg_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    return [(x.shape[:2] + (1,) * (len(x.shape) - 2), x.np_dtype)]


def _global_avg_grad(n, g, need):
    x = n.inputs[0]
    count = int(np.prod(x.shape[2:]))
    scaled = op("Mul", g[0], as_blob(1.0 / count, like=g[0]))
    return [op("Expand", scaled, int64_constant(scaled, x.shape))]


register("GlobalAveragePool", _global_avg_infer, _global_avg_grad)
