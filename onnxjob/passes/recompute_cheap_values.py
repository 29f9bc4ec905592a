"""RecomputeCheapValues: a cheap value live at the step's memory peak is made again after it.

Rewrite case (`memory_plan.plan` of the graph in its own order; v, of MIN_BYTES or more,
is made by a short chain of at most MAX_CHAIN elementwise nodes (CHEAP) from values that
stay live across the peak anyway, from constants, or from graph inputs the chain does not
only cast):
    v = f(g(u))   ... readers of v up to the peak ... readers of v after the peak
->  v = f(g(u))   ... readers of v up to the peak ...
    v' = f(g(u))  (copies, just before the first reader after the peak) ... those read v'
"Live across the peak anyway": u's buffer is read again no earlier than v's first reader
after the peak, so recomputing keeps nothing alive longer, and the chain's own values died
before the peak. v is then freed before the peak: the peak loses v's bytes for a few more
elementwise passes after it. The plan is made again after each round (the peak may move)
until no buffer live at the peak can be recomputed, or ROUNDS rounds.

Cases it finds:
- ResNet50's mixed-precision step kept a float32 copy (a Cast) of every convolution's half
  output from the forward's batch statistics to the backward's (x - mean): 335 of its 696
  MiB planned peak at batch 8.
- BERT's GELU: its gradient reads x alone and recomputes 1 + erf(x / sqrt(2)) in the
  backward, but CommonSubexpressionElimination merges that with the forward's, which is
  then kept across the peak (24 MiB a layer at batch 32).
A variable's half copy (a Cast of a variable) is made once a step, as AutoMixedPrecision's
rule 5 says; a half copy of fed data (the images, which a first convolution's weight
gradient reads again in the backward) is made again after the peak like any cheap value.
NOTE: this runs last, after CommonSubexpressionElimination, which would merge v' into v.
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph import memory_plan
from .auto_mixed_precision import fed_inputs

# elementwise ops (one output, each element from the same element of the inputs, or of a
# broadcast constant/vector)
CHEAP = frozenset({"Cast", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Erf", "Relu",
                   "Sqrt", "Reciprocal", "Tanh", "Sigmoid", "Exp"})
MAX_CHAIN = 6     # (an exact GELU is 5)
ROUNDS = 8
# values smaller than this stay as they are: the bytes saved at the peak are nothing, and
# each copy is a kernel launch of its own (ResNet50's AMP step recomputed 62 per-channel
# vectors of 0.25-8 KiB, gamma / std of each batch norm, after the peak)
MIN_BYTES = 64 << 10


class _Chain:
    """`build(value)` collects in `nodes` (earliest first) the nodes to copy to make
    `value` again at position `first_late` of `plan`'s order, and says whether it can be
    made there from values that are live there anyway."""

    def __init__(self, plan, first_late, fed):
        self.plan, self.first_late, self.fed = plan, first_late, fed
        self.nodes = []

    def build(self, value):
        node = value.producer()
        if node is None or node.op_type not in CHEAP or node.domain not in ("", "ai.onnx") \
                or len(node.outputs) != 1:
            return False
        for source in node.inputs:
            if source is None or source.const_value is not None:
                continue
            if source.is_graph_input() or source.is_initializer():
                if node.op_type == "Cast" and source not in self.fed:
                    return False    # a variable's half copy: made once a step
                continue
            until = self.plan.last_read_position(source)
            if until is not None and until >= self.first_late:
                continue            # live across the peak anyway: read it there
            if not self.build(source):
                return False        # (its chain node is appended before this one)
        if node not in self.nodes:
            self.nodes.append(node)
        return len(self.nodes) <= MAX_CHAIN


def _late_readers(plan, value, position):
    """The readers of `value` after the plan's peak."""
    return [(use.node, use.idx) for use in value.uses()
            if position[id(use.node)] > plan.peak_index]


def _recompute(graph, chain, value, late, position, tag):
    """Copies of `chain`'s nodes (names ending in `tag`) before the first of the `late`
    readers, which then read the copy of `value`."""
    first = min((n for n, _ in late), key=lambda n: position[id(n)])
    copies = {}
    for node in chain:
        inputs = [copies.get(v, v) for v in node.inputs]
        copy = ir.Node(node.domain, node.op_type, inputs,
                       attributes=list(node.attributes.values()),
                       name=f"{node.name}/{tag}", metadata_props=dict(node.metadata_props))
        out, source = copy.outputs[0], node.outputs[0]
        out.name, out.type, out.shape = f"{source.name}/{tag}", source.type, source.shape
        graph.insert_before(first, copy)
        copies[source] = out
    for reader, index in late:
        reader.replace_input_with(index, copies[value])


class RecomputeCheapValues(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified, copies = False, 0
        fed = fed_inputs(graph)     # (their half copies may be made again; a variable's not)
        for _ in range(ROUNDS):
            plan = memory_plan.plan(graph)
            position = {id(n): i for i, n in enumerate(plan.order)}
            moves = []
            for live in plan.at_peak:
                if live.nbytes < MIN_BYTES:
                    continue
                value = live.value
                late = _late_readers(plan, value, position) if not value.is_graph_output() \
                    else []
                if not late:
                    continue
                chain = _Chain(plan, min(position[id(n)] for n, _ in late), fed)
                if chain.build(value):
                    moves.append((chain.nodes, value, late))
            if not moves:
                break
            for chain, value, late in moves:
                copies += 1
                _recompute(graph, chain, value, late, position, f"recomputed{copies}")
            modified = True
        return PassResult(model, modified)
