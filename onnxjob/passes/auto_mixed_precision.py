"""AutoMixedPrecision: float32 compute moved to float16 (or bfloat16) as OneFlow's AMP does.

Switched on per job by `function_config.enable_auto_mixed_precision(True)`; the half type
is `function_config.mixed_precision_data_type(flow.float16 | flow.bfloat16)` (float16 by
default, as OneFlow). It runs once, after the default pipeline, over the whole job graph:
forward, backward and optimizer update.

OneFlow's lists (oneflow/core/job_rewriter/auto_mixed_precision_lists.cpp) name its own
user ops; here they are mapped onto the ONNX ops onnxjob emits:

  1. ALLOW ops run in half (OneFlow's white list: matmul, batch_matmul, conv2d,
     conv_data_grad, conv_filter_grad, ...): Conv, ConvTranspose, MatMul, Gemm, Einsum.
     Their float32 inputs are cast to half. Those of the optimizer's update stay float32.
  2. FOLLOW ops run in half when their inputs do (OneFlow's clear list: relu, reshape,
     transpose, max_pool, cat, slice, gather, pad, where, dropout, ...; and the
     elementwise part of its gray list: add, sub, mul, div, add_n, tanh, gelu, avg_pool).
     A FOLLOW node is half when every float input computed by another node is half and
     at least one is; inputs that do not vote (constants, graph inputs such as variables
     and placeholders, ConstantOfShape fills, 0/1 masks cast from bool, and FOLLOW results
     of such values only, like a bias reshaped to (1, C, 1, 1)) are cast to half. So a
     bias add after a half Conv or MatMul stays half, with the bias cast once. As
     OneFlow's white set (ops between white ops, and clear ops next to them), a forward
     FOLLOW op that computes (not one of CLEAR's moves and masks) runs in half only where
     an ALLOW op of the forward follows it: the last layer's bias add, a loss's parts and
     a placeholder subtracted from the logits stay float32, as do their gradients. A data
     movement (Reshape, Transpose, Pad, Gather, ...) of a fed input (not a variable) that
     is already cast to half for another reader, whose results reach ALLOW ops only,
     moves the half copy: the images a first convolution reads, gathered again into the
     columns of its weight gradient (ResNet50's AMP step at batch 64: 1.2 GiB less,
     graph/traffic.py).
  3. An inference-mode BatchNormalization (the normalization step of onnxjob's batch
     norm, forward and backward: graph/primitives/batch_norm.py) follows its data input
     alone, as OneFlow's normalization does: with a float16 x it runs in float16 (cuDNN
     computes it in float32 inside) and its per-channel inputs are cast to half. A
     computed variance is first folded in float32 into y = x * a + b (a = scale /
     sqrt(var + eps), b = bias - mean * a, then mean 0 and variance 1 - 1e-5 with epsilon
     1e-5): a variance above float16's 65504 would be infinite, a and b stay in range; a
     computed mean alone is cast (|mean| <= max |x|). So the activations between two
     convolutions stay half (ResNet50's AMP step cast ~5 GB a step at batch 8 between
     float16 and float32 with the normalization in float32).
     A LayerNormalization whose Y nothing reads (per-row statistics: passes/
     batch_norm_row_statistics.py) follows its data input too: with a half x its scale
     and bias are cast to half and its Mean and InvStdDev stay float32, which
     onnxruntime accumulates in float32 (ONNX's stash_type).
     An Exp of a value that is never positive (a square times a negative constant, or
     minus a square: the Gaussian exp(-x^2 / 2) of GELU's derivative) follows its input
     too: its result lies in [0, 1], where half's relative precision holds.
  4. every other op stays float32: softmax, log-softmax and the losses, reductions
     (ReduceSum/ReduceMean: batch-norm statistics, bias gradients; scatters with
     reduction="add", which the CPU EP also cannot run in float16), Exp/Log/Pow/Sqrt,
     the optimizer's updates and any op not listed. A half input is cast back to float32.
     The max pool's backward (a scatter-add, OneFlow's max_pool_grad, which OneFlow runs in
     half) sums in float32 and hands its readers a half result, cast once, so the ReLU and
     batch norm backward before it stay half (ResNet50's stem at batch 64: 2.3 GiB a step
     less, graph/traffic.py).
     (OneFlow lets softmax follow too; keeping it float32 is the accuracy side of the
     same choice.)
  5. One Cast per value and target type, however many nodes read it: a weight read by
     the forward Conv and by the backward ConvTranspose is cast to half once per step.
  6. Graph inputs and outputs keep their declared types: variables stay float32 (master
     weights), a half result that is a graph output is cast back under its own name.

Gradients reach the optimizer through the explicit float32 Cast that the compiler adds
under AMP (graph/compiler.py), so optimizer state and updates stay float32 (rule 4 keeps
them there: Cast is type-changing, its output votes float32).

onnxruntime's CPU EP runs float16 graphs by inserting float32 casts around nodes that
have no half kernel; the CUDA EP runs them in half.
"""
import functools

