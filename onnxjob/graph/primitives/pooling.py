"""Pooling: MaxPool (gradient through its Indices), MaxUnpool, AveragePool and
GlobalAveragePool; shape and gradient rules, float64 lowerings where onnxruntime's CPU
kernels take float32 only."""
import itertools

import numpy as np

from onnxjob.graph.primitives.elementwise import cast
from onnxjob.graph.primitives.reductions import run_time_count
from onnxjob.graph.primitives.shape_ops import (
    flat, reshape_back, reshape_to, shape_of, zeros_of)
from onnxjob.graph.primitives.conv import conv_input_grad
from onnxjob.graph.primitives.windows import (
    checked_lowering, gather_windows, geometry, pad_or_crop, pad_spatial, spatial_axes,
    window_index, window_out)
from onnxjob.graph.registry import register, register_composite, static_value
from onnxjob.graph.tracer import as_blob, int64_constant, op


# -- pooling ------------------------------------------------------------------------------

def _pool_geometry(attrs, x):
    """(kernel, strides, dilations, pads, output spatial shape) of a MaxPool or AveragePool."""
    k = [int(v) for v in attrs["kernel_shape"]]
    if len(x.shape) != len(k) + 2:
        raise ValueError(f"a {len(k)}-D pool takes a {len(k) + 2}-D input (N, C, *spatial)")
    strides, dil, pads = geometry(attrs, x)
    nd = len(k)
    out = [window_out(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[nd + i],
                       attrs.get("ceil_mode", 0)) for i in range(nd)]
    return k, strides, dil, pads, out


def _pool_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    *_, out = _pool_geometry(attrs, x)
    shape = (x.shape[0], x.shape[1], *out)
    outs = [(shape, x.np_dtype)]
    if num_outputs > 1:
        outs.append((shape, np.dtype(np.int64)))
    return outs


def _max_pool_grad(n, g, need):
    """Route gy to the arg-max positions recorded in MaxPool's Indices output (a pool
    traced without it, before minimize() made its job a train job, pools again for them)."""
    x = n.inputs[0]
    if len(n.outputs) > 1:
        idx = n.outputs[1]
    else:
        _, idx = op("MaxPool", x, num_outputs=2, **n.attrs)
    k, strides, dil, pads, _ = _pool_geometry(n.attrs, x)
    non_overlapping = strides == k and not any(pads) and all(d == 1 for d in dil)
    if non_overlapping and not n.attrs.get("ceil_mode", 0) and x.np_dtype == np.float32:
        # NOTE: MaxUnpool measured as fast as ScatterElements with 8 fewer nodes; it
        # overwrites rather than adds, which is exact only when windows do not overlap.
        return [op("MaxUnpool", g[0], idx, shape_of(x), kernel_shape=k, strides=strides)]
    if x.np_dtype == np.float32:    # onnxruntime's MaxUnpool takes float32 only
        zeros = flat(_zeros_at_run_time(x, idx, k, strides))
    else:
        zeros = flat(zeros_of(x, x.shape, x.np_dtype))
    scattered = op("ScatterElements", zeros, flat(idx), flat(g[0]), axis=0, reduction="add")
    return [reshape_back(scattered, x)]


def _zeros_at_run_time(x, idx, k, strides):
    """Zeros shaped like `x`, made by each run: MaxUnpool of a few zeros at the first
    window's indices. NOTE: onnxruntime folds a ConstantOfShape into an initializer that
    lives as long as the session (ResNet50's stem at batch 32: 100 MB) and that each step's
    ScatterElements then copies. Made this way, ResNet50's batch-32 train step peaked
    ~100 MB lower and its batch-8 step was 3% faster (bench_memory.py, bench_variants.py)."""
    nd = len(k)
    first = op("Slice", idx, int64_constant(idx, [0] * nd), int64_constant(idx, [1] * nd),
               int64_constant(idx, list(range(2, 2 + nd))))
    few = zeros_of(first, first.shape, x.np_dtype) if first.is_dynamic else \
        as_blob(np.zeros(first.shape, x.np_dtype), like=x)
    return op("MaxUnpool", few, first, shape_of(x), kernel_shape=k, strides=strides)


register("MaxPool", _pool_infer, _max_pool_grad)


