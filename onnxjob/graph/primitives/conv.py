"""Convolution, pooling, resizing and depth/space moves: shape and gradient rules.

Everything here takes 1, 2 or 3 spatial axes, channels first: (N, C, *spatial). Pads
are always explicit ONNX pads `[begin per spatial axis..., end per spatial axis...]`:
the API layer (ops/conv.py) resolves OneFlow's "SAME" (= SAME_LOWER) and "VALID".

onnxruntime's CPU kernels for Conv, ConvTranspose, AveragePool, GlobalAveragePool and
Resize take float32 only, OneFlow's take float64 too: float64 nodes are lowered to exact
float64 formulations (window Gathers and MatMuls), whose gradients come from their parts.
"""
import itertools

import numpy as np

from onnxjob import settings
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.registry import const_value, register
from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.source_info import user_location


# -- geometry ---------------------------------------------------------------------------

def _window_out(size, k, s, d, p0, p1, ceil_mode=False):
    span = (size + p0 + p1 - d * (k - 1) - 1)
    if span < 0:
        raise ValueError(f"window {k} (dilation {d}) is larger than the padded input "
                         f"{size + p0 + p1}")
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= size + p0:
        raise ValueError("with ceil_mode the last window starts in the end padding, where "
                         "onnxruntime's kernel drops it but its shape inference keeps it")
    return out


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def _geometry(attrs, x):
    """(strides, dilations, pads) of a Conv or pool node over input `x`."""
    nd = len(x.shape) - 2
    if _text(attrs.get("auto_pad", "NOTSET")) != "NOTSET":
        raise ValueError("onnxjob emits explicit pads; auto_pad must be NOTSET")
    strides = [int(v) for v in attrs.get("strides", [1] * nd)]
    dil = [int(v) for v in attrs.get("dilations", [1] * nd)]
    pads = [int(v) for v in attrs.get("pads", [0] * (2 * nd))]
    if len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise ValueError(f"strides, dilations and pads must have {nd}, {nd} and {2 * nd} "
                         f"entries for a {nd + 2}-D input")
    return strides, dil, pads


def _spatial_axes(rank):
    return list(range(2, rank))


def _window_index(padded, kernel, out, strides, dil):
    """Flat offsets into a padded spatial block: row k (kernel offset), column q (output
    position) holds the input element that kernel offset k meets at output q."""
    nd = len(kernel)
    index = np.zeros([1] * (2 * nd), np.int64)
    step = 1
    for i in reversed(range(nd)):
        pos = np.arange(kernel[i])[:, None] * dil[i] + np.arange(out[i])[None, :] * strides[i]
        shape = [1] * (2 * nd)
        shape[i], shape[nd + i] = kernel[i], out[i]
        index = index + pos.reshape(shape) * step
        step *= padded[i]
    index = index.reshape(int(np.prod(kernel)), int(np.prod(out)))
    return index.astype(np.int32 if step < 2 ** 31 else np.int64)


def _gather_windows(flat, padded, kernel, out, strides, dil, axis):
    """Gather of `flat` (spatial block flattened on `axis`) at _window_index: the axis
    becomes (K, Q), kernel offsets by output positions."""
    return _gather_at(flat, _window_index(padded, kernel, out, strides, dil), axis)


def _gather_at(x, index, axis):
    """Gather of `x` at the constant integer array `index` along `axis`."""
    return op("Gather", x, as_blob(index, like=x, dtype=index.dtype), axis=axis)


def _pad_spatial(x, begin, end, lead=2, trail=0):
    """Zero-pad the spatial axes of `x` (`lead` axes before them, `trail` after)."""
    if not any(begin) and not any(end):
        return x
    zeros_l, zeros_t = [0] * lead, [0] * trail
    return op("Pad", x, int64_constant(x, zeros_l + list(begin) + zeros_t
                                       + zeros_l + list(end) + zeros_t))


def _pad_or_crop(x, begin, end):
    """Spatial pads of (N, C, *S) where negative entries crop instead."""
    x = _pad_spatial(x, [max(b, 0) for b in begin], [max(e, 0) for e in end])
    if min(begin + end) >= 0:
        return x
    nd = len(begin)
    starts = [max(-b, 0) for b in begin]
    ends = [x.shape[2 + i] - max(-end[i], 0) for i in range(nd)]
    return op("Slice", x, int64_constant(x, starts), int64_constant(x, ends),
              int64_constant(x, _spatial_axes(nd + 2)))


