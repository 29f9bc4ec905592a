"""Resize (nearest and linear, as separable matrices for the gradient), DepthToSpace
and SpaceToDepth: shape and gradient rules."""
import numpy as np

from onnxjob.graph.primitives.shape_ops import reshape_rows, reshape_to
from onnxjob.graph.primitives.windows import checked_lowering, text
from onnxjob.graph.registry import const_value, register
from onnxjob.graph.tracer import as_blob, int64_constant, op


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
    mode = text(attrs.get("mode", "nearest"))
    src = _source_coordinates(in_size, out_size, scale,
                              text(attrs.get("coordinate_transformation_mode", "half_pixel")))
    rows = np.arange(out_size)
    matrix = np.zeros((out_size, in_size))
    if mode == "nearest":
        rounding = _ROUNDING[text(attrs.get("nearest_mode", "round_prefer_floor"))]
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
        blocked = reshape_rows(gy, split, x.is_dynamic and 0 not in blocks)
        return [op("ReduceSum", blocked, int64_constant(gy, axes), keepdims=0)
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
         lower=checked_lowering("Resize", _resize_infer, _resize_float64))


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
    b, mode = int(n.attrs["blocksize"]), text(n.attrs.get("mode", "DCR"))
    if mode == "DCR":
        return [op("SpaceToDepth", g[0], blocksize=b)]
    nb, c, hb, wb = g[0].shape
    return [_rearrange(g[0], [nb, c, hb // b, b, wb // b, b], [0, 1, 3, 5, 2, 4],
                       [nb, c * b * b, hb // b, wb // b])]


# onnxruntime's kernels take floats and 8-bit integers; the other dtypes are rearranged
# by Reshape + Transpose, which take them all.
_NO_DEPTH_KERNEL = (np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64, np.bool_)

register("DepthToSpace", _depth_to_space_infer, _depth_to_space_grad,
         lower=checked_lowering("DepthToSpace", _depth_to_space_infer, lambda i, a, k: [
             _depth_to_space_parts(i[0], int(a["blocksize"]), text(a.get("mode", "DCR")))],
             _NO_DEPTH_KERNEL))
register("SpaceToDepth", _space_to_depth_infer,
         lambda n, g, need: [op("DepthToSpace", g[0], blocksize=n.attrs["blocksize"])],
         lower=checked_lowering("SpaceToDepth", _space_to_depth_infer, lambda i, a, k: [
             _space_to_depth_parts(i[0], int(a["blocksize"]))], _NO_DEPTH_KERNEL))
