"""Batch normalization with batch statistics (train jobs), as one composite.

Forward: mean and (biased) variance over every axis but the channel axis, then
y = (x - mean) / sqrt(var + eps) * gamma + beta. The composite also outputs mean and
variance (shape (C,)) for the moving-average updates. With the channels on axis 1, y is
one inference-mode BatchNormalization node given the batch's statistics (one pass over x
where Mul and Add take two).
NOTE: the training-mode BatchNormalization node is not used: onnxruntime's CPU kernel
writes its running-statistics outputs over its mean/variance inputs (aliased buffers,
shared constants included) and its CUDA kernel does not run it.

Backward: the closed form, with N elements per channel, std = sqrt(var + eps) and
a = gamma / std:
    d_beta = sum(dy),  d_gamma = sum(dy * (x - mean)) / std,
    dx = a * (dy - d_beta / N - (x - mean) / std * d_gamma / N)
       = a * dy + b * (x - mean) + c
with per-channel b = k_b * d_gamma and c = k_c * d_beta, k_c = -a / N and k_b = k_c / std
(the four vectors a, 1 / std, k_b, k_c depend on the forward alone: every layer's are
computed together, graph/batch_norm_coefficients.py); with the channels on
axis 1, a * dy + c is one BatchNormalization node (ResNet50's train step: 1-2% faster than
Mul + Add, bench_variants.py) and b * (x - mean) another.
NOTE: x - mean is recomputed rather than expanded into sum(dy * x) - mean * sum(dy), which
cancels badly where a channel's variance is small against its mean (ResNeXt's train test
diverged with it).
NOTE: this is what cuDNN and PyTorch compute; the autodiff of the forward's parts gives
the same values in more passes over the activation and with a larger float32 error (the
ResNet50 twin test measured 2.9% against float64 for the parts, as PyTorch's 1.9%).
"""
import numpy as np

from onnxjob.graph import batch_norm_coefficients
from onnxjob.graph.primitives.collectives import DOMAIN
from onnxjob.graph.primitives.normalization import channel_affine
from onnxjob.graph.primitives.reductions import run_time_count
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.registry import register_composite
from onnxjob.graph.tracer import as_blob, int64_constant, op


def _layout(x, axis):
    """(axes reduced, broadcast shape of a per-channel vector, elements per channel)."""
    rank = len(x.shape)
    axes = [i for i in range(rank) if i != axis]
    bshape = [1] * rank
    bshape[axis] = x.shape[axis]
    return axes, bshape, int(np.prod([x.shape[i] for i in axes]))


def _scale(x, per_channel, bshape):
    return op("Mul", x, reshape_to(per_channel, bshape))


def _row(x, i):
    return op("Gather", x, int64_constant(x, i), axis=0)


def _whole_batch_statistics(mean, var, ranks):
    """The whole batch's (mean, var) of shape (C,) from each rank's (see the docstring)."""
    c = mean.shape[0]
    stats = op("Concat", reshape_to(mean, (1, c)), reshape_to(var, (1, c)), axis=0)
    gathered = op(f"{DOMAIN}.AllGather", stats, ranks=ranks)           # (W, 2, C)
    average = op("ReduceMean", gathered, axes=[0], keepdims=0)          # (2, C)
    spread = op("Sub", gathered, average)
    spread = op("ReduceMean", op("Mul", spread, spread), axes=[0], keepdims=0)
    return _row(average, 0), op("Add", _row(average, 1), _row(spread, 0))


def _rank_local(value, ranks):
    """`value` as this rank computes it from its own rows, on purpose (a data-parallel
    graph's statistics before they are combined, or with local_statistics). `ranks`:
    the world size of a data-parallel step, None outside one."""
    return op(f"{DOMAIN}.RankLocal", value) if ranks is not None else value


