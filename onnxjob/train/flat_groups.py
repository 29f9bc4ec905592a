"""The updates of many small variables as one update of their concatenation.

An elementwise update (SGD, momentum, Adam, RMSProp) of a variable of a few hundred values
is a handful of kernels that each move almost nothing; a GPU spends a few microseconds on
each whatever its size. ResNet50 has 107 such variables (each batch norm's gamma and beta,
the classifier's bias): ~1000 of its step's kernels. Here the small variables of one
optimizer that share a weight decay rate, a dtype and a pending gradient factor are
flattened and concatenated with their gradients and optimizer slots, updated once by the
optimizer's own rule, and split back: the same elementwise operations on the same values,
so every new value is bit for bit the one a per-variable update gives (as fused optimizers'
multi-tensor kernels do). A dynamic loss scale's skip of a non-finite step selects over the
concatenation too.
"""
import numpy as np

from onnxjob.graph.primitives.shape_ops import concat_flat, split_flat, width_class

# a variable of at most this many elements is small (256 KiB of float32: about the bytes a
# GPU moves in a kernel's launch time)
SMALL_ELEMENTS = 1 << 16


def is_small(blob):
    """Whether `blob` (static shape) holds at most SMALL_ELEMENTS values (not a scalar)."""
    return bool(blob.shape) and int(np.prod(blob.shape)) <= SMALL_ELEMENTS


class FlatGroup:
    """Small variables updated as one: `name` stands for the concatenation of `members`
    ({variable name: blob}) in the optimizer's rule; `state(suffix, ...)` makes each
    member's slot and returns their concatenation."""

    def __init__(self, name, members, make_state):
        self.name, self.members, self._make_state = name, members, make_state
        self.old = {}           # key in the rule's result -> the flat value it replaces
        self.slot_names = {}    # key -> [each member's slot name]
        self.shapes = [tuple(b.shape) for b in members.values()]
        self.old[name] = concat_flat(list(members.values()))
        self.slot_names[name] = list(members)

    def state(self, suffix, init, shape):
        """(key, flat value) of the members' `<member>-<suffix>` slots."""
        if shape is not None:   # (only LAMB's (1,) slots: LAMB is not elementwise)
            raise AssertionError(f"internal: slot {suffix!r} of shape {shape} in a flat group")
        made = [self._make_state(n, suffix, w, init) for n, w in self.members.items()]
        key = f"{self.name}-{suffix}"
        self.old[key] = concat_flat([blob for _, blob in made])
        self.slot_names[key] = [n for n, _ in made]
        return key, self.old[key]

    def split(self, key, flat):
        """{each member's variable or slot name: its part of `flat`}."""
        return dict(zip(self.slot_names[key], split_flat(flat, self.shapes)))


def small_groups(optimizer, ctx, grads):
    """[[names]] of `grads`' variables (`grads` {name: (gradient, factor)}) that
    `optimizer` can update as one: small, dense, of one dtype, weight decay rate and
    gradient factor; groups of two or more."""
    if not optimizer._elementwise_update:
        return []
    groups = {}
    for name, (g, factor) in grads.items():
        w = ctx.builder.variables[name]
        if not is_small(w) or name in ctx.sparse_names or \
                not np.issubdtype(w.np_dtype, np.floating):
            continue
        key = (np.dtype(w.np_dtype).str, width_class(w), optimizer._weight_decay_rate(name),
               id(factor), name in ctx.deferred)
        groups.setdefault(key, []).append(name)
    return [names for names in groups.values() if len(names) > 1]
