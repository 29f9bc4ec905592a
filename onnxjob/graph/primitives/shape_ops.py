"""Ops that move or select elements: shape rules and gradient rules.

Shape arguments (Reshape's shape, Slice's starts, ...) are traced constants, so every
shape is known while tracing.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op
from onnxjob.graph.registry import (broadcast_shape, const_value, normalize_axis, register,
                                    register_composite, static_value)

_INT64_MIN = np.iinfo(np.int64).min


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
    # the shape may be another Blob's, read with Shape (its static shape: the maximum)
    return [(resolve_reshape(inputs[0].shape, static_value(inputs[1])), inputs[0].np_dtype)]


def reshape_to(x, shape):
    if tuple(x.shape) == tuple(shape):
        return x
    return op("Reshape", x, int64_constant(x, shape))


def reshape_back(v, x):
    """`v` reshaped to x's shape: its run-time shape where x is dynamic (a mirrored batch
    smaller than its placeholder)."""
    return op("Reshape", v, op("Shape", x)) if x.is_dynamic else reshape_to(v, x.shape)


def reshape_rows(v, shape, dynamic):
    """`v` reshaped to `shape`, whose first axis holds a batch's rows: -1 there (the run's
    rows) where `dynamic`, the batch being a mirrored one smaller than its placeholder."""
    if dynamic:
        return op("Reshape", v, int64_constant(v, [-1] + list(shape[1:])))
    return reshape_to(v, shape)


def flat(v):
    """`v` as a vector (of its run-time size when it is dynamic)."""
    return reshape_rows(v, [int(np.prod(v.shape))], v.is_dynamic)


# the widest rows concat_flat cuts its values into (see concat_flat)
MAX_FLAT_WIDTH = 1024


def flat_width(sizes):
    """The largest power of two, at most MAX_FLAT_WIDTH, that divides every one of `sizes`."""
    width = MAX_FLAT_WIDTH
    for size in sizes:
        width = min(width, size & -size if size else width)
    return width


# values concatenated together are grouped by the power of two, up to this, that divides
# their sizes, so that one odd size (a classifier's 1000 biases) does not narrow the rows
# of a group of multiples of 64 (a network's batch norm parameters)
GROUPED_WIDTH = 64


def width_class(blob):
    """The width class `blob` (static shape) is grouped by for concat_flat (GROUPED_WIDTH)."""
    return min(GROUPED_WIDTH, flat_width([int(np.prod(blob.shape))]))


def concat_flat(blobs):
    """The static-shaped `blobs`' values, in order, as one Concat: a vector, or, where every
    size is a multiple of a power of two (flat_width), a matrix of rows of that width.
    onnxruntime's CUDA Concat and Split build, each run on the host, a table of every index
    along their axis and copy it to the device (core/providers/cuda/tensor/concat.cc,
    split.cc): 6 MB a run for ResNet50's 768040 batch norm parameters as a vector, 94 KB
    as rows of 64. Elementwise updates do not mind the shape."""
    if len(blobs) == 1:
        return flat(blobs[0])
    width = flat_width([int(np.prod(b.shape)) for b in blobs])
    if width == 1:
        return op("Concat", *[flat(b) for b in blobs], axis=0)
    return op("Concat", *[reshape_to(b, [int(np.prod(b.shape)) // width, width])
                          for b in blobs], axis=0)


def concat_flat_constant(values, shapes, like):
    """A constant laid out as `like` (concat_flat of values of `shapes`): each value's
    elements hold the matching one of `values`, in `like`'s dtype."""
    array = np.concatenate([np.full(int(np.prod(shape)), v, dtype=like.np_dtype)
                            for v, shape in zip(values, shapes)])
    return as_blob(array.reshape(like.shape), like=like)


