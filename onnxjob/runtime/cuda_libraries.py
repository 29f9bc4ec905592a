"""Finding the CUDA libraries onnxruntime's CUDA execution provider needs, and saying
what is missing when a GPU is there but the provider cannot load.

onnxruntime only logs a failed provider load and runs on the CPU; a user with a GPU who
installed the CPU wheel, or onnxruntime-gpu without the CUDA/cuDNN libraries, would
otherwise train on the CPU without knowing.
"""
import contextlib
import ctypes
import ctypes.util
import functools
import glob
import importlib.metadata
import io
import os
import re
import shutil
import sys

import onnxruntime as ort

_MISSING_LIBRARY = re.compile(r"([\w.+-]+\.so[.\d]*): cannot open shared object file")


def preload():
    """On a machine with a GPU, load the CUDA and cuDNN libraries of the pip `nvidia-*`
    packages (or PyTorch's) into the process with onnxruntime-gpu's `preload_dlls`
    (>= 1.21); without it the provider library only finds what the system's loader path
    holds. Its lines about libraries it did not find are dropped: provider_load_error()
    names the one that matters."""
    if not hasattr(ort, "preload_dlls") or not gpu_present():
        return
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            ort.preload_dlls()
        except Exception:
            pass


@functools.lru_cache(maxsize=None)
def gpu_present():
    """True when this machine shows an NVIDIA GPU: its device node, its driver library
    or nvidia-smi."""
    return (os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
            or _driver_library_installed())


def _driver_library_installed():
    """Whether the driver's libcuda is where the loader finds it. On Linux that is what
    ctypes.util.find_library reports, read from the loader's cache and LD_LIBRARY_PATH
    directly: find_library runs ldconfig and gcc, about 12 ms of every CPU session start."""
    if not sys.platform.startswith("linux"):
        return ctypes.util.find_library("cuda") is not None
    try:
        with open("/etc/ld.so.cache", "rb") as cache:
            if b"libcuda.so" in cache.read():
                return True
    except OSError:
        pass
    return any(glob.glob(os.path.join(d, "libcuda.so*"))
               for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d)


def installed_onnxruntime():
    """The name of the installed onnxruntime distribution ('onnxruntime-gpu', ...)."""
    for name in ("onnxruntime-gpu", "onnxruntime"):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return "onnxruntime"


def provider_load_error():
    """Why onnxruntime's CUDA provider library does not load here, in a sentence that
    names the missing library where the loader named one; None when it loads."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (f"the installed {installed_onnxruntime()} is a CPU-only build "
                "(pip install 'onnxruntime-gpu[cuda,cudnn]' instead of onnxruntime)")
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    try:
        ctypes.CDLL(os.path.join(capi, "libonnxruntime_providers_shared.so"),
                    mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(os.path.join(capi, "libonnxruntime_providers_cuda.so"))
    except OSError as e:
        found = _MISSING_LIBRARY.search(str(e))
        what = f"{found.group(1)} is not found" if found else str(e)
        return (f"its CUDA provider library does not load: {what} (pip install "
                "'onnxruntime-gpu[cuda,cudnn]' installs the CUDA and cuDNN libraries it was "
                "built for, or add their folder to LD_LIBRARY_PATH)")
    return None
