"""One region of the shared arena made ahead of a train step, sized by its memory plan.

onnxjob's sessions share one arena per device that grows by exactly the size asked
(runtime/backend.py). Grown tensor by tensor over a step, it ends up as many regions that
never merge: a step's tensors then take more than the plan's peak (graph/memory_plan.py),
because a freed chunk of one region cannot serve a request that two neighbouring regions
could. onnxruntime sizes a first region up front only for its doubling growth
(`initial_chunk_size_bytes`), where a later miss doubles the arena. Here a tiny session
on the shared arena makes one tensor of the plan's peak and drops it, before the first
train session runs: the arena keeps that region, the step's tensors are cut from it (best
fit, split and merged within the region), and a step that needs more still grows by exactly
the size asked. graph/arena_model.py replays both for a plan, which picks the region's size
(`region_bytes`): ResNet50's batch-64 AMP step compiled for CUDA reserves 3579 MiB grown
tensor by tensor and 2816 MiB with a first region of the plan's peak (2692 MiB). On the CPU
(bench/bench_memory.py's way, ru_maxrss), ResNet50's batch-16 train process peaked at 2375
MiB with the region and 2489 MiB without, in the same step time.
"""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

_reserved = {}      # device -> bytes of the region made ahead (once per process)


def done(device):
    """Whether this process's arena on `device` got its region already."""
    return device in _reserved


def reserve(device, nbytes, session_options, providers):
    """Make one region of `nbytes` in the shared arena of `device`, once per process (the
    first call's size stays; a later call does nothing). `session_options` must share the
    environment's allocator (session.use_env_allocators); `providers` put the session on
    `device`. Returns the bytes reserved by this call (0 when it did nothing)."""
    if done(device):
        return 0
    elements = region_elements(nbytes)
    _reserved[device] = elements * 8
    if elements == 0:
        return 0
    session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session_options.log_severity_level = 4     # (a refused region is not the user's error)
    try:
        sess = ort.InferenceSession(_region_model().SerializeToString(), session_options,
                                    providers=providers)
        sess.run(None, {"size": np.array([elements], dtype=np.int64)})
    except Exception:   # onnxruntime's own error types: the arena's bound, the device's memory
        # (only the layout is lost: the step then asks as it goes, and a step that cannot
        # get its memory says so itself, runtime/out_of_memory.py)
        _reserved[device] = 0
        return 0
    return elements * 8


_MAX_ELEMENTS = 2 ** 31 - 1


def region_elements(nbytes):
    """The int64 elements of a region of about `nbytes` (0: none). CUDA kernels index a
    tensor's elements with 32-bit integers (ConstantOfShape's fill of a 2.8 GB uint8 tensor
    read out of bounds on an H200 and left the CUDA context unusable), so the region is
    made of 8-byte elements and never more than 2**31 - 1 of them (16 GiB): a larger plan
    gets no region ahead rather than one in pieces."""
    elements = -(-max(int(nbytes), 0) // 8)
    return elements if elements <= _MAX_ELEMENTS else 0


def _region_model():
    """size (1,) int64 -> the shape of an int64 tensor of `size` elements made on the device
    (ConstantOfShape) and dropped: only its allocation matters."""
    made = helper.make_node("ConstantOfShape", ["size"], ["region"],
                            value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
    shape = helper.make_node("Shape", ["region"], ["shape"])
    graph = helper.make_graph(
        [made, shape], "onnxjob_arena_region",
        [helper.make_tensor_value_info("size", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def region_bytes(compiled, device, in_place=()):
    """Bytes of the region to make ahead of `compiled`'s steps on `device`, or 0: of the
    candidates (none, or 1, 1.05, 1.1 times the planned peak of the step's intermediates in
    the order a `device` session runs them: graph/memory_plan.py), the one after which the
    arena, as graph/arena_model.py replays the step, holds the least. NOTE: a region can
    lose: a request that fits none of its free chunks grows the arena by its whole size
    (LeNet's train step: 137 MiB with a region of its peak, 98 MiB without)."""
    from onnxjob.graph import arena_model, memory_plan
    plan = memory_plan.plan_of(compiled, device, in_place)
    candidates = [0] + [int(plan.peak_bytes * f) for f in CANDIDATES]
    held = arena_model.reserved_after_regions(plan, candidates)
    return min(candidates, key=lambda n: (held[n], n))


CANDIDATES = (1.0, 1.05, 1.1)      # region sizes tried, in units of the planned peak


def reset():
    """Forget what was reserved (tests: a fresh process's state)."""
    _reserved.clear()
