"""Lowering an exported model to an older ONNX opset.

onnx's version converter has no downward adapter for many ops whose newer versions only
widened the accepted types (Div 14 -> 13, Identity 16 -> 14, Equal 13 -> 11, Pow 15 ->
13, ...) or added an attribute the graph leaves at its default (Reshape's `allowzero`,
GatherND's `batch_dims`, MaxPool's `ceil_mode`, ...), so it refuses whole graphs that
OneFlow's own exporter wrote in the opset asked for (`flow.onnx.export(..., opset=10)`,
which TensorRT 7 programs ask for), and relabels Softmax 13 as Softmax 11 over the same
axis, which in 11 normalizes over every axis from it on. `lower(proto, opset)` rewrites each node of the default
domain for the op version in force at `opset`:

- a node whose op has the same version there is kept;
- a node whose old version has the same inputs and outputs (by name, within the old
  version's counts) and every attribute the node sets (or the node leaves it at the new
  version's default, which is then dropped) is kept as it is: the versions differ only
  in types, which the final check verifies;
- ops whose meaning or interface changed are rewritten: Softmax / LogSoftmax / Hardmax
  below 13 (which flatten from `axis` on: a transpose brings the axis last), ReduceSum,
  Squeeze and Unsqueeze below 13 (`axes` an input -> an attribute) and Split (`split`),
  Clip below 11 (`min` / `max` inputs -> attributes) and Pad below 11 (`pads` and the
  constant value), the moved inputs constants; Gemm below 11 gets a zero C (optional
  only since 11), Round below 11 (opset 11) is computed from Floor, and LessOrEqual /
  GreaterOrEqual below 12 from Greater / Less (false where an operand is NaN);
- below 11, negative `axis` / `axes` attributes (counted from the back only since 11) are
  written as the non-negative axes they stand for.

Anything else raises LoweringError naming the op and why. The result must pass
onnx.checker with full shape inference at the new opset (which verifies the types).
"""
import numpy as np
import onnx
from onnx import defs, helper, numpy_helper

from onnxjob.io.model_file import check_in_memory

DEFAULT_DOMAINS = ("", "ai.onnx")
# inputs a later version renamed without changing their meaning: (op, new name) -> old
_RENAMED_INPUTS = {("BatchNormalization", "input_mean"): "mean",
                   ("BatchNormalization", "input_var"): "var"}
# attributes without a schema default whose value here changes nothing
_NEUTRAL_ATTRIBUTES = {"dilations": lambda v: all(d == 1 for d in v)}


class LoweringError(Exception):
    """The model cannot be written in the opset asked for; the message says which op."""


def default_opset(proto):
    return next(o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS)


def lower(proto, opset):
    """A copy of `proto` in ONNX opset `opset` (< the model's), or LoweringError."""
    current = default_opset(proto)
    if opset >= current:
        raise LoweringError(f"opset {opset} is not below the model's {current}")
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    graph = model.graph
    context = _Context(model, current, opset)
    nodes = []
    for node in graph.node:
        nodes.extend(context.lowered(node))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(context.new_initializers)
    for entry in model.opset_import:
        if entry.domain in DEFAULT_DOMAINS:
            entry.version = opset
    try:
        check_in_memory(model)
    except Exception as e:   # onnx's checker raises ValidationError / InferenceError
        raise LoweringError(str(e).strip().splitlines()[-1]) from e
    return model


