"""BatchBackwardCasts: the backward's casts of small float32 vectors to half as one Cast
(CUDA jobs under mixed precision).

Rewrite case (after AutoMixedPrecision; v_i float32 values of at most MAX_BYTES computed
at run time (a constant's cast is folded when the session starts), each Cast read by
backward nodes only, none of which any v_j depends on):
    Cast(v_1, to=half), ..., Cast(v_k, to=half)
->  pieces of Split(Cast(Concat(v_1, ..., v_k), to=half))
one group per width: the vectors as rows of the widest power of two, at most 64, that
divides their sizes, as graph/primitives/shape_ops.concat_flat lays them out (onnxruntime's
CUDA Concat and Split copy a table of every index along the axis from the host), and
Concats of at most 32 inputs (passes/keep_on_cuda.py).

Why: a half batch norm takes half per-channel parameters, so the backward of every batch
norm under mixed precision casts its statistics and coefficients to half (the mean it
centres with, 1 / std for its x-hat, gamma / std for dy): ResNet50's step
launches ~200 casts of a few hundred values each, whose time on a GPU is their launch
(graph/traffic.py). Those made from the forward alone are ready when the backward starts;
cast together they are the same values in three launches and a tree of Concats.

The concatenation is placed before its first reader, after what it reads: nodes it
depends on that came later are moved ahead with it (in their order). A value whose
making reads a reader of one of the casts (a layer's gradient sums, made after an
earlier layer's casts are read) is left out, so no cycle is made.
"""
import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph.primitives.shape_ops import GROUPED_WIDTH, flat_width
from onnxjob.graph.tracer import ORIGIN
from onnxjob.graph.traffic import constant_nodes
from ._util import NodeEmitter, attr, static_shape
from .auto_mixed_precision import HALF_TYPES
from .keep_on_cuda import CONCAT_INPUTS_IN_CUDA_GRAPHS

# casts of values larger than this stay as they are (their time is their bytes)
MAX_BYTES = 64 << 10


def _is_backward(node):
    return node.metadata_props.get(ORIGIN, "forward").partition(":")[0] == "backward"


def _candidate(node):
    """Whether `node` is a Cast of a small static float32 vector to half that backward
    nodes alone read."""
    if node.op_type != "Cast" or node.domain or node.graph is None:
        return False
    source, out = node.inputs[0], node.outputs[0]
    if source is None or source.type is None or source.type.dtype != ir.DataType.FLOAT or \
            out.type is None or out.type.dtype not in HALF_TYPES or out.is_graph_output():
        return False
    shape = static_shape(source)
    if shape is None or not 0 < int(np.prod(shape)) * 4 <= MAX_BYTES:
        return False
    uses = out.uses()
    return bool(uses) and all(_is_backward(u.node) for u in uses)


def _downstream(nodes):
    """ids of the nodes that read, directly or not, an output of one of `nodes`."""
    seen, stack = set(), list(nodes)
    while stack:
        node = stack.pop()
        for out in node.outputs:
            for use in out.uses():
                if id(use.node) not in seen:
                    seen.add(id(use.node))
                    stack.append(use.node)
    return seen


def _without_cycles(casts):
    """The casts whose source is not made, directly or not, from what any of the kept
    casts' readers compute (dropping one can free others: repeated to a fixed point)."""
    while True:
        readers = [u.node for c in casts for u in c.outputs[0].uses()]
        below = _downstream(readers)
        kept = [c for c in casts if id(c) not in below]
        if len(kept) == len(casts):
            return kept
        casts = kept


def _width(sizes):
    """The rows' width for vectors of `sizes` (shape_ops.concat_flat's, grouped widths)."""
    return min(GROUPED_WIDTH, flat_width(sizes))


class BatchBackwardCasts(InPlacePass):
    def call(self, model):
        graph = model.graph
        # (a cast of a constant is folded when the session starts: it launches nothing)
        folded = constant_nodes(graph)
        casts = _without_cycles([n for n in graph if _candidate(n) and id(n) not in folded])
        groups = {}     # (by width too: one odd size would make every row one value)
        for cast in casts:
            size = int(np.prod(static_shape(cast.inputs[0])))
            groups.setdefault((attr(cast, "to"), _width([size])), []).append(cast)
        modified = False
        for members in groups.values():
            if len(members) > 1:
                self._together(graph, members)
                modified = True
        return PassResult(model, modified)

    @staticmethod
    def _together(graph, casts):
        order = {id(n): i for i, n in enumerate(graph)}
        casts.sort(key=lambda c: order[id(c)])
        readers = {id(u.node): u.node for c in casts for u in c.outputs[0].uses()}
        first = min(readers.values(), key=lambda n: order[id(n)])
        half = casts[0].outputs[0].type.dtype
        sources = [c.inputs[0] for c in casts]
        shapes = [static_shape(v) for v in sources]
        sizes = [int(np.prod(s)) for s in shapes]
        width = _width(sizes)       # (the group's, see call)
        e = NodeEmitter(graph, first, "batched_casts")
        f32 = ir.DataType.FLOAT
        rows = [e.node("Reshape", [v, e.const(np.array([n // width, width], np.int64))],
                       (n // width, width), f32) for v, n in zip(sources, sizes)]
        while len(rows) > 1:    # (at most 32 inputs a Concat)
            rows = [e.node("Concat", part, (sum(static_shape(r)[0] for r in part), width),
                           f32, axis=0) if len(part) > 1 else part[0]
                    for part in (rows[i:i + CONCAT_INPUTS_IN_CUDA_GRAPHS]
                                 for i in range(0, len(rows), CONCAT_INPUTS_IN_CUDA_GRAPHS))]
        whole = e.node("Cast", rows, (sum(sizes) // width, width), half, to=half.value)
        pieces = e.node_outputs("Split", [whole, e.const(np.array(
            [n // width for n in sizes], np.int64))], [(n // width, width) for n in sizes],
            half, axis=0)
        for cast, piece, shape in zip(casts, pieces, shapes):
            value = e.node("Reshape", [piece, e.const(np.array(shape, np.int64))], shape, half)
            for use in list(cast.outputs[0].uses()):
                use.node.replace_input_with(use.idx, value)
            graph.remove(cast, safe=True)
        _move_ahead(graph, [v.producer() for v in sources], first, order)


def _move_ahead(graph, producers, anchor, order):
    """Move the nodes among `producers` and what they are made from that come after
    `anchor` to just before the nodes emitted before `anchor` (in their order)."""
    limit = order[id(anchor)]
    late, stack = {}, [p for p in producers if p is not None]
    while stack:
        node = stack.pop()
        if id(node) in late or order.get(id(node), -1) < limit:
            continue
        late[id(node)] = node
        stack.extend(v.producer() for v in node.inputs
                     if v is not None and v.producer() is not None)
    if not late:
        return
    moved = sorted(late.values(), key=lambda n: order[id(n)])
    # (the batched nodes were emitted just before `anchor`: the moved ones go before them)
    first_new = next(n for n in graph if id(n) not in order)
    graph.remove(moved)
    graph.insert_before(first_new, moved)
