"""OneFlow 0.5's remaining single-client ops: count_not_finite, indexed_slices_reduce_sum,
the fused attention helpers, the face-recognition ops (combined_margin_loss,
distributed_partial_fc_sample), the time-shape ops (repeat / acc, unpack / pack) and the
stateful categorical_ordinal_encode.

Sources: python/oneflow/compatible/single_client/ops/{count_not_finite,
combined_margin_loss, partial_fc_sample, domain_ops, math_ops,
categorical_ordinal_encode_op}.py, framework/ops.py, experimental/indexed_slices_ops.py,
and the kernels under oneflow/user/kernels/ of the v0.5.0 tag.
"""
import numbers

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend import initializers, scope, variables
from onnxjob.frontend.variables import assign
from onnxjob.graph.primitives.elementwise import FLOATS
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op
from onnxjob.ops import random as _random
from onnxjob.ops.selection import unique_with_counts

_INDEX = (np.dtype(np.int32), np.dtype(np.int64))


def _named(blob, name):
    return blob if name is None else op("Identity", blob, name=name)


def _blob(x, api, what="x", allowed=None):
    if not isinstance(x, Blob):
        raise TraceError(f"{api}: {what} must be a Blob, got {type(x).__name__}")
    if allowed is not None and x.np_dtype not in allowed:
        raise TraceError(f"{api}: {what} must be " + " or ".join(map(str, allowed))
                         + f", got {x.np_dtype}")
    return x


def _positive_int(value, api, what):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise TraceError(f"{api}: {what} must be a positive int, got {value!r}")
    return int(value)


def _row_labels(label, api, rows=None):
    """`label` as an (N,) Blob: OneFlow's face-recognition ops check only the label's first
    axis (against x's `rows` where given) and read one label per row, so a reader's (N, 1)
    labels (a raw decoder's `shape=(1,)`) pass as (N,)."""
    shape = tuple(label.shape)
    if (not shape or (rows is not None and shape[0] != rows)
            or int(np.prod(shape[1:])) != 1):
        n = "N" if rows is None else rows
        raise TraceError(f"{api}: label must hold one class per row, ({n},) or ({n}, 1), "
                         f"got {shape}")
    return label if len(shape) == 1 else reshape_to(label, shape[:1])


# -- count_not_finite ------------------------------------------------------------------------

def _not_finite_count(x):
    """int64 (1,): the number of NaN and +-inf elements (x - x is NaN exactly there)."""
    bad = op("IsNaN", op("Sub", x, x))
    flat = reshape_to(op("Cast", bad, to=7), (int(np.prod(x.shape)),))
    return op("ReduceSum", flat, int64_constant(flat, [0]), keepdims=1)


def count_not_finite(x, name=None):
    """int64 of shape (1,): how many elements of x are NaN or infinite (flow.count_not_finite;
    float32 / float64, as OneFlow's kernels). No gradient."""
    _blob(x, "flow.count_not_finite", allowed=FLOATS)
    return _named(_not_finite_count(x), name)


def multi_count_not_finite(x=None, name=None):
    """count_not_finite summed over a list of Blobs of one float dtype."""
    api = "flow.multi_count_not_finite"
    if not x or not isinstance(x, (list, tuple)):
        raise TraceError(f"{api} takes a non-empty list of Blobs, got {x!r}")
    for b in x:
        _blob(b, api, allowed=FLOATS)
    if len({b.np_dtype for b in x}) > 1:
        raise TraceError(f"{api}: the Blobs must share one dtype, got "
                         + ", ".join(str(b.np_dtype) for b in x))
    total = _not_finite_count(x[0])
    for b in x[1:]:
        total = op("Add", total, _not_finite_count(b))
    return _named(total, name)


# -- indexed_slices_reduce_sum ---------------------------------------------------------------