def _flipped_transposed(w, group):
    """A Conv weight (M, C/g, *k) as the weight of its adjoint: every kernel flipped and
    the channel axes swapped within each group, (C, M/g, *k)."""
    nd = len(w.shape) - 2
    m, cg, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    if group == 1:
        swapped = op("Transpose", w, perm=[1, 0] + _spatial_axes(nd + 2))
    else:
        grouped = reshape_to(w, [group, m // group, cg] + kernel)
        swapped = op("Transpose", grouped, perm=[0, 2, 1] + list(range(3, nd + 3)))
        swapped = reshape_to(swapped, [group * cg, m // group] + kernel)
    return _flip_kernels(swapped)


def _flip_kernels(w):
    """`w` (A, B, *k) with every kernel reversed along each spatial axis.

    Reversing every axis of a kernel reverses its row-major flattening, so for float32 and
    float64 this is a MatMul of the (A*B, K) kernels with the K x K reversal permutation.
    NOTE: onnxruntime's CPU Slice with negative steps took 4.8 ms on a (512, 512, 3, 3)
    weight and the MatMul 0.64 ms (0.94 / 0.10 ms at 256 x 256), once per train step.
    """
    k = int(np.prod(w.shape[2:]))
    if k == 1:  # a 1x1 kernel is its own flip
        return w
    nd = len(w.shape) - 2
    if w.np_dtype in (np.float32, np.float64):
        rows = reshape_to(w, [w.shape[0] * w.shape[1], k])
        reversal = as_blob(np.eye(k, dtype=w.np_dtype)[::-1].copy(), like=w)
        return reshape_to(op("MatMul", rows, reversal), list(w.shape))
    return op("Slice", w, *(int64_constant(w, v) for v in (
        [-1] * nd, [np.iinfo(np.int64).min] * nd, _spatial_axes(nd + 2), [-1] * nd)))


def _checked_lowering(op_type, infer, build, lowered=(np.float64,)):
    """A `lower` hook: inputs of a dtype in `lowered` (no onnxruntime kernel) are emitted
    by `build` after the shape rule has checked them."""
    lowered = tuple(np.dtype(t) for t in lowered)

    def lower(inputs, attrs, num_outputs):
        if inputs[0].np_dtype not in lowered:
            return None
        try:
            infer(inputs, attrs, num_outputs)
        except (ValueError, AssertionError, IndexError) as e:
            shapes = ", ".join(str(x.shape) if x is not None else "None" for x in inputs)
            raise TraceError(f"{op_type} cannot take inputs of shapes ({shapes}): {e}",
                             location=user_location()) from None
        return build(inputs, attrs, num_outputs)
    return lower


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
    strides, dil, pads = _geometry(attrs, x)
    out = [_window_out(x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], pads[i],
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
        return op("Conv", gy, _flipped_transposed(w, group), pads=conv_pads,
                  dilations=list(dil), strides=[1] * nd, group=group)
    out_pad = []
    for i in range(nd):
        natural = strides[i] * (gy.shape[2 + i] - 1) + full[i] + 1 - pads[i] - pads[nd + i]
        out_pad.append(x_shape[2 + i] - natural)
    return op("ConvTranspose", gy, w, strides=list(strides), dilations=list(dil),
              pads=list(pads), group=group, output_padding=out_pad if any(out_pad) else None)


def conv_weight_grad(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a Conv with group 1: a Conv over batch-transposed tensors.

    x^T (C, N, *S) convolved with gy^T (M, N, *So) as the kernel, stride and dilation
    swapped, gives (C, M, *k') with k' >= k; the extra rows come from input rows no
    output window used and are cut off.
    """
    nd = len(w_shape) - 2
    swap = [1, 0] + _spatial_axes(nd + 2)
    xt = op("Transpose", x, perm=swap)
    gt = op("Transpose", gy, perm=swap)
    gw = op("Conv", xt, gt, strides=list(dil), dilations=list(strides), pads=list(pads))
    if gw.shape[2:] != tuple(w_shape[2:]):
        gw = op("Slice", gw, *(int64_constant(gw, v) for v in (
            [0] * nd, list(w_shape[2:]), _spatial_axes(nd + 2))))
    return op("Transpose", gw, perm=swap)


def conv_weight_grad_im2col(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a Conv with group 1 as one Gemm over explicit im2col columns.

    The columns are built from x^T (C, N, *S): one strided Slice per kernel offset, each
    (C, N, *So), concatenated to (C*K, N*Q) (K kernel offsets, Q output positions); gy^T
    is (M, N*Q); so the sum over the batch happens inside the Gemm's K dimension and
    nothing large is transposed.
    """
    nd = len(w_shape) - 2
    m, c, kernel = w_shape[0], w_shape[1], list(w_shape[2:])
    n, out = gy.shape[0], list(gy.shape[2:])
    swap = [1, 0] + _spatial_axes(nd + 2)
    xt = _pad_spatial(op("Transpose", x, perm=swap), pads[:nd], pads[nd:])
    axes = int64_constant(xt, _spatial_axes(nd + 2))
    cols = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offset, dil)]
        ends = [b + s * (q - 1) + 1 for b, s, q in zip(starts, strides, out)]
        cols.append(op("Slice", xt, int64_constant(xt, starts), int64_constant(xt, ends),
                       axes, int64_constant(xt, list(strides))))
    # (C, K*N, *So) has the memory layout of (C*K, N*Q): no per-patch reshape
    q = int(np.prod(out))
    columns = reshape_to(op("Concat", *cols, axis=1), [c * len(cols), n * q])
    gy_t = reshape_to(op("Transpose", gy, perm=swap), [m, n * q])
    return reshape_to(op("Gemm", gy_t, columns, transB=1), w_shape)


def pointwise_weight_grad(x, gy, w_shape, strides):
    """dL/dW of an unpadded 1x1 Conv (group 1): the columns are x itself (strided).

    Either per image, (N, M, Q) @ (N, Q, C) summed over N (no activation transposed), or
    both channels-first, (M, N*Q) @ (N*Q, C) in one Gemm; the first writes N*M*C values,
    the second copies x and gy: the smaller wins.
    """
    nd = len(w_shape) - 2
    n, c, m = x.shape[0], x.shape[1], w_shape[0]
    if any(s != 1 for s in strides):
        ends = [x.shape[2 + i] for i in range(nd)]
        x = op("Slice", x, int64_constant(x, [0] * nd), int64_constant(x, ends),
               int64_constant(x, _spatial_axes(nd + 2)), int64_constant(x, list(strides)))
    q = int(np.prod(gy.shape[2:]))
    if n * m * c <= n * q * (m + c):
        x_t = op("Transpose", reshape_to(x, [n, c, q]), perm=[0, 2, 1])  # MatMul's transB
        per_image = op("MatMul", reshape_to(gy, [n, m, q]), x_t)
        return reshape_to(op("ReduceSum", per_image, int64_constant(per_image, [0]),
                             keepdims=0), w_shape)
    # NOTE: channels first, (C, N, Q), moves runs of Q values where batch-last (C, Q, N)
    # moves single values: ResNet50's (8, 1024, 14, 14) took 0.31 ms instead of 1.12 in its
    # train step; the Gemm sums over (N, Q) in either order
    swap = [1, 0] + _spatial_axes(nd + 2)
    x_t = reshape_to(op("Transpose", x, perm=swap), [c, n * q])
    gy_t = reshape_to(op("Transpose", gy, perm=swap), [m, n * q])
    return reshape_to(op("Gemm", gy_t, x_t, transB=1), w_shape)


def conv_weight_grad_gather(x, gy, w_shape, strides, dil, pads, group=1):
    """dL/dW of a Conv as one Gemm (group 1) or one batched MatMul (grouped) over im2col
    columns built by one Gather.

    With x batch-last and flattened, (C, P, N) (P padded positions), the columns of kernel
    offset k and output position q are the rows at _window_index[k, q]: one Gather with
    that constant (K, Q) index gives (C, K, Q, N) = (C*K, Q*N), copying runs of N values.
    Group 1: gy batch-last is (M, Q*N) and the Gemm's (M, C*K) result is the weight's
    layout (large columns go by chunks of output positions, see COLUMN_CHUNK_BYTES).
    Grouped: the columns split per group, (g, C/g*K, Q*N), meet gy as (g, Q*N, M/g) in one
    batched MatMul, and only the small (g, C/g*K, M/g) result is transposed.
    """
    nd = len(w_shape) - 2
    m, cg, kernel = w_shape[0], w_shape[1], list(w_shape[2:])
    n, c, out = x.shape[0], x.shape[1], list(gy.shape[2:])
    k, q = int(np.prod(kernel)), int(np.prod(out))
    batch_last = list(range(1, nd + 2)) + [0]
    xt = _pad_spatial(op("Transpose", x, perm=batch_last), pads[:nd], pads[nd:], 1, 1)
    padded = list(xt.shape[1:-1])
    flat = reshape_to(xt, [c, int(np.prod(padded)), n])
    if group == 1:
        gy_t = reshape_to(op("Transpose", gy, perm=batch_last), [m, q * n])
        unit = c * k * n * x.np_dtype.itemsize      # the columns' bytes per output position
        parts = _parts(q, unit, COLUMN_CHUNK_BYTES) if q * unit > 2 * COLUMN_CHUNK_BYTES \
            else 1
        index = _window_index(padded, kernel, out, strides, dil)
        return reshape_to(_columns_gemm(flat, index, gy_t, parts), w_shape)
    patches = _gather_windows(flat, padded, kernel, out, strides, dil, axis=1)
    columns = reshape_to(patches, [group, cg * k, q * n])
    gy_g = reshape_to(gy, [n, group, m // group, q])
    gy_g = reshape_to(op("Transpose", gy_g, perm=[1, 3, 0, 2]), [group, q * n, m // group])
    gw_t = op("MatMul", columns, gy_g)                                  # (g, C/g*K, M/g)
    return reshape_to(op("Transpose", gw_t, perm=[0, 2, 1]), w_shape)


# NOTE: a group-1 weight gradient's columns hold the input once per kernel offset:
# ResNet50's stem and res2 3x3 convs at batch 32 have 230 MB of them, and they set the train
# step's peak. Columns beyond twice this size are gathered and multiplied by chunks of at
# most this size: the batch-32 step peaked at 3.90 GB instead of 4.22 GB (bench_memory.py;
# 16 MB chunks: 3.89 GB). Smaller columns stay whole: LeNet's 63 MB ran 1-2% faster so,
# and the batch-8 ResNet50 step (58 MB at most) timed the same either way.
COLUMN_CHUNK_BYTES = 32 << 20


def _columns_gemm(flat, index, gy_t, parts):
    """gy_t (M, Q*N) times the transposed im2col columns of `flat` (C, P, N) at `index`
    (K, Q): (M, C*K). With parts > 1 the columns are gathered and multiplied Q/parts
    output positions at a time, each Gemm adding the previous one's result, so that only
    one chunk of columns is alive at a time."""
    c, n = flat.shape[0], flat.shape[2]
    k, q = index.shape
    per = q // parts
    total = None
    for i, gy_part in enumerate(_split(gy_t, 1, parts)):
        chunk = np.ascontiguousarray(index[:, i * per:(i + 1) * per])
        columns = reshape_to(_gather_at(flat, chunk, 1), [c * k, per * n])
        total = op("Gemm", gy_part, columns, transB=1) if total is None else \
            op("Gemm", gy_part, columns, total, transB=1, beta=1.0)
    return total


_WEIGHT_GRAD = {"gather": conv_weight_grad_gather, "im2col": conv_weight_grad_im2col,
                "conv": conv_weight_grad}


def _weight_grad_choice():
    # NOTE: on the doc LeNet train step (2 threads) the Gather columns measured 87 ms
    # against 97 ms for the per-offset Slice + Concat columns (im2col) and ~140 ms for the
    # batch-transposed Conv; ONNXJOB_CONV_WGRAD=im2col|conv selects the others.
    return settings.get("CONV_WGRAD")


def grouped_weight_grad_slices(x, gy, w_shape, strides, dil, pads, group):
    """dL/dW of a grouped Conv from per-image im2col columns, one batched MatMul.

    One strided Slice of the padded x per kernel offset (copying runs of output rows),
    concatenated to (N, g, C/g*K, Q), meets gy as (N, g, Q, M/g) in one MatMul batched over
    images and groups; the (N, g, C/g*K, M/g) per-image results are summed.
    """
    nd = len(w_shape) - 2
    m, cg, kernel = w_shape[0], w_shape[1], list(w_shape[2:])
    n, out = x.shape[0], list(gy.shape[2:])
    q, mg = int(np.prod(out)), m // group
    xp = _pad_spatial(x, pads[:nd], pads[nd:])
    axes = int64_constant(xp, _spatial_axes(nd + 2))
    cols = []
    for offset in itertools.product(*(range(k) for k in kernel)):
        starts = [o * d for o, d in zip(offset, dil)]
        ends = [b + s * (size - 1) + 1 for b, s, size in zip(starts, strides, out)]
        patch = op("Slice", xp, int64_constant(xp, starts), int64_constant(xp, ends), axes,
                   int64_constant(xp, list(strides)))
        cols.append(reshape_to(patch, [n, group, cg, 1, q]))
    columns = reshape_to(op("Concat", *cols, axis=3), [n, group, cg * len(cols), q])
    gy_g = reshape_to(gy, [n, group, mg, q])
    gy_t = reshape_to(gy_g, [n, group, q, 1]) if mg == 1 else \
        op("Transpose", gy_g, perm=[0, 1, 3, 2])
    per_image = op("MatMul", columns, gy_t)
    summed = op("ReduceSum", per_image, int64_constant(per_image, [0]), keepdims=0)
    if mg != 1:
        summed = op("Transpose", summed, perm=[0, 2, 1])
    return reshape_to(summed, w_shape)


# NOTE: im2col columns larger than the cache make the weight gradient memory-bound: the
# columns are built and multiplied in chunks of at most this many bytes (an L2's worth).
CHUNK_BYTES = 1 << 20


def _parts(total, unit_bytes, limit=None):
    """How many equal parts to split `total` units into so each is <= `limit` bytes
    (CHUNK_BYTES by default)."""
    limit = CHUNK_BYTES if limit is None else limit
    per = max(1, min(total, limit // max(unit_bytes, 1)))
    while total % per:
        per -= 1
    return total // per


def _split(x, axis, parts):
    if parts == 1:
        return [x]
    sizes = int64_constant(x, [x.shape[axis] // parts] * parts)
    return op("Split", x, sizes, axis=axis, num_outputs=parts)


def grouped_weight_grad(x, gy, w_shape, strides, dil, pads, group):
    """dL/dW of a grouped or depthwise Conv: im2col columns and batched MatMuls, by chunks.

    The columns copy contiguous runs of either the batch (Gather with x batch-last) or an
    output row (per-offset Slices); the longer run wins. Batch-last columns are chunked
    by groups (results concatenated), per-image ones by images (results added).
    """
    n, out = x.shape[0], list(gy.shape[2:])
    unit = int(np.prod(w_shape[2:])) * int(np.prod(out)) * x.np_dtype.itemsize
    row = out[-1] if strides[-1] == 1 else 1
    # NOTE: one train step's conv gradient (input + weight), 1 thread, CPU ms: x (4, 256,
    # 28, 28), w (256, 8, 3, 3), 32 groups: 11.2 against 21.0 for a per-group loop of Gemms
    # and 23.8 for one unchunked batch-last Gather + MatMul; at batch 32: 70, 70 and 94.
    # Depthwise x (4, 144, 56, 56): 15, 42 and 46; at batch 32 (28 x 28): 29, 29 and 42.
    if row > n:
        parts = _parts(n, x.shape[1] * unit)
        partial = [grouped_weight_grad_slices(xi, gi, w_shape, strides, dil, pads, group)
                   for xi, gi in zip(_split(x, 0, parts), _split(gy, 0, parts))]
        total = partial[0]
        for p in partial[1:]:
            total = op("Add", total, p)
        return total
    parts = _parts(group, w_shape[1] * unit * n)
    sub = (w_shape[0] // parts,) + tuple(w_shape[1:])
    grads = [conv_weight_grad_gather(xi, gi, sub, strides, dil, pads, group // parts)
             for xi, gi in zip(_split(x, 1, parts), _split(gy, 1, parts))]
    return grads[0] if parts == 1 else op("Concat", *grads, axis=0)


def weight_grad(x, gy, w_shape, strides, dil, pads, group):
    """dL/dW of a Conv of any rank and group (ONNXJOB_CONV_WGRAD picks group 1's)."""
    choice = _weight_grad_choice()
    if group == 1 and choice == "gather" and all(k == 1 for k in w_shape[2:]) \
            and not any(pads):
        return pointwise_weight_grad(x, gy, w_shape, strides)
    if group == 1:
        return _WEIGHT_GRAD[choice](x, gy, w_shape, strides, dil, pads)
    return grouped_weight_grad(x, gy, w_shape, strides, dil, pads, group)


def _conv_grad(n, g, need):
    x, w = n.inputs[:2]
    strides, dil, pads = _geometry(n.attrs, x)
    group = int(n.attrs.get("group", 1))
    gy = g[0]
    grads = [conv_input_grad(gy, w, x.shape, strides, dil, pads, group) if need[0] else None,
             weight_grad(x, gy, w.shape, strides, dil, pads, group) if need[1] else None]
    if len(n.inputs) > 2:
        grads.append(op("ReduceSum", gy, int64_constant(gy, [0] + _spatial_axes(len(x.shape))),
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
    strides, dil, pads = _geometry(attrs, x)
    group = int(attrs.get("group", 1))
    (out_shape, _), = _conv_infer(inputs, attrs, num_outputs)
    n, c, m, kernel = x.shape[0], x.shape[1], w.shape[0], list(w.shape[2:])
    xp = _pad_spatial(x, pads[:nd], pads[nd:])
    padded = list(xp.shape[2:])
    flat = reshape_to(xp, [n, c, int(np.prod(padded))])
    cols = _gather_windows(flat, padded, kernel, out_shape[2:], strides, dil, axis=2)
    k, q = int(np.prod(kernel)), int(np.prod(out_shape[2:]))
    cols = reshape_to(cols, [n, group, c // group * k, q])
    wm = reshape_to(w, [group, m // group, c // group * k])
    y = reshape_to(op("MatMul", wm, cols), out_shape)
    return [_add_channel_bias(y, bias)]


register("Conv", _conv_infer, _conv_grad,
         lower=_checked_lowering("Conv", _conv_infer, _conv_float64))


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
    auto_pad = _text(attrs.get("auto_pad", "NOTSET"))
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
    grads = [op("Conv", gy, w, strides=strides, dilations=dil, pads=pads, group=group)
             if need[0] else None,
             weight_grad(gy, x, w.shape, strides, dil, pads, group) if need[1] else None]
    if len(n.inputs) > 2:
        grads.append(op("ReduceSum", gy, int64_constant(gy, [0] + _spatial_axes(nd + 2)),
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
    return _pad_or_crop(spread, [0] * nd, [1 - s for s in strides])


def _conv_transpose_float64(inputs, attrs, num_outputs):
    """ConvTranspose as a stride-1 Conv of the zero-dilated, padded input with the flipped
    kernel (itself lowered to float64 Gather + MatMul)."""
    x, w = inputs[:2]
    bias = inputs[2] if len(inputs) > 2 else None
    strides, dil, pads, out_pad, _ = _conv_transpose_geometry(attrs, x, w)
    group = int(attrs.get("group", 1))
    nd = len(x.shape) - 2
    full = [dil[i] * (w.shape[2 + i] - 1) for i in range(nd)]
    spread = _pad_or_crop(_dilate(x, strides), [full[i] - pads[i] for i in range(nd)],
                          [full[i] - pads[nd + i] + out_pad[i] for i in range(nd)])
    y = op("Conv", spread, _flipped_transposed(w, group), dilations=dil, group=group)
    return [_add_channel_bias(y, bias)]


register("ConvTranspose", _conv_transpose_infer, _conv_transpose_grad,
         lower=_checked_lowering("ConvTranspose", _conv_transpose_infer,
                                 _conv_transpose_float64))


# -- pooling ------------------------------------------------------------------------------

def _pool_geometry(attrs, x):
    """(kernel, strides, dilations, pads, output spatial shape) of a MaxPool or AveragePool."""
    k = [int(v) for v in attrs["kernel_shape"]]
    if len(x.shape) != len(k) + 2:
        raise ValueError(f"a {len(k)}-D pool takes a {len(k) + 2}-D input (N, C, *spatial)")
    strides, dil, pads = _geometry(attrs, x)
    nd = len(k)
    out = [_window_out(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[nd + i],
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
    """Route gy to the arg-max positions recorded in MaxPool's Indices output."""
    if len(n.outputs) < 2:
        raise NotImplementedError("MaxPool without its Indices output has no gradient rule")
    x = n.inputs[0]
    y, idx = n.outputs
    k, strides, dil, pads, _ = _pool_geometry(n.attrs, x)
    non_overlapping = strides == k and not any(pads) and all(d == 1 for d in dil)
    if non_overlapping and not n.attrs.get("ceil_mode", 0) and x.np_dtype == np.float32:
        # NOTE: MaxUnpool measured as fast as ScatterElements with 8 fewer nodes; it
        # overwrites rather than adds, which is exact only when windows do not overlap.
        return [op("MaxUnpool", g[0], idx, int64_constant(g[0], x.shape), kernel_shape=k,
                   strides=strides)]
    size = int(np.prod(x.shape))
    if x.np_dtype == np.float32:    # onnxruntime's MaxUnpool takes float32 only
        zeros = reshape_to(_zeros_at_run_time(x, idx, k, strides), [size])
    else:
        zeros = op("ConstantOfShape", int64_constant(g[0], [size]), value=np.zeros(1, x.np_dtype))
    flat = op("ScatterElements", zeros, reshape_to(idx, [int(np.prod(idx.shape))]),
              reshape_to(g[0], [int(np.prod(y.shape))]), axis=0, reduction="add")
    return [reshape_to(flat, x.shape)]


def _zeros_at_run_time(x, idx, k, strides):
    """Zeros shaped like `x`, made by each run: MaxUnpool of a few zeros at the first
    window's indices. NOTE: onnxruntime folds a ConstantOfShape into an initializer that
    lives as long as the session (ResNet50's stem at batch 32: 100 MB) and that each step's
    ScatterElements then copies. Made this way, ResNet50's batch-32 train step peaked
    ~100 MB lower and its batch-8 step was 3% faster (bench_memory.py, bench_variants.py)."""
    nd = len(k)
    first = op("Slice", idx, int64_constant(idx, [0] * nd), int64_constant(idx, [1] * nd),
               int64_constant(idx, list(range(2, 2 + nd))))
    few = as_blob(np.zeros(first.shape, x.np_dtype), like=x)
    return op("MaxUnpool", few, first, int64_constant(idx, x.shape), kernel_shape=k,
              strides=strides)


register("MaxPool", _pool_infer, _max_pool_grad)


def _max_unpool_infer(inputs, attrs, num_outputs):
    return [(tuple(int(d) for d in const_value(inputs[2])), inputs[0].np_dtype)]


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
    """Spread gy / count over each window: a per-channel ConvTranspose with a ones kernel."""
    x = n.inputs[0]
    k, strides, _, pads, out = _pool_geometry(n.attrs, x)
    nd = len(k)
    counts = _avg_pool_counts(x.shape, k, strides, pads, out,
                              n.attrs.get("count_include_pad", 0))
    gy = g[0]
    if np.all(counts == counts.flat[0]):
        scaled = op("Mul", gy, as_blob(1.0 / counts.flat[0], like=gy))
    else:
        scaled = op("Div", gy, as_blob(counts.astype(x.np_dtype), like=gy))
    if not any(pads) and all(x.shape[2 + i] == out[i] * k[i] and (strides[i] == k[i] or out[i] == 1)
                             for i in range(nd)):
        return [_spread_tiles(scaled, k, x.shape)]
    nc = x.shape[0] * x.shape[1]
    per_channel = reshape_to(scaled, [nc, 1, *gy.shape[2:]])
    kernel = as_blob(np.ones((1, 1, *k), x.np_dtype), like=gy)
    extra = _ceil_extra(x.shape, k, strides, pads, out)
    pads = pads[:nd] + [p + e for p, e in zip(pads[nd:], extra)]
    spread = conv_input_grad(per_channel, kernel, (nc, 1, *x.shape[2:]), strides, [1] * nd,
                             pads, 1)
    return [reshape_to(spread, x.shape)]


def _avg_pool_float64(inputs, attrs, num_outputs):
    """AveragePool as a window Gather, a ReduceSum and a division by the counts."""
    x = inputs[0]
    k, strides, _, pads, out = _pool_geometry(attrs, x)
    nd = len(k)
    extra = _ceil_extra(x.shape, k, strides, pads, out)
    xp = _pad_spatial(x, pads[:nd], [p + e for p, e in zip(pads[nd:], extra)])
    padded = list(xp.shape[2:])
    n, c = x.shape[:2]
    flat = reshape_to(xp, [n, c, int(np.prod(padded))])
    windows = _gather_windows(flat, padded, k, out, strides, [1] * nd, axis=2)
    sums = op("ReduceSum", windows, int64_constant(windows, [2]), keepdims=0)
    counts = _avg_pool_counts(x.shape, k, strides, pads, out,
                              attrs.get("count_include_pad", 0))
    y = op("Div", sums, as_blob(counts.reshape(-1), like=sums))
    return [reshape_to(y, [n, c] + out)]


register("AveragePool", _pool_infer, _avg_pool_grad,
         lower=_checked_lowering("AveragePool", _pool_infer, _avg_pool_float64))


def _global_avg_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    if len(x.shape) < 3:
        raise ValueError("GlobalAveragePool takes an (N, C, *spatial) input")
    return [(x.shape[:2] + (1,) * (len(x.shape) - 2), x.np_dtype)]


def _global_avg_grad(n, g, need):
    x = n.inputs[0]
    count = int(np.prod(x.shape[2:]))
    scaled = op("Mul", g[0], as_blob(1.0 / count, like=g[0]))
    return [op("Expand", scaled, int64_constant(scaled, x.shape))]


def _global_avg_float64(inputs, attrs, num_outputs):
    x = inputs[0]
    return [op("ReduceMean", x, axes=_spatial_axes(len(x.shape)), keepdims=1)]  # opset 17


register("GlobalAveragePool", _global_avg_infer, _global_avg_grad,
         lower=_checked_lowering("GlobalAveragePool", _global_avg_infer, _global_avg_float64))


# -- Resize -------------------------------------------------------------------------------

def _resize_geometry(inputs):
    """(per-axis scales, output shape) of a Resize from its constant scales or sizes."""
    x = inputs[0]
    scales = inputs[2] if len(inputs) > 2 else None
    sizes = inputs[3] if len(inputs) > 3 else None
    if sizes is not None:
        out = [int(v) for v in const_value(sizes)]
        if len(out) != len(x.shape):
            raise ValueError(f"sizes {out} must have one entry per input axis")
        return [o / i for o, i in zip(out, x.shape)], tuple(out)
    if scales is None:
        raise ValueError("Resize needs constant scales or sizes")
    scale = [float(v) for v in np.asarray(const_value(scales), np.float32)]
    if len(scale) != len(x.shape):
        raise ValueError(f"scales {scale} must have one entry per input axis")
    # as onnxruntime (and OneFlow's upsample) compute it: float32 product, truncated
    out = tuple(int(np.float32(s) * np.float32(d)) for s, d in zip(scale, x.shape))
    if min(out) < 1:
        raise ValueError(f"scales {scale} leave an empty output")
    return scale, out


def _resize_infer(inputs, attrs, num_outputs):
    _, out = _resize_geometry(inputs)
    return [(out, inputs[0].np_dtype)]


def _source_coordinates(in_size, out_size, scale, transform):
    x = np.arange(out_size, dtype=np.float64)
    if transform == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if transform == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_size > 1 else np.zeros(out_size)
    if transform == "align_corners":
        return x * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros(out_size)
    if transform == "asymmetric":
        return x / scale
    if transform == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise NotImplementedError(f"Resize with coordinate_transformation_mode {transform!r}")


_ROUNDING = {"floor": np.floor, "ceil": np.ceil,
             "round_prefer_floor": lambda v: np.ceil(v - 0.5),
             "round_prefer_ceil": lambda v: np.floor(v + 0.5)}


def _resize_matrix(in_size, out_size, scale, attrs):
    """The (out, in) matrix that Resize applies along one axis (nearest or linear)."""
    mode = _text(attrs.get("mode", "nearest"))
    src = _source_coordinates(in_size, out_size, scale,
                              _text(attrs.get("coordinate_transformation_mode", "half_pixel")))
    rows = np.arange(out_size)
    matrix = np.zeros((out_size, in_size))
    if mode == "nearest":
        rounding = _ROUNDING[_text(attrs.get("nearest_mode", "round_prefer_floor"))]
        matrix[rows, np.clip(rounding(src), 0, in_size - 1).astype(np.int64)] = 1.0
    elif mode == "linear":
        src = np.clip(src, 0, in_size - 1)
        low = np.floor(src).astype(np.int64)
        high = np.minimum(low + 1, in_size - 1)
        np.add.at(matrix, (rows, low), 1.0 - (src - low))
        np.add.at(matrix, (rows, high), src - low)
    else:
        raise NotImplementedError(f"Resize with mode {mode!r}")
    return matrix


def _apply_along(x, axis, matrix):
    """Contract axis `axis` of x with `matrix` (out, in): that axis becomes `out` long."""
    rank = len(x.shape)
    m = matrix.astype(x.np_dtype)
    if axis == rank - 1:
        return op("MatMul", x, as_blob(np.ascontiguousarray(m.T), like=x))
    if axis == rank - 2:
        return op("MatMul", as_blob(m, like=x), x)
    perm = [a for a in range(rank) if a != axis] + [axis]
    moved = op("MatMul", op("Transpose", x, perm=perm), as_blob(np.ascontiguousarray(m.T), like=x))
    return op("Transpose", moved, perm=[int(a) for a in np.argsort(perm)])


def _resize_matrices(inputs, attrs):
    """{axis: (out, in) matrix} for the axes a Resize changes."""
    x = inputs[0]
    scale, out = _resize_geometry(inputs)
    matrices = {}
    for axis, (i, o, s) in enumerate(zip(x.shape, out, scale)):
        matrix = _resize_matrix(i, o, s, attrs)
        if i != o or not np.array_equal(matrix, np.eye(i)):
            matrices[axis] = matrix
    return matrices


def _resize_grad(n, g, need):
    """The transposed interpolation, axis by axis; an integer nearest upscale (each input
    copied to a block) is summed back block by block instead."""
    x = n.inputs[0]
    gy = g[0]
    matrices = _resize_matrices(n.inputs, n.attrs)
    if not matrices:
        return [gy] + [None] * (len(n.inputs) - 1)
    blocks = {a: m.shape[0] // m.shape[1] for a, m in matrices.items()
              if m.shape[0] % m.shape[1] == 0
              and np.array_equal(m, np.repeat(np.eye(m.shape[1]), m.shape[0] // m.shape[1], 0))}
    if len(blocks) == len(matrices):
        split = [d for a, size in enumerate(x.shape)
                 for d in ((size, blocks[a]) if a in blocks else (size,))]
        axes = [a + i + 1 for i, a in enumerate(sorted(blocks))]
        return [op("ReduceSum", reshape_to(gy, split), int64_constant(gy, axes), keepdims=0)
                ] + [None] * (len(n.inputs) - 1)
    for axis, matrix in matrices.items():
        gy = _apply_along(gy, axis, matrix.T)
    return [gy] + [None] * (len(n.inputs) - 1)


def _resize_float64(inputs, attrs, num_outputs):
    """Resize as one MatMul per resized axis with its interpolation matrix."""
    y = inputs[0]
    for axis, matrix in _resize_matrices(inputs, attrs).items():
        y = _apply_along(y, axis, matrix)
    return [y]


register("Resize", _resize_infer, _resize_grad,
         lower=_checked_lowering("Resize", _resize_infer, _resize_float64))


# -- DepthToSpace / SpaceToDepth ----------------------------------------------------------

def _depth_to_space_infer(inputs, attrs, num_outputs):
    x, b = inputs[0], int(attrs["blocksize"])
    if len(x.shape) != 4 or x.shape[1] % (b * b):
        raise ValueError(f"DepthToSpace takes an (N, C, H, W) input with C divisible by "
                         f"blocksize^2 = {b * b}")
    n, c, h, w = x.shape
    return [((n, c // (b * b), h * b, w * b), x.np_dtype)]


def _space_to_depth_infer(inputs, attrs, num_outputs):
    x, b = inputs[0], int(attrs["blocksize"])
    if len(x.shape) != 4 or x.shape[2] % b or x.shape[3] % b:
        raise ValueError(f"SpaceToDepth takes an (N, C, H, W) input with H and W divisible "
                         f"by blocksize {b}")
    n, c, h, w = x.shape
    return [((n, c * b * b, h // b, w // b), x.np_dtype)]


def _rearrange(x, split, perm, shape):
    return reshape_to(op("Transpose", reshape_to(x, split), perm=perm), shape)


def _depth_to_space_parts(x, b, mode):
    n, c, h, w = x.shape
    c //= b * b
    if mode == "CRD":
        return _rearrange(x, [n, c, b, b, h, w], [0, 1, 4, 2, 5, 3], [n, c, h * b, w * b])
    return _rearrange(x, [n, b, b, c, h, w], [0, 3, 4, 1, 5, 2], [n, c, h * b, w * b])


def _space_to_depth_parts(x, b):
    n, c, h, w = x.shape
    return _rearrange(x, [n, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4],
                      [n, c * b * b, h // b, w // b])


def _depth_to_space_grad(n, g, need):
    b, mode = int(n.attrs["blocksize"]), _text(n.attrs.get("mode", "DCR"))
    if mode == "DCR":
        return [op("SpaceToDepth", g[0], blocksize=b)]
    nb, c, hb, wb = g[0].shape
    return [_rearrange(g[0], [nb, c, hb // b, b, wb // b, b], [0, 1, 3, 5, 2, 4],
                       [nb, c * b * b, hb // b, wb // b])]


# onnxruntime's kernels take floats and 8-bit integers; the other dtypes are rearranged
# by Reshape + Transpose, which take them all.
_NO_DEPTH_KERNEL = (np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64, np.bool_)

register("DepthToSpace", _depth_to_space_infer, _depth_to_space_grad,
         lower=_checked_lowering("DepthToSpace", _depth_to_space_infer, lambda i, a, k: [
             _depth_to_space_parts(i[0], int(a["blocksize"]), _text(a.get("mode", "DCR")))],
             _NO_DEPTH_KERNEL))
register("SpaceToDepth", _space_to_depth_infer,
         lambda n, g, need: [op("DepthToSpace", g[0], blocksize=n.attrs["blocksize"])],
         lower=_checked_lowering("SpaceToDepth", _space_to_depth_infer, lambda i, a, k: [
             _space_to_depth_parts(i[0], int(a["blocksize"]))], _NO_DEPTH_KERNEL))
