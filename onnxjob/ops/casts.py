"""Casts and identities: flow.cast, identity, identity_n, amp_white_identity,
parallel_cast, cast_to_current_logical_view, cast_to_static_shape.

OneFlow's placement and mixed-precision markers are identities on onnxjob's one device.
Rules of Cast and Identity: onnxjob/graph/primitives/elementwise.py.
"""
from onnxjob.graph.tracer import op
from onnxjob.ops._array_common import to_flow_dtype

__all__ = ["amp_white_identity", "cast", "cast_to_current_logical_view", "cast_to_static_shape",
           "identity", "identity_n", "parallel_cast"]


def cast(x, dtype, name=None):
    """`x` converted to `dtype` (returned as is when it already has it)."""
    flow_dtype = to_flow_dtype(dtype)
    if x.np_dtype == flow_dtype.np_dtype:
        return x
    return op("Cast", x, to=flow_dtype.ir_dtype.value, name=name)


def identity(x, name=None):
    """`x` unchanged (a tensor list stays the list it is: the graph's Identity of a
    sequence would be typed as a tensor)."""
    if getattr(x, "is_tensor_list", False):
        return x
    return op("Identity", x, name=name)


def identity_n(inputs, name=None):
    """Each of `inputs`, unchanged (a list)."""
    return [identity(x) for x in inputs]


def amp_white_identity(x, name=None):
    """A mixed-precision marker in OneFlow; the identity here."""
    return op("Identity", x, name=name)


def parallel_cast(input, name=None, distribute=None, gradient_distribute=None):
    """A placement hint in OneFlow (split/broadcast between devices); the identity on
    onnxjob's one device. With `gradient_distribute`, OneFlow's backward is a parallel_cast
    op of its own, which its IndexedSlicesOptimizerRewritePass does not step over: a table
    read through it is updated densely, so it is an Identity node here, as flow.identity
    (train/update_rules.lookup_indices stops at it)."""
    if gradient_distribute is not None:
        return op("Identity", input, name=name)
    return input


def cast_to_current_logical_view(x):
    """The identity: onnxjob has one logical view per job."""
    return x


def cast_to_static_shape(x, name=None):
    """`x` with a static shape: its (maximum) shape, the runtime shape must equal it."""
    if not x.is_dynamic:
        return x
    out = op("Identity", x, name=name)
    out.is_dynamic = False
    return out