def indexed_slices_reduce_sum(indices, values, name=None):
    """[y_indices (n,), y_values (n, m), num_unique (1,) int64] for x_indices of n elements
    and values of shape indices.shape + rest (m = prod(rest)): the first num_unique rows hold
    each distinct index (in order of first appearance) and the sum of its value rows; the
    rows after them are 0 (OneFlow leaves them unspecified). No gradient, as in OneFlow."""
    api = "flow.experimental.indexed_slices_reduce_sum"
    _blob(indices, api, "indices", _INDEX)
    _blob(values, api, "values")
    k = len(indices.shape)
    if k >= len(values.shape) or tuple(values.shape[:k]) != tuple(indices.shape):
        raise TraceError(f"{api}: values {values.shape} must start with the indices' shape "
                         f"{indices.shape} and have more axes")
    n = int(np.prod(indices.shape))
    m = int(np.prod(values.shape[k:]))
    flat = reshape_to(indices, (n,))
    y, idx, _, num_unique = unique_with_counts(flat, out_idx=dtypes.int64)
    rows = reshape_to(values, (n, m))
    summed = op("onnxjob.UnsortedSegmentSum", rows, idx, axis=0, num_segments=n)
    prefix = "" if name is None else name + "/"
    return [op("Identity", y, name=prefix + "y_indices" if name else None),
            op("Identity", summed, name=prefix + "y_values" if name else None),
            op("Cast", num_unique, to=7, name=prefix + "num_unique" if name else None)]


# -- fused attention helpers -----------------------------------------------------------------

def fused_self_attention_query_mul_key_and_value(x, head_size, alpha=1.0, name=None):
    """(query_mul_key (b, n, s, s), value (b, n, s, h)) of hidden states x (s, b, n*3*h):
    x viewed as (s, b, n, 3, h) holds q, k, v per head; query_mul_key = alpha * q @ k^T."""
    api = "flow.nn.fused_self_attention_query_mul_key_and_value"
    _blob(x, api, allowed=FLOATS)
    head_size = _positive_int(head_size, api, "head_size")
    if len(x.shape) != 3 or x.shape[2] % (3 * head_size):
        raise TraceError(f"{api}: x must be (seq_len, batch, num_heads * 3 * head_size), got "
                         f"{x.shape} with head_size {head_size}")
    s, b, hidden = x.shape
    heads = hidden // (3 * head_size)
    per_head = op("Transpose", reshape_to(x, (s, b, heads, 3, head_size)), perm=[3, 1, 2, 0, 4])
    q, k, v = [reshape_to(p, (b, heads, s, head_size))
               for p in op("Split", per_head, axis=0, num_outputs=3)]
    qmk = op("MatMul", q, op("Transpose", k, perm=[0, 1, 3, 2]))
    if float(alpha) != 1.0:
        qmk = op("Mul", qmk, as_blob(float(alpha), like=qmk))
    prefix = "" if name is None else name + "/"
    return (_named(qmk, prefix + "query_mul_key" if name else None),
            _named(v, prefix + "value" if name else None))


# -- face recognition ------------------------------------------------------------------------

def combined_margin_loss(x, label, m1=1, m2=0, m3=0, name=None):
    """The combined (ArcFace / CosFace / SphereFace) margin: x (N, C...) holds cosines; at each
    row's label the value becomes cos(m1 * acos(x) + m2) - m3, the rest passes through.
    Labels outside [0, C) leave their row unchanged. `label` holds one class per row: (N,)
    or, as a reader's (N, 1) output, (N, 1, ...). Gradient: OneFlow's rule."""
    api = "flow.combined_margin_loss"
    _blob(x, api, allowed=FLOATS)
    _blob(label, api, "label", _INDEX)
    if len(x.shape) < 2:
        raise TraceError(f"{api}: x must be (N, C, ...), got {x.shape}")
    label = _row_labels(label, api, rows=x.shape[0])
    flat = reshape_to(x, (x.shape[0], int(np.prod(x.shape[1:]))))
    y, _theta = op("onnxjob.CombinedMarginLoss", flat, label, m1=float(m1), m2=float(m2),
                   m3=float(m3), num_outputs=2)
    return _named(reshape_to(y, x.shape), name)