class _Context:
    def __init__(self, model, current, target):
        self.current, self.target = current, target
        self.constants = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS:
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.constants[node.output[0]] = value
        self.ranks, self.elem_types = _ranks_and_types(model)
        self.new_initializers = []
        self.count = 0

    def lowered(self, node):
        if node.domain not in DEFAULT_DOMAINS:
            return [node]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute):
            raise LoweringError(f"{node.op_type}: nodes with subgraphs are not lowered")
        new = defs.get_schema(node.op_type, self.current, "")
        rewrite = _REWRITES.get(node.op_type)
        if rewrite is not None and rewrite[0](self.target):
            lowered = rewrite[1](self, node)
        else:
            try:
                old = defs.get_schema(node.op_type, self.target, "")
            except Exception:  # onnx raises SchemaError when the op is newer than the opset
                raise LoweringError(f"{node.op_type} does not exist in opset "
                                    f"{self.target}") from None
            if old.since_version != new.since_version:
                _drop_default_attributes(node, old, new)
                _check_interface(node, old, new)
            lowered = [node]
        if self.target < 11:
            for n in lowered:
                self.positive_axes(n)
        return lowered

    # -- helpers for rewrites -----------------------------------------------------------
    def constant(self, node, index, what):
        """The constant array at input `index` of `node`, or None when absent."""
        if index >= len(node.input) or not node.input[index]:
            return None
        tensor = self.constants.get(node.input[index])
        if tensor is None:
            raise LoweringError(f"{node.op_type}: its {what} must be a constant to be written "
                                f"as an attribute in opset {self.target}")
        return numpy_helper.to_array(tensor)

    def scalar(self, value, dtype):
        """The name of a new 0-d initializer holding `value`."""
        name = self.name(f"constant_{value}")
        self.new_initializers.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def elem_type(self, name, op_type):
        elem = self.elem_types.get(name)
        if elem is None:
            raise LoweringError(f"{op_type}: the type of {name!r} is unknown")
        return elem

    def rank(self, name, op_type):
        rank = self.ranks.get(name)
        if rank is None:
            raise LoweringError(f"{op_type}: the rank of {name!r} is unknown")
        return rank

    def name(self, base):
        self.count += 1
        return f"{base}/lowered_{self.count}"

    def positive_axes(self, node):
        """Negative `axis` / `axes` attributes as the axes they stand for (opsets < 11)."""
        for attribute in node.attribute:
            if attribute.name == "axis" and attribute.i < 0:
                attribute.i += self._axis_rank(node)
            elif attribute.name == "axes" and any(a < 0 for a in attribute.ints):
                rank = self._axis_rank(node)
                attribute.ints[:] = [a + rank if a < 0 else a for a in attribute.ints]

    def _axis_rank(self, node):
        if node.op_type == "Unsqueeze":      # axes of the output
            axes = next(a.ints for a in node.attribute if a.name == "axes")
            return self.rank(node.input[0], node.op_type) + len(axes)
        if node.op_type == "OneHot":         # a new axis of the output
            return self.rank(node.input[0], node.op_type) + 1
        return self.rank(node.input[0], node.op_type)


def _ranks_and_types(model):
    """{value name: rank}, {value name: element type} by shape inference on a copy without the weights' payloads
    (which may be past protobuf's limit)."""
    light = _copy_without_weights(model)
    inferred = onnx.shape_inference.infer_shapes(light)
    ranks, types = {}, {}
    graph = inferred.graph
    for info in list(graph.input) + list(graph.value_info) + list(graph.output):
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            ranks[info.name] = len(tensor_type.shape.dim)
        if tensor_type.elem_type:
            types[info.name] = tensor_type.elem_type
    return ranks, types


