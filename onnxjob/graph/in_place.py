"""Which of a train step's new variable values may be written over the old ones.

A train step reads each variable w (a graph input) and makes its next value w' (a graph
output). Written into w's own buffer (runtime/session.py binds the output to the input's
memory), the step holds one copy of its variables and optimizer state instead of two:
BERT-base's LAMB keeps three float32 tensors per weight (1.26 GiB), ResNet50's momentum
SGD two (195 MiB). That is safe when no node can read w after w' is written, whatever
order the nodes run in (onnxruntime fuses and reorders nodes, and the CPU and CUDA
sessions order them differently), so `in_place_state` asks of the graph itself:

* every node that reads w, or a copy of w that onnxruntime may fold away (COPIES: a
  view, a cast, a transpose, which it removes or fuses into their readers, e.g. a half
  copy whose float32 Cast it inserts on the CPU, a transposed weight a MatMul reads), is
  an ancestor of the node that writes w' (so it has run before, in any topological
  order) or is that node;
* the node that writes w' is elementwise (ELEMENTWISE), and where it reads w itself, w has
  w''s shape (each element read before the same element is written), or it is a ScatterND
  of new rows into w (a row-sparse update: the rows' new values are its other inputs), or
  it does not read w at all (small variables updated as one: their part of the
  concatenation's new value, train/flat_groups.py);
* w' has w's type and shape and is no other output's value.

Variables whose update depends on every gradient (a dynamic loss scale's finite check,
clipping by the global norm) qualify, weights included; without such a dependency a
weight's gradient for the previous layer (its dgrad) reads it outside the update's
ancestors, and only the optimizer's own slots qualify.
"""
import collections

from onnxjob.graph.memory_plan import ALIAS_OPS

# nodes whose output onnxruntime may replace by their input in their readers
COPIES = ALIAS_OPS | {"Cast", "Transpose"}

ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Neg", "Max", "Min", "Clip",
                         "Abs", "Sqrt", "Relu", "Sign", "Pow"})


def _ancestor_bits(nodes):
    """{id(node): an int whose bit i is set when nodes[i] is an ancestor of the node}."""
    index = {id(n): i for i, n in enumerate(nodes)}
    bits = {}
    for node in nodes:
        mask = 0
        for value in node.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and id(producer) in index:
                mask |= bits[id(producer)] | (1 << index[id(producer)])
        bits[id(node)] = mask
    return bits, index


def _readers(value):
    """The nodes reading `value` or a copy of it (COPIES)."""
    found = []
    for use in value.uses():
        node = use.node
        found.append(node)
        if node.op_type in COPIES and use.idx == 0:
            found.extend(_readers(node.outputs[0]))
    return found


def _writes_rows_of(writer, w):
    """Whether `writer` is a ScatterND writing new rows into w itself (a row-sparse update:
    train/optimizer.py _update_rows): in w's buffer it writes only those rows, whose new
    values its other inputs hold already."""
    reduction = writer.attributes.get("reduction")
    return writer.op_type == "ScatterND" and writer.inputs[0] is w and \
        (reduction is None or reduction.value == "none")


def in_place_state(graph, variable_inputs, state_outputs):
    """The variables of `state_outputs` ({variable: output name}) whose next value may be
    written over the value read from `variable_inputs` ({variable: input name}) in one run
    of `graph` (an onnx_ir Graph in topological order): see the module docstring."""
    nodes = list(graph)
    bits, index = _ancestor_bits(nodes)
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name: v for v in graph.outputs}
    counted = collections.Counter(id(v) for v in graph.outputs)
    safe = set()
    for variable, out_name in state_outputs.items():
        w, new = inputs.get(variable_inputs.get(variable)), outputs.get(out_name)
        if w is None or new is None or counted[id(new)] > 1:
            continue
        writer = new.producer()
        readers = _readers(w)
        if writer is None or not (writer.op_type in ELEMENTWISE or _writes_rows_of(writer, w)
                                  or writer not in readers) \
                or writer.domain != "" or new.type != w.type or new.shape is None or \
                w.shape is None or list(new.shape) != list(w.shape):
            continue
        before = bits[id(writer)]
        if all(r is writer or (id(r) in index and before >> index[id(r)] & 1)
               for r in readers):
            safe.add(variable)
    return safe