def distributed_partial_fc_sample(weight, label, num_sample, name=None):
    """(mapped_label, sampled_label, sampled_weight) on one device: `num_sample` classes of
    weight (C, ...) drawn at random each run, every class in `label` first (ascending),
    then random others; sampled_weight = weight[sampled_label] (its gradient reaches the
    sampled rows of weight); mapped_label[i] is the position of label[i] among the samples.

    Labels must lie in [0, C) and there must be at most num_sample distinct labels (OneFlow's
    kernel assumes both)."""
    api = "flow.distributed_partial_fc_sample"
    _blob(weight, api, "weight", FLOATS)
    _blob(label, api, "label", _INDEX)
    num_sample = _positive_int(num_sample, api, "num_sample")
    if len(weight.shape) < 1:
        raise TraceError(f"{api}: weight must be (C, ...), got {weight.shape}")
    label_shape = label.shape
    label = _row_labels(label, api)
    classes = weight.shape[0]
    if num_sample > classes:
        raise TraceError(f"{api}: num_sample {num_sample} exceeds the {classes} classes of "
                         "weight")
    lab = op("Cast", label, to=7)
    hits = op("Equal", op("Unsqueeze", lab, int64_constant(lab, [1])),
              int64_constant(lab, np.arange(classes)[None, :]))
    hit_count = op("ReduceSum", op("Cast", hits, to=6), int64_constant(lab, [0]), keepdims=0)
    positive = op("Greater", hit_count, as_blob(np.int32(0), like=hit_count))
    # keys: classes in label get (class - C) < 0, so they sort first and ascending; the
    # others a uniform draw in [0, 1), so the rest of the sample is random
    draw = _random._uniform((classes,), np.float32, None, api)
    keys = op("Where", positive, as_blob(np.arange(classes, dtype=np.float32) - classes,
                                         like=draw), draw)
    _, picked = op("TopK", keys, int64_constant(keys, [num_sample]), axis=0, largest=0,
                   sorted=1, num_outputs=2)
    slot = op("ScatterElements", int64_constant(lab, np.zeros(classes, np.int64)), picked,
              int64_constant(lab, np.arange(num_sample)), axis=0)
    mapped = op("Gather", slot, lab, axis=0)
    to = dtypes.from_numpy(label.np_dtype).ir_dtype.value
    prefix = "" if name is None else name + "/"
    # as OneFlow's shape rule: mapped_label has label's shape, sampled_label label's shape
    # with num_sample rows
    mapped = reshape_to(mapped, label_shape)
    picked_label = reshape_to(picked, (num_sample,) + tuple(label_shape[1:]))
    return (op("Cast", mapped, to=to, name=prefix + "mapped_label" if name else None),
            op("Cast", picked_label, to=to, name=prefix + "sampled_label" if name else None),
            _named(op("Gather", weight, picked, axis=0), prefix + "sampled_weight" if name
                   else None))


# -- time-shape ops: repeat / acc, unpack / pack ---------------------------------------------
# In OneFlow these change a Blob's time shape: the ops after repeat(x, n) run n times per
# job step and acc(y, n) sums their n results; unpack(x, n) feeds n micro-batches (the
# slices of axis 0) to the ops after it, one per time step, and pack(y, n) concatenates
# the n results along axis 0. onnxjob traces one graph per job, so it replays the traced
# ops between the two ends once per time step (_replay below).

def _cone(starts, end):
    """The traced nodes that lead from the Blobs `starts` (one Blob or a list) to Blob
    `end`, in trace order; None when `end` depends on none of them."""
    starts = starts if isinstance(starts, list) else [starts]
    builder = end.builder
    index = {id(n): i for i, n in enumerate(builder.nodes)}
    depends = {id(s) for s in starts}
    cone = []
    first = min(index.get(id(s.producer), -1) for s in starts) + 1
    for node in builder.nodes[first:index[id(end.producer)] + 1]:
        if any(id(b) in depends for b in node.inputs):
            cone.append(node)
            depends.update(id(b) for b in node.outputs)
    if id(end) not in depends:
        return None
    return cone


