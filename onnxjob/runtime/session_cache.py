"""On-disk cache of the models onnxruntime optimized, so that a later process skips
onnxruntime's graph optimization of the same job (most of a session's creation time).

A job's graph carries no variable values (they are inputs), so its bytes are small and
name the computation exactly. The key is the SHA-256 of those bytes, the session options
that shape the optimized model (optimization level, disabled transformers, execution
provider and its options, threads, deterministic kernels: backend.create_session), the
onnxruntime and onnxjob versions and this machine's processor: the file onnxruntime
writes with `optimized_model_filepath` holds hardware-specific rewrites (NCHWc layouts,
fused kernels) and is only valid where it was made. A cached model is loaded with
onnxruntime's optimizations off, since it already went through them.

Each file ends with a metadata entry naming its own key (`stamp`), and a loaded entry's
graph inputs and outputs are compared with the job's: a file that is not what its name
says (garbage, truncated, another graph's model) is a miss, said in one line, and
rebuilt in place.

Folder: ONNXJOB_CACHE_DIR, else $XDG_CACHE_HOME/onnxjob, else ~/.cache/onnxjob;
ONNXJOB_CACHE_DIR=off turns the cache off. It keeps at most ONNXJOB_CACHE_MB megabytes
(default 1024), dropping the least recently used models first. CPU sessions cache the
file onnxruntime writes; CUDA train sessions cache the optimized graph put back in the
graph's order (runtime/graph_order.py), the bytes their session loads, which a later
process loads the same way (CUDA predict sessions are not cached: the CUDA EP's own
optimized file was not checked on a GPU). The pass pipeline's results share the folder
and the limit (graph/pass_cache.py, `*.passes.onnx`).
"""
import functools
import hashlib
import importlib.metadata
import itertools
import os
import platform
import sys
import tempfile

import onnx
import onnxruntime as ort

from onnxjob import settings

FORMAT = "3"    # bump when what goes into the key or the file changes
STAMP = "onnxjob.cache_entry"     # metadata key whose value is the file's own name
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir():
    """The cache folder, or None when the cache is off."""
    return settings.get("CACHE_DIR")


@functools.lru_cache(maxsize=None)
def _processor():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=None)
def onnxjob_version():
    """What names this onnxjob in cache keys: the installed release's version when the
    imported package is that release's files, else a hash of the imported source.

    NOTE: the version alone would be wrong for an editable install or a checkout on
    PYTHONPATH, whose code changes while the version stays (0.1.0 for every commit);
    hashing the source (~0.6 MB, ~8 ms once per process) is exact there, and a
    released install's files only change with its version."""
    try:
        release = importlib.metadata.distribution("onnxjob")
        installed = os.path.abspath(str(release.locate_file("onnxjob/__init__.py")))
        if installed == os.path.join(_PACKAGE, "__init__.py"):
            return release.version
    except importlib.metadata.PackageNotFoundError:
        pass
    return "source-" + _source_digest(_PACKAGE)


def _source_digest(package):
    """A hash (16 hex digits) of every .py file under the folder `package`, names and all."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")   # visited in this order
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as source:
                    digest.update(os.path.relpath(path, package).encode() + b"\0" +
                                  source.read() + b"\0")
    return digest.hexdigest()[:16]


def cached_model_path(model_bytes, *choices):
    """Where the optimized form of `model_bytes` under `choices` lives (it may not exist
    yet), or None when the cache is off."""
    folder = cache_dir()
    if folder is None:
        return None
    key = hashlib.sha256()
    for part in (FORMAT, ort.__version__, onnxjob_version(), _processor(), repr(choices)):
        key.update(part.encode() + b"\0")
    key.update(model_bytes)
    return os.path.join(folder, f"{key.hexdigest()}.onnx")


def writing_to(path):
    """A temporary file beside `path` for onnxruntime to write; `publish` moves it there."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle, tmp = tempfile.mkstemp(suffix=".onnx.tmp", dir=os.path.dirname(path))
    os.close(handle)
    return tmp


def publish(tmp, path):
    """Make the model onnxruntime wrote at `tmp` the cached one (atomic: a concurrent
    reader sees the old state or the whole file), then trim the folder to its limit."""
    if os.path.getsize(tmp):
        stamp(tmp, path)
        os.replace(tmp, path)
    else:
        os.remove(tmp)
    _trim(os.path.dirname(path), settings.get("CACHE_MB") << 20)


def publish_bytes(data, path):
    """Make the model `data` (bytes) the cached one at `path`, as `publish` does."""
    tmp = writing_to(path)
    with open(tmp, "wb") as out:
        out.write(data)
    publish(tmp, path)


def stamp(tmp, path):
    """Append to the model file `tmp` a metadata entry naming `path`, its place in the
    cache. NOTE: protobuf merges concatenated messages, so this costs no parse; it sits
    at the end of the file, so a truncated file loses it."""
    with open(tmp, "ab") as out:
        out.write(stamp_bytes(path))


def stamp_bytes(path):
    """The bytes `stamp` appends to the file cached at `path`."""
    entry = onnx.ModelProto()
    entry.metadata_props.add(key=STAMP, value=os.path.basename(path))
    return entry.SerializeToString()


def stamp_problem(metadata, path):
    """Why a cached file with model metadata `metadata` ({key: value}) is not the entry
    for `path`, or None when its stamp says it is."""
    found = metadata.get(STAMP)
    if found == os.path.basename(path):
        return None
    return "no cache stamp (truncated, or not written by onnxjob)" if found is None else (
        f"it is the cache entry {found}")


def io_problem(session, model_bytes):
    """Why onnxruntime `session` (made from a cached file) does not run the graph of
    `model_bytes`: its inputs or outputs differ in name, order or type. None when they
    match."""
    model = onnx.ModelProto()
    model.ParseFromString(model_bytes)
    constants = {tensor.name for tensor in model.graph.initializer}
    for what, wanted, got in (
            ("inputs", [v for v in model.graph.input if v.name not in constants],
             session.get_inputs()),
            ("outputs", model.graph.output, session.get_outputs())):
        wanted = [(v.name, _type_name(v.type)) for v in wanted]
        got = [(v.name, v.type) for v in got]
        for index, (job, cached) in enumerate(itertools.zip_longest(wanted, got)):
            if job != cached:
                return (f"graph {what[:-1]} #{index} is {cached or 'missing'} where the job "
                        f"has {job or 'none'}")
    return None


def _type_name(type_proto):
    """onnxruntime's spelling of an ONNX type (NodeArg.type): tensor(float), seq(...)."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        name = onnx.TensorProto.DataType.Name(type_proto.tensor_type.elem_type)
        return f"tensor({name.lower()})"
    if kind == "sequence_type":
        return f"seq({_type_name(type_proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_name(type_proto.optional_type.elem_type)})"
    return str(kind)


def warn_invalid(path, reason):
    """The one line said when a cached file is not used (it is then rebuilt)."""
    print(f"onnxjob: ignoring the cached model {path} ({reason}); building it again",
          file=sys.stderr)


def touch(path):
    """Mark a cached model as just used (the trim drops the least recently used)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _trim(folder, limit):
    """Remove the least recently used cached models until the folder holds <= `limit`
    bytes. Other processes trim the same folder at the same time (data-parallel ranks,
    parallel test runs): a file gone between the listing and its stat or removal is
    skipped."""
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".onnx"):
            try:
                stat = entry.stat()
            except OSError:
                continue
            entries.append((stat.st_mtime, stat.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        try:
            os.remove(path)
        except OSError:
            continue
        total -= size