import numpy as np
import onnx.defs
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from onnxjob.graph.traffic import origin
from ._util import NodeEmitter, const_array, const_array_through_cast

ALLOW = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum"})
FOLLOW = frozenset({
    # OneFlow's clear list (data movement, masks, comparisons)
    "Relu", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Slice",
    "Split", "Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND",
    "MaxPool", "MaxUnpool", "Pad", "Expand", "Tile", "Identity", "Where", "Dropout",
    "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Neg", "Abs", "Sign",
    "Trilu", "DepthToSpace", "SpaceToDepth",
    # the elementwise part of OneFlow's gray list
    "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Clip", "Tanh", "Erf", "LeakyRelu",
    "AveragePool",
})
# FOLLOW ops that only move or copy values (exact in any precision).
MOVES = frozenset({
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather",
    "GatherElements", "GatherND", "Pad", "Expand", "Tile", "Identity", "DepthToSpace",
    "SpaceToDepth"})
# FOLLOW ops of OneFlow's clear list (they only move, select or mask values), which follow
# a half input also after the forward's last ALLOW op; the computing ones (its gray list's
# add, mul, ...) run in half there only between ALLOW ops (rule 2).
CLEAR = MOVES | frozenset({"Relu", "MaxPool", "Concat", "Dropout"})
# Ops that follow their data input (input 0) alone; the others are per-channel (rule 3).
DATA_FOLLOW = frozenset({"BatchNormalization"})
BATCH_NORM_EPSILON = 1e-5   # cuDNN raises a smaller epsilon to this
HALF_MAX = 65504.0
# Ops that take any type and decide their outputs' types themselves.
_ANY = frozenset({"Cast", "Shape", "Size"})
# The values these ops make are constants or exact small integers: they do not vote.
_NON_VOTING_PRODUCERS = frozenset({"Constant", "ConstantOfShape"})

HALF_TYPES = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
MARKER = "onnxjob.mixed_precision"


def _dtype(value):
    """The element type of a tensor value; None for sequences (tensor lists stay as they
    are) and values of unknown type."""
    if value is None or not isinstance(value.type, ir.TensorType):
        return None
    return value.type.dtype


