"""One ONNX node run on arrays: how an eager tensor op computes its value.

The node is cut out of the tape's graph (its inputs and outputs renamed, its name and
metadata dropped) into a one-node model, run on the CPU EP; a session is kept per node
form and input signature (types and shapes), so a loop that repeats its ops creates each
session once.
"""
import collections

import onnx
import onnx_ir as ir

from onnxjob import dtypes
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.runtime import backend

_KEPT = 1024        # sessions kept, least recently used dropped
_sessions = collections.OrderedDict()


def run_node(node, arrays, opset_imports):
    """The output arrays of ir.Node `node` for input `arrays` (None for an omitted
    optional input), with the graph's `opset_imports`."""
    proto = ir.serde.serialize_node(node)
    proto.name = ""
    del proto.metadata_props[:]
    for i, name in enumerate(proto.input):
        if name:
            proto.input[i] = f"i{i}"
    for i in range(len(proto.output)):
        proto.output[i] = f"o{i}"
    signature = tuple(None if a is None else (a.dtype.str, a.shape) for a in arrays)
    key = (proto.SerializeToString(), signature)
    session = _sessions.get(key)
    if session is None:
        session = _sessions[key] = _session(proto, node, arrays, opset_imports)
    _sessions.move_to_end(key)
    while len(_sessions) > _KEPT:
        _sessions.popitem(last=False)
    feeds = {f"i{i}": a for i, a in enumerate(arrays) if a is not None}
    return session.run(None, feeds)


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
    return backend.create_session(model.SerializeToString(), "cpu", is_train=False)