def _replay(cone, replacements, end):
    """Emit the nodes of `cone` again with `replacements` ({id(Blob): Blob}) in place of
    those Blobs; returns the copy of `end`. Random ops get fresh seeds, as each OneFlow
    time step draws anew."""
    copies = dict(replacements)
    for node in cone:
        attrs = dict(node.attrs)
        if "seed" in attrs:
            attrs["seed"] = type(attrs["seed"])(_random.op_seed(None))
        inputs = [copies.get(id(b), b) for b in node.inputs]
        outs = op(node.op_type, *inputs, num_outputs=len(node.outputs), **attrs)
        outs = outs if isinstance(outs, list) else [outs]
        for old, new in zip(node.outputs, outs):
            copies[id(old)] = new
    return copies[id(end)]


def _time_sources(y, kind, api, n):
    """[(Blob, its source)] of the `kind` results (repeat / unpack) y depends on: one or
    more, each of count `n` (OneFlow runs the ops over inputs of one time shape once per
    time step, whatever number of unpacks made them); they are closed here."""
    builder = y.builder
    sources = getattr(builder, "_time_sources", {})
    found = [(blob, count, src) for blob, count, k, src in sources.values() if k == kind
             and (blob is y or _cone(blob, y) is not None)]
    if not found:
        raise TraceError(f"{api}: its input depends on no flow.{kind} result")
    counts = sorted({count for _, count, _ in found})
    if counts != [n]:
        closing = "pack_num" if kind == "unpack" else "max_acc_num"
        raise TraceError(f"{api}: {closing} {n} differs from the {kind}_num "
                         f"{', '.join(map(str, counts))} of the flow.{kind} it closes")
    for blob, _, _ in found:
        del sources[id(blob)]
    return [(blob, src) for blob, _, src in found]


def _mark(blob, source, n, kind):
    builder = blob.builder
    if not hasattr(builder, "_time_sources"):
        builder._time_sources = {}
    builder._time_sources[id(blob)] = (blob, n, kind, source)
    return blob


def repeat(input, repeat_num, name=None):
    """x, seen `repeat_num` times by the ops after it (until flow.acc sums them)."""
    api = "flow.repeat"
    _blob(input, api, "input")
    n = _positive_int(repeat_num, api, "repeat_num")
    return _mark(op("Identity", input, name=name), input, n, "repeat")


def acc(one, max_acc_num, name=None):
    """The sum of `one` over the max_acc_num time steps that a flow.repeat started: the ops
    between flow.repeat and here run once per step (random ones draw anew each step)."""
    api = "flow.acc"
    _blob(one, api, "one")
    n = _positive_int(max_acc_num, api, "max_acc_num")
    sources = [blob for blob, _ in _time_sources(one, "repeat", api, n)]
    cone = _cone(sources, one) or []
    same = {id(blob): blob for blob in sources}
    total = one
    for _ in range(n - 1):
        total = op("Add", total, _replay(cone, same, one) if cone else one)
    return _named(total if n > 1 else op("Identity", one), name)


def unpack(input, unpack_num, name=None):
    """The first of unpack_num micro-batches (slices of axis 0) of input; the ops after it
    run on each micro-batch in turn when a flow.pack closes them."""
    api = "flow.unpack"
    _blob(input, api, "input")
    n = _positive_int(unpack_num, api, "unpack_num")
    if len(input.shape) == 0 or input.shape[0] % n:
        raise TraceError(f"{api}: axis 0 of input {input.shape} must be a multiple of "
                         f"unpack_num {n}")
    part = input.shape[0] // n
    first = op("Slice", input, int64_constant(input, [0]), int64_constant(input, [part]),
               int64_constant(input, [0]), name=name)
    return _mark(first, input, n, "unpack")


