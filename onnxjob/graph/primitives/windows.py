"""Window geometry shared by convolution, pooling and their gradients: output sizes,
explicit pads, window index tables (gathers), kernel flips, and the float64 lowering guard.

Everything takes 1, 2 or 3 spatial axes, channels first: (N, C, *spatial). Pads are always
explicit ONNX pads `[begin per spatial axis..., end per spatial axis...]`: the API layer
(ops/conv.py) resolves OneFlow's "SAME" (= SAME_LOWER) and "VALID".
"""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.source_info import user_location


# -- geometry ---------------------------------------------------------------------------

def window_out(size, k, s, d, p0, p1, ceil_mode=False):
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


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def geometry(attrs, x):
    """(strides, dilations, pads) of a Conv or pool node over input `x`."""
    nd = len(x.shape) - 2
    if text(attrs.get("auto_pad", "NOTSET")) != "NOTSET":
        raise ValueError("onnxjob emits explicit pads; auto_pad must be NOTSET")
    strides = [int(v) for v in attrs.get("strides", [1] * nd)]
    dil = [int(v) for v in attrs.get("dilations", [1] * nd)]
    pads = [int(v) for v in attrs.get("pads", [0] * (2 * nd))]
    if len(strides) != nd or len(dil) != nd or len(pads) != 2 * nd:
        raise ValueError(f"strides, dilations and pads must have {nd}, {nd} and {2 * nd} "
                         f"entries for a {nd + 2}-D input")
    return strides, dil, pads


def spatial_axes(rank):
    return list(range(2, rank))


def window_index(padded, kernel, out, strides, dil):
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


def gather_windows(flat, padded, kernel, out, strides, dil, axis):
    """Gather of `flat` (spatial block flattened on `axis`) at window_index: the axis
    becomes (K, Q), kernel offsets by output positions."""
    return gather_at(flat, window_index(padded, kernel, out, strides, dil), axis)


def gather_at(x, index, axis):
    """Gather of `x` at the constant integer array `index` along `axis`."""
    return op("Gather", x, as_blob(index, like=x, dtype=index.dtype), axis=axis)


def pad_spatial(x, begin, end, lead=2, trail=0):
    """Zero-pad the spatial axes of `x` (`lead` axes before them, `trail` after)."""
    if not any(begin) and not any(end):
        return x
    zeros_l, zeros_t = [0] * lead, [0] * trail
    return op("Pad", x, int64_constant(x, zeros_l + list(begin) + zeros_t
                                       + zeros_l + list(end) + zeros_t))


def pad_or_crop(x, begin, end):
    """Spatial pads of (N, C, *S) where negative entries crop instead."""
    x = pad_spatial(x, [max(b, 0) for b in begin], [max(e, 0) for e in end])
    if min(begin + end) >= 0:
        return x
    nd = len(begin)
    starts = [max(-b, 0) for b in begin]
    ends = [x.shape[2 + i] - max(-end[i], 0) for i in range(nd)]
    return op("Slice", x, int64_constant(x, starts), int64_constant(x, ends),
              int64_constant(x, spatial_axes(nd + 2)))


def flipped_transposed(w, group):
    """A Conv weight (M, C/g, *k) as the weight of its adjoint: every kernel flipped and
    the channel axes swapped within each group, (C, M/g, *k)."""
    nd = len(w.shape) - 2
    m, cg, kernel = w.shape[0], w.shape[1], list(w.shape[2:])
    if group == 1:
        swapped = op("Transpose", w, perm=[1, 0] + spatial_axes(nd + 2))
    else:
        grouped = reshape_to(w, [group, m // group, cg] + kernel)
        swapped = op("Transpose", grouped, perm=[0, 2, 1] + list(range(3, nd + 3)))
        swapped = reshape_to(swapped, [group * cg, m // group] + kernel)
    return flip_kernels(swapped)


def flip_kernels(w):
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
        [-1] * nd, [np.iinfo(np.int64).min] * nd, spatial_axes(nd + 2), [-1] * nd)))


def checked_lowering(op_type, infer, build, lowered=(np.float64,)):
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
