"""Batch normalization's backward coefficients, computed for every layer together once the
backward is traced.

A train batch norm's backward (graph/primitives/batch_norm.py) scales its sums by four
per-channel vectors that depend on the forward alone: inv_std = 1 / sqrt(var + eps),
a = gamma * inv_std, k_c = a * (-1 / n) and k_b = k_c * inv_std (n the elements per
channel). Made per layer they are six kernels of a few hundred values each, whose time on a
GPU is their launch (graph/traffic.py: ResNet50 has 53 batch norms). `per_channel` emits
them per layer, so that a trace that never reaches `flush` (the eager tape) has them, and
records them; `flush`, after the backward is traced (graph/compiler.py), computes those of
one dtype and width class as one concatenation (the same float32 operations on the same
values), splits it back, and hands each layer's readers their piece. The per-layer nodes are
left unread (the passes remove them). The concatenation is placed before the first reader
of any piece: the backward starts after the whole forward, so every statistic it reads
is made by then.
"""
import numpy as np

from onnxjob.graph.primitives.shape_ops import (
    concat_flat, concat_flat_constant, split_flat, width_class)
from onnxjob.graph.tracer import Blob, as_blob, op

# the metadata property marking the pieces that are a batch norm's 1 / sqrt(var + eps)
# (passes/batch_norm_row_statistics.py matches the backward's d_gamma by it)
ROLE = "onnxjob.batch_norm_coefficient"
INV_STD = "inv_std"


def per_channel(gamma, var, epsilon, minus_inv_n):
    """(inv_std, a, k_c, k_b) of one batch norm (see the module docstring), recorded for
    `flush` on the builder of `var` when `minus_inv_n` is a number (a Blob, counted at run
    time, keeps the layer's own)."""
    coefficients = _coefficients(gamma, var, epsilon, minus_inv_n)
    pending = var.builder.batch_norm_coefficients
    if pending is not None and not isinstance(minus_inv_n, Blob) and var.shape and \
            gamma.shape == var.shape and gamma.np_dtype == var.np_dtype:
        pending.append((gamma, var, float(epsilon), float(minus_inv_n), coefficients))
    return coefficients


def inv_std_of(var, epsilon):
    """1 / sqrt(var + epsilon) (`epsilon` a number or a Blob)."""
    return op("Reciprocal", op("Sqrt", op("Add", var, as_blob(epsilon, like=var))))


def _coefficients(gamma, var, epsilon, minus_inv_n):
    """(inv_std, a, k_c, k_b) from per-channel `gamma` and `var` (one layer's or the
    concatenation of several) and `epsilon` and `minus_inv_n` (numbers or Blobs)."""
    inv_std = inv_std_of(var, epsilon)
    a = op("Mul", gamma, inv_std)
    k_c = op("Mul", a, as_blob(minus_inv_n, like=var))
    return inv_std, a, k_c, op("Mul", k_c, inv_std)


def flush(builder):
    """Replace the recorded coefficients that share a dtype and width class by one
    computation of their concatenation (two layers or more)."""
    pending, builder.batch_norm_coefficients = builder.batch_norm_coefficients, []
    groups = {}
    for member in pending or ():
        var = member[1]
        groups.setdefault((np.dtype(var.np_dtype).str, width_class(var)), []).append(member)
    for members in groups.values():
        if len(members) > 1:
            _together(builder, members)


def _together(builder, members):
    graph = builder.graph
    first_new = len(graph)
    shapes = [tuple(var.shape) for _, var, _, _, _ in members]
    with builder.origin("backward", "onnxjob.BatchNormTrain"):
        variance = concat_flat([var for _, var, _, _, _ in members])
        gamma = concat_flat([g for g, _, _, _, _ in members])
        epsilon = concat_flat_constant([m[2] for m in members], shapes, variance)
        minus_inv_n = concat_flat_constant([m[3] for m in members], shapes, variance)
        pieces = [split_flat(whole, shapes)
                  for whole in _coefficients(gamma, variance, epsilon, minus_inv_n)]
    for piece in pieces[0]:
        piece.value.producer().metadata_props[ROLE] = INV_STD
    for i, (_, _, _, _, per_layer) in enumerate(members):
        for kind, old in enumerate(per_layer):
            old.value.replace_all_uses_with(pieces[kind][i].value)
    _move_before_first_reader(graph, list(graph)[first_new:])


def _move_before_first_reader(graph, new_nodes):
    """Move `new_nodes` (appended last) to just before the first node that reads one of
    their outputs and is not one of them."""
    new = set(map(id, new_nodes))
    readers = {id(use.node) for node in new_nodes for out in node.outputs
               for use in out.uses() if id(use.node) not in new}
    first = next((node for node in graph if id(node) in readers), None)
    if first is None:
        return
    graph.remove(new_nodes)
    graph.insert_before(first, new_nodes)
