"""ScatterAddIntoSum: a scatter-add into zeros that is then added to a tensor of its shape
scatters into that tensor instead.

Rewrite case (S read by the Add alone, A of S's shape and type):
  Add(A, ScatterElements(zeros, indices, updates, reduction="add"))
    -> ScatterElements(A, indices, updates, reduction="add")
(either operand order; ScatterND alike), where zeros is a ConstantOfShape of 0 or a
constant of zeros. The gradient of a table that is both gathered and read whole has this
form: BERT's word embeddings, looked up by the input and tied to the masked-LM head, whose
product's gradient the lookups' scatter is added to. The zero table, its copy into the
scatter's output and the Add (five passes over the table) go: at (30522, 256) float32 on 2
CPU threads, the head's weight gradient and the sum took 33 ms and 28 ms so.

A row looked up several times is now added to A one update after another instead of the
updates being summed first: the same sum in another order (a float32 difference in the
last bits, as between any two orders of a sum).
"""
import numpy as np
from onnx_ir.passes import InPlacePass, PassResult

from ._util import (NodeEmitter, attr, const_array, has_single_use, replace_value,
                    static_shape)

_SCATTERS = ("ScatterElements", "ScatterND")


def _is_zeros(value):
    """Whether `value` is a constant of zeros or a ConstantOfShape of 0."""
    array = const_array(value)
    if array is not None:
        return not np.any(array)
    node = value.producer()
    if node is None or node.op_type != "ConstantOfShape" or node.domain != "":
        return False
    fill = attr(node, "value")
    return fill is None or not np.any(fill.numpy())


def _scatter_into_zeros(value):
    """The scatter-add into zeros that made `value`, read by one node only, or None."""
    node = value.producer()
    if node is None or node.op_type not in _SCATTERS or node.domain != "" or \
            attr(node, "reduction", "none") != "add" or not has_single_use(value):
        return None
    return node if _is_zeros(node.inputs[0]) else None


class ScatterAddIntoSum(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for add in list(graph):
            if add.graph is None or add.op_type != "Add" or add.domain != "" or \
                    len(add.inputs) != 2:
                continue
            for position in (0, 1):
                scatter = _scatter_into_zeros(add.inputs[position])
                other = add.inputs[1 - position]
                if scatter is None or static_shape(other) is None or \
                        static_shape(other) != static_shape(scatter.outputs[0]) or \
                        other.type != scatter.outputs[0].type:
                    continue
                out = add.outputs[0]
                e = NodeEmitter(graph, add, "into")
                into = e.node(scatter.op_type, [other, *scatter.inputs[1:]], static_shape(out),
                              out.type.dtype, **{k: a.value for k, a in scatter.attributes.items()})
                if replace_value(out, into):
                    graph.remove([add, scatter], safe=True)
                    modified = True
                break
        return PassResult(model, modified)
