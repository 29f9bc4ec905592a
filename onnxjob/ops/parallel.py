"""Parallel layout ops: `flow.advanced.distribute_*`, `flow.hierarchical_parallel_cast` and
the `flow.sbp` descriptors.

OneFlow splits a blob over the devices of the current placement (its parallel_num)
with these; onnxjob runs a job on one device, and gives the same numbers: distribute_split
cuts `x` into parallel_num parts as OneFlow's balanced splitter does (the first
size % n parts one row longer), distribute_concat / distribute_add join them again, and a
layout cast (hierarchical_parallel_cast) leaves the values as they are.
"""
import re

from onnxjob.errors import TraceError
from onnxjob.frontend import distribute, scope
from onnxjob.graph.tracer import current_builder
from onnxjob.ops.casts import identity
from onnxjob.ops.math import add_n
from onnxjob.ops.slicing import concat, split


class SbpParallel:
    """An SBP signature: how a consistent blob lies across devices ("S(axis)", "B", "P")."""

    def __init__(self, text):
        self.text = text

    def __eq__(self, other):
        return isinstance(other, SbpParallel) and other.text == self.text

    def __hash__(self):
        return hash(self.text)

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"oneflow.sbp.{self.text}"


def sbp_split(axis):
    """The signature splitting a blob at `axis` (flow.sbp.split)."""
    assert type(axis) is int
    return SbpParallel(f"S({axis})")


sbp_broadcast = SbpParallel("B")
sbp_partial_sum = SbpParallel("P")

_SBP_TEXT = re.compile(r"^(S\(\d+\)|B|P)$")


def _sbp_text(value, api):
    if value is None:
        return ""
    if isinstance(value, SbpParallel):
        return value.text
    if isinstance(value, distribute.SplitDistribute):
        return f"S({value.axis})"
    if isinstance(value, distribute.BroadcastDistribute):
        return "B"
    if isinstance(value, str) and _SBP_TEXT.match(value):
        return value
    raise TraceError(f"{api}: {value!r} is not an SBP signature (\"S(axis)\", \"B\", \"P\", "
                     "flow.sbp.* or flow.distribute.split/broadcast)")


def parallel_num():
    """How many devices the current placement spans, as OneFlow's
    `current_scope().device_parallel_desc_symbol.parallel_num` (scope.placed_device_count)."""
    return scope.placed_device_count(current_builder("flow.advanced.distribute_*"))


def hierarchical_parallel_cast(input, nd_sbp=None, grad_mode=None, grad_nd_sbp=None, name=None,
                               parallel_distribution=None, grad_parallel_distribution=None):
    """`input` laid out by the SBP signatures `nd_sbp` (one per level of the device
    hierarchy): the values are unchanged, and on one device so is the layout. OneFlow 0.4
    named `nd_sbp` and `grad_nd_sbp` `parallel_distribution` and
    `grad_parallel_distribution`."""
    api = "flow.hierarchical_parallel_cast"
    nd_sbp = nd_sbp if nd_sbp is not None else parallel_distribution
    grad_nd_sbp = grad_nd_sbp if grad_nd_sbp is not None else grad_parallel_distribution
    if not isinstance(nd_sbp, (list, tuple)):
        raise TraceError(f"{api}: nd_sbp must be a list of SBP signatures, got {nd_sbp!r}")
    for value in list(nd_sbp) + list(grad_nd_sbp or []):
        _sbp_text(value, api)
    if grad_mode not in (None, "identity", "manual", "restore"):
        raise TraceError(f"{api}: grad_mode must be \"identity\", \"manual\" or \"restore\", "
                         f"got {grad_mode!r}")
    return identity(input, name=name)


def balanced_parts(size, n):
    """`size` in `n` parts as OneFlow's BalancedSplitter cuts it: the first size % n one
    longer."""
    base, extra = divmod(size, n)
    return [base + 1 if i < extra else base for i in range(n)]


def distribute_split(x, axis=0, name=None):
    """`x` cut at `axis` into one part per device of the current placement (a tuple)."""
    n = parallel_num()
    if n == 1:
        return (identity(x, name=name),)
    if x.shape[axis] < n:
        raise TraceError(f"flow.advanced.distribute_split: axis {axis} of {x.shape} has fewer "
                         f"rows than the {n} devices")
    return tuple(split(x, balanced_parts(x.shape[axis], n), axis=axis, name=name))


def distribute_clone(x, name=None):
    """One copy of `x` per device of the current placement (a tuple)."""
    return tuple(identity(x, name=None if name is None else f"{name}_{i}")
                 for i in range(parallel_num()))


def _check_count(xs, api):
    if not isinstance(xs, (list, tuple)) or len(xs) != parallel_num():
        raise TraceError(f"{api} takes one blob per device of the current placement "
                         f"({parallel_num()}), got {xs!r}")


def distribute_concat(xs, axis=0, name=None):
    """The per-device parts `xs` joined at `axis` (the inverse of distribute_split)."""
    _check_count(xs, "flow.advanced.distribute_concat")
    return identity(xs[0], name=name) if len(xs) == 1 else concat(list(xs), axis=axis,
                                                                   name=name)


def distribute_add(xs, name=None):
    """The sum of the per-device blobs `xs`."""
    _check_count(xs, "flow.advanced.distribute_add")
    return identity(xs[0], name=name) if len(xs) == 1 else add_n(list(xs), name=name)


def distribute_map(xs, f, axis=0):
    """`f` applied to each device's part of `xs` (a blob or a list of blobs, split at
    `axis`), the results joined at `axis`: a blob, or a tuple if `f` returns several. As
    OneFlow's (_UnderSingleDevicePlacementScope), `f` runs under a placement of one device,
    the first of the current one ("@0:0": what it returns from inside its loop), so a batch
    norm in it normalizes the part it is given."""
    single_input = not isinstance(xs, (list, tuple))
    parts = [distribute_split(x, axis=axis) for x in ([xs] if single_input else xs)]
    tag = scope.current_scope().device_parallel_desc_symbol.device_tag
    results = []
    for args in zip(*parts):
        with scope.placement(tag, "@0:0"):
            results.append(f(*args))
    single_output = not isinstance(results[0], (list, tuple))
    results = [(r,) if single_output else tuple(r) for r in results]
    joined = tuple(distribute_concat(list(r), axis=axis) for r in zip(*results))
    return joined[0] if single_output else joined