def _copy_without_weights(model):
    """`model` with its initializers as graph inputs of the same type and shape."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    graph.output.extend(model.graph.output)
    for tensor in model.graph.initializer:
        graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                         list(tensor.dims)))
    return light


def _drop_default_attributes(node, old, new):
    """Remove the attributes the old version lacks where the node leaves them at their
    default; LoweringError for one it sets otherwise."""
    keep = []
    for attribute in node.attribute:
        if attribute.name in old.attributes:
            keep.append(attribute)
            continue
        value = helper.get_attribute_value(attribute)
        schema_attribute = new.attributes.get(attribute.name)
        default = schema_attribute.default_value if schema_attribute is not None else None
        neutral = _NEUTRAL_ATTRIBUTES.get(attribute.name)
        if default is not None and default.name and helper.get_attribute_value(default) == value:
            continue
        if neutral is not None and neutral(value):
            continue
        raise LoweringError(f"{node.op_type}: attribute {attribute.name}={value!r} does not "
                            f"exist in its version {old.since_version}")
    del node.attribute[:]
    node.attribute.extend(keep)


def _check_interface(node, old, new):
    """LoweringError unless the node's inputs and outputs mean the same in `old`: their
    count fits, and each one used has the same formal name in both versions."""
    for kind, used, old_formal, new_formal, low, high in (
            ("inputs", node.input, old.inputs, new.inputs, old.min_input, old.max_input),
            ("outputs", node.output, old.outputs, new.outputs, old.min_output,
             old.max_output)):
        count = len(used)
        while count and not used[count - 1]:
            count -= 1
        if not low <= count <= high:
            raise LoweringError(f"{node.op_type}: {count} {kind} do not fit its version "
                                f"{old.since_version} ({low} to {high})")
        for index in range(count):
            renamed = _formal_name(new_formal, index)
            renamed = _RENAMED_INPUTS.get((node.op_type, renamed), renamed) \
                if kind == "inputs" else renamed
            if used[index] and _formal_name(old_formal, index) != renamed:
                raise LoweringError(f"{node.op_type}: {kind} {index} changed meaning before "
                                    f"version {new.since_version}")


def _formal_name(formal, index):
    """The formal parameter at `index` (the last one when it is variadic)."""
    if index < len(formal):
        return formal[index].name
    last = formal[-1] if formal else None
    if last is not None and last.option == defs.OpSchema.FormalParameterOption.Variadic:
        return last.name
    return None


# -- rewrites ---------------------------------------------------------------------------

def _softmax_before_13(context, node):
    """Softmax-family below 13 flattens the input from `axis` on into one axis: with the
    axis last that is the same as 13's softmax over one axis; otherwise transpose it
    there and back."""
    rank = context.rank(node.input[0], node.op_type)
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    axis = axis + rank if axis < 0 else axis
    if axis == rank - 1:
        return [helper.make_node(node.op_type, list(node.input), list(node.output),
                                 name=node.name, axis=axis)]
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    moved, result = context.name(node.output[0]), context.name(node.output[0])
    return [helper.make_node("Transpose", [node.input[0]], [moved], perm=perm),
            helper.make_node(node.op_type, [moved], [result], name=node.name, axis=rank - 1),
            helper.make_node("Transpose", [result], list(node.output), perm=perm)]


def _axes_input_to_attribute(context, node):
    """ReduceSum, Squeeze, Unsqueeze: `axes` from the second input to an attribute."""
    axes = context.constant(node, 1, "axes")
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    noop = attributes.pop("noop_with_empty_axes", 0)
    if axes is not None and axes.size == 0 and noop:
        return [helper.make_node("Identity", [node.input[0]], list(node.output),
                                 name=node.name)]
    if axes is not None and axes.size:
        attributes["axes"] = [int(a) for a in axes.reshape(-1)]
    return [helper.make_node(node.op_type, [node.input[0]], list(node.output),
                             name=node.name, **attributes)]


def _split_input_to_attribute(context, node):
    sizes = context.constant(node, 1, "split sizes")
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if sizes is not None:
        attributes["split"] = [int(s) for s in sizes.reshape(-1)]
    return [helper.make_node("Split", [node.input[0]], list(node.output), name=node.name,
                             **attributes)]


def _clip_inputs_to_attributes(context, node):
    attributes = {}
    for index, name in ((1, "min"), (2, "max")):
        bound = context.constant(node, index, name)
        if bound is not None:
            attributes[name] = float(bound.reshape(-1)[0])
    return [helper.make_node("Clip", [node.input[0]], list(node.output), name=node.name,
                             **attributes)]


def _pad_inputs_to_attributes(context, node):
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    pads = context.constant(node, 1, "pads")
    value = context.constant(node, 2, "constant value")
    if len(node.input) > 3 and node.input[3]:
        raise LoweringError("Pad: its axes input does not exist before opset 18")
    attributes["pads"] = [int(p) for p in pads.reshape(-1)]
    if value is not None:
        attributes["value"] = float(value.reshape(-1)[0])
    return [helper.make_node("Pad", [node.input[0]], list(node.output), name=node.name,
                             **attributes)]


def _round_before_11(context, node):
    """Round (half to even; opset 11) from Floor: r = floor(x + 0.5), less one where x
    was a tie (x + 0.5 == r) and r is odd; |x| >= 2^23 (2^52 in double) is whole already
    and kept, as is NaN."""
    x, out = node.input[0], node.output[0]
    elem = context.elem_type(x, node.op_type)
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    c = {v: context.scalar(v, dtype) for v in (0.5, 1.0, 2.0, 0.0)}
    big = context.scalar(2.0 ** (52 if dtype == np.float64 else 23), dtype)
    n = context.name
    shifted, r, frac, half_r, even, odd = (n(out) for _ in range(6))
    not_tie, odd_tie, correction, rounded, magnitude, whole = (n(out) for _ in range(6))
    return [
        helper.make_node("Add", [x, c[0.5]], [shifted]),
        helper.make_node("Floor", [shifted], [r]),
        helper.make_node("Sub", [shifted, r], [frac]),
        helper.make_node("Greater", [frac, c[0.0]], [not_tie]),
        helper.make_node("Div", [r, c[2.0]], [half_r]),
        helper.make_node("Floor", [half_r], [even]),
        helper.make_node("Mul", [even, c[2.0]], [odd]),
        helper.make_node("Sub", [r, odd], [correction]),            # 1 where r is odd
        helper.make_node("Where", [not_tie, c[0.0], correction], [odd_tie]),
        helper.make_node("Sub", [r, odd_tie], [rounded]),
        helper.make_node("Abs", [x], [magnitude]),
        helper.make_node("Less", [magnitude, big], [whole]),
        helper.make_node("Where", [whole, rounded, x], [out], name=node.name),
    ]


def _or_equal_before_12(context, node):
    """LessOrEqual / GreaterOrEqual (opset 12) as not Greater / not Less, false where an
    operand is NaN (as the comparison is)."""
    a, b = node.input[0], node.input[1]
    strict = "Greater" if node.op_type == "LessOrEqual" else "Less"
    n = context.name
    out = node.output[0]
    opposite, holds = n(out), n(out)
    nodes = [helper.make_node(strict, [a, b], [opposite]),
             helper.make_node("Not", [opposite], [holds])]
    elem = context.elem_type(a, node.op_type)
    if elem not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                    onnx.TensorProto.FLOAT16):
        nodes[-1].output[0] = out
        return nodes
    nan_a, nan_b, either, number = n(out), n(out), n(out), n(out)
    return nodes + [helper.make_node("IsNaN", [a], [nan_a]),
                    helper.make_node("IsNaN", [b], [nan_b]),
                    helper.make_node("Or", [nan_a, nan_b], [either]),
                    helper.make_node("Not", [either], [number]),
                    helper.make_node("And", [holds, number], [out], name=node.name)]


def _gemm_with_c_before_11(context, node):
    """Gemm's C became optional in 11: before that, a zero that broadcasts."""
    if len(node.input) > 2 and node.input[2]:
        return [node]
    dtype = helper.tensor_dtype_to_np_dtype(context.elem_type(node.input[0], node.op_type))
    zero = context.scalar(0.0, dtype)
    del node.input[2:]
    node.input.append(zero)
    return [node]


# op -> (whether the rewrite applies to the target opset, rewrite)
_REWRITES = {
    "Softmax": (lambda t: t < 13, _softmax_before_13),
    "LogSoftmax": (lambda t: t < 13, _softmax_before_13),
    "Hardmax": (lambda t: t < 13, _softmax_before_13),
    "ReduceSum": (lambda t: t < 13, _axes_input_to_attribute),
    "Squeeze": (lambda t: t < 13, _axes_input_to_attribute),
    "Unsqueeze": (lambda t: t < 13, _axes_input_to_attribute),
    "Split": (lambda t: t < 13, _split_input_to_attribute),
    "Clip": (lambda t: t < 11, _clip_inputs_to_attributes),
    "Pad": (lambda t: t < 11, _pad_inputs_to_attributes),
    "Round": (lambda t: 9 <= t < 11, _round_before_11),
    "Gemm": (lambda t: t < 11, _gemm_with_c_before_11),
    "LessOrEqual": (lambda t: 9 <= t < 12, _or_equal_before_12),
    "GreaterOrEqual": (lambda t: 9 <= t < 12, _or_equal_before_12),
}
