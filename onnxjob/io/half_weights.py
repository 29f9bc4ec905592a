"""Exported predict files with their weights stored in half precision
(`flow.export(job, path, half_weights=True)`, io/export.py).

Under `enable_auto_mixed_precision(True)` a predict job's graph reads each float32 weight
that a half Conv/MatMul/Gemm uses through a Cast to float16 (or bfloat16) right after the
weight (onnxjob/passes/auto_mixed_precision.py, rule 4: one Cast per value and type). In the
exported file such a weight is an initializer, so the file can hold the half values
themselves and drop the Cast: the same numbers reach the same nodes (NumPy's rounding to
half is the Cast's, round to nearest even), in a file about half the size.

Only a float32 initializer whose every reader is such a Cast (to one half type) is
converted; one that a float32 node also reads, or that is a graph output, stays float32
(the doc LeNet's convolution biases, reshaped before their Cast, for instance). A file
without any (a job without AMP) is refused: half weights there would change the job's
numbers, which this option does not do. Train steps keep float32 weights (the master
copy that the update needs).
"""
import numpy as np
import onnx
from onnx import numpy_helper

_HALF = {onnx.TensorProto.FLOAT16: np.float16}
try:
    import ml_dtypes
    _HALF[onnx.TensorProto.BFLOAT16] = ml_dtypes.bfloat16
except ImportError:     # bfloat16 weights then stay float32 with their Cast
    pass


def _readers(graph):
    """{value name: [nodes of `graph` that read it]}, and the names subgraphs read."""
    readers, in_subgraphs = {}, set()
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
        for attribute in node.attribute:
            for sub in list(attribute.g.node if attribute.HasField("g") else []) + \
                    [n for g in attribute.graphs for n in g.node]:
                in_subgraphs.update(sub.input)
    return readers, in_subgraphs


def _cast_to(node):
    return next((a.i for a in node.attribute if a.name == "to"), None)


def store_half_weights(proto):
    """Rewrite `proto` (an exported predict model) in place: each float32 initializer read
    only through Casts to one half type becomes an initializer of that type, named after
    the first Cast's output, and the Casts go. Returns (weights converted, bytes saved)."""
    if any(p.key == "onnxjob.train_step" for p in proto.metadata_props):
        raise ValueError("half_weights=True applies to predict jobs: a train step keeps "
                         "float32 weights (the copy its optimizer updates)")
    graph = proto.graph
    readers, in_subgraphs = _readers(graph)
    outputs = {o.name for o in graph.output}
    converted, saved, dropped, renamed = 0, 0, set(), {}
    for index, initializer in enumerate(graph.initializer):
        name = initializer.name
        users = readers.get(name, [])
        if (initializer.data_type != onnx.TensorProto.FLOAT or not users or name in outputs
                or name in in_subgraphs):
            continue
        targets = {_cast_to(n) if n.op_type == "Cast" else None for n in users}
        if len(targets) != 1 or targets.pop() not in _HALF or \
                any(n.output[0] in outputs for n in users):
            continue
        half_name = users[0].output[0]
        array = numpy_helper.to_array(initializer).astype(_HALF[_cast_to(users[0])])
        graph.initializer[index].CopyFrom(numpy_helper.from_array(array, half_name))
        for cast in users:
            dropped.add(id(cast))
            renamed[cast.output[0]] = half_name
        converted += 1
        saved += array.size * 2
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    return converted, saved
