"""BatchNormRowStatistics: a train batch norm's statistics and gradient sums from per-row
LayerNormalization statistics (CUDA jobs under mixed precision).

Rewrite cases (the parts of onnxjob.BatchNormTrain, graph/primitives/batch_norm.py, with
the channels on axis 1 and x of shape (N, C, *S), K = prod(S) > 1; `axes` = (0, 2, ...);
R(v) any chain of Reshapes of v):
  forward, the batch's statistics:
    m = ReduceMean(x, axes, keepdims=1)
    v = ReduceMean(Mul(Sub(x, m'), Sub(x, m')), axes, keepdims=1)     (m' = m or R(m))
->  _, mr, rr = LayerNormalization(x, ones(S), zeros(S), axis=2, epsilon=0)
    m = ReduceMean(mr, (0,), keepdims=1)
    v = ReduceMean(Pow(rr, -2) + (mr - m)^2, (0,))
  (mr, rr: each of the N * C rows' mean and 1 / std, float32; a mean of equal-sized rows'
  means is the mean, and their variances combine with the spread of their means without
  cancellation), and, for the backward of the forward's F = BatchNormalization(x, gamma,
  beta, mean, var, epsilon):
    d_beta  = ReduceSum(dy, axes, keepdims=0)
    d_gamma = Mul(ReduceSum(Mul(dy, Sub(x, R(mean))), axes, keepdims=0), inv_std)
->  xhat    = BatchNormalization(x, inv_std, zeros, mean, 1 - e', e')   ((x - mean) * inv_std)
    d_beta  = K * ReduceSum(LayerNormalization's mean of dy, axes, keepdims=0)
    d_gamma = K * ReduceSum(LayerNormalization's mean of Mul(dy, xhat), axes, keepdims=0)
  (inv_std the value d_gamma was multiplied by; e' channel_affine's epsilon).

Why: under mixed precision x and dy are half, and the statistics and sums are float32
(passes/auto_mixed_precision.py rule 4): before, each batch norm cast x to float32 twice
and dy once and read and wrote the float32 copies several times (ResNet50's AMP step at
batch 64: 13.4 GiB of casts, graph/traffic.py). A LayerNormalization whose Y nothing reads
follows its half input (AMP rule 3): onnxruntime's CUDA kernel reads the half rows once
and accumulates in float32 (Welford's algorithm), writing float32 statistics, where a
half ReduceMean or ReduceSum would write each row's sum in half (infinite past 65504).
Its Y is written and dropped (half: one write of the tensor). The product dy * xhat is
half: |xhat| is a few units, so it is in range wherever dy is, as cuDNN's half weight
gradients are.

In float32 the rewrite would move about as many bytes as the parts (ReduceSum reads a
float32 tensor once and writes nothing of its size), so it runs under mixed precision
only (default_pipeline). Before SumSquareReductions and SplitChannelReductions, which
rewrite the reductions it matches.
"""
import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph import batch_norm_coefficients
from onnxjob.graph.primitives.collectives import DOMAIN as COLLECTIVES
from onnxjob.graph.primitives.normalization import CHANNEL_AFFINE_EPSILON
from ._util import (
    NodeEmitter, add_initializer, attr, producer, reduce_axes, replace_value, static_shape)


def _root(value):
    """The value a chain of Reshapes made `value` from (`value` itself if none)."""
    node = producer(value, "Reshape")
    while node is not None:
        value = node.inputs[0]
        node = producer(value, "Reshape")
    return value


def _uses(value, op_type, index=None):
    """The nodes of type `op_type` in the graph that read `value` (at input `index`)."""
    return [u.node for u in value.uses() if u.node.op_type == op_type and
            u.node.domain == "" and u.node.graph is not None and
            (index is None or u.idx == index)]


def _only_use(value):
    uses = value.uses()
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def _remove_unread(graph, nodes):
    """Remove each of `nodes`, in order, that nothing reads any more: a node matched again
    later (by another batch norm of the same x) must not be rewritten twice."""
    for node in nodes:
        if not any(out.uses() or out.is_graph_output() for out in node.outputs):
            graph.remove(node, safe=True)


def _is_inv_std(value):
    """Whether `value` is a batch norm's 1 / sqrt(var + eps): a Reciprocal, or a piece of
    every layer's made together (graph/batch_norm_coefficients.py)."""
    node = value.producer() if value is not None else None
    return node is not None and (
        node.op_type == "Reciprocal" and not node.domain or
        node.metadata_props.get(batch_norm_coefficients.ROLE) == batch_norm_coefficients.INV_STD)


