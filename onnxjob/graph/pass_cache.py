"""On-disk cache of what the pass pipeline (onnxjob/passes/) made of a job's graph, so that a
later process compiling the same job skips the passes and the serialization of their
result (ResNet50's train session start with a filled session cache: 0.85-0.88 s before,
0.68-0.75 s with this cache).

The key is the SHA-256 of the graph before the passes (graph_digest: every node, value,
attribute, initializer and metadata entry the passes read or carry over), the device it
is compiled for, ONNXJOB_SKIP_PASSES, the onnx-ir version, onnxjob's version
(session_cache.onnxjob_version: the compiler's steps after the passes are cached too) and
the source of the `passes` package itself, so editing a pass invalidates what it made.
A file is used only when its stamp names it and its graph has the job's outputs and a
subset of its inputs (same types); anything else is a miss, said in one line, and
rewritten. Jobs whose pipeline has user passes (`function_config.passes`,
`register_pass`) or dumps its graphs (`dump_passes`) are not cached: a user pass's code is
not part of the key.
The files live beside runtime/session_cache.py's (`<key>.passes.onnx`), under the same
folder, size limit and ONNXJOB_CACHE_DIR=off switch.
"""
import functools
import hashlib
import os

import onnx
import onnx_ir as ir

from onnxjob import passes, settings
from onnxjob.runtime import session_cache

FORMAT = "3"    # bump when what goes into the key or the file changes


@functools.lru_cache(maxsize=None)
def _passes_source_digest():
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(passes.__file__))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as source:
                digest.update(name.encode() + b"\0" + source.read() + b"\0")
    return digest.hexdigest()


def enabled(config):
    """Whether a job with `config` has its pipeline's result cached (not when the cache is
    off, the passes are disabled or dumped, or user passes run)."""
    return (session_cache.cache_dir() is not None and not passes.passes_disabled(config)
            and not passes.has_user_passes(config) and not passes.dump_folder(config))


def path_for(digest, device, mixed_precision=None):
    """Where the pipeline's result for the graph of `digest` (graph_digest of the model
    before the passes) lives; `mixed_precision` is the job's AMP half type or None."""
    folder = session_cache.cache_dir()
    key = hashlib.sha256()
    for part in (FORMAT, str(device), str(mixed_precision),
                 ",".join(sorted(settings.get("SKIP_PASSES"))),
                 ir.__version__, session_cache.onnxjob_version(), _passes_source_digest(),
                 digest):
        key.update(part.encode() + b"\0")
    return os.path.join(folder, f"{key.hexdigest()}.passes.onnx")


def graph_digest(model):
    """SHA-256 (hex) of `model`: its IR version, opsets and producer, and its graph's
    inputs, outputs, initializers (with their bytes) and nodes in order (name, op, domain,
    inputs, outputs with their types and shapes, attributes, metadata). It stands for the
    serialized model as a cache key: serializing ResNet50's train graph took 0.05-0.14 s
    (onnx-ir's serializer builds every shape field by field), this walk 0.04-0.05 s.
    None for a model with local functions, which it does not walk (not cached)."""
    if len(model.functions):
        return None
    digest = hashlib.sha256()
    head = (model.ir_version, sorted(model.opset_imports.items()), model.producer_name,
            model.producer_version, model.domain, model.doc_string)
    digest.update(repr(head).encode())
    _digest_graph(digest, model.graph)
    return digest.hexdigest()


def _value_key(value):
    if value is None:
        return None
    shape = None if value.shape is None else tuple(str(d) for d in value.shape)
    meta = sorted(value.metadata_props.items()) if value.metadata_props else ()
    return (value.name, str(value.type), shape, meta, value.doc_string)


