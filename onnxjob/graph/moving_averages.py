"""Batch normalization's moving averages, updated together once the forward is traced.

Each training batch norm updates its moving mean and variance: running * momentum +
statistic * (1 - momentum) (times n / (n - 1) for the variance), three small kernels per
tensor, six per layer (ResNet50: 318 of a step's kernels, each moving a few hundred
values). `update` records each one (and sets the per-layer value, so a trace that never
reaches `flush` still updates them); `flush`, after the job's body is traced
(graph/compiler.py), computes those sharing a momentum and dtype as one concatenation and
splits it back: the same float32 operations on the same values, one Mul/Mul/Add for all
layers. The per-layer nodes it replaces are left unread (the passes remove them).
"""
import numpy as np

from onnxjob.graph.primitives.shape_ops import (
    concat_flat, concat_flat_constant, split_flat, width_class)
from onnxjob.graph.tracer import as_blob


def update(builder, running, statistic, momentum, unbias=1.0):
    """Set `running`'s next value (a variable Blob) to running * momentum + statistic *
    (1 - momentum) * unbias, and record it for `flush`."""
    if running.name in builder.assigned_at:
        builder.refuse_second_writer(running.name, "a batch normalization's moving average",
                                     builder.assigned_at[running.name])
    coefficient = (1.0 - momentum) * unbias
    new = running * as_blob(momentum, like=statistic) + \
        statistic * as_blob(coefficient, like=statistic)
    builder.state_updates[running.name] = new
    builder.moving_averages[running.name] = (running, statistic, momentum, coefficient, new)


def flush(builder):
    """Replace the recorded updates that share a momentum and dtypes by one update of their
    concatenation (two or more; an update overwritten since is left alone)."""
    pending, builder.moving_averages = builder.moving_averages, {}
    groups = {}
    for name, (running, statistic, momentum, coefficient, new) in pending.items():
        if builder.state_updates.get(name) is not new or not running.shape:
            continue
        key = (float(momentum), width_class(running), np.dtype(running.np_dtype).str,
               np.dtype(statistic.np_dtype).str)
        groups.setdefault(key, []).append((running, statistic, coefficient))
    for (momentum, *_), members in groups.items():
        if len(members) > 1:
            _update_together(builder, momentum, members)


def _update_together(builder, momentum, members):
    shapes = [tuple(running.shape) for running, _, _ in members]
    old = concat_flat([running for running, _, _ in members])
    stats = concat_flat([statistic for _, statistic, _ in members])
    coefficients = concat_flat_constant([c for _, _, c in members], shapes, stats)
    new = old * as_blob(momentum, like=stats) + stats * coefficients
    for (running, _, _), part in zip(members, split_flat(new, shapes)):
        builder.state_updates[running.name] = part