def _max_pool_every_tie_grad(n, g, need):
    """OneFlow's CPU max-pool gradient (pool_cpu_kernel.cpp: `if (in == out) in_diff +=
    out_diff`): every input equal to its window's maximum takes the window's whole
    gradient, where cuDNN's (a GPU's, and MaxPool's Indices here) routes it to one. Each
    window's elements are gathered from x padded, compared with the window's output and
    their gradients scattered back with their sums."""
    x, y = n.inputs[0], n.outputs[0]
    k, strides, dil, pads, out = _pool_geometry(n.attrs, x)
    nd = len(k)
    if strides == k and not any(pads) and all(d == 1 for d in dil) and \
            all(x.shape[2 + i] == out[i] * k[i] for i in range(nd)):
        # windows that tile x: each input meets one output, spread over its tile
        ties = cast(op("Equal", x, _spread_tiles(y, k, x.shape)), x.np_dtype)
        return [op("Mul", ties, _spread_tiles(g[0], k, x.shape))]
    end = [p + e for p, e in zip(pads[nd:], _ceil_extra(x.shape, k, strides, pads, out))]
    xp = pad_spatial(x, pads[:nd], end)     # (padded positions are cut off at the end)
    padded = list(xp.shape[2:])
    n_, c = x.shape[:2]
    size, window, outputs = int(np.prod(padded)), int(np.prod(k)), int(np.prod(out))
    windows = gather_windows(reshape_to(xp, [n_, c, size]), padded, k, out, strides, dil,
                             axis=2)
    ties = cast(op("Equal", windows, reshape_to(y, [n_, c, 1, outputs])), x.np_dtype)
    spread = op("Mul", ties, reshape_to(g[0], [n_, c, 1, outputs]))
    index = window_index(padded, k, out, strides, dil).astype(np.int64).reshape(1, 1, -1)
    index = op("Expand", as_blob(index, like=x, dtype=np.int64),
               int64_constant(x, [n_, c, window * outputs]))
    # (onnxruntime's CPU ScatterElements adds no float16: half sums in float32)
    sums = np.float32 if x.np_dtype == np.float16 else x.np_dtype
    summed = op("ScatterElements", zeros_of(x, [n_, c, size], sums), index,
                cast(reshape_to(spread, [n_, c, window * outputs]), sums), axis=2,
                reduction="add")
    return [pad_or_crop(cast(reshape_to(summed, [n_, c, *padded]), x.np_dtype),
                        [-p for p in pads[:nd]], [-e for e in end])]


# a MaxPool whose gradient reaches every tied maximum (ops/conv.py: a pool OneFlow runs on
# its CPU kernel)
register_composite("onnxjob.MaxPoolEveryTie",
                   lambda inputs, attrs, n: [op("MaxPool", inputs[0], **attrs)],
                   _max_pool_every_tie_grad)


def _max_unpool_infer(inputs, attrs, num_outputs):
    # (an output shape read from a dynamic Blob: its static, largest shape)
    return [(tuple(int(d) for d in static_value(inputs[2])), inputs[0].np_dtype)]


register("MaxUnpool", _max_unpool_infer, None)


def _ceil_extra(x_shape, k, strides, pads, out):
    """Per axis, how far the last ceil_mode window reaches past the end padding."""
    nd = len(k)
    return [max(0, (out[i] - 1) * strides[i] + k[i] - (x_shape[2 + i] + pads[i] + pads[nd + i]))
            for i in range(nd)]


def _avg_pool_counts(x_shape, k, strides, pads, out, count_include_pad):
    """How many elements each output window averages (static shapes): padding counts
    only with count_include_pad, the ceil_mode overhang never."""
    nd = len(k)
    extra = _ceil_extra(x_shape, k, strides, pads, out)
    fill = 1.0 if count_include_pad else 0.0
    ones = np.pad(np.ones(x_shape[2:]), [(pads[i], pads[nd + i]) for i in range(nd)],
                  constant_values=fill)
    ones = np.pad(ones, [(0, e) for e in extra])
    counts = np.zeros(out)
    for offset in itertools.product(*(range(kk) for kk in k)):
        counts += ones[tuple(slice(o, o + s * (q - 1) + 1, s)
                             for o, s, q in zip(offset, strides, out))]
    return counts


def _spread_tiles(gy, k, x_shape):
    """Each value of gy repeated over its k-sized tile of x_shape (windows that tile x
    exactly, e.g. a global pool): one Expand, where a ConvTranspose with a ones kernel
    costs a convolution per channel."""
    nd = len(k)
    tiled = [d for i in range(nd) for d in (gy.shape[2 + i], 1)]
    spread = [d for i in range(nd) for d in (gy.shape[2 + i], k[i])]
    expanded = op("Expand", reshape_to(gy, list(gy.shape[:2]) + tiled),
                  int64_constant(gy, list(gy.shape[:2]) + spread))
    return reshape_to(expanded, x_shape)


