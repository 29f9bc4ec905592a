"""Small helpers shared by the passes."""
import numpy as np
import onnx_ir as ir


def attr(node, name, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def const_array(value):
    """NumPy value of an initializer / constant input, or None."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def const_array_through_cast(value):
    """const_array of `value`, or of the constant a Cast made it from (mixed precision's
    cast of a constant, before onnxruntime folds it); None for neither."""
    array = const_array(value)
    if array is not None or value is None:
        return array
    cast = value.producer()
    if cast is not None and cast.op_type == "Cast" and not cast.domain:
        return const_array(cast.inputs[0])
    return None


def is_zero_constant(value, rank0=False):
    """Whether `value` is a constant holding one 0 (and, with `rank0`, of rank 0)."""
    array = const_array(value)
    return (array is not None and array.size == 1 and (array.ndim == 0 or not rank0)
            and float(array.reshape(())) == 0.0)


def reduce_axes(node):
    """The axes a Reduce* node names (its `axes` attribute or constant second input), or
    None when it names none or they are computed."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        array = const_array(node.inputs[1])
        return None if array is None else [int(a) for a in array.reshape(-1)]
    return attr(node, "axes")


# the first opset where each reduction takes its axes as an input rather than an attribute
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceSumSquare": 18}


def producer(value, op_type):
    """The node of the default domain and of type `op_type` that made `value`, or None."""
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type and node.domain == "" \
        else None


def static_shape(value):
    """The value's shape as a tuple of ints, or None if unknown or symbolic."""
    if value is None or value.shape is None:
        return None
    dims = tuple(value.shape)
    return dims if all(isinstance(d, int) for d in dims) else None


def has_single_use(value):
    return len(value.uses()) == 1 and not value.is_graph_output()


def replace_value(old, new):
    """Point every consumer of `old` at `new`; a graph output keeps its name.

    Returns False (and changes nothing) when `old` is a graph output and `new` cannot take
    its place (it is already an input, initializer or output of the graph).
    """
    if old.is_graph_output():
        if new.is_graph_output() or new.is_graph_input() or new.is_initializer():
            return False
        graph = old.graph
        index = list(graph.outputs).index(old)
        name = old.name
        old.name = f"{name}/replaced"
        new.name = name
        graph.outputs[index] = new
    ir.convenience.replace_all_uses_with(old, new)
    return True


def add_initializer(graph, array, name):
    """A new initializer of `graph` holding `array`."""
    value = ir.Value(name=name, const_value=ir.Tensor(np.asarray(array), name=name),
                     type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                     shape=ir.Shape(array.shape))
    graph.register_initializer(value)
    return value


class NodeEmitter:
    """Emits a rewrite's nodes just before `anchor`, carrying its source metadata, each
    named `<anchor>/<tag>_<op><n>` (and its output the same)."""

    def __init__(self, graph, anchor, tag):
        self.graph, self.anchor = graph, anchor
        self.meta = dict(anchor.metadata_props)
        self.prefix = f"{anchor.name or anchor.op_type}/{tag}_"
        self.count = 0

    def const(self, array):
        """A new initializer holding `array`."""
        self.count += 1
        return add_initializer(self.graph, np.asarray(array), f"{self.prefix}c{self.count}")

    def node(self, op_type, inputs, shape, dtype, domain="", **attributes):
        """The output of a new `op_type` node, of `shape` and element type `dtype`."""
        return self.node_outputs(op_type, inputs, [shape], dtype, domain, **attributes)[0]

    def reduce(self, op_type, value, axes, shape, dtype, keepdims, opset):
        """The output of a new reduction of `value` over `axes`, its axes an input or an
        attribute as `opset` wants (AXES_INPUT_SINCE)."""
        axes = [int(a) for a in axes]
        if opset >= AXES_INPUT_SINCE[op_type]:
            return self.node(op_type, [value, self.const(np.array(axes, np.int64))], shape,
                             dtype, keepdims=keepdims)
        return self.node(op_type, [value], shape, dtype, axes=axes, keepdims=keepdims)

    def node_outputs(self, op_type, inputs, shapes, dtype, domain="", **attributes):
        """The outputs of a new `op_type` node (of `domain`), one per entry of `shapes`, all
        of element type `dtype`; the first is named as the node, the others
        `<name>_<index>`."""
        self.count += 1
        name = f"{self.prefix}{op_type}{self.count}"
        node = ir.node(op_type, inputs, attributes=attributes, name=name, domain=domain,
                       num_outputs=len(shapes), metadata_props=dict(self.meta))
        self.graph.insert_before(self.anchor, node)
        for index, (out, shape) in enumerate(zip(node.outputs, shapes)):
            out.name = name if index == 0 else f"{name}_{index}"
            out.shape, out.type = ir.Shape(shape), ir.TensorType(dtype)
        return list(node.outputs)
