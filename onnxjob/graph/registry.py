"""The primitive table and the helpers its rules share.

The rules live in `onnxjob/graph/primitives/<family>.py` (see that package's
docstring); this module holds only the table, so the tracer can look rules up
without importing them.
"""
import numpy as np

from onnxjob.errors import TraceError

_TABLE = {}


class Primitive:
    __slots__ = ("op_type", "infer", "grad", "differentiable")

    def __init__(self, op_type, infer, grad, differentiable):
        self.op_type = op_type
        self.infer = infer
        self.grad = grad
        self.differentiable = differentiable


def register(op_type, infer, grad=None, differentiable=True):
    """Add a primitive. `differentiable=False`: its outputs never carry gradients."""
    _TABLE[op_type] = Primitive(op_type, infer, grad, differentiable)


def get_primitive(op_type):
    try:
        return _TABLE[op_type]
    except KeyError:
        raise TraceError(f"onnxjob has no primitive {op_type!r}") from None


def registered_ops():
    return dict(_TABLE)


# -- helpers shared by the rule modules ----------------------------------------------

def const_value(blob):
    """The NumPy value of a Blob that is a traced constant (ValueError otherwise)."""
    tensor = blob.value.const_value
    if tensor is None:
        raise ValueError(f"{blob.name} must be a constant known while tracing")
    return tensor.numpy()


def same_as_input(index=0):
    def infer(inputs, attrs, num_outputs):
        return [(inputs[index].shape, inputs[index].np_dtype)]
    return infer


def broadcast_shape(*shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError("shapes " + " and ".join(map(str, shapes)) + " do not broadcast") from None


def normalize_axis(axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0

