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
                 "node_type", "data_dependent")

    def __init__(self, op_type, infer, grad, differentiable, lower=None, expand=None,
                 domain="", data_dependent=None):
        self.op_type = op_type
        # a node outside the ONNX domain is named without the domain's prefix
        self.domain = domain
        self.node_type = op_type[len(domain) + 1:] if domain else op_type
        self.infer = infer
        self.grad = grad
        self.differentiable = differentiable
        self.lower = lower
        self.expand = expand
        # data_dependent(inputs) -> bool: whether the outputs' run-time shape depends on
        # the input values (NonZero, a Slice to a computed end): they are then dynamic
        # Blobs whose static shape, from `infer`, is the largest they can have
        self.data_dependent = data_dependent


def register(op_type, infer, grad=None, differentiable=True, lower=None, domain="",
             data_dependent=None):
    """Add a primitive. `differentiable=False`: its outputs never carry gradients.
    `domain`: the node's ONNX domain when it is not an ONNX op; `op_type` is then
    "<domain>.<node type>" (see primitives/collectives.py). `data_dependent`: see
    Primitive."""
    _TABLE[op_type] = Primitive(op_type, infer, grad, differentiable, lower=lower,
                                domain=domain, data_dependent=data_dependent)


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


def static_value(blob):
    """The NumPy value of a shape-valued Blob while tracing: a constant's value, or, for a
    value computed from the shape of a dynamic Blob (Shape, then Gather, Slice, Concat,
    Min, Max, Add, Sub, Cast, Reshape, Squeeze or Unsqueeze of such values), its value at the
    static shapes, which are the maximum shapes of dynamic Blobs. Shape rules use it for
    the inputs that say how large an output is (ConstantOfShape's shape, TopK's k, ...):
    the output's static shape is then its maximum shape."""
    tensor = blob.value.const_value
    if tensor is not None:
        return tensor.numpy()
    node = blob.producer
    kind = node.op_type if node is not None and node.ir_node is not None else None
    if kind == "Shape":
        shape = np.asarray(node.inputs[0].shape, np.int64)
        return shape[node.attrs.get("start", 0):node.attrs.get("end", len(shape))]
    if kind in _STATIC_FOLDS:
        args = [None if x is None else static_value(x) for x in node.inputs]
        return np.asarray(_STATIC_FOLDS[kind](args, node.attrs))
    raise ValueError(f"{blob.name} must be a constant known while tracing (or computed "
                     "from the shape of a Blob)")


def _fold_slice(args, attrs):
    data, starts, ends = args[:3]
    axes = args[3] if len(args) > 3 and args[3] is not None else range(len(starts))
    steps = args[4] if len(args) > 4 and args[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        index[int(ax)] = slice(int(st), int(en), int(sp))
    return data[tuple(index)]


_STATIC_FOLDS = {
    "Gather": lambda a, at: np.take(a[0], a[1], axis=at.get("axis", 0)),
    "Slice": _fold_slice,
    "Concat": lambda a, at: np.concatenate(a, axis=at["axis"]),
    "Min": lambda a, at: np.minimum.reduce(a),
    "Max": lambda a, at: np.maximum.reduce(a),
    "Cast": lambda a, at: a[0],
    "Identity": lambda a, at: a[0],
    "Reshape": lambda a, at: a[0].reshape([int(d) for d in a[1]]),
    "Squeeze": lambda a, at: np.squeeze(a[0], axis=tuple(int(d) for d in a[1])),
    "Unsqueeze": lambda a, at: np.expand_dims(a[0], axis=tuple(int(d) for d in a[1])),
    # (a size from two Blobs' sizes: a dynamic conv's input gradient padded to x's size)
    "Add": lambda a, at: np.add(a[0], a[1]),
    "Sub": lambda a, at: np.subtract(a[0], a[1]),
}


def same_as_input(index=0):
    def infer(inputs, attrs, num_outputs):
        return [(inputs[index].shape, inputs[index].np_dtype)]
    return infer


def broadcast_shape(*shapes, bound=False):
    """NumPy's broadcast shape. `bound`: the shapes are largest shapes of dynamic Blobs,
    which may agree at run time where their static dims differ: such an axis gets the
    larger dim (onnxruntime checks the run-time shapes)."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        if bound:
            rank = max(len(s) for s in shapes)
            padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
            return tuple(max(dims) for dims in zip(*padded))
        raise ValueError("shapes " + " and ".join(map(str, shapes)) + " do not broadcast") from None


def any_dynamic(inputs):
    """Whether one of `inputs` (Blobs or None) is a dynamic Blob."""
    return any(x is not None and x.is_dynamic for x in inputs)


def normalize_axis(axis, rank):
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0