def _reduces(node, rank, keepdims):
    """Whether `node` reduces every axis but 1 of a rank-`rank` input, with `keepdims`."""
    axes = reduce_axes(node)
    return axes is not None and attr(node, "keepdims", 1) == keepdims and \
        sorted(a % rank for a in axes) == [0] + list(range(2, rank))


class BatchNormRowStatistics(InPlacePass):
    def call(self, model):
        graph = model.graph
        self._opset = model.opset_imports.get("", 1)
        self._constants = {}    # (fill, shape) -> one initializer every rewrite reads
        if self._opset < 17:    # LayerNormalization came with opset 17
            return PassResult(model, False)
        modified = False
        for node in list(graph):
            if node.graph is None or node.op_type != "BatchNormalization" or \
                    node.domain != "" or len(node.inputs) != 5 or len(node.outputs) != 1 or \
                    attr(node, "training_mode", 0):
                continue
            shape = static_shape(node.inputs[0])
            if shape is None or len(shape) < 3 or int(np.prod(shape[2:])) < 2 or \
                    node.inputs[0].type is None or \
                    node.inputs[0].type.dtype != ir.DataType.FLOAT:
                continue
            modified |= self._statistics(graph, node, shape)
            modified |= self._gradient_sums(graph, node, shape)
        return PassResult(model, modified)

    # -- the forward's statistics ---------------------------------------------------------
    def _statistics(self, graph, bn, shape):
        x, rank = bn.inputs[0], len(shape)
        # (the forward's mean may reach F through a rank-local marker or the whole batch's
        # statistics of a data-parallel step: the reductions are found from x)
        for candidate in _uses(x, "ReduceMean", 0):
            if _reduces(candidate, rank, 1):
                m_node = candidate
                break
        else:
            return False
        v_node = self._variance_of(x, m_node, rank)
        if v_node is None:
            return False
        e = NodeEmitter(graph, m_node, "rows")
        row_mean, row_inv_std = self._row_statistics(e, x, shape)
        f32 = ir.DataType.FLOAT
        out = static_shape(m_node.outputs[0])
        batch_mean = self._reduce(e, "ReduceMean", row_mean, [0], out, keepdims=1)
        # (1 / inv_std^2 in one kernel; inv_std = inf for a constant row gives 0)
        row_var = e.node("Pow", [row_inv_std, e.const(np.array(-2.0, np.float32))],
                         row_inv_std.shape, f32)
        # (in a data-parallel step the batch's mean is this rank's own where the parts
        # read it so: the rows' spread around it is too, before the split)
        local = [u.node for u in m_node.outputs[0].uses()
                 if u.node.op_type == "RankLocal" and u.node.domain == COLLECTIVES]
        center = e.node("RankLocal", [batch_mean], out, f32, domain=COLLECTIVES) if local \
            else batch_mean
        spread = e.node("Sub", [row_mean, center], row_mean.shape, f32)
        # each row's variance and squared offset summed before the one mean over the rows
        # (both non-negative: no cancellation; one reduction instead of two and their Add)
        batch_var = self._reduce(e, "ReduceMean", e.node("Add", [
            row_var, e.node("Mul", [spread, spread], row_mean.shape, f32)], row_mean.shape, f32),
            [0], out, keepdims=1)
        if not replace_value(m_node.outputs[0], batch_mean):
            return False    # (what was emitted is left to RemoveUnusedNodesPass)
        replace_value(v_node.outputs[0], batch_var)
        square = v_node.inputs[0].producer()
        _remove_unread(graph, [v_node, square, square.inputs[0].producer(), m_node])
        return True

    @staticmethod
    def _variance_of(x, m_node, rank):
        """The ReduceMean(Mul(c, c)) node, c = Sub(x, m) with m `m_node`'s mean (or a
        view of it through one node, a rank-local marker), or None."""
        means = {m_node.outputs[0]}
        for use in m_node.outputs[0].uses():
            means.update(use.node.outputs)
        for sub in _uses(x, "Sub", 0):
            if sub.inputs[1] not in means:
                continue
            for square in _uses(sub.outputs[0], "Mul"):
                if square.inputs[0] is not square.inputs[1]:
                    continue
                for v_node in _uses(square.outputs[0], "ReduceMean", 0):
                    if _reduces(v_node, rank, 1):
                        return v_node
        return None

    # -- the backward's sums --------------------------------------------------------------
    def _gradient_sums(self, graph, bn, shape):
        x, _, _, mean, _ = bn.inputs
        rank, f32 = len(shape), ir.DataType.FLOAT
        channels = (shape[1],)
        modified = False
        for sub in _uses(x, "Sub", 0):
            if _root(sub.inputs[1]) is not _root(mean) or static_shape(sub.outputs[0]) != shape:
                continue
            for product in _uses(sub.outputs[0], "Mul"):
                dy = product.inputs[1 - list(product.inputs).index(sub.outputs[0])]
                if static_shape(dy) != shape or dy.type is None or dy.type.dtype != f32:
                    continue
                total = _only_use(product.outputs[0])
                if total is None or total.op_type != "ReduceSum" or not _reduces(total, rank, 0):
                    continue
                d_gamma = _only_use(total.outputs[0])
                if d_gamma is None or d_gamma.op_type != "Mul" or \
                        not _is_inv_std(d_gamma.inputs[1]):
                    continue
                e = NodeEmitter(graph, product, "rows")
                # (x - mean) times the backward's own 1 / std, with a variance + epsilon of
                # 1 (as channel_affine): a constant variance is not folded into per-layer
                # scale and shift by AutoMixedPrecision (rule 3); its half parameters are
                # cast with the backward's others (BatchBackwardCasts)
                xhat = e.node("BatchNormalization",
                              [x, d_gamma.inputs[1], self._filled(graph, 0, channels), mean,
                               self._filled(graph, 1 - CHANNEL_AFFINE_EPSILON, channels)],
                              shape, f32, epsilon=CHANNEL_AFFINE_EPSILON)
                weighted = e.node("Mul", [dy, xhat], shape, f32)
                if not replace_value(d_gamma.outputs[0], self._channel_sum(e, weighted, shape)):
                    continue
                _remove_unread(graph, [d_gamma, total, product])
                modified = True
                for d_beta in _uses(dy, "ReduceSum", 0):
                    if _reduces(d_beta, rank, 0) and static_shape(d_beta.outputs[0]) == channels:
                        e = NodeEmitter(graph, d_beta, "rows")
                        if replace_value(d_beta.outputs[0], self._channel_sum(e, dy, shape)):
                            _remove_unread(graph, [d_beta])
        return modified

    def _channel_sum(self, e, value, shape):
        """The per-channel sum of `value` (shape (N, C, *S)) from its rows' means."""
        row_mean, _ = self._row_statistics(e, value, shape)
        f32 = ir.DataType.FLOAT
        summed = self._reduce(e, "ReduceSum", row_mean, [0] + list(range(2, len(shape))),
                              (shape[1],), keepdims=0)
        return e.node("Mul", [summed, e.const(np.array(np.prod(shape[2:]), np.float32))],
                      (shape[1],), f32)

    def _row_statistics(self, e, value, shape):
        """(mean, 1 / std) of each of `value`'s N * C rows, float32, shape (N, C, 1, ...)."""
        rows = tuple(shape[:2]) + (1,) * (len(shape) - 2)
        row = tuple(shape[2:])
        # (epsilon 0: 1 / inv_std^2 is the row's variance, 0 for a constant row)
        _, mean, inv_std = e.node_outputs(
            "LayerNormalization", [value, self._filled(e.graph, 1, row),
                                   self._filled(e.graph, 0, row)],
            [shape, rows, rows], ir.DataType.FLOAT, axis=2, epsilon=0.0)
        return mean, inv_std

    def _filled(self, graph, fill, shape):
        """One float32 initializer of `shape` holding `fill`, shared by the rewrites."""
        key = (fill, tuple(shape))
        if key not in self._constants:
            kind = {1: "ones", 0: "zeros"}.get(fill, f"fill{fill:g}")
            name = f"batch_norm_rows/{kind}_" + "x".join(map(str, shape))
            # (an earlier run of the pass may have made it: its name says what it holds)
            self._constants[key] = graph.initializers.get(name) or add_initializer(
                graph, np.full(shape, fill, np.float32), name)
        return self._constants[key]

    def _reduce(self, e, op_type, value, axes, shape, keepdims):
        return e.reduce(op_type, value, axes, shape, ir.DataType.FLOAT, keepdims, self._opset)
