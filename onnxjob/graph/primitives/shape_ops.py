"""Ops that move or select elements: shape rules and gradient rules.

Shape arguments (Reshape's shape, Slice's starts, ...) are traced constants, so every
shape is known while tracing.
"""
import numpy as np

from onnxjob.graph.tracer import int64_constant, op
from onnxjob.graph.registry import const_value, normalize_axis, register


def resolve_reshape(in_shape, shape):
    """Target shape with one -1 resolved (0 means 0, not "copy": allowzero semantics off)."""
    shape = [int(d) for d in shape]
    size = int(np.prod(in_shape))
    if shape.count(-1) > 1:
        raise ValueError(f"at most one -1 is allowed in shape {shape}")
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape {tuple(in_shape)} ({size} elements) to {shape}")
        shape[shape.index(-1)] = size // known
    if int(np.prod(shape)) != size:
        raise ValueError(f"cannot reshape {tuple(in_shape)} ({size} elements) to {tuple(shape)}")
    return tuple(shape)


def _reshape_infer(inputs, attrs, num_outputs):
    return [(resolve_reshape(inputs[0].shape, const_value(inputs[1])), inputs[0].np_dtype)]


def reshape_to(x, shape):
    if tuple(x.shape) == tuple(shape):
        return x
    return op("Reshape", x, int64_constant(x, shape))


register("Reshape", _reshape_infer, lambda n, g, need: [reshape_to(g[0], n.inputs[0].shape), None])


def _squeeze_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axes = [normalize_axis(int(a), len(x.shape)) for a in const_value(inputs[1])]
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of size {x.shape[a]}")
    return [(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.np_dtype)]


def _unsqueeze_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axes = sorted(normalize_axis(int(a), len(x.shape) + len(const_value(inputs[1])))
                  for a in const_value(inputs[1]))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return [(tuple(shape), x.np_dtype)]


_back_to_input = lambda n, g, need: [reshape_to(g[0], n.inputs[0].shape)] + [None] * (len(n.inputs) - 1)  # noqa: E731
register("Squeeze", _squeeze_infer, _back_to_input)
register("Unsqueeze", _unsqueeze_infer, _back_to_input)


def _flatten_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axis = normalize_axis(attrs.get("axis", 1), len(x.shape) + 1) if x.shape else 0
    return [((int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))), x.np_dtype)]


register("Flatten", _flatten_infer, _back_to_input)


def _transpose_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    perm = attrs.get("perm", list(reversed(range(len(x.shape)))))
    if sorted(perm) != list(range(len(x.shape))):
        raise ValueError(f"perm {perm} is not a permutation of the {len(x.shape)} axes")
    return [(tuple(x.shape[p] for p in perm), x.np_dtype)]


def _transpose_grad(n, g, need):
    perm = n.attrs.get("perm", list(reversed(range(len(n.inputs[0].shape)))))
    return [op("Transpose", g[0], perm=[int(i) for i in np.argsort(perm)])]


register("Transpose", _transpose_infer, _transpose_grad)


