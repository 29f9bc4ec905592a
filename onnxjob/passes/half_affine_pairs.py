"""HalfAffinePairs: the sum of two half per-channel affines with one BatchNormalization
fewer (CUDA jobs under mixed precision).

Rewrite case (after AutoMixedPrecision; the per-channel affines of
graph/primitives/normalization.py `channel_affine`, inference BatchNormalizations whose
variance + epsilon is 1, as batch norm's input gradient a * dy + c + b * (x - mean) makes
them, graph/primitives/batch_norm.py):
    Add(BatchNormalization(u, a, c, 0, v1), BatchNormalization(w, b, 0, m, v2))   (u, w half)
->  Add(Mul(u, Reshape(a, (C, 1, ...))), BatchNormalization(w, b, c, m, v2))
(either operand order; each affine read by the Add alone).

Why: onnxruntime's CUDA BatchNormalization on half data casts its four parameters to
float32, a kernel each, before cuDNN's (core/providers/cuda/nn/batch_norm.cc; graph/
traffic.py `hidden_kernels`): a half affine launches five kernels where a Mul by a
per-channel vector launches one, reading and writing the same bytes. ResNet50's AMP step
has one such pair per batch norm. The values are the same but for the affine's
1 / sqrt(v1 + epsilon), which is 1 to within 1e-4 (channel_affine's variance is 1 - epsilon,
in half 1.0: a factor 1 - 5e-6, under half's resolution) and the Mul leaves out.
In float32 a BatchNormalization is one launch: nothing to gain, and the pass leaves it.
"""
import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, attr, const_array_through_cast, replace_value, static_shape

# |variance + epsilon - 1| under which an affine's scale is taken as exactly its `scale`
UNIT_TOLERANCE = 1e-4


def _is_zero(value):
    array = const_array_through_cast(value)
    return array is not None and not np.any(array)


def _half_affine(value, add):
    """The BatchNormalization making `value` when it is a half per-channel affine (its
    variance + epsilon 1) read by `add` alone, else None."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != "BatchNormalization" or node.domain or \
            len(node.inputs) != 5 or len(node.outputs) != 1 or attr(node, "training_mode", 0):
        return None
    uses = value.uses()
    if value.is_graph_output() or len(uses) != 1 or uses[0].node is not add:
        return None
    x = node.inputs[0]
    if x is None or x.type is None or x.type.dtype != ir.DataType.FLOAT16:
        return None
    var = const_array_through_cast(node.inputs[4])
    epsilon = float(attr(node, "epsilon", 1e-5))
    if var is None or np.abs(var.astype(np.float64) + epsilon - 1).max() > UNIT_TOLERANCE:
        return None
    return node


class HalfAffinePairs(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for add in list(graph):
            if add.graph is None or add.op_type != "Add" or add.domain or len(add.inputs) != 2:
                continue
            pair = [_half_affine(v, add) for v in add.inputs]
            if None in pair:
                continue
            for plain, centred in (pair, pair[::-1]):
                # plain: a * u + c (mean 0); centred: b * (w - m) (bias 0)
                if _is_zero(plain.inputs[3]) and _is_zero(centred.inputs[2]):
                    modified |= self._rewrite(graph, add, plain, centred)
                    break
        return PassResult(model, modified)

    @staticmethod
    def _rewrite(graph, add, plain, centred):
        u, a, c = plain.inputs[:3]
        shape = static_shape(u)
        if shape is None or len(shape) < 2 or static_shape(a) != (shape[1],) or \
                static_shape(centred.inputs[0]) != shape:
            return False
        e = NodeEmitter(graph, add, "affine_pair")
        half = ir.DataType.FLOAT16
        channels = (shape[1],) + (1,) * (len(shape) - 2)
        scale = e.node("Reshape", [a, e.const(np.array(channels, np.int64))], channels, half)
        product = e.node("Mul", [u, scale], shape, half)
        w, b, _, m, var = centred.inputs
        shifted = e.node("BatchNormalization", [w, b, c, m, var], shape, half,
                         epsilon=float(attr(centred, "epsilon", 1e-5)))
        total = e.node("Add", [product, shifted], shape, half)
        if not replace_value(add.outputs[0], total):
            return False
        for node in (add, plain, centred):
            graph.remove(node, safe=True)
        return True
