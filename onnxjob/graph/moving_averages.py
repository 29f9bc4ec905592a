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

from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import as_blob, int64_constant, op


def update(builder, running, statistic, momentum, unbias=1.0):
    """Set `running`'s next value (a variable Blob) to running * momentum + statistic *
    (1 - momentum) * unbias, and record it for `flush`."""
    coefficient = (1.0 - momentum) * unbias
    new = running * as_blob(momentum, like=statistic) + \
        statistic * as_blob(coefficient, like=statistic)
    builder.state_updates[running.name] = new
    pending = builder.__dict__.setdefault("_moving_averages", {})
    pending[running.name] = (running, statistic, momentum, coefficient, new)


def flush(builder):
    """Replace the recorded updates that share a momentum and dtypes by one update of their
    concatenation (two or more; an update overwritten since is left alone)."""
    pending = builder.__dict__.pop("_moving_averages", {})
    groups = {}
    for name, (running, statistic, momentum, coefficient, new) in pending.items():
        if builder.state_updates.get(name) is not new or not running.shape:
            continue
        key = (float(momentum), np.dtype(running.np_dtype).str,
               np.dtype(statistic.np_dtype).str)
        groups.setdefault(key, []).append((running, statistic, coefficient))
    for (momentum, _, _), members in groups.items():
        if len(members) > 1:
            _update_together(builder, momentum, members)


def _update_together(builder, momentum, members):
    sizes = [int(np.prod(running.shape)) for running, _, _ in members]
    old = op("Concat", *(reshape_to(r, [-1]) for r, _, _ in members), axis=0)
    stats = op("Concat", *(reshape_to(s, [-1]) for _, s, _ in members), axis=0)
    dtype = stats.np_dtype
    coefficients = np.concatenate([np.full(n, np.asarray(c, dtype=dtype)) for n, (_, _, c)
                                   in zip(sizes, members)])
    new = old * as_blob(momentum, like=stats) + stats * as_blob(coefficients, like=stats)
    parts = op("Split", new, int64_constant(new, sizes), axis=0, num_outputs=len(sizes))
    for (running, _, _), part in zip(members, parts):
        builder.state_updates[running.name] = reshape_to(part, list(running.shape))