def _concat_infer(inputs, attrs, num_outputs):
    first = inputs[0]
    axis = normalize_axis(attrs["axis"], len(first.shape))
    for x in inputs[1:]:
        if len(x.shape) != len(first.shape) or x.np_dtype != first.np_dtype or any(
                a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != axis):
            raise ValueError(f"cannot concatenate {first.shape} and {x.shape} on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in inputs)
    return [(tuple(shape), first.np_dtype)]


def _concat_grad(n, g, need):
    axis = n.attrs["axis"]
    sizes = [x.shape[axis] for x in n.inputs]
    parts = op("Split", g[0], int64_constant(g[0], sizes), axis=axis, num_outputs=len(sizes))
    return parts if len(sizes) > 1 else [parts]


register("Concat", _concat_infer, _concat_grad)


def _split_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axis = normalize_axis(attrs.get("axis", 0), len(x.shape))
    if len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(s) for s in const_value(inputs[1])]
    else:
        if x.shape[axis] % num_outputs:
            raise ValueError(f"axis {axis} of size {x.shape[axis]} does not split in {num_outputs}")
        sizes = [x.shape[axis] // num_outputs] * num_outputs
    if sum(sizes) != x.shape[axis] or len(sizes) != num_outputs:
        raise ValueError(f"split sizes {sizes} do not cover axis {axis} of size {x.shape[axis]}")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append((tuple(shape), x.np_dtype))
    return outs


def _split_grad(n, g, need):
    parts = [gy if gy is not None else
             op("ConstantOfShape", int64_constant(n.inputs[0], out.shape),
                value=np.zeros(1, out.np_dtype))
             for gy, out in zip(g, n.outputs)]
    return [op("Concat", *parts, axis=n.attrs.get("axis", 0)), None]


register("Split", _split_infer, _split_grad)


def slice_bounds(shape, starts, ends, axes, steps):
    """Per-axis (start, stop, step) as Python slicing would resolve them."""
    bounds = [(0, d, 1) for d in shape]
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = normalize_axis(int(a), len(shape))
        bounds[a] = slice(int(s), int(e), int(st)).indices(shape[a])
    return bounds


def _slice_args(n_inputs):
    x, starts, ends = n_inputs[:3]
    rank = len(x.shape)
    axes = const_value(n_inputs[3]) if len(n_inputs) > 3 and n_inputs[3] is not None else range(rank)
    steps = const_value(n_inputs[4]) if len(n_inputs) > 4 and n_inputs[4] is not None else [1] * len(const_value(starts))
    return slice_bounds(x.shape, const_value(starts), const_value(ends), axes, steps)


def _slice_infer(inputs, attrs, num_outputs):
    bounds = _slice_args(inputs)
    shape = tuple(len(range(*b)) for b in bounds)
    return [(shape, inputs[0].np_dtype)]


def _slice_grad(n, g, need):
    bounds = _slice_args(n.inputs)
    if any(step != 1 for _, _, step in bounds):
        raise NotImplementedError("gradient of a strided Slice")
    x = n.inputs[0]
    pads = [b[0] for b in bounds] + [d - b[1] for d, b in zip(x.shape, bounds)]
    return [op("Pad", g[0], int64_constant(g[0], pads))] + [None] * (len(n.inputs) - 1)


register("Slice", _slice_infer, _slice_grad)


def _pad_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    pads = const_value(inputs[1])
    r = len(x.shape)
    return [(tuple(int(d + pads[i] + pads[i + r]) for i, d in enumerate(x.shape)), x.np_dtype)]


def _pad_grad(n, g, need):
    x = n.inputs[0]
    pads = const_value(n.inputs[1])
    r = len(x.shape)
    if attr_mode(n) != "constant":
        raise NotImplementedError("gradient of a non-constant Pad")
    starts = [int(p) for p in pads[:r]]
    ends = [int(s + d) for s, d in zip(starts, x.shape)]
    sliced = op("Slice", g[0], int64_constant(g[0], starts), int64_constant(g[0], ends))
    return [sliced] + [None] * (len(n.inputs) - 1)


def attr_mode(n):
    mode = n.attrs.get("mode", "constant")
    return mode.decode() if isinstance(mode, bytes) else mode


register("Pad", _pad_infer, _pad_grad)


def _gather_infer(inputs, attrs, num_outputs):
    data, idx = inputs
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape))
    return [(data.shape[:axis] + idx.shape + data.shape[axis + 1:], data.np_dtype)]


def _gather_grad(n, g, need):
    data, idx = n.inputs
    axis = normalize_axis(n.attrs.get("axis", 0), len(data.shape))
    perm = [axis] + [i for i in range(len(data.shape)) if i != axis]
    moved_shape = tuple(data.shape[p] for p in perm)
    gy = g[0]
    if axis:  # move the gathered axes to the front so ScatterND can add rows
        r_idx = len(idx.shape)
        gperm = list(range(axis, axis + r_idx)) + list(range(axis)) + list(
            range(axis + r_idx, len(gy.shape)))
        gy = op("Transpose", gy, perm=gperm)
    zeros = op("ConstantOfShape", int64_constant(gy, moved_shape), value=np.zeros(1, data.np_dtype))
    idx64 = idx if idx.np_dtype == np.int64 else op("Cast", idx, to=7)
    idx64 = op("Unsqueeze", idx64, int64_constant(idx64, [-1]))
    scattered = op("ScatterND", zeros, idx64, gy, reduction="add")
    if axis:
        scattered = op("Transpose", scattered, perm=[int(i) for i in np.argsort(perm)])
    return [scattered, None]


