"""onnxruntime sessions: provider choice, fallback checks, and IOBinding runs."""
import functools
import os
import re

import numpy as np
import onnxruntime as ort

from onnxjob.errors import DeviceUnavailableError, TraceError

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"


@functools.lru_cache(maxsize=None)
def cuda_usable():
    """True when the CUDA EP really loads (onnxruntime-gpu lists it even without CUDA)."""
    if CUDA not in ort.get_available_providers():
        return False
    if os.environ.get("ONNXJOB_DEVICE", "").lower() == "cpu":
        return False
    try:
        from onnx import helper, TensorProto
        g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        # the failed library load is logged by the default logger, not the session's
        ort.set_default_logger_severity(4)
        try:
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=[CUDA, CPU])
        finally:
            ort.set_default_logger_severity(2)
        return CUDA in sess.get_providers()
    except Exception:
        return False


def choose_device(requested=None):
    """'cuda' or 'cpu'. `requested` is the user's explicit wish (None = whatever is best)."""
    requested = (requested or os.environ.get("ONNXJOB_DEVICE") or "").lower() or None
    if requested in ("cuda", "gpu"):
        if not cuda_usable():
            raise DeviceUnavailableError(
                "a GPU was requested (execution_provider('cuda') or ONNXJOB_DEVICE=cuda) but "
                "onnxruntime cannot use the CUDA execution provider here: "
                f"available providers {ort.get_available_providers()}; check that the CUDA 12 "
                "and cuDNN 9 libraries are installed (pip install 'onnxruntime-gpu[cuda,cudnn]')")
        return "cuda"
    if requested not in (None, "cpu"):
        raise ValueError(f"unknown device {requested!r}: use 'cpu' or 'cuda'")
    return "cuda" if requested is None and cuda_usable() else "cpu"


def cuda_provider_options(config):
    """CUDA EP options from a job's function_config.

    `cudnn_conv_algo_search("EXHAUSTIVE"|"HEURISTIC"|"DEFAULT")`: onnxruntime's default,
    EXHAUSTIVE, benchmarks every algorithm on the first run (slow start, fastest steps).
    """
    options = {}
    search = config.get("cudnn_conv_algo_search")
    if search is not None:
        search = str(search).upper()
        if search not in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"):
            raise ValueError(f"cudnn_conv_algo_search must be EXHAUSTIVE, HEURISTIC or DEFAULT, "
                             f"got {search!r}")
        options["cudnn_conv_algo_search"] = search
    return options


def session_options(is_train, threads=None):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = threads or int(os.environ.get("ONNXJOB_NUM_THREADS", "0"))
    if threads:
        opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    return opts


def create_session(model_bytes, device, is_train, cuda_options=None):
    """An InferenceSession on `device`, checked: no silent CPU fallback."""
    opts = session_options(is_train)
    providers = [(CUDA, cuda_options or {}), CPU] if device == "cuda" else [CPU]
    # NOTE: EliminateDropout removes a Dropout whose mask is unused even in training mode;
    # train graphs must keep dropping, so it is disabled for them.
    disabled = ["EliminateDropout"] if is_train else None
    sess = ort.InferenceSession(model_bytes, opts, providers=providers,
                                disabled_optimizers=disabled)
    if device == "cuda" and CUDA not in sess.get_providers():
        raise DeviceUnavailableError(f"onnxruntime fell back to {sess.get_providers()} although "
                                     "the CUDA execution provider was requested")
    return sess


_NODE_NAME = re.compile(r"node with name '([^']*)'")


def session_error(error, model):
    """onnxruntime's refusal of a job graph, as a TraceError at the user's line of the op
    it names (or None when the message names no node of `model`)."""
    found = _NODE_NAME.search(str(error))
    if not found:
        return None
    for node in model.graph:
        if node.name == found.group(1):
            types = ", ".join(str(v.type) if v is not None else "-" for v in node.inputs)
            return TraceError(f"onnxruntime cannot run {node.op_type} on inputs ({types}): "
                              f"{str(error).strip()}",
                              location=node.metadata_props.get("source", "<unknown>"))
    return None


def to_device(array, device):
    """The stored form of a variable value on `device`: a CUDA OrtValue, or on the CPU an
    owned C-contiguous array (a copy, so later changes to `array` do not leak in)."""
    if device == "cuda":
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", 0)
    return np.array(array, order="C", copy=True)


def from_host(array, device):
    """Stored form of an array onnxruntime just returned (owned already: no copy on CPU)."""
    return array if device != "cuda" else ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0)


def host_array(stored):
    """A NumPy view of a stored variable value (copied from the device for CUDA)."""
    return stored if isinstance(stored, np.ndarray) else stored.numpy()
