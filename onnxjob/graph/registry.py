"""The primitive table and the helpers its rules share.

The rules live in `onnxjob/graph/primitives/<family>.py` (see that package's
docstring); this module holds only the table, so the tracer can look rules up
without importing them.
"""
import numpy as np

from onnxjob.errors import TraceError

_TABLE = {}


class Primitive:
    """One table entry: an ONNX op (or a composite) with its shape and gradient rules.

    * `lower(inputs, attrs, num_outputs) -> [Blob] or None`: for inputs onnxruntime has
      no kernel for (OneHot with int32 indices, Mod on floats, ...) it emits another
      formulation and returns its outputs; None means "emit the op as it is".
    * `expand(inputs, attrs, num_outputs) -> [Blob]`: set for composites, ops that are
      not ONNX ops but a group of them (OneFlow's softmax cross entropy, ...). The group
      is one node for autodiff, so the composite's own `grad` rule is used, not the
      gradients of its parts.
    """

    __slots__ = ("op_type", "infer", "grad", "differentiable", "lower", "expand", "domain",
                 "node_type")

    def __init__(self, op_type, infer, grad, differentiable, lower=None, expand=None,
                 domain=""):
        self.op_type = op_type
        # a node outside the ONNX domain is named without the domain's prefix
        self.domain = domain
        self.node_type = op_type[len(domain) + 1:] if domain else op_type
        self.infer = infer
        self.grad = grad
        self.differentiable = differentiable
        self.lower = lower
        self.expand = expand


def register(op_type, infer, grad=None, differentiable=True, lower=None, domain=""):
    """Add a primitive. `differentiable=False`: its outputs never carry gradients.
    `domain`: the node's ONNX domain when it is not an ONNX op; `op_type` is then
    "<domain>.<node type>" (see primitives/collectives.py)."""
    _TABLE[op_type] = Primitive(op_type, infer, grad, differentiable, lower=lower,
                                domain=domain)


def register_composite(name, expand, grad=None, differentiable=True):
    """Add a composite: `expand` emits its ONNX nodes, `grad` is its gradient rule.

    Composite names are not ONNX op types; by convention they start with "onnxjob.".
    """
    _TABLE[name] = Primitive(name, None, grad, differentiable, expand=expand)


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