register("Gather", _gather_infer, _gather_grad)


def _gather_elements_grad(n, g, need):
    data, idx = n.inputs
    zeros = op("ConstantOfShape", int64_constant(g[0], data.shape), value=np.zeros(1, data.np_dtype))
    return [op("ScatterElements", zeros, idx, g[0], axis=n.attrs.get("axis", 0),
               reduction="add"), None]


register("GatherElements", lambda i, a, k: [(i[1].shape, i[0].np_dtype)], _gather_elements_grad)
register("ScatterElements", lambda i, a, k: [(i[0].shape, i[0].np_dtype)], None)
register("ScatterND", lambda i, a, k: [(i[0].shape, i[0].np_dtype)], None)


def _expand_infer(inputs, attrs, num_outputs):
    from onnxjob.graph.registry import broadcast_shape
    return [(broadcast_shape(inputs[0].shape, tuple(int(d) for d in const_value(inputs[1]))),
             inputs[0].np_dtype)]


register("Expand", _expand_infer, lambda n, g, need: [g[0], None])  # engine reduces
register("Shape", lambda i, a, k: [((len(i[0].shape),), np.dtype(np.int64))], None,
         differentiable=False)


def _const_of_shape_infer(inputs, attrs, num_outputs):
    value = attrs.get("value")
    dt = np.asarray(value).dtype if value is not None else np.dtype(np.float32)
    return [(tuple(int(d) for d in const_value(inputs[0])), dt)]


register("ConstantOfShape", _const_of_shape_infer, None, differentiable=False)


def _one_hot_infer(inputs, attrs, num_outputs):
    idx, depth, values = inputs
    axis = attrs.get("axis", -1)
    shape = list(idx.shape)
    shape.insert(axis % (len(shape) + 1), int(np.asarray(const_value(depth)).reshape(-1)[0]))
    return [(tuple(shape), values.np_dtype)]


def _one_hot_lower(inputs, attrs, num_outputs):
    """onnxruntime's CPU OneHot takes int64 indices and float32 or int64 values only: other
    indices are cast to int64, other values are picked with Where from an int64 one-hot."""
    idx, depth, values = inputs
    if idx.np_dtype == np.int64 and values.np_dtype in (np.float32, np.int64):
        return None
    idx = idx if idx.np_dtype == np.int64 else op("Cast", idx, to=7)
    if values.np_dtype in (np.float32, np.int64):
        return [op("OneHot", idx, depth, values, **attrs)]
    hot = op("OneHot", idx, depth, int64_constant(idx, [0, 1]), **attrs)
    pick = op("Cast", hot, to=9)  # bool
    split = op("Split", values, int64_constant(values, [1, 1]), axis=0, num_outputs=2)
    return [op("Where", pick, reshape_to(split[1], ()), reshape_to(split[0], ()))]


register("OneHot", _one_hot_infer, None, differentiable=False, lower=_one_hot_lower)


def _tile_infer(inputs, attrs, num_outputs):
    reps = const_value(inputs[1])
    return [(tuple(int(d * r) for d, r in zip(inputs[0].shape, reps)), inputs[0].np_dtype)]


def _tile_grad(n, g, need):
    x = n.inputs[0]
    reps = [int(r) for r in const_value(n.inputs[1])]
    split_shape = []
    for r, d in zip(reps, x.shape):
        split_shape += [r, d]
    summed = op("ReduceSum", reshape_to(g[0], split_shape),
                int64_constant(g[0], list(range(0, 2 * len(reps), 2))), keepdims=0)
    return [summed, None]


register("Tile", _tile_infer, _tile_grad)
register("Range", lambda i, a, k: [((int(np.ceil((const_value(i[1]) - const_value(i[0])) / const_value(i[2]))),), i[0].np_dtype)], None, differentiable=False)
