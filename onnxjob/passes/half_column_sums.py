"""HalfColumnSums: a float32 sum over the rows of a half tensor as one matrix-vector product
of the half tensor (CUDA jobs under mixed precision).

Rewrite case (after AutoMixedPrecision: a bias gradient, the sum of a half gradient over
every axis but the trailing ones, which AMP computes in float32 on a float32 copy):
    ReduceSum(Cast(v, to=float32), axes=(0, ..., j - 1), keepdims=0)   (v half, R rows)
->  Cast(Reshape(MatMul(ones(1, R), Reshape(v, (R, C))), out), to=float32)
with C the product of v's other dimensions. Before: v was read, a float32 copy written and
read again (10 bytes an element); now v is read once (2). onnxruntime's CUDA MatMul
multiplies half matrices with float32 accumulation (cuBLAS's CUBLAS_COMPUTE_32F, its
HalfGemmOptions default) and rounds the result to half once: the bias gradient is then
half, as the weight gradient beside it (a half MatMul over the same rows) and as PyTorch
autocast's. Its range is the weight gradient's too: a sum past 65504 is infinite, which a
dynamic loss scale skips as it skips any overflow in half. (Scaling the row of ones by
1/R keeps the sum in range but sends small gradients under half's smallest normal:
BERT's bias gradients at batch 64 x 32, unscaled, came out 13% off.)
Rows of fewer than MIN_ROWS are left alone (nothing to gain).
"""
import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, attr, reduce_axes, replace_value, static_shape
from .auto_mixed_precision import HALF_TYPES

MIN_ROWS = 256


def _half_source(cast):
    """The half value `cast` (a Cast to float32 read by nothing else) copies, or None."""
    if cast is None or cast.op_type != "Cast" or cast.domain != "" or \
            attr(cast, "to") != ir.DataType.FLOAT.value:
        return None
    out, source = cast.outputs[0], cast.inputs[0]
    if len(out.uses()) != 1 or out.is_graph_output() or source.type is None or \
            source.type.dtype not in HALF_TYPES:
        return None
    return source


def _leading_axes(node, rank):
    """j when `node` reduces axes 0 .. j-1 (j >= 1) of a rank-`rank` input, keepdims 0,
    else None."""
    axes = reduce_axes(node)
    if axes is None or attr(node, "keepdims", 1) != 0:
        return None
    axes = sorted({a % rank for a in axes})
    return len(axes) if axes == list(range(len(axes))) and 0 < len(axes) < rank else None


class HalfColumnSums(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for node in list(graph):
            if node.graph is None or node.op_type != "ReduceSum" or node.domain != "":
                continue
            cast = node.inputs[0].producer() if node.inputs[0] is not None else None
            source = _half_source(cast)
            shape = static_shape(source) if source is not None else None
            if shape is None:
                continue
            lead = _leading_axes(node, len(shape))
            if lead is None:
                continue
            rows, cols = int(np.prod(shape[:lead])), int(np.prod(shape[lead:]))
            out_shape = static_shape(node.outputs[0])
            if rows < MIN_ROWS or out_shape is None:
                continue
            replacement = self._column_sums(graph, node, source, rows, cols, out_shape)
            if replace_value(node.outputs[0], replacement):
                graph.remove(node, safe=True)
                graph.remove(cast, safe=True)
                modified = True
        return PassResult(model, modified)

    @staticmethod
    def _column_sums(graph, node, source, rows, cols, out_shape):
        e = NodeEmitter(graph, node, "gemv")
        half, f32 = source.type.dtype, ir.DataType.FLOAT
        ones = np.ones((1, rows), np.float32)
        ones = e.const(ones.astype(np.float16)) if half == ir.DataType.FLOAT16 else \
            e.node("Cast", [e.const(ones)], (1, rows), half, to=half.value)  # (no NumPy bf16)
        matrix = e.node("Reshape", [source, e.const(np.array([rows, cols], np.int64))],
                        (rows, cols), half)
        product = e.node("MatMul", [ones, matrix], (1, cols), half)
        return e.node("Cast", [e.node(
            "Reshape", [product, e.const(np.array(out_shape, np.int64))], out_shape, half)],
            out_shape, f32, to=f32.value)
