"""FoldTransposeIntoGemm: a 2-D Transpose that only feeds a Gemm/MatMul becomes a flag.

Rewrite cases:
  1. Gemm(Transpose(a, perm=[1, 0]), b)   -> Gemm(a, b, transA = not transA)
  2. Gemm(a, Transpose(b, perm=[1, 0]))   -> Gemm(a, b, transB = not transB)
  3. MatMul(Transpose(a), b), both 2-D    -> Gemm(a, b, transA=1)  (same for b: transB=1)
A Transpose with other consumers is kept (folding would not remove it), and so is an
integer MatMul (onnxruntime has no integer Gemm).
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import attr, has_single_use, replace_value, static_shape

_GEMM_TYPES = (ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16)


def _plain_transpose_2d(value):
    node = value.producer()
    if node is None or node.op_type != "Transpose" or not has_single_use(value):
        return None
    shape = static_shape(node.inputs[0])
    if shape is None or len(shape) != 2 or list(attr(node, "perm", [1, 0])) != [1, 0]:
        return None
    return node


class FoldTransposeIntoGemm(InPlacePass):
    def call(self, model):
        modified = False
        graph = model.graph
        for node in list(graph):
            if node.op_type == "Gemm":  # cases 1, 2
                for index, flag in ((0, "transA"), (1, "transB")):
                    t = _plain_transpose_2d(node.inputs[index])
                    if t is None:
                        continue
                    node.replace_input_with(index, t.inputs[0])
                    node.attributes[flag] = ir.AttrInt64(flag, 1 - attr(node, flag, 0))
                    graph.remove(t, safe=True)
                    modified = True
            elif node.op_type == "MatMul":  # case 3
                a, b = node.inputs
                if static_shape(a) is None or static_shape(b) is None:
                    continue
                if len(static_shape(a)) != 2 or len(static_shape(b)) != 2:
                    continue
                if a.type is None or a.type.dtype not in _GEMM_TYPES:
                    continue
                ta, tb = _plain_transpose_2d(a), _plain_transpose_2d(b)
                if ta is None and tb is None:
                    continue
                inputs = [ta.inputs[0] if ta else a, tb.inputs[0] if tb else b]
                gemm = ir.node("Gemm", inputs, attributes={"transA": int(ta is not None),
                                                           "transB": int(tb is not None)},
                               name=f"{node.name}/gemm", metadata_props=dict(node.metadata_props))
                graph.insert_before(node, gemm)
                old, new = node.outputs[0], gemm.outputs[0]
                new.name, new.shape, new.type = f"{old.name}/gemm", old.shape, old.type
                if not replace_value(old, new):
                    graph.remove(gemm, safe=True)
                    continue
                graph.remove(node, safe=True)
                for t in (ta, tb):
                    if t is not None:
                        graph.remove(t, safe=True)
                modified = True
        return PassResult(model, modified)