def pack(input, pack_num, name=None):
    """The results of the unpack_num time steps a flow.unpack started, concatenated along
    axis 0 (a scalar result becomes a vector of pack_num values)."""
    api = "flow.pack"
    _blob(input, api, "input")
    n = _positive_int(pack_num, api, "pack_num")
    sources = _time_sources(input, "unpack", api, n)
    cone = _cone([blob for blob, _ in sources], input) or []

    def micro_batch(whole, i):
        size = whole.shape[0] // n
        return op("Slice", whole, int64_constant(whole, [i * size]),
                  int64_constant(whole, [(i + 1) * size]), int64_constant(whole, [0]))
    steps = [input]
    for i in range(1, n):
        replacements = {id(blob): micro_batch(whole, i) for blob, whole in sources}
        # (no cone: the input is an unpack's own result)
        steps.append(_replay(cone, replacements, input) if cone else replacements[id(input)])
    if len(input.shape) == 0:
        steps = [reshape_to(s, (1,)) for s in steps]
    return op("Concat", *steps, axis=0, name=name)


# -- categorical_ordinal_encode --------------------------------------------------------------

def categorical_ordinal_encode(table, size, input_tensor, hash_precomputed=True, name=None):
    """Each value of `input_tensor` as its ordinal: 0 stays 0, other values get 1, 2, 3, ...
    in order of first appearance over all runs of the job, as OneFlow's CPU kernel numbers
    them. `table` (shape (2 * capacity,)) and `size` (shape (1,), the largest id given) are
    int variables of the input's dtype, initialised to 0, that remember the values seen;
    the job updates them after each run (as flow.assign).

    The table's layout differs from OneFlow's open-addressing hash table: onnxjob keeps
    the known values in its first half and their ids in the second, and finds a batch's
    values among them by one stable sort (TopK) of [0, known values, batch]. OneFlow's
    kernel aborts once more than `capacity` distinct values arrive; onnxjob numbers them
    on, but remembers only the first `capacity` (later ones get new ids in each run)."""
    api = "flow.categorical_ordinal_encode"
    if hash_precomputed is not True:
        raise TraceError(f"{api}: only hash_precomputed=True is supported (as in OneFlow)")
    x = _blob(input_tensor, api, "input_tensor", _INDEX)
    for what, var in (("table", table), ("size", size)):
        _blob(var, api, what, (x.np_dtype,))
    if len(table.shape) != 1 or table.shape[0] < 2 or table.shape[0] % 2:
        raise TraceError(f"{api}: table must be a 1-D variable of even length "
                         f"(2 * capacity), got shape {table.shape}")
    if tuple(size.shape) != (1,):
        raise TraceError(f"{api}: size must be a variable of shape (1,), got {size.shape}")
    new_table, new_size, ids = _ordinal_encode(table, size, x)
    assign(table, new_table)
    assign(size, new_size)
    return _named(reshape_to(ids, x.shape), name)