def split_flat(value, shapes):
    """`value` (as concat_flat makes it) cut back into values of `shapes` (one Split)."""
    sizes = [int(np.prod(shape)) for shape in shapes]
    if len(sizes) == 1:
        return [reshape_to(value, list(shapes[0]))]
    width = int(np.prod(value.shape[1:]))
    parts = op("Split", value, int64_constant(value, [n // width for n in sizes]), axis=0,
               num_outputs=len(sizes))
    return [reshape_to(part, list(shape)) for part, shape in zip(parts, shapes)]


def _reshape_zero_sizes(inputs, attrs, num_outputs):
    """A Reshape to a constant shape with a 0 in it (and no -1): `allowzero`, so the 0 is
    a size of 0 (a zero-sized Blob, as OneFlow reshapes it), not ONNX's default "copy the
    input's size"; None for every other Reshape."""
    if "allowzero" in attrs or inputs[1].value.const_value is None:
        return None
    shape = [int(d) for d in static_value(inputs[1])]
    if 0 not in shape or -1 in shape:
        return None
    return [op("Reshape", inputs[0], inputs[1], allowzero=1)]


register("Reshape", _reshape_infer, lambda n, g, need: _back_to_input(n, g, need),
         lower=_reshape_zero_sizes)


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


def _back_to_input(n, g, need):
    return [reshape_back(g[0], n.inputs[0])] + [None] * (len(n.inputs) - 1)


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
        if x.np_dtype != first.np_dtype:    # (OneFlow's concat_op.cpp checks it too)
            raise ValueError(f"cannot concatenate {first.np_dtype} and {x.np_dtype} values: "
                             "the inputs must have one dtype (flow.cast one of them)")
        if len(x.shape) != len(first.shape) or any(
                a != b for i, (a, b) in enumerate(zip(x.shape, first.shape)) if i != axis):
            raise ValueError(f"cannot concatenate {first.shape} and {x.shape} on axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in inputs)
    return [(tuple(shape), first.np_dtype)]


def _concat_grad(n, g, need):
    axis = n.attrs["axis"]
    if any(x.is_dynamic for x in n.inputs):
        sizes = op("Concat", *(dim_of(x, axis) for x in n.inputs), axis=0)
    else:
        sizes = int64_constant(g[0], [x.shape[axis] for x in n.inputs])
    parts = op("Split", g[0], sizes, axis=axis, num_outputs=len(n.inputs))
    return parts if len(n.inputs) > 1 else [parts]


register("Concat", _concat_infer, _concat_grad)


def _split_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    axis = normalize_axis(attrs.get("axis", 0), len(x.shape))
    if len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(s) for s in static_value(inputs[1])]
    else:
        if x.shape[axis] % num_outputs:
            raise ValueError(f"axis {axis} of size {x.shape[axis]} does not split in {num_outputs}")
        sizes = [x.shape[axis] // num_outputs] * num_outputs
    exact = len(inputs) < 2 or inputs[1] is None or inputs[1].value.const_value is not None
    # (sizes read from a dynamic Blob's shape are largest sizes: only their count is known)
    if len(sizes) != num_outputs or (exact and sum(sizes) != x.shape[axis]):
        raise ValueError(f"split sizes {sizes} do not cover axis {axis} of size {x.shape[axis]}")
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append((tuple(shape), x.np_dtype))
    return outs


def _split_grad(n, g, need):
    parts = [gy if gy is not None else zeros_of(out, out.shape, out.np_dtype)
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
    axes, steps = (n_inputs[i] if len(n_inputs) > i else None for i in (3, 4))
    axes = range(len(x.shape)) if axes is None else const_value(axes)
    steps = [1] * len(const_value(starts)) if steps is None else const_value(steps)
    return slice_bounds(x.shape, const_value(starts), const_value(ends), axes, steps)


def _computed_ends(inputs):
    """Whether a Slice ends at run-time values: constant starts (and axes, steps), ends
    computed in the graph (a Slice that keeps the first `size` rows)."""
    return len(inputs) > 2 and inputs[2].value.const_value is None


def _slice_infer(inputs, attrs, num_outputs):
    if _computed_ends(inputs):   # at most up to the end of each sliced axis
        x, starts = inputs[0], const_value(inputs[1])
        axes = const_value(inputs[3]) if len(inputs) > 3 else range(len(starts))
        if len(inputs) > 4 and any(int(s) != 1 for s in const_value(inputs[4])):
            raise ValueError("a Slice with computed ends takes steps of 1")
        ends = [np.iinfo(np.int64).max] * len(starts)
        bounds = slice_bounds(x.shape, starts, ends, axes, [1] * len(starts))
    else:
        bounds = _slice_args(inputs)
    shape = tuple(len(range(*b)) for b in bounds)
    return [(shape, inputs[0].np_dtype)]


def shape_of(x):
    """The shape of `x` as an int64 Blob: a constant, or Shape(x) when x is dynamic."""
    return op("Shape", x) if x.is_dynamic else int64_constant(x, x.shape)


def dim_of(x, axis):
    """x.shape[axis] as an int64 Blob of shape (1,) (computed at run time for a dynamic
    x)."""
    axis = normalize_axis(axis, len(x.shape))
    if x.is_dynamic:
        return op("Shape", x, start=axis, end=axis + 1)
    return int64_constant(x, [x.shape[axis]])


def zeros_of(like_blob, shape, np_dtype):
    """A ConstantOfShape of zeros in the graph of `like_blob` (of like_blob's run-time
    shape when it is dynamic and `shape` is its static one)."""
    if like_blob.is_dynamic and tuple(shape) == like_blob.shape:
        return op("ConstantOfShape", op("Shape", like_blob), value=np.zeros(1, np_dtype))
    return op("ConstantOfShape", int64_constant(like_blob, shape), value=np.zeros(1, np_dtype))


def reverse_axis(x, axis):
    """`x` with the order of `axis` reversed (a Slice of step -1)."""
    return op("Slice", x, *(int64_constant(x, [v]) for v in (-1, _INT64_MIN, axis, -1)))


def _spread_axis(gy, axis, step):
    """Put `step - 1` zeros between the entries of `gy` along `axis` (none after the last)."""
    count = gy.shape[axis]
    pad_widths = [0] * (2 * (len(gy.shape) + 1))
    pad_widths[len(gy.shape) + 1 + axis + 1] = step - 1
    spread = op("Pad", op("Unsqueeze", gy, int64_constant(gy, [axis + 1])),
                int64_constant(gy, pad_widths))
    shape = list(gy.shape)
    shape[axis] = count * step
    spread = reshape_rows(spread, shape, gy.is_dynamic and axis > 0)
    return op("Slice", spread, *(int64_constant(gy, [v]) for v in
                                 (0, (count - 1) * step + 1, axis)))


def _slice_grad(n, g, need):
    """Scatter gy back to the sliced positions: reverse negative steps, spread strides with
    zeros, then pad to the input's shape."""
    x = n.inputs[0]
    bounds = _slice_args(n.inputs)
    rest = [None] * (len(n.inputs) - 1)
    if any(len(range(*b)) == 0 for b in bounds):
        return [zeros_of(x, x.shape, g[0].np_dtype)] + rest
    gy = g[0]
    before, after = [], []
    for axis, ((start, stop, step), dim) in enumerate(zip(bounds, x.shape)):
        count = len(range(start, stop, step))
        if step < 0:
            gy = reverse_axis(gy, axis)
            start, step = start + (count - 1) * step, -step
        if step > 1:
            gy = _spread_axis(gy, axis, step)
        before.append(start)
        after.append(dim - start - (count - 1) * step - 1)
    if any(before) or any(after):
        gy = op("Pad", gy, int64_constant(gy, before + after))
    return [gy] + rest


register("Slice", _slice_infer, _slice_grad, data_dependent=_computed_ends)


def _non_zero_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    return [((len(x.shape), int(np.prod(x.shape))), np.dtype(np.int64))]


register("NonZero", _non_zero_infer, None, differentiable=False,
         data_dependent=lambda inputs: True)



def _pad_infer(inputs, attrs, num_outputs):
    x = inputs[0]
    # (pads computed from a dynamic Blob's shape: their value at the maximum shapes)
    pads = static_value(inputs[1])
    r = len(x.shape)
    if attr_text(attrs, "mode", "constant") == "reflect" and any(
            max(pads[i], pads[i + r]) >= d for i, d in enumerate(x.shape)):
        raise ValueError(f"reflect pads {list(pads)} must be smaller than the padded axes")
    return [(tuple(int(d + pads[i] + pads[i + r]) for i, d in enumerate(x.shape)), x.np_dtype)]


def pad_source_index(dim, before, after, mode):
    """For each output position of one padded axis, the input position it copies."""
    src = np.arange(-before, dim + after)
    if mode == "edge":
        return np.clip(src, 0, dim - 1)
    src = np.abs(src)  # reflect: mirror around the first and the last entry
    return np.where(src >= dim, 2 * (dim - 1) - src, src)


def _pad_grad(n, g, need):
    x = n.inputs[0]
    pads = [int(p) for p in const_value(n.inputs[1])]
    r = len(x.shape)
    mode = attr_text(n.attrs, "mode", "constant")
    rest = [None] * (len(n.inputs) - 1)
    if mode == "constant":
        starts = pads[:r]
        ends = [s + d for s, d in zip(starts, x.shape)]
        return [op("Slice", g[0], int64_constant(g[0], starts), int64_constant(g[0], ends))] + rest
    # NOTE: reflect / edge pads are a gather along each padded axis; their gradient
    # scatter-adds gy back along those axes, one axis at a time.
    gy = g[0]
    for axis, dim in enumerate(x.shape):
        if pads[axis] or pads[axis + r]:
            src = pad_source_index(dim, pads[axis], pads[axis + r], mode)
            gy = scatter_add_axis(gy, int64_constant(gy, src), axis, dim)
    return [gy] + rest


def attr_text(attrs, name, default):
    """A string attribute (ONNX may hold it as bytes)."""
    value = attrs.get(name, default)
    return value.decode() if isinstance(value, bytes) else value


register("Pad", _pad_infer, _pad_grad)


def _gather_infer(inputs, attrs, num_outputs):
    data, idx = inputs
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape))
    return [(data.shape[:axis] + idx.shape + data.shape[axis + 1:], data.np_dtype)]


def scatter_add_axis(gy, idx, axis, size):
    """The transpose of Gather(data, idx, axis) for a data axis of `size`: gy's entries
    added into the rows of a zero tensor that idx picked."""
    r_idx = len(idx.shape)
    rank = len(gy.shape) - r_idx + 1
    if axis:  # move the gathered axes to the front so ScatterND can add rows
        gperm = list(range(axis, axis + r_idx)) + list(range(axis)) + list(
            range(axis + r_idx, len(gy.shape)))
        gy = op("Transpose", gy, perm=gperm)
    rest = gy.shape[r_idx:]
    if not isinstance(size, Blob) and not gy.is_dynamic:
        zeros = zeros_of(gy, (size,) + rest, gy.np_dtype)
    else:   # a run-time size (int64 (1,) Blob: a dynamic data axis) or a dynamic gy
        # (its rows are the indices', not data's, even where the static sizes agree)
        rows = size if isinstance(size, Blob) else int64_constant(gy, [size])
        shape = op("Concat", rows, op("Shape", gy, start=r_idx), axis=0)
        zeros = op("ConstantOfShape", shape, value=np.zeros(1, gy.np_dtype))
    idx64 = idx if idx.np_dtype == np.int64 else op("Cast", idx, to=dtypes.int64.ir_dtype.value)
    idx64 = op("Unsqueeze", idx64, int64_constant(idx64, [-1]))
    scattered = op("ScatterND", zeros, idx64, gy, reduction="add")
    if axis:
        perm = [axis] + [i for i in range(rank) if i != axis]
        scattered = op("Transpose", scattered, perm=[int(i) for i in np.argsort(perm)])
    return scattered


def _gather_grad(n, g, need):
    data, idx = n.inputs
    axis = normalize_axis(n.attrs.get("axis", 0), len(data.shape))
    size = dim_of(data, axis) if data.is_dynamic else data.shape[axis]
    return [scatter_add_axis(g[0], idx, axis, size), None]


register("Gather", _gather_infer, _gather_grad)


def _gather_elements_infer(inputs, attrs, num_outputs):
    data, idx = inputs
    axis = normalize_axis(attrs.get("axis", 0), len(data.shape))
    if len(idx.shape) != len(data.shape) or not (data.is_dynamic or idx.is_dynamic) and any(
            i != axis and k > d for i, (k, d) in enumerate(zip(idx.shape, data.shape))):
        raise ValueError(f"indices {idx.shape} must have the rank of data {data.shape} and "
                         f"no larger axes except axis {axis}")
    return [(idx.shape, data.np_dtype)]


def _gather_elements_grad(n, g, need):
    data, idx = n.inputs
    zeros = zeros_of(data, data.shape, g[0].np_dtype)
    return [op("ScatterElements", zeros, idx, g[0], axis=n.attrs.get("axis", 0),
               reduction="add"), None]


register("GatherElements", _gather_elements_infer, _gather_elements_grad)
register("ScatterElements", lambda i, a, k: [(i[0].shape, i[0].np_dtype)], None)


def nd_index_shape(data_shape, idx_shape):
    """Shape of GatherND(data, idx) (batch_dims 0): idx's batch axes, then the slice."""
    if not idx_shape or not 1 <= idx_shape[-1] <= len(data_shape):
        raise ValueError(f"the last axis of indices {idx_shape} must be in [1, rank of "
                         f"{data_shape}]")
    return tuple(idx_shape[:-1]) + tuple(data_shape[idx_shape[-1]:])


def _gather_nd_infer(inputs, attrs, num_outputs):
    data, idx = inputs
    if attrs.get("batch_dims", 0):
        raise ValueError("GatherND with batch_dims is not supported")
    return [(nd_index_shape(data.shape, idx.shape), data.np_dtype)]


def _gather_nd_grad(n, g, need):
    data, idx = n.inputs
    zeros = zeros_of(data, data.shape, g[0].np_dtype)
    return [op("ScatterND", zeros, idx, g[0], reduction="add"), None]


register("GatherND", _gather_nd_infer, _gather_nd_grad)


def _scatter_nd_infer(inputs, attrs, num_outputs):
    data, idx, updates = inputs
    expected = nd_index_shape(data.shape, idx.shape)
    if updates.shape != expected or updates.np_dtype != data.np_dtype:
        raise ValueError(f"updates must have shape {expected} and dtype {data.np_dtype}, got "
                         f"{updates.shape} {updates.np_dtype}")
    return [(data.shape, data.np_dtype)]


def _scatter_nd_grad(n, g, need):
    """Overwritten positions pass no gradient to data (added ones do); updates get
    their positions' gy."""
    data, idx, updates = n.inputs
    g_data = g_updates = None
    if need[0]:
        g_data = g[0]
        if attr_text(n.attrs, "reduction", "none") == "none":
            # (zeros of updates' run-time shape: data's may agree with it statically only)
            g_data = op("ScatterND", g[0], idx, zeros_of(updates, updates.shape,
                                                         g[0].np_dtype))
    if need[2]:
        g_updates = op("GatherND", g[0], idx)
    return [g_data, None, g_updates]


def _scatter_nd_add_expand(inputs, attrs, num_outputs):
    """ScatterND(data, idx, updates, reduction="add") as a ScatterElements along the rows
    of data viewed as (rows, slice size): onnxruntime's CPU ScatterND adds the slices on
    several threads without ordering them, so repeated indices lose updates at random (a
    segment sum of 6144 rows into 4 was off by up to 15 in 2 of 8 runs; a mirrored job's
    gather gradient, whose indices have a run-time row count, by up to 56); its
    ScatterElements adds them one after another. The number of updates may be known only
    at run time (dynamic idx / updates); so may data's dims (_dynamic_rows_scatter_add)."""
    data, idx, updates = inputs
    if data.is_dynamic:
        return [_dynamic_rows_scatter_add(data, idx, updates)]
    k = idx.shape[-1]
    head, tail = data.shape[:k], data.shape[k:]
    size = int(np.prod(tail))
    idx = op("Reshape", op("Cast", idx, to=dtypes.int64.ir_dtype.value),
             int64_constant(idx, [-1, k]))
    dims = int64_constant(idx, list(head))
    strides = int64_constant(idx, [int(np.prod(head[j + 1:])) for j in range(k)])
    idx = _wrap_negative(idx, dims)
    row = op("ReduceSum", op("Mul", idx, strides), int64_constant(idx, [1]), keepdims=1)
    positions = op("Expand", row, int64_constant(idx, [1, size]))      # (count, size)
    slices = int64_constant(idx, [-1, size])
    summed = op("ScatterElements", op("Reshape", data, slices), positions,
                op("Reshape", updates, slices), axis=0, reduction="add")
    return [reshape_to(summed, data.shape)]


def _wrap_negative(idx, dims):
    """int64 indices counted from the back (-1: the last) as the non-negative ones they
    stand for, `dims` the sizes of the axes they index."""
    return op("Where", op("Less", idx, int64_constant(idx, 0)), op("Add", idx, dims), idx)


def _dynamic_rows_scatter_add(data, idx, updates):
    """The scatter-add into data whose dims are known at run time only: with k = idx's
    last dim, data as (rows: its first k dims, the rest flattened), the updates as (count,
    the rest flattened) (Flatten: no size fixed while tracing), each index's row number
    from data's run-time dims (((i0 * d1 + i1) * d2 + i2) ...), one ScatterElements along
    the rows with the row numbers broadcast to the updates' run-time shape, and the sum
    back in data's shape."""
    k, lead = idx.shape[-1], len(idx.shape) - 1
    idx = op("Reshape", op("Cast", idx, to=dtypes.int64.ir_dtype.value),
             int64_constant(idx, [-1, k]))
    dims = op("Shape", data, start=0, end=k)
    idx = _wrap_negative(idx, dims)
    row = None
    for j in range(k):
        column = op("Slice", idx, *(int64_constant(idx, [v]) for v in (j, j + 1, 1)))
        row = column if row is None else op("Add", op("Mul", row, op(
            "Slice", dims, *(int64_constant(idx, [v]) for v in (j, j + 1, 0)))), column)
    updates = op("Flatten", updates, axis=lead)
    zeros = op("ConstantOfShape", op("Shape", updates), value=np.zeros(1, np.int64))
    summed = op("ScatterElements", op("Flatten", data, axis=k), op("Add", zeros, row),
                updates, axis=0, reduction="add")
    return op("Reshape", summed, op("Shape", data))


register_composite("onnxjob.ScatterNDAdd", _scatter_nd_add_expand, _scatter_nd_grad)


def _scatter_nd_lower(inputs, attrs, num_outputs):
    """Every scatter-add is onnxjob.ScatterNDAdd (see there)."""
    data, idx, _ = inputs
    if attr_text(attrs, "reduction", "none") != "add" or idx.is_dynamic and \
            len(idx.shape) < 2:
        return None
    try:
        _scatter_nd_infer(inputs, attrs, num_outputs)
    except ValueError:
        return None     # the shape rule then raises, naming the user's line
    return [op("onnxjob.ScatterNDAdd", *inputs, reduction="add")]


register("ScatterND", _scatter_nd_infer, _scatter_nd_grad, lower=_scatter_nd_lower)


def _expand_infer(inputs, attrs, num_outputs):
    return [(broadcast_shape(inputs[0].shape, tuple(int(d) for d in static_value(inputs[1]))),
             inputs[0].np_dtype)]


def _shape_infer(inputs, attrs, num_outputs):
    rank = len(inputs[0].shape)
    dims = range(rank)[attrs.get("start", 0):attrs.get("end", rank)]
    return [((len(dims),), np.dtype(np.int64))]


register("Expand", _expand_infer, lambda n, g, need: [g[0], None])  # engine reduces
register("Shape", _shape_infer, None, differentiable=False)
register("Size", lambda i, a, k: [((), np.dtype(np.int64))], None, differentiable=False)


def _const_of_shape_infer(inputs, attrs, num_outputs):
    value = attrs.get("value")
    dt = np.asarray(value).dtype if value is not None else np.dtype(np.float32)
    return [(tuple(int(d) for d in static_value(inputs[0])), dt)]


register("ConstantOfShape", _const_of_shape_infer, None, differentiable=False)


def _one_hot_infer(inputs, attrs, num_outputs):
    idx, depth, values = inputs
    axis = normalize_axis(attrs.get("axis", -1), len(idx.shape) + 1)
    shape = list(idx.shape)
    shape.insert(axis, int(np.asarray(const_value(depth)).reshape(-1)[0]))
    return [(tuple(shape), values.np_dtype)]


def _one_hot_lower(inputs, attrs, num_outputs):
    """onnxruntime's CPU OneHot takes int64 indices and float32 or int64 values only: other
    indices are cast to int64, other values are picked with Where from an int64 one-hot."""
    idx, depth, values = inputs
    if not idx.shape and attrs.get("axis", -1) in (-1, 0):
        # onnxruntime's OneHot needs indices of rank >= 1: a 0-d index is one of shape (1,)
        attrs = dict(attrs, axis=-1)
        hot = op("OneHot", reshape_to(idx, (1,)), depth, values, **attrs)
        return [reshape_to(hot, hot.shape[1:])]
    if idx.np_dtype == np.int64 and values.np_dtype in (np.float32, np.int64):
        return None
    idx = idx if idx.np_dtype == np.int64 else op("Cast", idx, to=dtypes.int64.ir_dtype.value)
    if values.np_dtype in (np.float32, np.int64):
        return [op("OneHot", idx, depth, values, **attrs)]
    hot = op("OneHot", idx, depth, int64_constant(idx, [0, 1]), **attrs)
    pick = op("Cast", hot, to=dtypes.bool_.ir_dtype.value)
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


def _range_infer(inputs, attrs, num_outputs):
    start, limit, delta = (np.float64(const_value(x)) for x in inputs)
    if delta == 0:
        raise ValueError("Range's delta must not be 0")
    return [((max(int(np.ceil((limit - start) / delta)), 0),), inputs[0].np_dtype)]


def _range_lower(inputs, attrs, num_outputs):
    """onnxruntime's Range takes float, double, int16, int32 and int64: int8 and uint8
    ranges are computed in int32 and cast."""
    dtype = inputs[0].np_dtype
    if dtype not in (np.int8, np.uint8):
        return None
    wide = [x.builder.constant(np.asarray(const_value(x), np.int32)) for x in inputs]
    return [op("Cast", op("Range", *wide), to=dtypes.from_numpy(dtype).ir_dtype.value)]


register("Range", _range_infer, None, differentiable=False, lower=_range_lower)
