"""BatchNormStatistics: a train batch norm's statistics and output from one node (CPU only).

Rewrite case (the forward of onnxjob.BatchNormTrain, graph/primitives/batch_norm.py, with
the channels on axis 1 and a rank's own batch):
    m = ReduceMean(x, all axes but 1, keepdims=1)
    v = ReduceMean(Mul(Sub(x, m), Sub(x, m)), same axes, keepdims=1)
    y = BatchNormalization(x, scale, B, Reshape(m, (C,)), Reshape(v, (C,)))
->  y, mean, var = BatchNormalization(x, scale, B, z, Mul(z, z), training_mode=1,
                                        momentum=0)
with z = Sub(scale, scale) (or of B, whichever is a graph input: a variable). With momentum
0 the "running" outputs are the batch's mean and biased variance, as before, and every
reader of the old statistics reads them. The zero inputs are made at run time and are two
tensors because onnxruntime's CPU kernel may write each running statistic over its input:
an earlier version wrote over a shared zero constant, and given one tensor for both inputs
it put the mean and the variance in one buffer (tests/test_passes.py).

onnxruntime's CPU kernel computes them in the same two passes (equal to the last bit in
tests) and normalizes in one more: five passes over x become three. At (8, 256, 56, 56):
2.75 against 5.19 ms. The CUDA EP does not run training-mode BatchNormalization, so CUDA
jobs keep the parts.
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, attr, const_array, producer, replace_value, static_shape

_FLOATS = (ir.DataType.FLOAT, ir.DataType.DOUBLE)


def _channel_mean(value, source):
    """The ReduceMean of `source` over every axis but 1 (keepdims) that made `value`, or
    None."""
    node = producer(value, "ReduceMean")
    if node is None or len(node.inputs) != 1 or node.inputs[0] is not source or \
            attr(node, "keepdims", 1) != 1:
        return None
    if source.shape is None:
        return None
    rank = len(source.shape)
    axes = sorted(a % rank for a in attr(node, "axes", []) or [])
    return node if axes == [0] + list(range(2, rank)) else None


def _statistics(bn):
    """(m, v): the keepdims batch mean and variance `bn` normalizes with, or None."""
    x = bn.inputs[0]
    reshapes = [producer(bn.inputs[i], "Reshape") for i in (3, 4)]
    if None in reshapes:
        return None
    mean, var = (r.inputs[0] for r in reshapes)
    var_node = producer(var, "ReduceMean")
    if _channel_mean(mean, x) is None or var_node is None:
        return None
    square = producer(var_node.inputs[0], "Mul")
    if square is None or square.inputs[0] is not square.inputs[1] or \
            _channel_mean(var, square.outputs[0]) is None:
        return None
    centered = producer(square.inputs[0], "Sub")
    if centered is None or centered.inputs[0] is not x or centered.inputs[1] is not mean:
        return None
    return mean, var


def _run_time_vector(bn):
    """scale or B when it is a graph input (a variable: never folded into a constant),
    else None."""
    for value in (bn.inputs[1], bn.inputs[2]):
        if value is not None and value.is_graph_input() and const_array(value) is None:
            return value
    return None


def _match(bn):
    """The run-time vector to make the zero statistics from when `bn` is the rewrite's
    pattern, else None."""
    if bn.op_type != "BatchNormalization" or bn.domain != "" or len(bn.inputs) != 5 or \
            len(bn.outputs) != 1 or attr(bn, "training_mode", 0):
        return None
    x = bn.inputs[0]
    shape = static_shape(x)
    if shape is None or len(shape) < 3 or x.type is None or x.type.dtype not in _FLOATS:
        return None
    vector = _run_time_vector(bn)
    return vector if vector is not None and _statistics(bn) is not None else None


class BatchNormStatistics(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        if graph.opset_imports.get("", 0) < 14:     # training_mode came with opset 14
            return PassResult(model, False)
        for bn in list(graph):
            vector = _match(bn) if bn.graph is not None else None
            if vector is None:
                continue
            x, scale, bias, old_mean, old_var = bn.inputs
            channels, dtype = [x.shape[1]], x.type.dtype
            e = NodeEmitter(graph, bn, "stats")
            # two zero vectors: onnxruntime may write each statistic over its input, and
            # given one tensor for both it wrote the mean and the variance into one buffer
            zero_mean = e.node("Sub", [vector, vector], channels, dtype)
            zero_var = e.node("Mul", [zero_mean, zero_mean], channels, dtype)
            y, batch_mean, batch_var = e.node_outputs(
                "BatchNormalization", [x, scale, bias, zero_mean, zero_var],
                [x.shape, channels, channels], dtype, epsilon=attr(bn, "epsilon", 1e-5),
                momentum=0.0, training_mode=1)
            if not replace_value(bn.outputs[0], y):
                continue    # (what was emitted is left to RemoveUnusedNodesPass)
            graph.remove(bn, safe=True)
            # every other reader of the statistics (the moving averages, the backward) reads
            # the new ones; the old parts are left to RemoveUnusedNodesPass (or kept, still
            # correct, where something else reads m or v)
            replace_value(old_mean, batch_mean)
            replace_value(old_var, batch_var)
            modified = True
        return PassResult(model, modified)