def _ordinal_encode(table, size, x):
    """(new table, new size, ids of x flattened), all in x's dtype; see
    categorical_ordinal_encode. Every shape is static."""
    i64 = dtypes.int64.ir_dtype.value
    capacity, m = table.shape[0] // 2, int(np.prod(x.shape))
    n = 1 + capacity + m

    def const(values):
        return int64_constant(x, values)

    def part(blob, start, stop):
        return op("Slice", blob, const([start]), const([stop]), const([0]))

    def scatter(base, where, index, values):
        """base with values[i] written at index[i] where `where` holds; the others go to
        an extra last slot (dropped) so that no two kept writes share a slot."""
        dump = base.shape[0]
        grown = op("Concat", base, base.builder.constant(np.zeros(1, base.np_dtype)), axis=0)
        target = op("Where", where, index, const([dump]))
        return part(op("ScatterElements", grown, target, values, axis=0), 0, dump)

    count = op("Cast", size, to=i64)
    known_keys = op("Cast", part(table, 0, capacity), to=i64)
    known_ids = op("Cast", part(table, capacity, 2 * capacity), to=i64)
    # position 0 is the value 0 with id 0; unused table slots hold 0 and join its run
    keys = op("Concat", const([0]), known_keys,
              op("Cast", reshape_to(x, (m,)), to=i64), axis=0)
    key_ids = op("Concat", const([0]), known_ids, axis=0)
    # runs of equal sorted keys; NOTE: the ONNX spec makes TopK stable, but the CUDA EP's
    # is not, so a run's first place in `keys` is the smallest position in it, found by
    # a segmented prefix minimum over the sorted order
    sorted_keys, order = op("TopK", keys, const([n]), axis=0, largest=0, sorted=1,
                            num_outputs=2)
    differs = op("Not", op("Equal", part(sorted_keys, 1, n), part(sorted_keys, 0, n - 1)))
    true = x.builder.constant(np.ones(1, bool))
    starts = op("Concat", true, differs, axis=0)
    ends = op("Concat", differs, true, axis=0)
    run = op("Sub", op("CumSum", op("Cast", starts, to=i64), const(0)), const([1]))
    run_first = scatter(x.builder.constant(np.zeros(n, np.int64)), ends, run,
                        _segmented_prefix_min(order, run, n, const, part))
    first = op("Gather", run_first, run, axis=0)   # per sorted entry: its run's first place
    is_new = op("GreaterOrEqual", first, const([1 + capacity]))
    # new values are numbered by the place of their first appearance in the batch
    new_here = op("And", starts, is_new)
    flags = scatter(x.builder.constant(np.zeros(n, np.int64)), new_here, first,
                    op("Cast", new_here, to=i64))
    rank = op("CumSum", flags, const(0))   # at a new value's first place: 1, 2, ...
    old_id = op("Gather", key_ids, op("Min", first, const([capacity])), axis=0)
    new_id = op("Add", count, op("Gather", rank, first, axis=0))
    sorted_ids = op("Where", is_new, new_id, old_id)
    place_ids = scatter(x.builder.constant(np.zeros(n, np.int64)),
                        x.builder.constant(np.ones(n, bool)), order, sorted_ids)
    dtype = dtypes.from_numpy(x.np_dtype).ir_dtype.value
    ids = op("Cast", part(place_ids, 1 + capacity, n), to=dtype)
    # the new values go to the table slots after the known ones, while there is room
    slot = op("Add", count, op("Sub", rank, const([1])))
    stored = op("And", op("Cast", flags, to=dtypes.bool_.ir_dtype.value),
                op("Less", slot, const([capacity])))
    table_keys = scatter(known_keys, stored, slot, keys)
    table_ids = scatter(known_ids, stored, slot, op("Add", count, rank))
    new_table = op("Cast", op("Concat", table_keys, table_ids, axis=0), to=dtype)
    new_size = op("Cast", op("Add", count, part(rank, n - 1, n)), to=dtype)
    return new_table, new_size, ids


def _segmented_prefix_min(values, run, n, const, part):
    """Per entry i, the minimum of `values` over the entries of its run (equal `run`
    ids, contiguous) up to i: ceil(log2 n) doubling steps (Hillis-Steele). `const` and
    `part` are _ordinal_encode's int64 constant and slice helpers."""
    step = 1
    while step < n:
        before = op("Concat", const(np.full(step, np.iinfo(np.int64).max)),
                    part(values, 0, n - step), axis=0)
        before_run = op("Concat", const(np.full(step, -1)), part(run, 0, n - step), axis=0)
        values = op("Where", op("Equal", before_run, run), op("Min", values, before), values)
        step *= 2
    return values


def categorical_ordinal_encoder(input_tensor, capacity, hash_precomputed=True,
                                name="CategoricalOrdinalEncoder"):
    """categorical_ordinal_encode with its own table and size variables (non-trainable,
    zero-initialised) under the namespace `name`, as OneFlow's layer."""
    _positive_int(capacity, "flow.layers.categorical_ordinal_encoder", "capacity")
    x = _blob(input_tensor, "flow.layers.categorical_ordinal_encoder", "input_tensor", _INDEX)
    dtype = dtypes.from_numpy(x.np_dtype)
    with scope.namespace(name):
        made = [variables.get_variable(
            name=var, shape=shape, dtype=dtype, trainable=False, reuse=False,
            initializer=initializers.constant_initializer(0, dtype=dtype))
            for var, shape in (("Table", (capacity * 2,)), ("Size", (1,)))]
        return categorical_ordinal_encode(made[0], made[1], x, hash_precomputed,
                                          name="Encode")
