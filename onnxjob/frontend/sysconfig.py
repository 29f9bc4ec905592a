"""`flow.sysconfig`: what this installation was built with, as OneFlow's build flags say.

The answers describe onnxjob's runtime, onnxruntime: CUDA means onnxruntime's CUDA
execution provider is installed. The paths and flags for compiling C++ ops against
OneFlow (get_include, get_lib, get_compile_flags, get_link_flags) are refused
(frontend/refusals.py): onnxjob has no C++ library to build against.
"""
from onnxjob.errors import missing_api


def with_cuda():
    """Whether the installed onnxruntime has the CUDA execution provider (onnxruntime-gpu)."""
    import onnxruntime
    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def get_cuda_version():
    """The CUDA version onnxruntime was built for, as OneFlow's CUDA_VERSION integer
    (1000 * major + 10 * minor, e.g. 12020 for 12.2); 0 without CUDA, as OneFlow."""
    if not with_cuda():
        return 0
    try:
        from onnxruntime.capi import build_and_package_info as info
        major, minor = (int(p) for p in str(info.cuda_version).split(".")[:2])
    except (ImportError, AttributeError, ValueError):
        return 0
    return 1000 * major + 10 * minor


def with_xla():
    """False: onnxjob has no XLA backend."""
    return False


def has_rpc_backend_grpc():
    """False: onnxjob has no gRPC control plane between machines."""
    return False


def has_rpc_backend_local():
    """True: onnxjob's processes (and its data-parallel ranks) run on this machine."""
    return True


__getattr__ = missing_api("flow.sysconfig")
