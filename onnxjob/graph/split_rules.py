"""The per-op rules of graph/split_batch.py: how each op's outputs are split over the ranks
given its inputs' kinds (whole, split(axis, inner), partial sum, partial mean).

A rule reads `rw.kinds`, may replace the node's inputs (a whole operand sliced to the
rank's rows: `rw.rows`; a partial one made whole by a collective: `rw.whole`), and ends
with `rw.finish(node, output kinds)`; `rw.fail(why)` stops the split naming the node.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxjob.graph.primitives.collectives import DOMAIN
from onnxjob.graph.split_kinds import MEAN, SUM, WHOLE, Split

PARTIAL = (SUM, MEAN)
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _ints_input(rw, node, index, attr_name):
    """An int list given as attribute `attr_name` (older opsets) or constant input `index`."""
    value = _attr(node, attr_name)
    if value is None and len(node.input) > index and node.input[index]:
        array = rw.const_value(node.input[index])
        if array is None:
            rw.fail(f"its {attr_name} are computed in the graph, not constants")
        value = array.tolist()
    return None if value is None else [int(v) for v in np.ravel(value)]


def _split_inputs(rw, node):
    return [(i, rw.kinds[n]) for i, n in enumerate(node.input)
            if n and isinstance(rw.kinds[n], Split)]


def _same_kind(rw, node, out_kinds=None):
    """A rule for ops linear in their first input that keep its layout: the first input's
    kind to every output (the other inputs made whole)."""
    for i in range(1, len(node.input)):
        if node.input[i]:
            node.input[i] = rw.whole(node.input[i])
    kind = rw.kinds[node.input[0]]
    rw.finish(node, out_kinds or [kind] * len(node.output))


# -- elementwise -------------------------------------------------------------------------------

def elementwise(rw, node):
    """Broadcasting n-ary ops: split operands agree; whole ones are sliced to the rank's
    rows where they hold the batch; partial operands pass Add/Sub/Mul/Div linearly."""
    out_rank = max(rw.rank_of(n) for n in node.input if n)
    target = None
    for i, kind in _split_inputs(rw, node):
        aligned = Split(kind.axis + out_rank - rw.rank_of(node.input[i]), kind.inner)
        if target is not None and aligned != target:
            rw.fail(f"its inputs are split along different axes ({target}, {aligned})")
        target = aligned
    if target is not None:
        for i, name in enumerate(node.input):
            if not name or isinstance(rw.kinds[name], Split):
                continue
            name = rw.whole(name)
            axis = target.axis - (out_rank - rw.rank_of(name))
            if axis >= 0 and rw.shapes[name][axis] != 1:
                name = rw.rows(name, axis, target.inner)
            node.input[i] = name
        rw.finish(node, [target] * len(node.output))
        return
    kinds = [rw.kinds[n] for n in node.input if n]
    partial = [k for k in kinds if k in PARTIAL]
    if not partial:
        rw.finish(node, [WHOLE] * len(node.output))
    elif node.op_type in ("Add", "Sub", "Sum"):
        if SUM in kinds:
            for i, name in enumerate(node.input):
                node.input[i] = rw.partial_sum(name)
            rw.finish(node, [SUM])
        else:       # partial means and whole values (the mean of equal values is the value)
            rw.finish(node, [MEAN])
    elif node.op_type == "Mul" and len(partial) == 1:
        rw.finish(node, partial)
    elif node.op_type == "Div" and rw.kinds[node.input[0]] in PARTIAL and \
            rw.kinds[node.input[1]] == WHOLE:
        rw.finish(node, [rw.kinds[node.input[0]]])
    else:
        for i, name in enumerate(node.input):
            if name:
                node.input[i] = rw.whole(name)
        rw.finish(node, [WHOLE] * len(node.output))


_LINEAR_UNARY = {"Neg", "Identity"}


def unary(rw, node):
    """One-input elementwise ops (extra inputs, such as Clip's bounds, whole)."""
    kind = rw.kinds[node.input[0]]
    linear = node.op_type in _LINEAR_UNARY or (
        node.op_type == "Cast" and _attr(node, "to") in _FLOATS)
    if kind in PARTIAL and not linear:
        node.input[0] = rw.whole(node.input[0])
    _same_kind(rw, node)


_RANDOM_LIKE = "Dropout RandomNormalLike RandomUniformLike BernoulliLike Bernoulli"
# ONNX seeds are float32 attributes, exact below 2**24 (ops/random.py folds them so)
_SEED_RANGE = 2 ** 24


def random_like(rw, node):
    """Random values shaped like their input: on a rank's rows, each rank draws its own
    (the seed moved by the rank: the ranks share the job's seeds, runtime/session.py, so
    that values computed whole on every rank agree, which rows of one process would not
    repeat)."""
    unary(rw, node)
    if rw.rank and isinstance(rw.kinds.get(node.output[0]), Split):
        for a in node.attribute:
            if a.name == "seed" and a.type == onnx.AttributeProto.FLOAT:
                a.f = float((int(a.f) * 1000003 + rw.rank * 7919) % _SEED_RANGE)
            elif a.name == "seed" and a.type == onnx.AttributeProto.INT:
                a.i = (a.i * 1000003 + rw.rank * 7919) % 2 ** 31


# -- reductions and ops along an axis ------------------------------------------------------------

def reduce(rw, node):
    x = node.input[0]
    rank = rw.rank_of(x)
    axes = _ints_input(rw, node, 1, "axes")
    if not axes:
        if _attr(node, "noop_with_empty_axes", 0):
            return _same_kind(rw, node)
        axes = list(range(rank))
    axes = sorted(a % rank for a in axes)
    keep = _attr(node, "keepdims", 1)
    kind = rw.kinds[x]
    if isinstance(kind, Split):
        if kind.axis in axes:
            if node.op_type in ("ReduceSum", "ReduceSumSquare", "ReduceL1"):
                return _same_kind(rw, node, [SUM])
            if node.op_type == "ReduceMean":    # every rank holds as many rows
                return _same_kind(rw, node, [MEAN])
            rw.fail(f"{node.op_type} over the batch axis needs every rank's rows")
        axis = kind.axis if keep else kind.axis - sum(a < kind.axis for a in axes)
        return _same_kind(rw, node, [Split(axis, kind.inner)])
    if kind in PARTIAL and node.op_type not in ("ReduceSum", "ReduceMean"):
        node.input[0] = rw.whole(x)
    _same_kind(rw, node)


def along_axis(default_axis, keepdims_attr=False):
    """Ops that work along one axis (Softmax, ArgMax, TopK...): split along another."""
    def rule(rw, node):
        x = node.input[0]
        if rw.kinds[x] in PARTIAL:
            node.input[0] = rw.whole(x)
        kind = rw.kinds[node.input[0]]
        if not isinstance(kind, Split):
            return _same_kind(rw, node)
        rank = rw.rank_of(x)
        axis = _attr(node, "axis", default_axis) % rank
        if axis == kind.axis:
            rw.fail(f"it works along the batch axis ({axis}), which the ranks share")
        out = kind
        if keepdims_attr and not _attr(node, "keepdims", 1) and axis < kind.axis:
            out = Split(kind.axis - 1, kind.inner)
        _same_kind(rw, node, [out] * len(node.output))
    return rule


# -- contractions -------------------------------------------------------------------------------

def _linear_in_one(rw, node, operands):
    """For a product linear in each operand: the partial kind when exactly one operand is
    partial and the others whole; otherwise the partial ones are made whole. None when no
    operand is partial."""
    kinds = [rw.kinds[node.input[i]] for i in operands]
    partial = [k for k in kinds if k in PARTIAL]
    if not partial:
        return None
    if len(partial) == 1 and all(k == WHOLE or k in PARTIAL for k in kinds):
        return partial[0]
    for i in operands:
        node.input[i] = rw.whole(node.input[i])
    return False


def _contract(rw, node, a_axes, b_axes, out_rank):
    """Kinds of a product of A and B (inputs 0 and 1) given the roles of their axes:
    a_axes/b_axes map an axis to "K" (contracted), ("out", output axis) or None."""
    a, b = node.input[0], node.input[1]
    ka, kb = rw.kinds[a], rw.kinds[b]
    role_a = a_axes(ka.axis) if isinstance(ka, Split) else None
    role_b = b_axes(kb.axis) if isinstance(kb, Split) else None
    if role_a == "K" or role_b == "K":
        for name, index, kind, role, axes_of in (
                (a, 0, ka, role_a, a_axes), (b, 1, kb, role_b, b_axes)):
            if role == "K":
                continue
            if isinstance(kind, Split):
                rw.fail("one operand is split along the contracted axis, the other elsewhere")
            split = ka if role_a == "K" else kb
            k_axis = next(i for i in range(rw.rank_of(name)) if axes_of(i) == "K")
            node.input[index] = rw.rows(name, k_axis, split.inner)
        if role_a == "K" and role_b == "K" and ka.inner != kb.inner:
            rw.fail("its operands hold the batch differently along the contracted axis")
        return SUM
    outs = {r[1] for r in (role_a, role_b) if r is not None}
    if len(outs) > 1:
        rw.fail("its operands are split along different output axes")
    split = ka if role_a is not None else kb
    target = Split(outs.pop(), split.inner)
    for name, index, kind, axes_of in ((a, 0, ka, a_axes), (b, 1, kb, b_axes)):
        if isinstance(kind, Split):
            continue
        for axis in range(rw.rank_of(name)):
            if axes_of(axis) == ("out", target.axis) and rw.shapes[name][axis] != 1:
                node.input[index] = rw.rows(name, axis, target.inner)
    return target


def matmul(rw, node):
    a, b = node.input[0], node.input[1]
    ra, rb = rw.rank_of(a), rw.rank_of(b)
    partial = _linear_in_one(rw, node, [0, 1])
    if partial:
        return rw.finish(node, [partial])
    if rw.kinds[node.input[0]] == WHOLE and rw.kinds[node.input[1]] == WHOLE:
        return rw.finish(node, [WHOLE])
    if ra < 2 or rb < 2:
        rw.fail("a split operand of rank 1")
    out_rank = max(ra, rb)

    def a_axes(axis):
        return "K" if axis == ra - 1 else ("out", axis + out_rank - ra)

    def b_axes(axis):
        if axis == rb - 2:
            return "K"
        return ("out", out_rank - 1) if axis == rb - 1 else ("out", axis + out_rank - rb)
    rw.finish(node, [_contract(rw, node, a_axes, b_axes, out_rank)])


def gemm(rw, node):
    trans_a, trans_b = _attr(node, "transA", 0), _attr(node, "transB", 0)
    has_c = len(node.input) > 2 and node.input[2]
    partial = _linear_in_one(rw, node, [0, 1])
    if partial:
        if has_c:
            node.input[2] = rw.partial_sum(node.input[2]) if partial == SUM \
                else rw.whole(node.input[2])
        return rw.finish(node, [partial])
    if rw.kinds[node.input[0]] == WHOLE and rw.kinds[node.input[1]] == WHOLE:
        if has_c:
            node.input[2] = rw.whole(node.input[2])
        return rw.finish(node, [WHOLE])

    def a_axes(axis):
        return "K" if axis == (0 if trans_a else 1) else ("out", 0)

    def b_axes(axis):
        return "K" if axis == (1 if trans_b else 0) else ("out", 1)
    kind = _contract(rw, node, a_axes, b_axes, 2)
    if has_c:
        c = rw.whole(node.input[2])
        if kind == SUM:     # the bias counted once: each rank adds C / W
            c = rw.partial_sum(c)
        else:
            axis = kind.axis - (2 - rw.rank_of(c))
            if axis >= 0 and rw.shapes[c][axis] != 1:
                c = rw.rows(c, axis, kind.inner)
        node.input[2] = c
    rw.finish(node, [kind])


def conv(rw, node, transposed=False):
    """Conv / ConvTranspose: split on the images (axis 0) stays split; the weight
    gradient's form, with the batch as the contracted channel axis of both operands,
    makes a partial sum."""
    x, w = node.input[0], node.input[1]
    for i in range(2, len(node.input)):
        if node.input[i]:
            node.input[i] = rw.whole(node.input[i])
    partial = _linear_in_one(rw, node, [0, 1])
    if partial:
        if len(node.input) > 2 and node.input[2]:
            rw.fail("a partial value with a bias")
        return rw.finish(node, [partial])
    kx, kw = rw.kinds[x], rw.kinds[w]
    contracted_w = 0 if transposed else 1
    if kx == WHOLE and kw == WHOLE:
        return rw.finish(node, [WHOLE])
    if isinstance(kx, Split) and kx.axis == 0 and kw == WHOLE:
        return rw.finish(node, [kx])
    if isinstance(kx, Split) and isinstance(kw, Split) and kx.axis == 1 and \
            kw.axis == contracted_w and kx.inner == kw.inner and _attr(node, "group", 1) == 1 \
            and not (len(node.input) > 2 and node.input[2]):
        return rw.finish(node, [SUM])
    rw.fail(f"no rule for inputs {kx} and weights {kw}")


def images_op(rw, node):
    """Ops over images that treat each example alone (pools, LRN, inference batch norm):
    the first input split on axis 0, the others whole."""
    x = node.input[0]
    if rw.kinds[x] in PARTIAL:
        node.input[0] = rw.whole(x)
    kind = rw.kinds[node.input[0]]
    if isinstance(kind, Split) and kind.axis != 0:
        rw.fail(f"its input is split along axis {kind.axis}, not the batch axis 0")
    _same_kind(rw, node, [kind] * len(node.output))


def max_unpool(rw, node):
    """MaxUnpool's output shape input holds the batch: the rank's rows."""
    x, indices = node.input[0], node.input[1]
    kind = rw.kinds[indices]
    if kind == WHOLE:
        return _same_kind(rw, node)
    if not (isinstance(kind, Split) and kind.axis == 0):
        rw.fail(f"its indices are {kind}")
    node.input[0] = x = rw.whole(x) if rw.kinds[x] in PARTIAL else x
    if rw.kinds[x] == WHOLE:
        node.input[0] = rw.rows(x, 0, kind.inner)
    if len(node.input) > 2 and node.input[2]:
        shape = rw.const_value(node.input[2])
        if shape is None:
            rw.fail("its output shape is computed in the graph")
        local = np.array(shape, np.int64)
        local[0] //= rw.ranks
        node.input[2] = rw.constant(local, "shape")
    rw.finish(node, [kind])


# -- layout ------------------------------------------------------------------------------------

def _prod(dims):
    return int(np.prod(dims, dtype=np.int64)) if len(dims) else 1


def reshaped_split(in_shape, kind, out_shape, batch):
    """The Split of a Reshape's output given its input's, or None when the rank's rows
    are not one block of an output axis (the batch's elements spread over several)."""
    stride = kind.inner * _prod(in_shape[kind.axis + 1:])     # elements between two rows
    for j in range(len(out_shape)):
        after = _prod(out_shape[j + 1:])
        if stride % after == 0 and out_shape[j] % (stride // after * batch) == 0:
            return Split(j, stride // after)
    return None


def _local_shape_input(rw, node, target):
    """Input 1 of Reshape / Expand (the output's shape) as this rank's: the output's
    traced shape with the split axis `target.axis` divided by W."""
    local = list(rw.shapes[node.output[0]])
    local[target.axis] //= rw.ranks
    node.input[1] = rw.constant(np.array(local, np.int64), "shape")


def reshape(rw, node):
    x = node.input[0]
    kind = rw.kinds[x]
    out = node.output[0]
    if not isinstance(kind, Split):
        return _same_kind(rw, node)
    target = reshaped_split(rw.shapes[x], kind, rw.shapes[out], rw.batch)
    if target is None:
        rw.fail(f"it moves the batch of {rw.shapes[x]} (axis {kind.axis}) across the axes "
                f"of {rw.shapes[out]}")
    if node.op_type == "Reshape":
        _local_shape_input(rw, node, target)
    rw.finish(node, [target])


def transpose(rw, node):
    kind = rw.kinds[node.input[0]]
    if not isinstance(kind, Split):
        return _same_kind(rw, node)
    perm = _attr(node, "perm") or list(reversed(range(rw.rank_of(node.input[0]))))
    rw.finish(node, [Split(list(perm).index(kind.axis), kind.inner)])


def squeeze(rw, node):
    kind = rw.kinds[node.input[0]]
    if not isinstance(kind, Split):
        return _same_kind(rw, node)
    rank = rw.rank_of(node.input[0])
    axes = _ints_input(rw, node, 1, "axes")
    if axes is None:
        axes = [i for i, d in enumerate(rw.shapes[node.input[0]]) if d == 1]
    axes = [a % rank for a in axes]
    if kind.axis in axes:
        rw.fail("it removes the batch axis")
    _same_kind(rw, node, [Split(kind.axis - sum(a < kind.axis for a in axes), kind.inner)])


def unsqueeze(rw, node):
    kind = rw.kinds[node.input[0]]
    if not isinstance(kind, Split):
        return _same_kind(rw, node)
    out_rank = rw.rank_of(node.output[0])
    axes = {a % out_rank for a in _ints_input(rw, node, 1, "axes")}
    kept = [i for i in range(out_rank) if i not in axes]
    _same_kind(rw, node, [Split(kept[kind.axis], kind.inner)])


def concat(rw, node):
    axis = _attr(node, "axis") % rw.rank_of(node.output[0])
    splits = _split_inputs(rw, node)
    if not splits:
        kinds = {rw.kinds[n] for n in node.input}
        if SUM in kinds:
            for i, name in enumerate(node.input):
                node.input[i] = rw.partial_sum(name)
            return rw.finish(node, [SUM])
        return rw.finish(node, [MEAN if MEAN in kinds else WHOLE])
    target = splits[0][1]
    if any(k != target for _, k in splits):
        rw.fail("its inputs are split differently")
    if target.axis == axis:
        rw.fail("it concatenates along the batch axis, which the ranks share")
    for i, name in enumerate(node.input):
        if not isinstance(rw.kinds[name], Split):
            node.input[i] = rw.rows(rw.whole(name), target.axis, target.inner)
    rw.finish(node, [target])


def split(rw, node):
    kind = rw.kinds[node.input[0]]
    if isinstance(kind, Split) and kind.axis == _attr(node, "axis", 0) % rw.rank_of(
            node.input[0]):
        rw.fail("it splits the batch axis")
    _same_kind(rw, node, [kind] * len(node.output))


def _covers(start, end, step, dim):
    """Whether Slice's start:end:step takes the whole of an axis of `dim` elements."""
    start = max(start + dim, 0) if start < 0 else start
    end = end + dim if end < 0 else end
    return step == 1 and start == 0 and end >= dim


def slice_(rw, node):
    x = node.input[0]
    kind = rw.kinds[x]
    if isinstance(kind, Split):
        rank, dim = rw.rank_of(x), rw.shapes[x][kind.axis]
        starts = _ints_input(rw, node, 1, "starts")
        ends = _ints_input(rw, node, 2, "ends")
        axes = _ints_input(rw, node, 3, "axes") or list(range(len(starts)))
        steps = _ints_input(rw, node, 4, "steps") or [1] * len(starts)
        for a, s, e, st in zip(axes, starts, ends, steps):
            if a % rank == kind.axis and not _covers(s, e, st, dim):
                rw.fail(f"it takes some of the batch's rows ({s}:{e}:{st} of {dim}); a "
                        "rank has only its own")
    _same_kind(rw, node)


def gather(rw, node):
    data, indices = node.input[0], node.input[1]
    kd, ki = rw.kinds[data], rw.kinds[indices]
    axis = _attr(node, "axis", 0) % rw.rank_of(data)
    if ki in PARTIAL:
        node.input[1] = indices = rw.whole(indices)
        ki = WHOLE
    if isinstance(kd, Split) and isinstance(ki, Split):
        rw.fail("both its data and its indices are split")
    if isinstance(ki, Split):
        node.input[0] = rw.whole(data)
        return rw.finish(node, [Split(axis + ki.axis, ki.inner)])
    if isinstance(kd, Split):
        if kd.axis == axis:
            rw.fail("it picks rows of the batch by index; a rank has only its own")
        out_axis = kd.axis if kd.axis < axis else kd.axis + rw.rank_of(indices) - 1
        return rw.finish(node, [Split(out_axis, kd.inner)])
    _same_kind(rw, node)


# ops a value passes through unchanged but for its shape or type
_RESHAPING = ("Reshape", "Flatten", "Cast", "Unsqueeze", "Squeeze", "Identity", "Expand")


def _through_reshapes(rw, name):
    """(node, output index) that made `name`, looking through _RESHAPING nodes."""
    node, index = rw.producer(name)
    while node is not None and node.op_type in _RESHAPING and node.domain == "":
        node, index = rw.producer(node.input[0])
    return node, index


def _pooling_positions(rw, name):
    """Whether `name` is a MaxPool's indices (reshaped): positions in this rank's rows."""
    node, index = _through_reshapes(rw, name)
    return node is not None and node.op_type == "MaxPool" and index == 1


def _zeros(rw, name):
    """Whether `name` is zeros made in the graph (a ConstantOfShape of 0, reshaped)."""
    node, _ = _through_reshapes(rw, name)
    if node is None or node.op_type != "ConstantOfShape":
        array = rw.const_value(name)
        return array is not None and not np.any(array)
    value = _attr(node, "value")
    return value is None or not np.any(numpy_helper.to_array(value))


def scatter_add_of_rows(rw, node):
    """ScatterElements / ScatterND adding this rank's updates at this rank's indices into
    data the ranks share (an embedding table's gradient from its lookups, whose indices
    are table rows, not positions in the batch): each rank adds its own into its share of
    data (data / W, nothing for zeros), so the ranks' results are a partial sum."""
    if not _zeros(rw, node.input[0]):
        node.input[0] = rw.partial_sum(node.input[0])
    rw.finish(node, [SUM])


def _adds_rows_of_a_shared_table(rw, node):
    """Whether `node` is a scatter-add whose split indices address rows of data that is
    not split (scatter_add_of_rows), not positions in this rank's rows."""
    if _attr(node, "reduction", b"none") != b"add" or len(node.input) < 3:
        return False
    data, indices, updates = node.input[:3]
    return isinstance(rw.kinds[indices], Split) and isinstance(rw.kinds[updates], Split) \
        and not isinstance(rw.kinds[data], Split) and not _pooling_positions(rw, indices)


def scatter_nd(rw, node):
    """ScatterND: a scatter-add of this rank's rows into shared data (scatter_add_of_rows);
    otherwise every operand whole."""
    if _adds_rows_of_a_shared_table(rw, node):
        return scatter_add_of_rows(rw, node)
    rw._generic(node)


def elements_along_axis(rw, node):
    """GatherElements / ScatterElements: operands of one shape. Along the batch axis only
    when the indices are split too: they are then positions in this rank's rows (as the
    indices MaxPool computed from them); a scatter-add of split indices into data that is
    not split adds table rows (scatter_add_of_rows)."""
    splits = _split_inputs(rw, node)
    if not splits:
        return elementwise(rw, node)
    if node.op_type == "ScatterElements" and _adds_rows_of_a_shared_table(rw, node):
        return scatter_add_of_rows(rw, node)
    axes = {k.axis for _, k in splits}
    if len(axes) > 1:
        rw.fail("its inputs are split along different axes")
    axis = _attr(node, "axis", 0) % rw.rank_of(node.input[0])
    if axis == axes.pop():
        if not isinstance(rw.kinds[node.input[1]], Split):
            rw.fail("it indexes the batch axis with whole indices")
        data = node.input[0]
        kind = rw.kinds[data]
        if not isinstance(kind, Split):
            inner = rw.shapes[data][axis] // rw.batch
            node.input[0] = rw.rows(rw.whole(data), axis, inner)
            kind = Split(axis, inner)
        rows_of_indices = rw.kinds[node.input[1]]
        for i in range(2, len(node.input)):
            # ScatterElements' updates have the indices' shape: a whole one (a constant
            # of zeros, say) gives the rank's rows the indices address
            if not isinstance(rw.kinds[node.input[i]], Split):
                node.input[i] = rw.rows(rw.whole(node.input[i]), axis, rows_of_indices.inner)
        return rw.finish(node, [kind])
    elementwise(rw, node)


def expand(rw, node):
    x, out = node.input[0], node.output[0]
    kind = rw.kinds[x]
    if not isinstance(kind, Split):
        return _same_kind(rw, node)
    target = Split(kind.axis + rw.rank_of(out) - rw.rank_of(x), kind.inner)
    _local_shape_input(rw, node, target)
    rw.finish(node, [target])


def one_hot(rw, node):
    kind = rw.kinds[node.input[0]]
    if not isinstance(kind, Split):
        return _same_kind(rw, node)
    rank = rw.rank_of(node.output[0])
    axis = _attr(node, "axis", -1) % rank
    _same_kind(rw, node, [Split(kind.axis + (axis <= kind.axis), kind.inner)])


def tile(rw, node):
    kind = rw.kinds[node.input[0]]
    if isinstance(kind, Split):
        repeats = rw.const_value(node.input[1])
        if repeats is None or int(repeats[kind.axis]) != 1:
            rw.fail("it repeats along the batch axis")
    _same_kind(rw, node)


def pad(rw, node):
    x = node.input[0]
    if rw.kinds[x] in PARTIAL:
        node.input[0] = rw.whole(x)
    kind = rw.kinds[node.input[0]]
    if isinstance(kind, Split):
        rank = rw.rank_of(x)
        pads = _ints_input(rw, node, 1, "pads")
        axes = _ints_input(rw, node, 3, "axes") or list(range(rank))
        n = len(axes)
        for i, a in enumerate(axes):
            if a % rank == kind.axis and (pads[i] or pads[i + n]):
                rw.fail("it pads the batch axis")
    _same_kind(rw, node)


# -- losses and normalization ------------------------------------------------------------------

def softmax_cross_entropy(rw, node):
    scores, labels = node.input[0], node.input[1]
    if rw.kinds[scores] in PARTIAL:
        node.input[0] = scores = rw.whole(scores)
    kind = rw.kinds[scores]
    if not isinstance(kind, Split):
        if isinstance(rw.kinds[labels], Split):
            rw.fail("its labels are split over the ranks but not its scores")
        return _same_kind(rw, node)
    if kind.axis != 0 or kind.inner != 1:
        rw.fail(f"its scores are {kind}, not split along the batch axis")
    if not isinstance(rw.kinds[labels], Split):
        node.input[1] = rw.rows(rw.whole(labels), 0, 1)
    reduction = _attr(node, "reduction", b"mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    weighted = len(node.input) > 2 and node.input[2]
    if reduction == "mean" and (weighted or _attr(node, "ignore_index") is not None):
        rw.fail("a mean weighted per class or with ignored labels over the ranks")
    loss = {"none": kind, "sum": SUM, "mean": MEAN}[reduction]
    if weighted:
        node.input[2] = rw.whole(node.input[2])
    rw.finish(node, [loss, kind][:len(node.output)])


def layer_norm(rw, node):
    x = node.input[0]
    if rw.kinds[x] in PARTIAL:
        node.input[0] = rw.whole(x)
    kind = rw.kinds[node.input[0]]
    if isinstance(kind, Split) and kind.axis >= _attr(node, "axis", -1) % rw.rank_of(x):
        rw.fail("it normalizes over the batch axis")
    _same_kind(rw, node, [kind] * len(node.output))


# -- collectives --------------------------------------------------------------------------------

def collective(rw, node):
    """A collective's input is this rank's value, whatever its kind; the result is whole."""
    rw.finish(node, [WHOLE])


def rank_local(rw, node):
    """A value this rank computed from its rows on purpose: taken as it is (whole)."""
    node.op_type, node.domain = "Identity", ""
    rw.finish(node, [WHOLE])


_ELEMENTWISE = ("Add Sub Mul Div Pow Max Min Sum Mean Where Equal Greater Less GreaterOrEqual "
                "LessOrEqual And Or Xor Mod PRelu BitShift BitwiseAnd BitwiseOr BitwiseXor")
_UNARY = ("Relu Exp Log Sigmoid Tanh Sqrt Reciprocal Abs Neg Cast Identity Erf Softplus "
          "Softsign LeakyRelu Elu Selu Celu Gelu HardSigmoid HardSwish Mish Clip Not IsNaN "
          "IsInf Floor Ceil Round Sign Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh "
          "Atanh ThresholdedRelu Shrink CastLike")
_REDUCE = ("ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 "
           "ReduceSumSquare ReduceLogSum ReduceLogSumExp")
_IMAGES = ("MaxPool AveragePool GlobalAveragePool GlobalMaxPool LpPool GlobalLpPool LRN "
           "BatchNormalization InstanceNormalization DepthToSpace SpaceToDepth")

RULES = {}
for names, rule in ((_ELEMENTWISE, elementwise), (_UNARY, unary), (_REDUCE, reduce),
                    (_IMAGES, images_op), (_RANDOM_LIKE, random_like)):
    RULES.update((("", name), rule) for name in names.split())
RULES.update({
    ("", "Softmax"): along_axis(-1), ("", "LogSoftmax"): along_axis(-1),
    ("", "Hardmax"): along_axis(-1), ("", "LpNormalization"): along_axis(-1),
    ("", "ArgMax"): along_axis(0, True), ("", "ArgMin"): along_axis(0, True),
    ("", "TopK"): along_axis(-1),
    ("", "MatMul"): matmul, ("", "Gemm"): gemm, ("", "Conv"): conv,
    ("", "ConvTranspose"): lambda rw, node: conv(rw, node, transposed=True),
    ("", "MaxUnpool"): max_unpool,
    ("", "Reshape"): reshape, ("", "Flatten"): reshape, ("", "Transpose"): transpose,
    ("", "Squeeze"): squeeze, ("", "Unsqueeze"): unsqueeze, ("", "Concat"): concat,
    ("", "Split"): split, ("", "Slice"): slice_, ("", "Gather"): gather,
    ("", "GatherElements"): elements_along_axis, ("", "ScatterElements"): elements_along_axis,
    ("", "ScatterND"): scatter_nd,
    ("", "Expand"): expand, ("", "OneHot"): one_hot, ("", "Tile"): tile, ("", "Pad"): pad,
    ("", "SoftmaxCrossEntropyLoss"): softmax_cross_entropy,
    ("", "NegativeLogLikelihoodLoss"): softmax_cross_entropy,
    ("", "LayerNormalization"): layer_norm,
    (DOMAIN, "AllGather"): collective, (DOMAIN, "AllReduceMean"): collective,
    (DOMAIN, "AllReduceSum"): collective, (DOMAIN, "RankLocal"): rank_local,
})
