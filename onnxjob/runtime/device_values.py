"""Device values that outlive a step, made in the arena the sessions share.

onnxruntime's Python constructors of device values (`OrtValue.ortvalue_from_numpy` and
`ortvalue_from_shape_and_type` on "cuda") allocate from an arena of the Python binding's
own (`GetCudaAllocator` in onnxruntime_pybind_state.cc), not from the arena the CUDA
sessions share (runtime/backend.py). That arena takes no configuration from Python: it
grows by doubling (kNextPowerOfTwo, regions of 1, 2, 4, ... MiB) and never gives memory
back. A train job's variables and optimizer state live in it for the whole run, so
BERT-base's 1.26 GiB of weights and LAMB slots leave up to twice that reserved there,
beside the sessions' arena.

`place(array)` makes such a value with a one-node session (Identity) on the shared arena
(which no session that captures CUDA graphs uses: runtime/backend.py create_session)
instead: the session's output, bound to the device, is allocated by the session's
allocator, the shared one, which grows by exactly the size asked. The host-to-device copy
passes through one transient tensor of the value's size, which the arena reuses for the
next value. Where the shared arena is off (ONNXJOB_CUDA_SHARED_ARENA=0) or onnxruntime
refused it, `place` returns None and the caller keeps the binding's constructor; values
made each step (feeds, a host run's results) keep it too: a session run per value would
cost more there than the arena saves.
"""
import threading

import numpy as np
import onnxruntime as ort
from onnx import helper

_sessions = {}      # (device, device id, ONNX element type) -> session, or None (no shared arena)
_lock = threading.Lock()
_CUDA, _CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def place(array, device, device_id, shared_options):
    """An OrtValue on `device` holding a copy of `array`, allocated from the arena the
    sessions share; None where they share none (the caller then makes it as before).
    `shared_options()` gives the session options of a session on that arena, or None
    where there is none (runtime/backend.py `shared_arena_options`)."""
    array = np.asarray(array, order="C")    # (np.ascontiguousarray would make 0-d 1-d)
    session = _identity_session(device, device_id, array.dtype, shared_options)
    if session is None:
        return None
    binding = session.io_binding()
    binding.bind_cpu_input("x", array)
    binding.bind_output("y", device, device_id)
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0]


def _identity_session(device, device_id, dtype, shared_options):
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    key = (device, device_id, elem_type)
    with _lock:
        if key not in _sessions:
            _sessions[key] = _make_session(device, device_id, elem_type, shared_options())
        return _sessions[key]


def _make_session(device, device_id, elem_type, options):
    if options is None:
        return None
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "onnxjob_place",
        [helper.make_tensor_value_info("x", elem_type, None)],
        [helper.make_tensor_value_info("y", elem_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    providers = [(_CUDA, {"device_id": str(device_id)})] if device == "cuda" else [_CPU]
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except Exception:   # onnxruntime's own error types (a dtype its Identity does not take)
        return None
    if device == "cuda" and _CUDA not in session.get_providers():
        return None
    return session


def reset():
    """Forget the sessions (tests: another arena configuration)."""
    with _lock:
        _sessions.clear()