def _expand(inputs, attrs, num_outputs):
    x, gamma, beta = inputs
    axes, bshape, _ = _layout(x, attrs["axis"])
    ranks = attrs.get("ranks")
    mean = _rank_local(op("ReduceMean", x, axes=axes, keepdims=1), ranks)
    centered = op("Sub", x, mean)
    var = _rank_local(op("ReduceMean", op("Mul", centered, centered), axes=axes, keepdims=1),
                      ranks)
    c = x.shape[attrs["axis"]]
    mean, var = reshape_to(mean, (c,)), reshape_to(var, (c,))
    if ranks is not None and not attrs.get("local_statistics", 0):
        mean, var = _whole_batch_statistics(mean, var, ranks)
        centered = op("Sub", x, reshape_to(mean, bshape))
    if attrs["axis"] == 1:
        y = op("BatchNormalization", x, gamma, beta, mean, var, epsilon=float(attrs["epsilon"]))
    else:
        a = op("Mul", gamma, batch_norm_coefficients.inv_std_of(var, attrs["epsilon"]))
        y = op("Add", _scale(centered, a, bshape), reshape_to(beta, bshape))
    return [y, mean, var]


def _grad(n, g, need):
    if g[1] is not None or g[2] is not None:
        raise NotImplementedError("gradient through the batch statistics of a batch norm")
    x, gamma, _beta = n.inputs
    _, mean, var = n.outputs
    axes, bshape, count = _layout(x, n.attrs["axis"])
    dy = g[0]
    ranks = n.attrs.get("ranks")
    # a data-parallel graph is traced at the whole batch and split W ways
    # (graph/split_batch.py): each rank holds count / W elements per channel; a dynamic x
    # (a mirrored batch smaller than its placeholder) counts its run's (-1 / n: the minus
    # signs of b and c ride on the constant, not two Neg kernels)
    if x.is_dynamic:
        minus_inv_n = op("Div", as_blob(-float(ranks or 1), like=dy),
                         run_time_count(x, axes, dy))
    else:
        minus_inv_n = -(ranks or 1) / count
    # (with a static count, computed for every layer together: graph/batch_norm_coefficients.py)
    inv_std, a, k_c, k_b = batch_norm_coefficients.per_channel(
        gamma, var, n.attrs["epsilon"], minus_inv_n)
    reduce_axes = int64_constant(dy, axes)
    centered = op("Sub", x, reshape_to(mean, bshape))
    d_beta = op("ReduceSum", dy, reduce_axes, keepdims=0)
    d_gamma = op("Mul", op("ReduceSum", op("Mul", dy, centered), reduce_axes, keepdims=0),
                 inv_std)
    dx = None
    if need[0]:
        sum_dy, sum_dy_centered = d_beta, d_gamma
        if ranks is not None and n.attrs.get("local_statistics", 0):    # this rank's own sums
            sum_dy, sum_dy_centered = _rank_local(d_beta, ranks), _rank_local(d_gamma, ranks)
        elif ranks is not None:     # the whole batch's sums / W (see the docstring)
            c = d_beta.shape[0]
            sums = op(f"{DOMAIN}.AllReduceMean", op(
                "Concat", reshape_to(d_beta, (1, c)), reshape_to(d_gamma, (1, c)), axis=0))
            sum_dy, sum_dy_centered = _row(sums, 0), _row(sums, 1)
        b = op("Mul", k_b, sum_dy_centered)
        c = op("Mul", k_c, sum_dy)
        if n.attrs["axis"] == 1:
            # a * dy + c and b * (x - mean) as inference BatchNormalizations: one pass
            # over dy and one over x, and under mixed precision both follow their half
            # data (passes/auto_mixed_precision.py rule 3)
            dx = op("Add", channel_affine(dy, a, c), channel_affine(x, b, center=mean))
        else:
            spread = _scale(centered, b, bshape)
            dx = op("Add", op("Add", _scale(dy, a, bshape), spread), reshape_to(c, bshape))
    return [dx, d_gamma if need[1] else None, d_beta if need[2] else None]


register_composite("onnxjob.BatchNormTrain", _expand, _grad)
