"""On-disk cache of what the pass pipeline (passes/) made of a job's graph, so that a
later process compiling the same job skips the passes and the serialization of their
result (ResNet50's train session start with a filled session cache: 0.85-0.88 s before,
0.68-0.75 s with this cache).

The key is the SHA-256 of the graph before the passes (its serialized bytes), the device
it is compiled for, ONNXJOB_SKIP_PASSES, the onnx-ir version and the source of the
`passes` package itself, so editing a pass invalidates what it made. Jobs whose pipeline
has user passes (`function_config.passes`, `register_pass`) or dumps its graphs
(`dump_passes`) are not cached: a user pass's code is not part of the key.
The files live beside runtime/session_cache.py's (`<key>.passes.onnx`), under the same
folder, size limit and ONNXJOB_CACHE_DIR=off switch.
"""
import functools
import hashlib
import os

import onnx
import onnx_ir as ir

import passes
from onnxjob.runtime import session_cache

FORMAT = "1"    # bump when what goes into the key or the file changes


@functools.lru_cache(maxsize=None)
def _passes_source_digest():
    digest = hashlib.sha256()
    folder = os.path.dirname(os.path.abspath(passes.__file__))
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            with open(os.path.join(folder, name), "rb") as source:
                digest.update(name.encode() + b"\0" + source.read() + b"\0")
    return digest.hexdigest()


def _cacheable(config):
    if passes.passes_disabled(config) or passes.has_user_passes(config):
        return False
    return not ((config.get("dump_passes") if config is not None else None)
                or os.environ.get("ONNXJOB_DUMP_PASSES"))


def enabled(config):
    """Whether a job with `config` has its pipeline's result cached (not when the cache is
    off, the passes are disabled or dumped, or user passes run)."""
    return session_cache.cache_dir() is not None and _cacheable(config)


def path_for(model_bytes, config, device):
    """Where the pipeline's result for the graph `model_bytes` (before the passes) lives."""
    folder = session_cache.cache_dir()
    key = hashlib.sha256()
    for part in (FORMAT, str(device), os.environ.get("ONNXJOB_SKIP_PASSES", ""),
                 ir.__version__, _passes_source_digest()):
        key.update(part.encode() + b"\0")
    key.update(model_bytes)
    return os.path.join(folder, f"{key.hexdigest()}.passes.onnx")


def load(path):
    """The cached model bytes at `path`, or None."""
    if path is None:
        return None
    try:
        with open(path, "rb") as cached:
            data = cached.read()
    except OSError:
        return None
    session_cache.touch(path)
    return data or None


def store(path, model_bytes):
    """Keep `model_bytes` at `path` (no-op when `path` is None); a failure to write only
    costs the next start its shortcut."""
    if path is None:
        return
    try:
        tmp = session_cache.writing_to(path)
        with open(tmp, "wb") as out:
            out.write(model_bytes)
        session_cache.publish(tmp, path)
    except OSError:
        pass


def graph_input_names(model_bytes):
    """The names of the graph inputs of a serialized model."""
    proto = onnx.ModelProto()
    proto.ParseFromString(model_bytes)
    return [value.name for value in proto.graph.input]
