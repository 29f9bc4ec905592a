"""On-disk cache of the models onnxruntime optimized, so that a later process skips
onnxruntime's graph optimization of the same job (most of a session's creation time).

A job's graph carries no variable values (they are inputs), so its bytes are small and
name the computation exactly. The key is the SHA-256 of those bytes, the session's
choices (train or predict, deterministic kernels), the onnxruntime version and this
machine's processor: the file onnxruntime writes with `optimized_model_filepath` holds
hardware-specific rewrites (NCHWc layouts, fused kernels) and is only valid where it was
made. A cached model is loaded with onnxruntime's optimizations off, since it already
went through them.

Folder: ONNXJOB_CACHE_DIR, else $XDG_CACHE_HOME/onnxjob, else ~/.cache/onnxjob;
ONNXJOB_CACHE_DIR=off turns the cache off. It keeps at most ONNXJOB_CACHE_MB megabytes
(default 1024), dropping the least recently used models first. Only CPU sessions are
cached (the CUDA EP's optimized form was not checked on a GPU). The pass pipeline's
results share the folder and the limit (graph/pass_cache.py, `*.passes.onnx`).
"""
import functools
import hashlib
import os
import platform
import tempfile

import onnxruntime as ort

from onnxjob import settings

FORMAT = "2"    # bump when what goes into the key or the file changes


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


def cached_model_path(model_bytes, *choices):
    """Where the optimized form of `model_bytes` under `choices` lives (it may not exist
    yet), or None when the cache is off."""
    folder = cache_dir()
    if folder is None:
        return None
    key = hashlib.sha256()
    for part in (FORMAT, ort.__version__, _processor(), repr(choices)):
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
        os.replace(tmp, path)
    else:
        os.remove(tmp)
    _trim(os.path.dirname(path), settings.get("CACHE_MB") << 20)


def touch(path):
    """Mark a cached model as just used (the trim drops the least recently used)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _trim(folder, limit):
    entries = []
    for entry in os.scandir(folder):
        if entry.name.endswith(".onnx"):
            stat = entry.stat()
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
