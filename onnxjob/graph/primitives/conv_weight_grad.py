"""The convolution's weight gradient, in the formulations measured for onnxruntime
(ONNXJOB_CONV_WGRAD picks one; bench_variants.py): window gathers and one Gemm (default),
im2col, a Conv with N and C swapped, a MatMul for pointwise kernels, and the grouped forms,
built in chunks where the columns would be large."""
import functools
import itertools

import numpy as np

from onnxjob import settings
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.primitives.windows import (
    gather_at, gather_windows, pad_spatial, spatial_axes, window_index)
from onnxjob.graph.tracer import int64_constant, op


def conv_weight_grad(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a Conv with group 1: a Conv over batch-transposed tensors.

    x^T (C, N, *S) convolved with gy^T (M, N, *So) as the kernel, stride and dilation
    swapped, gives (C, M, *k') with k' >= k; the extra rows come from input rows no
    output window used and are cut off (always where x's sizes are known at run time
    only: k' is then the run's).
    """
    nd = len(w_shape) - 2
    swap = [1, 0] + spatial_axes(nd + 2)
    xt = op("Transpose", x, perm=swap)
    gt = op("Transpose", gy, perm=swap)
    gw = op("Conv", xt, gt, strides=list(dil), dilations=list(strides), pads=list(pads))
    if gw.shape[2:] != tuple(w_shape[2:]) or x.is_dynamic or gy.is_dynamic:
        gw = op("Slice", gw, *(int64_constant(gw, v) for v in (
            [0] * nd, list(w_shape[2:]), spatial_axes(nd + 2))))
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
    swap = [1, 0] + spatial_axes(nd + 2)
    xt = pad_spatial(op("Transpose", x, perm=swap), pads[:nd], pads[nd:])
    axes = int64_constant(xt, spatial_axes(nd + 2))
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
               int64_constant(x, spatial_axes(nd + 2)), int64_constant(x, list(strides)))
    q = int(np.prod(gy.shape[2:]))
    if n * m * c <= n * q * (m + c):
        return _summed_over_images(gy, reshape_to(x, [n, c, q]), w_shape)
    # NOTE: channels first, (C, N, Q), moves runs of Q values where batch-last (C, Q, N)
    # moves single values: ResNet50's (8, 1024, 14, 14) took 0.31 ms instead of 1.12 in its
    # train step; the Gemm sums over (N, Q) in either order
    swap = [1, 0] + spatial_axes(nd + 2)
    x_t = reshape_to(op("Transpose", x, perm=swap), [c, n * q])
    gy_t = reshape_to(op("Transpose", gy, perm=swap), [m, n * q])
    return reshape_to(op("Gemm", gy_t, x_t, transB=1), w_shape)


def _summed_over_images(gy, columns, w_shape):
    """dL/dW as per-image products summed over the batch: gy (N, M, *So) as (N, M, Q) times
    `columns` (N, R, Q) transposed ((N, Q, R): MatMul's transB, which onnxruntime fuses into
    the product), the (N, M, R) results summed over N."""
    n, r, q = columns.shape
    per_image = op("MatMul", reshape_to(gy, [n, gy.shape[1], q]),
                   op("Transpose", columns, perm=[0, 2, 1]))
    return reshape_to(op("ReduceSum", per_image, int64_constant(per_image, [0]), keepdims=0),
                      w_shape)


def _per_image_windows(x, gy, w_shape, strides, dil, pads):
    """dL/dW of a group-1 Conv from im2col columns gathered per image, (N, C*K, Q), out of
    x padded as it is (channels first, along its last two axes), and _summed_over_images:
    neither x nor gy is made batch-last (two copies of each), for N*M*C*K values of
    per-image results (see conv_weight_grad_gather)."""
    nd = len(w_shape) - 2
    kernel, out = list(w_shape[2:]), list(gy.shape[2:])
    n, c = x.shape[:2]
    xp = pad_spatial(x, pads[:nd], pads[nd:])
    padded = list(xp.shape[2:])
    flat = reshape_to(xp, [n, c, int(np.prod(padded))])
    columns = gather_windows(flat, padded, kernel, out, strides, dil, axis=2)   # (N, C, K, Q)
    k, q = int(np.prod(kernel)), int(np.prod(out))
    return _summed_over_images(gy, reshape_to(columns, [n, c * k, q]), w_shape)


def conv_weight_grad_gather(x, gy, w_shape, strides, dil, pads, group=1, per_image=True):
    """dL/dW of a Conv as one Gemm (group 1) or one batched MatMul (grouped) over im2col
    columns built by one Gather.

    With x batch-last and flattened, (C, P, N) (P padded positions), the columns of kernel
    offset k and output position q are the rows at window_index[k, q]: one Gather with
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
    unit = c * k * n * x.np_dtype.itemsize          # the columns' bytes per output position
    limit = _column_chunk_bytes(x)
    # NOTE: compiled for CUDA, where the per-image results are smaller than the two
    # activations made batch-last (the early layers: ResNet50's stem and res2, res3) and
    # the columns go whole, they are gathered per image (traffic model, ResNet50 b64 step:
    # float32 81.1 -> 79.7 GiB, AMP 47.1 -> 46.7 GiB); the CPU keeps the batch-last
    # columns, whose runs of N values it copies faster (ONNXJOB_CONV_WGRAD=batch-last: on
    # CUDA too, to compare)
    if per_image and group == 1 and x.builder.device == "cuda" and q * unit <= 2 * limit \
            and m * c * k <= q * (m + c):
        return _per_image_windows(x, gy, w_shape, strides, dil, pads)
    batch_last = list(range(1, nd + 2)) + [0]
    xt = pad_spatial(op("Transpose", x, perm=batch_last), pads[:nd], pads[nd:], 1, 1)
    padded = list(xt.shape[1:-1])
    flat = reshape_to(xt, [c, int(np.prod(padded)), n])
    if group == 1:
        gy_t = reshape_to(op("Transpose", gy, perm=batch_last), [m, q * n])
        parts = _parts(q, unit, limit) if q * unit > 2 * limit else 1
        index = window_index(padded, kernel, out, strides, dil)
        return reshape_to(_columns_gemm(flat, index, gy_t, parts), w_shape)
    patches = gather_windows(flat, padded, kernel, out, strides, dil, axis=1)
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
# NOTE: on CUDA, chunks cost a Split of gy and a Gemm each (ResNet50's batch-64 step: 1.2
# GiB of traffic and ~200 kernels, graph/traffic.py), and whole columns left its planned
# peak where it was (bench/memory_plan.py --device cuda: float32 5263.5 MiB, AMP 2692.8 MiB
# either way: the early layers' weight gradients, whose columns are largest, come at the
# end of the backward, when the forward's activations are freed): there columns go whole
# up to 2 * CUDA_COLUMN_CHUNK_BYTES
CUDA_COLUMN_CHUNK_BYTES = 512 << 20


def _column_chunk_bytes(x):
    """The chunk size of `x`'s weight-gradient columns: COLUMN_CHUNK_BYTES, or
    CUDA_COLUMN_CHUNK_BYTES in a job compiled for CUDA."""
    return CUDA_COLUMN_CHUNK_BYTES if x.builder.device == "cuda" else COLUMN_CHUNK_BYTES


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
        columns = reshape_to(gather_at(flat, chunk, 1), [c * k, per * n])
        total = op("Gemm", gy_part, columns, transB=1) if total is None else \
            op("Gemm", gy_part, columns, total, transB=1, beta=1.0)
    return total


_WEIGHT_GRAD = {"gather": conv_weight_grad_gather, "im2col": conv_weight_grad_im2col,
                "conv": conv_weight_grad,
                "batch-last": functools.partial(conv_weight_grad_gather, per_image=False)}


def _weight_grad_choice():
    # NOTE: on the doc LeNet train step (2 threads) the Gather columns measured 87 ms
    # against 97 ms for the per-offset Slice + Concat columns (im2col) and ~140 ms for the
    # batch-transposed Conv; ONNXJOB_CONV_WGRAD=im2col|conv selects the others (batch-last:
    # the gathers without the per-image columns a CUDA job takes for its early layers).
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
    xp = pad_spatial(x, pads[:nd], pads[nd:])
    axes = int64_constant(xp, spatial_axes(nd + 2))
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
    if group == 1 and choice in ("gather", "batch-last") and all(k == 1 for k in w_shape[2:]) \
            and not any(pads):
        return pointwise_weight_grad(x, gy, w_shape, strides)
    if group == 1:
        return _WEIGHT_GRAD[choice](x, gy, w_shape, strides, dil, pads)
    return grouped_weight_grad(x, gy, w_shape, strides, dil, pads, group)
