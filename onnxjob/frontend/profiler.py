"""`flow.profiler`: NVTX ranges for GPU profilers (Nsight Systems), as OneFlow's.

`range_push` / `range_pop` call NVTX (libnvToolsExt) when the library loads, as
OneFlow's CUDA builds do, and do nothing else otherwise (as OneFlow's CPU builds); a pop
without a push raises. `nvtx_start` / `nvtx_end` are OneFlow's in-job marker ops: they
return their input unchanged (an ONNX graph has no NVTX markers, so none is emitted).
"""
import ctypes
import threading

from onnxjob.errors import missing_api
from onnxjob.ops.casts import identity

_state = threading.local()
_nvtx = []   # [library or None], loaded on first use


def _library():
    if not _nvtx:
        lib = None
        for name in ("libnvToolsExt.so.1", "libnvToolsExt.so"):
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        _nvtx.append(lib)
    return _nvtx[0]


def _stack():
    if not hasattr(_state, "ranges"):
        _state.ranges = []
    return _state.ranges


def range_push(range_name):
    """Open the NVTX range `range_name` (nested in the ranges open on this thread)."""
    _stack().append(str(range_name))
    lib = _library()
    if lib is not None:
        lib.nvtxRangePushA(str(range_name).encode())


def range_pop():
    """Close the innermost range opened by range_push on this thread; returns its name."""
    ranges = _stack()
    if not ranges:
        raise RuntimeError("flow.profiler.range_pop: no range is open (range_push first)")
    lib = _library()
    if lib is not None:
        lib.nvtxRangePop()
    return ranges.pop()


def nvtx_start(x, mark_prefix, name=None):
    """`x` unchanged; OneFlow marks the start of range `mark_prefix` here on the GPU."""
    return identity(x, name=name)


def nvtx_end(x, mark_prefix, name=None):
    """`x` unchanged; OneFlow marks the end of range `mark_prefix` here on the GPU."""
    return identity(x, name=name)


__getattr__ = missing_api("flow.profiler")
