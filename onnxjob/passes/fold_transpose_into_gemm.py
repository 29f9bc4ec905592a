"""FoldTransposeIntoGemm: a 2-D Transpose read only by matrix products becomes their flags.

Rewrite cases:
  1. Gemm(Transpose(a, perm=[1, 0]), b)   -> Gemm(a, b, transA = not transA)
  2. Gemm(a, Transpose(b, perm=[1, 0]))   -> Gemm(a, b, transB = not transB)
  3. MatMul(Transpose(a), b), both 2-D    -> Gemm(a, b, transA=1)  (same for b: transB=1)
  4. Transpose(Gemm(a, b)) (no C), or of a 2-D MatMul, read by nothing else
                                          -> Gemm(b, a) with each flag the other's negation
A Transpose with any reader that is not such a product is kept (folding would not remove
it), and so is an integer MatMul (onnxruntime has no integer Gemm). A Transpose read by
several products folds into each: a tied weight (BERT's word embeddings, read transposed
by its output layer's forward product and by the backward's input gradient) then has no
transposed copy, and case 4 writes the weight gradient in the weight's own layout (a
30522 x 768 float32 transpose and its half copy off the step's peak, two transposes a step
fewer).
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import attr, replace_value, static_shape

_GEMM_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)


def _is_plain_transpose_2d(node):
    if node.op_type != "Transpose" or node.domain != "":
        return False
    shape = static_shape(node.inputs[0])
    return shape is not None and len(shape) == 2 and \
        list(attr(node, "perm", [1, 0])) == [1, 0]


def _gemm_ready_matmul(node):
    """Whether `node` is a MatMul of two 2-D values of a type Gemm takes."""
    if node.op_type != "MatMul" or node.domain != "":
        return False
    a, b = node.inputs
    shapes = static_shape(a), static_shape(b)
    return None not in shapes and len(shapes[0]) == len(shapes[1]) == 2 and \
        a.type is not None and a.type.dtype in _GEMM_TYPES


def _foldable(use):
    node, index = use
    if index > 1 or node.domain != "":
        return False
    return node.op_type == "Gemm" or _gemm_ready_matmul(node)


def _gemm_like(graph, node, inputs, trans_a, trans_b, alpha=1.0):
    """A Gemm of `inputs` (flags `trans_a`, `trans_b`) in place of `node`, whose output it
    takes over; None (nothing changed) where that output cannot be replaced."""
    attributes = {"transA": int(trans_a), "transB": int(trans_b)}
    if alpha != 1.0:
        attributes["alpha"] = float(alpha)
    gemm = ir.node("Gemm", inputs, attributes=attributes, name=f"{node.name}/gemm",
                   metadata_props=dict(node.metadata_props))
    graph.insert_before(node, gemm)
    old, new = node.outputs[0], gemm.outputs[0]
    new.name, new.type = f"{old.name}/gemm", old.type
    new.shape = old.shape
    if not replace_value(old, new):
        graph.remove(gemm, safe=True)
        return None
    graph.remove(node, safe=True)
    return gemm


class FoldTransposeIntoGemm(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for node in list(graph):
            if node.graph is None or not _is_plain_transpose_2d(node):
                continue
            modified |= self._into_readers(graph, node) or self._into_producer(graph, node)
        return PassResult(model, modified)

    @staticmethod
    def _into_readers(graph, t):
        """Cases 1-3: every reader of `t`'s output takes `t`'s input with a flag flipped."""
        out = t.outputs[0]
        uses = [(u.node, u.idx) for u in out.uses()]
        # (a reader in a subgraph, If's or Loop's, keeps the transpose)
        if not uses or out.is_graph_output() or \
                not all(_foldable(u) and u[0].graph is graph for u in uses):
            return False
        readers = {id(n): n for n, _ in uses}.values()
        for reader in list(readers):
            if reader.op_type == "MatMul":
                reader = _gemm_like(graph, reader, list(reader.inputs), False, False)
                if reader is None:
                    continue
            for index, flag in ((0, "transA"), (1, "transB")):
                if reader.inputs[index] is out:
                    reader.replace_input_with(index, t.inputs[0])
                    reader.attributes[flag] = ir.AttrInt64(flag, 1 - attr(reader, flag, 0))
        if out.uses():
            return True     # (a reader whose output is a graph output it could not replace)
        graph.remove(t, safe=True)
        return True

    @staticmethod
    def _into_producer(graph, t):
        """Case 4: (A' B')^T = B'^T A'^T, a Gemm with its operands and flags swapped."""
        product = t.inputs[0].producer()
        source = t.inputs[0]
        if product is None or len(source.uses()) != 1 or source.is_graph_output():
            return False
        if product.op_type == "Gemm" and product.domain == "" and \
                (len(product.inputs) < 3 or product.inputs[2] is None):
            trans_a, trans_b = attr(product, "transA", 0), attr(product, "transB", 0)
            alpha = attr(product, "alpha", 1.0)
        elif _gemm_ready_matmul(product):
            trans_a, trans_b, alpha = 0, 0, 1.0
        else:
            return False
        a, b = product.inputs[0], product.inputs[1]
        if _gemm_like(graph, t, [b, a], not trans_b, not trans_a, alpha) is None:
            return False
        graph.remove(product, safe=True)
        return True