@functools.lru_cache(maxsize=None)
def _signature(op_type, opset):
    """From the op's ONNX schema at `opset`: (its formal inputs' type parameters, the
    parameters it computes in (those of its float outputs, else of its float inputs: a
    comparison), the ONNX type strings every one of those parameters allows); None for an
    op without a schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return None
    allowed = {t.type_param_str: frozenset(t.allowed_type_strs) for t in schema.type_constraints}
    floats = {p for p, types in allowed.items() if "tensor(float)" in types}
    params = ({o.type_str for o in schema.outputs} & floats) or \
        ({i.type_str for i in schema.inputs} & floats)
    common = frozenset.intersection(*(allowed[p] for p in params)) if params else frozenset()
    return tuple(i.type_str for i in schema.inputs), frozenset(params), common


def _t_inputs(node, opset):
    """Positions of the inputs of the type the node computes in (Where's X and Y, not its
    condition; Dropout's data, not its ratio)."""
    signature = _signature(node.op_type, opset)
    if signature is None:
        return []
    formal, params, _ = signature
    positions = []
    for i, value in enumerate(node.inputs):
        param = formal[min(i, len(formal) - 1)] if formal else None   # variadic: the last
        if value is not None and param in params:
            positions.append(i)
    return positions


def _may_vote(value):
    """Whether `value`'s precision decides a FOLLOW node's (rule 2)."""
    if value.is_graph_input() or value.is_initializer() or value.const_value is not None:
        return False
    producer = value.producer()
    if producer is None or producer.op_type in _NON_VOTING_PRODUCERS:
        return False
    if producer.op_type == "Cast" and _dtype(producer.inputs[0]) == ir.DataType.BOOL:
        return False
    return True


def _cast_node(value, dtype, name, source):
    """A Cast of `value` to `dtype` named `name` (its output too), with the metadata (the
    user's line, the origin) of the node `source`."""
    node = ir.node("Cast", [value], attributes={"to": dtype.value}, name=name,
                   metadata_props=dict(source.metadata_props))
    out = node.outputs[0]
    out.name, out.type, out.shape = name, ir.TensorType(dtype), value.shape
    return node


def fed_inputs(graph):
    """The graph inputs a train step is fed (placeholders, data sources): those nothing of
    the optimizer's update reads, in a graph that has an update (trained variables and
    the moving averages are read there). Empty for a graph without one: a predict job's
    weights cannot be told from its data."""
    read_by_update, trains = set(), False
    for node in graph:
        if origin(node)[0] == "update":
            trains = True
            read_by_update.update(id(v) for v in node.inputs if v is not None)
    return {v for v in graph.inputs if id(v) not in read_by_update} if trains else set()


def _forward_before_allow(graph):
    """The forward nodes from which an ALLOW op of the forward is reached through forward
    nodes: OneFlow's white set takes a gray op only upstream of a white one (and
    downstream: auto_mixed_precision.cpp FillWhiteSet), so what follows the forward's
    last matrix product or convolution (a classifier's bias add, a regression's y - t,
    the loss's parts) runs in float32."""
    before = set()
    for node in reversed(list(graph)):
        if origin(node)[0] != "forward":
            continue
        for out in node.outputs:
            if any(origin(use.node)[0] == "forward" and (
                    use.node.op_type in ALLOW or use.node in before) for use in out.uses()):
                before.add(node)
                break
    return before


def _reaches_allow_only(node):
    """Whether every reader of `node`'s results is an ALLOW op, directly or through data
    movements (MOVES, reading them as their data input)."""
    for out in node.outputs:
        if out.is_graph_output():
            return False
        for use in out.uses():
            reader = use.node
            if reader.op_type in ALLOW and reader.domain in ("", "ai.onnx"):
                continue
            if reader.op_type in MOVES and use.idx == 0 and _reaches_allow_only(reader):
                continue
            return False
    return True


def _constant_sign(value):
    """-1, 0 or 1 when `value` is a constant (or this pass's cast of one) whose elements
    all have that sign (0: all zero or of mixed signs), else None."""
    array = const_array_through_cast(value)
    if array is None:
        return None
    return -1 if np.all(array < 0) else 1 if np.all(array > 0) else 0


def _is_square(value):
    """Whether `value` is Mul(a, a): never negative."""
    node = value.producer() if value is not None else None
    return node is not None and node.op_type == "Mul" and len(node.inputs) == 2 and \
        node.inputs[0] is node.inputs[1]


def _never_positive(value):
    """Whether `value` is, by how it is made, <= 0 everywhere (rule 3's Exp): Neg of a
    square, or a square times a negative constant."""
    node = value.producer() if value is not None else None
    if node is None or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Neg":
        return _is_square(node.inputs[0])
    if node.op_type == "Mul" and len(node.inputs) == 2:
        a, b = node.inputs
        return (_is_square(a) and _constant_sign(b) == -1) or \
            (_is_square(b) and _constant_sign(a) == -1)
    return False


class AutoMixedPrecision(InPlacePass):
    """Rewrite a float32 job graph to compute in `half` (ir.DataType.FLOAT16 or BFLOAT16)
    by the rules in the module docstring."""

    def __init__(self, half=ir.DataType.FLOAT16):
        super().__init__()
        if half not in HALF_TYPES:
            raise ValueError(f"mixed precision computes in float16 or bfloat16, not {half}")
        self.half = half

    def call(self, model):
        graph = model.graph
        self._graph = graph
        self._opset = model.opset_imports.get("", 1)
        self._casts = {}        # (value, dtype) -> its cast
        self._changed = set()   # values that were float32 and are now half
        self._silent = set()    # values computed from non-voting values only (rule 2)
        self._fed = fed_inputs(graph)
        self._before_allow = _forward_before_allow(graph)
        for node in list(graph):
            if node.op_type in _ANY or node.graph is not graph:
                continue
            if node.op_type in DATA_FOLLOW and self._normalizes_half(node):
                self._batch_norm_to_half(node)
            elif self._row_statistics_of_half(node):
                self._to_half(node, outputs=1)
            elif self._runs_in_half(node):
                self._to_half(node)
            else:
                self._to_float(node)
                if self._is_max_pool_scatter(node):
                    self._result_to_half(node)
        self._restore_outputs(graph)
        self._drop_same_type_casts(graph)
        modified = bool(self._changed)
        if modified:
            model.metadata_props[MARKER] = self.half.name.lower()
        return PassResult(model, modified)

    # -- deciding -------------------------------------------------------------------------
    def _runs_in_half(self, node):
        if node.domain not in ("", "ai.onnx") or (
                node.op_type not in ALLOW and node.op_type not in FOLLOW and
                not (node.op_type == "Exp" and _never_positive(node.inputs[0]))):
            return False
        reduction = node.attributes.get("reduction")
        if reduction is not None and reduction.value != "none":
            return False    # a scatter that accumulates is a reduction: float32 (rule 3)
        signature = _signature(node.op_type, self._opset)
        if signature is None or f"tensor({self.half.name.lower()})" not in signature[2]:
            return False    # e.g. no bfloat16 Conv before opset 22
        types = [_dtype(node.inputs[i]) for i in _t_inputs(node, self._opset)]
        floats = [t for t in types if t in (ir.DataType.FLOAT, self.half)]
        if not floats or len(floats) != len([t for t in types if t is not None and
                                             t.is_floating_point()]):
            return False    # no float input, or float64 / another half type involved
        if node.op_type in ALLOW:
            # the update's own products (the finiteness count's matrix-vector sums,
            # train/update_rules.all_finite) read float32 gradients that half cannot hold
            return origin(node)[0] != "update"
        if node.op_type not in CLEAR and origin(node)[0] == "forward" and \
                node not in self._before_allow:
            return False    # after the forward's last ALLOW op: float32 (rule 2)
        voters = [node.inputs[i] for i in _t_inputs(node, self._opset)
                  if _dtype(node.inputs[i]) in (ir.DataType.FLOAT, self.half)
                  and self._votes(node.inputs[i])]
        if not voters:
            if self._moves_a_cast_input_to_half_readers(node):
                return True
            # e.g. a bias reshaped to (1, C, 1, 1): as silent as the variable itself
            self._silent.update(node.outputs)
            return False
        return all(_dtype(v) == self.half for v in voters)

    def _moves_a_cast_input_to_half_readers(self, node):
        """Rule 2's exception: a data movement (MOVES) of a fed graph input (not a
        variable: nothing of the optimizer's update reads it) that is already cast to half
        for another reader, whose results reach ALLOW ops only (through more data
        movement), moves the half copy. Moving values is exact: every reader sees what it
        would have seen. (A variable's half copy is made for the forward and dies there;
        its backward readers cast their own, rather than keep the model's half copy across
        the step's memory peak.)"""
        data = node.inputs[0] if node.inputs else None
        if node.op_type not in MOVES or data not in self._fed or \
                (data, self.half) not in self._casts:
            return False
        others = [node.inputs[i] for i in _t_inputs(node, self._opset) if i != 0]
        return not any(_may_vote(v) for v in others) and _reaches_allow_only(node)

    def _normalizes_half(self, node):
        """Rule 3: an inference-mode BatchNormalization of a half x, every other input a
        float32 per-channel vector (constant ones within float16's range)."""
        training = node.attributes.get("training_mode")
        if self.half != ir.DataType.FLOAT16:
            return False    # onnxruntime's CUDA EP has no bfloat16 BatchNormalization
        if node.domain not in ("", "ai.onnx") or len(node.inputs) != 5 or \
                len(node.outputs) != 1 or (training is not None and training.value):
            return False
        x, *per_channel = node.inputs
        if _dtype(x) != self.half or any(v is None or _dtype(v) != ir.DataType.FLOAT
                                         for v in per_channel):
            return False
        scale = per_channel[0]      # the others have its shape (C,), maybe not recorded
        if scale.shape is None or len(scale.shape) != 1 or not isinstance(scale.shape[0], int):
            return False
        constants = [v.const_value.numpy() for v in per_channel if v.const_value is not None]
        return all(np.all(np.abs(c) < HALF_MAX) for c in constants)

    def _row_statistics_of_half(self, node):
        """Rule 3: a LayerNormalization of a half x whose Y nothing reads."""
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx") or \
                len(node.outputs) < 2 or _dtype(node.inputs[0]) != self.half:
            return False
        y = node.outputs[0]
        return not y.uses() and not y.is_graph_output()

    def _votes(self, value):
        return value not in self._silent and _may_vote(value)

    # -- rewriting ------------------------------------------------------------------------
    def _to_half(self, node, outputs=None):
        """Cast `node`'s float32 inputs of its computed type to half and make its float32
        outputs (the first `outputs` of them, when given) half."""
        for i in _t_inputs(node, self._opset):
            value = node.inputs[i]
            if _dtype(value) == ir.DataType.FLOAT:
                node.replace_input_with(i, self._cast(value, self.half, node))
        for out in list(node.outputs)[:outputs]:
            if _dtype(out) == ir.DataType.FLOAT:
                out.type = ir.TensorType(self.half)
                self._changed.add(out)

    def _batch_norm_to_half(self, node):
        x, scale, bias, mean, var = node.inputs
        if var.const_value is None:     # a computed mean alone casts safely: |mean| <= max |x|
            inputs = self._folded_statistics(node, scale, bias, mean, var)
            node.attributes["epsilon"] = ir.AttrFloat32("epsilon", BATCH_NORM_EPSILON)
        else:
            inputs = (scale, bias, mean, var)
        for i, value in enumerate(inputs, start=1):
            node.replace_input_with(i, value if _dtype(value) == self.half
                                    else self._cast(value, self.half, node))
        out = node.outputs[0]
        out.type = ir.TensorType(self.half)
        self._changed.add(out)

    def _folded_statistics(self, node, scale, bias, mean, var):
        """(a, b, zeros, 1 - 1e-5): a and b float32 per-channel values made before `node`,
        the others half constants; the normalization by computed statistics as
        x * a + b (rule 3)."""
        epsilon = node.attributes.get("epsilon")
        epsilon = 1e-5 if epsilon is None else epsilon.value
        e = NodeEmitter(self._graph, node, "amp")
        shape, f32 = scale.shape, ir.DataType.FLOAT
        # (1 / sqrt as one Pow: a kernel a batch norm fewer than Sqrt and Reciprocal)
        inv_std = e.node("Pow", [e.node(
            "Add", [var, e.const(np.array(epsilon, np.float32))], shape, f32),
            e.const(np.array(-0.5, np.float32))], shape, f32)
        # (a scale of ones, a layer made with scale=False: a is 1 / std itself)
        ones_scale = const_array(scale)
        a = inv_std if ones_scale is not None and np.all(ones_scale == 1) else \
            e.node("Mul", [scale, inv_std], shape, f32)
        b = e.node("Sub", [bias, e.node("Mul", [mean, a], shape, f32)], shape, f32)
        half = self.half.numpy()
        ones = np.ones(scale.shape[0], half)
        return a, b, e.const(0 * ones), \
            e.const((ones - np.asarray(BATCH_NORM_EPSILON, half)).astype(half))

    def _is_max_pool_scatter(self, node):
        """The max pool's backward (a ScatterElements adding the gradient at the arg-max
        positions, graph/primitives/pooling.py) with a half gradient to scatter."""
        attribute = node.attributes.get("reduction")
        return (node.op_type == "ScatterElements" and not node.domain and
                attribute is not None and attribute.value == "add" and
                origin(node) == ("backward", "MaxPool") and
                any(self._cast_of_half(v) for v in node.inputs[2:3]))

    def _cast_of_half(self, value):
        producer = value.producer() if value is not None else None
        return producer is not None and producer.op_type == "Cast" and \
            _dtype(producer.inputs[0]) == self.half

    def _result_to_half(self, node):
        """Rule 4's exception: the max pool's backward (OneFlow's max_pool_grad runs in
        half) sums in float32 but hands its readers a half result, cast once, so the
        backward before it (ReLU, batch norm) stays half."""
        result = node.outputs[0]
        readers = list(result.uses())
        cast = _cast_node(result, self.half, f"{result.name}/cast_f2h", node)
        half = cast.outputs[0]
        for use in readers:
            use.node.replace_input_with(use.idx, half)
        self._graph.insert_after(node, cast)
        self._changed.add(half)

    def _to_float(self, node):
        for i, value in enumerate(node.inputs):
            if value is not None and value in self._changed:
                node.replace_input_with(i, self._cast(value, ir.DataType.FLOAT, node))

    def _cast(self, value, dtype, consumer):
        """The one Cast of `value` to `dtype` (rule 4), placed before its first reader."""
        key = (value, dtype)
        if key not in self._casts:
            source = value.producer() or consumer
            suffix = "cast_h2f" if dtype == ir.DataType.FLOAT else "cast_f2h"
            node = _cast_node(value, dtype, f"{value.name}/{suffix}", source)
            out = node.outputs[0]
            self._graph.insert_before(consumer, node)
            self._casts[key] = out
        return self._casts[key]

    def _drop_same_type_casts(self, graph):
        """Remove the Casts to a value's own type: the compiler's float32 Cast of each
        gradient (graph/compiler.py) where the gradient stayed float32. onnxruntime drops
        them too; the memory plan and traffic model would count a copy."""
        for node in list(graph):
            if node.op_type != "Cast" or node.domain or node.graph is not graph:
                continue
            source, out = node.inputs[0], node.outputs[0]
            to = node.attributes.get("to")
            if to is None or _dtype(source) is None or _dtype(source).value != to.value or \
                    out.is_graph_output():
                continue
            for use in list(out.uses()):
                use.node.replace_input_with(use.idx, source)
            graph.remove(node, safe=True)

    def _restore_outputs(self, graph):
        """A half graph output is renamed and a float32 Cast takes its name (rule 5)."""
        for index, value in enumerate(list(graph.outputs)):
            if value not in self._changed:
                continue
            name = value.name
            value.name = f"{name}/half"
            node = _cast_node(value, ir.DataType.FLOAT, f"{name}/cast_h2f", value.producer())
            out = node.outputs[0]
            out.name = name
            graph.append(node)
            graph.outputs[index] = out