def _digest_graph(digest, graph):
    parts = [("graph", graph.name, graph.doc_string, sorted(graph.metadata_props.items()),
              [_value_key(v) for v in graph.inputs], [_value_key(v) for v in graph.outputs])]
    for name, value in graph.initializers.items():
        tensor = value.const_value
        parts.append(("init", name, _value_key(value),
                      None if tensor is None else (str(tensor.dtype), tuple(tensor.shape))))
        if tensor is not None:
            digest.update(tensor.tobytes())
    for node in graph:
        attrs = []
        for attr in node.attributes.values():
            attrs.append((attr.name, str(attr.type), _attribute_value(digest, attr)))
        parts.append((node.name, node.op_type, node.domain, node.overload,
                      [None if v is None else v.name for v in node.inputs],
                      [_value_key(v) for v in node.outputs], attrs,
                      sorted(node.metadata_props.items()), node.doc_string))
    digest.update(repr(parts).encode())


_TENSOR_KINDS = (ir.AttributeType.TENSOR, ir.AttributeType.TENSORS,
                 ir.AttributeType.SPARSE_TENSOR, ir.AttributeType.SPARSE_TENSORS)
_ONE_ITEM_KINDS = (ir.AttributeType.TENSOR, ir.AttributeType.SPARSE_TENSOR,
                   ir.AttributeType.GRAPH)


def _attribute_value(digest, attr):
    """A repr-able stand-in for an attribute's value; tensors and graphs go into `digest`."""
    if attr.is_ref():
        return ("ref", attr.ref_attr_name)
    kind, value = attr.type, attr.value
    items = [value] if kind in _ONE_ITEM_KINDS else value
    if kind in _TENSOR_KINDS:
        for tensor in items:
            to_bytes = getattr(tensor, "tobytes", None)
            digest.update(to_bytes() if to_bytes is not None else repr(tensor).encode())
        return [(str(t.dtype), tuple(t.shape)) for t in items]
    if kind in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        for graph in items:
            _digest_graph(digest, graph)
        return len(items)
    return value if isinstance(value, (int, float, str, bytes, list, tuple)) else repr(value)


def load(path, model):
    """(model bytes, graph input names, model metadata) cached at `path` for `model` (the
    graph before the passes), or None: absent, unreadable or not `model`'s result (said in
    one line); the passes then run again and rewrite it."""
    if path is None or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as cached:
            data = cached.read()
        stamp = session_cache.stamp_bytes(path)
        if data.endswith(stamp):
            data = data[:-len(stamp)]   # the model as the passes made it, bytes and all
            proto = onnx.ModelProto()
            proto.ParseFromString(data)
            problem = _io_problem(proto.graph, model.graph)
        else:
            problem = "no cache stamp naming this file (truncated, or not written here)"
    except Exception as e:   # OSError, protobuf's DecodeError, a type onnx-ir cannot read
        problem = f"unreadable: {type(e).__name__}"
    if problem is None and not proto.graph.node:
        problem = "its graph has no nodes"
    if problem is not None:
        session_cache.warn_invalid(path, problem)
        return None
    session_cache.touch(path)
    return (data, {value.name for value in proto.graph.input},
            {p.key: p.value for p in proto.metadata_props})


def _io_problem(cached, graph):
    """Why the cached graph proto `cached` is not what the passes make of `graph`: the
    passes keep the outputs and may drop inputs, never add or retype one."""
    wanted = [(v.name, str(v.type)) for v in graph.outputs]
    got = [(v.name, _type_of(v)) for v in cached.output]
    if got != wanted:
        return f"its graph outputs are not the job's ({len(got)} vs {len(wanted)} or renamed)"
    inputs = {v.name: str(v.type) for v in graph.inputs}
    for value in cached.input:
        if inputs.get(value.name) != _type_of(value):
            return f"its graph input {value.name!r} is not one of the job's"
    return None


def _type_of(value_info):
    return str(ir.serde.deserialize_type_proto_for_type(value_info.type))


def store(path, model_bytes):
    """Keep `model_bytes` at `path` (no-op when `path` is None); a failure to write only
    costs the next start its shortcut."""
    if path is None:
        return
    try:
        tmp = session_cache.writing_to(path)
        with open(tmp, "wb") as out:
            out.write(model_bytes)
        session_cache.publish(tmp, path)    # stamped there
    except OSError:
        pass