def _avg_pool_grad(n, g, need):
    """Spread gy / count over each window: tiles by Expand, stride-1 windows by window sums
    (`_window_sums`), others by a per-channel ConvTranspose with a ones kernel."""
    x = n.inputs[0]
    k, strides, dil, pads, out = _pool_geometry(n.attrs, x)
    nd = len(k)
    counts = _avg_pool_counts(x.shape, k, strides, pads, out,
                              n.attrs.get("count_include_pad", 0))
    gy = g[0]
    if np.all(counts == counts.flat[0]):
        scaled = op("Mul", gy, as_blob(1.0 / counts.flat[0], like=gy))
    else:
        scaled = op("Div", gy, as_blob(counts.astype(x.np_dtype), like=gy))
    if not any(pads) and not x.is_dynamic and all(
            x.shape[2 + i] == out[i] * k[i] and (strides[i] == k[i] or out[i] == 1)
            for i in range(nd)):
        return [_spread_tiles(scaled, k, x.shape)]
    if all(s == 1 for s in strides + dil) and all(p < kk for p, kk in zip(pads, k + k)):
        return [_window_sums(scaled, k, pads)]
    nc = x.shape[0] * x.shape[1]
    if x.is_dynamic:    # a mirrored batch smaller than its placeholder: the run's rows
        per_channel = op("Reshape", scaled, op("Concat", int64_constant(gy, [-1, 1]),
                                               op("Shape", scaled, start=2), axis=0))
    else:
        per_channel = reshape_to(scaled, [nc, 1, *gy.shape[2:]])
    kernel = as_blob(np.ones((1, 1, *k), x.np_dtype), like=gy)
    extra = _ceil_extra(x.shape, k, strides, pads, out)
    pads = pads[:nd] + [p + e for p, e in zip(pads[nd:], extra)]
    spread = conv_input_grad(per_channel, kernel, (nc, 1, *x.shape[2:]), strides, [1] * nd,
                             pads, 1)
    return [reshape_back(spread, x)]


def _window_sums(scaled, k, pads):
    """The gradient of a stride-1 pool, where input i gets the sum of the k outputs whose
    windows hold it: the outputs' sums over k-windows, zeros padded by k - 1 - pad, as an
    AveragePool of the padding counted times the window's size. (The per-channel
    ConvTranspose with a ones kernel costs a convolution by the whole window: a global-size
    "SAME" pool of 112x112, as MobileNetV3's squeeze-excite writes it, took 24x its forward.)"""
    nd = len(k)
    window = int(np.prod(k))
    summed_pads = [k[i % nd] - 1 - p for i, p in enumerate(pads)]
    mean = op("AveragePool", scaled, kernel_shape=list(k), strides=[1] * nd,
              pads=summed_pads, count_include_pad=1)
    return op("Mul", mean, as_blob(float(window), like=mean))


def _avg_pool_float64(inputs, attrs, num_outputs):
    """AveragePool as a window Gather, a ReduceSum and a division by the counts."""
    x = inputs[0]
    k, strides, _, pads, out = _pool_geometry(attrs, x)
    nd = len(k)
    extra = _ceil_extra(x.shape, k, strides, pads, out)
    xp = pad_spatial(x, pads[:nd], [p + e for p, e in zip(pads[nd:], extra)])
    padded = list(xp.shape[2:])
    n, c = x.shape[:2]
    flat = reshape_to(xp, [n, c, int(np.prod(padded))])
    windows = gather_windows(flat, padded, k, out, strides, [1] * nd, axis=2)
    sums = op("ReduceSum", windows, int64_constant(windows, [2]), keepdims=0)
    counts = _avg_pool_counts(x.shape, k, strides, pads, out,
                              attrs.get("count_include_pad", 0))
    y = op("Div", sums, as_blob(counts.reshape(-1), like=sums))
    return [reshape_to(y, [n, c] + out)]


register("AveragePool", _pool_infer, _avg_pool_grad,
         lower=checked_lowering("AveragePool", _pool_infer, _avg_pool_float64))


def _global_avg_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    if len(x.shape) < 3:
        raise ValueError("GlobalAveragePool takes an (N, C, *spatial) input")
    return [(x.shape[:2] + (1,) * (len(x.shape) - 2), x.np_dtype)]


def _global_avg_grad(n, g, need):
    x = n.inputs[0]
    if x.is_dynamic:
        scaled = op("Div", g[0], run_time_count(x, spatial_axes(len(x.shape)), g[0]))
    else:
        scaled = op("Mul", g[0], as_blob(1.0 / int(np.prod(x.shape[2:])), like=g[0]))
    return [op("Expand", scaled, shape_of(x))]


def _global_avg_float64(inputs, attrs, num_outputs):
    x = inputs[0]
    return [op("ReduceMean", x, axes=spatial_axes(len(x.shape)), keepdims=1)]  # opset 17


register("GlobalAveragePool", _global_avg_infer, _global_avg_grad,
         lower=checked_lowering("GlobalAveragePool", _global_avg_infer, _global_avg_float64))
