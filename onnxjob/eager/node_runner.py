"""One ONNX node run on arrays: how an eager tensor op computes its value.

The node is cut out of the tape's graph (its inputs and outputs renamed, its name and
metadata dropped) into a one-node model, run on the CPU EP; a session is kept per node
form and input signature (types and shapes), so a loop that repeats its ops creates each
session once.
"""
import onnx
import onnx_ir as ir
import onnxruntime as ort

from onnxjob import dtypes
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.runtime import backend
from onnxjob.runtime.lru import LeastRecentlyUsed

_sessions = LeastRecentlyUsed(1024)     # by node form and input signature


def run_node(node, arrays, opset_imports):
    """The output arrays of ir.Node `node` for input `arrays` (None for an omitted
    optional input), with the graph's `opset_imports`."""
    signature = tuple(None if a is None else (a.dtype.str, a.shape) for a in arrays)
    form, proto = _form(node), None
    if form is None:
        proto = _cut(node)
        form = proto.SerializeToString()
    session = _sessions.get_or_make((form, signature), lambda: _session(
        proto if proto is not None else _cut(node), node, arrays, opset_imports))
    feeds = {f"i{i}": a for i, a in enumerate(arrays) if a is not None}
    return session.run(None, feeds)


def _cut(node):
    """`node` as a NodeProto of its own: inputs i0.., outputs o0.., no name or metadata."""
    proto = ir.serde.serialize_node(node)
    proto.name = ""
    del proto.metadata_props[:]
    for i, name in enumerate(proto.input):
        if name:
            proto.input[i] = f"i{i}"
    for i in range(len(proto.output)):
        proto.output[i] = f"o{i}"
    return proto


_PLAIN_ATTRS = {ir.AttributeType.INT, ir.AttributeType.FLOAT, ir.AttributeType.STRING,
                ir.AttributeType.INTS, ir.AttributeType.FLOATS, ir.AttributeType.STRINGS}


def _form(node):
    """A key for what `node` computes (op, attributes, which inputs are given) made
    without serializing it, or None where an attribute is not a plain value (a tensor or
    a graph: the NodeProto's bytes are the key then)."""
    attrs = []
    for name, attr in sorted(node.attributes.items()):
        if attr.type not in _PLAIN_ATTRS:
            return None
        value = attr.value
        attrs.append((name, attr.type, tuple(value) if isinstance(value, list) else value))
    return (node.domain, node.op_type, tuple(attrs), tuple(v is None for v in node.inputs),
            tuple(v.dtype for v in node.outputs))


def _session(proto, node, arrays, opset_imports):
    inputs = [onnx.helper.make_tensor_value_info(
        f"i{i}", dtypes.from_numpy(a.dtype).ir_dtype.value, a.shape)
        for i, a in enumerate(arrays) if a is not None]
    outputs = [onnx.helper.make_tensor_value_info(f"o{i}", v.dtype.value, None)
               for i, v in enumerate(node.outputs)]
    graph = onnx.helper.make_graph([proto], "eager_op", inputs, outputs)
    model = onnx.helper.make_model(
        graph, ir_version=IR_VERSION,
        opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opset_imports.items()])
    # one intra-op thread: a node of an eager op is small, and waking a pool for it cost
    # more than it saved (bench/bench_eager.py)
    return ort.InferenceSession(model.SerializeToString(),
                                backend.session_options(False, threads=1),
                                providers=["CPUExecutionProvider"])
