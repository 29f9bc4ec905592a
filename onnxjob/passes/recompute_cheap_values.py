"""RecomputeCheapValues: a cheap value live at the step's memory peak is made again after it.

Rewrite case (`memory_plan.plan` of the graph in its own order; the value's producer is one
of CHEAP, e.g. a Cast of a float16 activation to float32 that the forward's batch statistics
read and the backward's reads again):
    v = Cast(u)    ... readers of v up to the peak ... readers of v after the peak
->  v = Cast(u)    ... readers of v up to the peak ...
    v' = Cast(u)   (just before the first reader after the peak)  ... those readers read v'
when u's buffer stays live across the peak anyway (it is read again no earlier than v's
first reader after the peak). Values of graph inputs (a variable's half copy) are made once
a step, as AutoMixedPrecision's rule 5 says. v is then freed before the peak and
u's life does not change: the peak loses v's bytes for one more pass over u. The plan is
made again after each round (the peak may move) until no buffer live at the peak can be
recomputed, or ROUNDS rounds.

ResNet50's mixed-precision step kept a float32 copy of every convolution's float16 output
from the forward's statistics to the backward's (x - mean): 335 of its 696 MiB planned peak
at batch 8.
NOTE: this runs last (after CommonSubexpressionElimination, which would merge v' back into v).
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph import memory_plan

CHEAP = frozenset({"Cast"})
ROUNDS = 8


def _recomputable(plan, live, position):
    """The readers of `live.value` after the peak to move onto a recomputed copy, or []."""
    value, node = live.value, live.producer
    if node.op_type not in CHEAP or len(node.inputs) != 1 or node.inputs[0] is None or \
            value.is_graph_output() or len(node.outputs) != 1:
        return []
    late = [(use.node, use.idx) for use in value.uses()
            if position[id(use.node)] > plan.peak_index]
    if not late:
        return []
    first_late = min(position[id(n)] for n, _ in late)
    source = node.inputs[0]
    source_until = plan.last_read_position(source)
    # a variable's half copy is made once a step (passes/auto_mixed_precision.py, rule 5);
    # and recomputing must not keep u alive longer
    if source_until is None or source_until < first_late:
        return []
    return late


def _recompute(graph, value, late, position):
    """A copy of `value`'s producer before the first of the `late` readers, which read it."""
    node = value.producer()
    first = min((n for n, _ in late), key=lambda n: position[id(n)])
    copy = ir.Node(node.domain, node.op_type, list(node.inputs),
                   attributes=list(node.attributes.values()), name=f"{node.name}/recomputed",
                   metadata_props=dict(node.metadata_props))
    out = copy.outputs[0]
    out.name, out.type, out.shape = f"{value.name}/recomputed", value.type, value.shape
    graph.insert_before(first, copy)
    for reader, index in late:
        reader.replace_input_with(index, out)


class RecomputeCheapValues(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for _ in range(ROUNDS):
            plan = memory_plan.plan(graph)
            position = {id(n): i for i, n in enumerate(plan.order)}
            moves = [(live.value, late) for live in plan.at_peak
                     for late in [_recomputable(plan, live, position)] if late]
            if not moves:
                break
            for value, late in moves:
                _recompute(graph, value, late, position)
            modified = True
        return PassResult(model, modified)
