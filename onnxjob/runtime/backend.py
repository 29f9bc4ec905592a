"""onnxruntime sessions: provider choice, fallback checks, and IOBinding runs."""
import functools
import os
import re
import sys
import threading
import warnings

import numpy as np


@functools.lru_cache(maxsize=None)
def check_one_onnxruntime():
    """Say once, on stderr, when both the onnxruntime and the onnxruntime-gpu wheels are
    installed: they share one onnxruntime/ folder, so the files that import are a mix of
    whichever was installed last. Checked before onnxruntime is first imported."""
    from importlib import metadata
    installed = []
    for name in ("onnxruntime", "onnxruntime-gpu"):
        try:
            metadata.version(name)
            installed.append(name)
        except metadata.PackageNotFoundError:
            pass
    if len(installed) < 2:
        return None
    message = ("onnxjob: both onnxruntime and onnxruntime-gpu are installed; they share one "
               "onnxruntime/ folder and must not be installed together. Keep one: "
               "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu "
               "(or onnxruntime for the CPU)")
    print(message, file=sys.stderr)
    return message


check_one_onnxruntime()

import onnxruntime as ort  # noqa: E402  (after the check above)

from onnxjob import settings  # noqa: E402
from onnxjob.errors import DeviceUnavailableError, JobRunError, TraceError  # noqa: E402
from onnxjob.graph.tracer import FAILURE  # noqa: E402
from onnxjob.runtime import (  # noqa: E402
    arena_reserve, cuda_libraries, custom_op_libraries, device_values, graph_order,
    session_cache)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
# the key under which cuda_provider_options carries a job's TensorRT options to
# create_session (which takes it out: it is no CUDA EP option)
TENSORRT_REQUEST = "onnxjob.tensorrt"


@functools.lru_cache(maxsize=None)
def cuda_usable():
    """True when the CUDA EP really loads (onnxruntime-gpu lists it even without CUDA)."""
    if CUDA not in ort.get_available_providers():
        return False
    if settings.get("DEVICE") == "cpu":
        return False
    cuda_libraries.preload()
    try:
        return CUDA in _quiet_probe_session([CUDA, CPU]).get_providers()
    except Exception:
        return False


def _quiet_probe_session(providers, **kwargs):
    """A session of a one-node model on `providers`, with onnxruntime's logging off."""
    from onnx import helper, TensorProto
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    # a failed library load is logged by the default logger, not the session's
    ort.set_default_logger_severity(4)
    try:
        with warnings.catch_warnings():     # "Specified provider ... is not available"
            warnings.simplefilter("ignore")
            return ort.InferenceSession(model.SerializeToString(), opts, providers=providers,
                                        **kwargs)
    finally:
        ort.set_default_logger_severity(2)


@functools.lru_cache(maxsize=None)
def tensorrt_start_failure():
    """None when onnxruntime's TensorRT EP starts a session here, else why not.
    NOTE: onnxruntime-gpu lists TensorrtExecutionProvider whether or not TensorRT's own
    libraries are installed; asked once per process, so that a job whose TensorRT cannot
    start is planned for the CUDA EP (CUDA graphs included) from the start."""
    try:
        session = _quiet_probe_session([TENSORRT, CUDA, CPU], enable_fallback=0)
    except (ValueError, RuntimeError) as e:     # onnxruntime's own error types
        text = str(e).strip()
        return (text.splitlines()[0] if text else type(e).__name__)[:200]
    if TENSORRT not in session.get_providers():
        return "onnxruntime could not load it (TensorRT's libraries?)"
    return None


@functools.lru_cache(maxsize=None)
def warn_gpu_unused():
    """Say once, on stderr, that a GPU is present but onnxruntime cannot use it, and why."""
    if settings.get("DEVICE") == "cpu" or not cuda_libraries.gpu_present():
        return None
    reason = cuda_libraries.provider_load_error() or (
        "the CUDA execution provider failed to start a session")
    message = (f"onnxjob: this machine has an NVIDIA GPU but onnxruntime cannot use it: "
               f"{reason}. Running on the CPU (ONNXJOB_DEVICE=cpu silences this).")
    print(message, file=sys.stderr)
    return message


def choose_device(requested=None):
    """'cuda' or 'cpu'. `requested` is the user's explicit wish (None = whatever is best)."""
    requested = (requested or settings.get("DEVICE") or "").lower() or None
    if requested in ("cuda", "gpu"):
        if not cuda_usable():
            reason = cuda_libraries.provider_load_error() or (
                f"available providers {ort.get_available_providers()}")
            raise DeviceUnavailableError(
                "a GPU was requested (execution_provider('cuda') or ONNXJOB_DEVICE=cuda) but "
                f"onnxruntime cannot use the CUDA execution provider here: {reason}")
        return "cuda"
    if requested not in (None, "cpu"):
        raise ValueError(f"unknown device {requested!r}: use 'cpu' or 'cuda'")
    if requested is None:
        if cuda_usable():
            return "cuda"
        warn_gpu_unused()
    return "cpu"


# this process's GPU: 0, or a data-parallel rank's own (runtime/distributed.py use_device)
_cuda_device = [0]


def use_cuda_device(device_id):
    """Run this process's CUDA sessions, and keep its variables, on GPU `device_id` (a
    data-parallel rank's, LOCAL_RANK's: runtime/distributed.py)."""
    _cuda_device[0] = int(device_id)


def cuda_device_id():
    """The GPU this process's CUDA sessions and variables are on (0 unless a
    data-parallel rank was bound to another)."""
    return _cuda_device[0]


def cuda_provider_options(config, tf32=None):
    """CUDA EP options from a job's function_config and the process's TF32 choice.

    `cudnn_conv_algo_search("EXHAUSTIVE"|"HEURISTIC"|"DEFAULT")`: onnxruntime's default,
    EXHAUSTIVE, benchmarks every algorithm on the first run (slow start, fastest steps).
    Where it is unset, OneFlow's `cudnn_conv_heuristic_search_algo(True|False)`, when the
    job sets it, asks for HEURISTIC (cuDNN's own pick, no benchmarking: OneFlow's default)
    or EXHAUSTIVE; a job that sets neither gets onnxruntime's default.
    `tf32` (flow.config.enable_tensor_float_32_compute, else ONNXJOB_CUDA_TF32=0/1, else
    onnxruntime's default: on) lets convolutions and matmuls round inputs to TF32.
    OneFlow's `cudnn_buf_limit_mbyte(n)` bounds cuDNN's workspaces: onnxruntime offers two
    bounds, 32 MiB (`cudnn_conv_use_max_workspace` 0) or whatever the fastest algorithm
    asks (1, its default), so a job that sets a limit gets the 32 MiB one (said once when
    n is smaller still); unset, onnxruntime's default stands. The arena grows by exactly
    the size requested, as the CPU's (`_exact_cpu_arena`), bounded by
    flow.config.device_memory_limit_mbyte (`memory_limit_bytes`).
    `function_config.cuda_provider_options({name: value})` adds onnxruntime's own CUDA EP
    options (e.g. "prefer_nhwc": "1"), over onnxjob's choices.
    """
    options = {"arena_extend_strategy": "kSameAsRequested"}
    if cuda_device_id():
        options["device_id"] = str(cuda_device_id())
    if memory_limit_bytes():
        options["gpu_mem_limit"] = str(memory_limit_bytes())
    if tf32 is None:
        tf32 = settings.get("CUDA_TF32")
    if tf32 is not None:
        options["use_tf32"] = "1" if tf32 else "0"
    search = config.get("cudnn_conv_algo_search")
    heuristic = config.get("cudnn_conv_heuristic_search_algo")
    if search is None and heuristic is not None:
        search = "HEURISTIC" if heuristic else "EXHAUSTIVE"
    if search is not None:
        search = str(search).upper()
        if search not in ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"):
            raise ValueError(f"cudnn_conv_algo_search must be EXHAUSTIVE, HEURISTIC or DEFAULT, "
                             f"got {search!r}")
        options["cudnn_conv_algo_search"] = search
    workspace_limit = config.get("cudnn_buf_limit_mbyte")
    if workspace_limit is not None:
        options["cudnn_conv_use_max_workspace"] = "0"
        if workspace_limit < SMALL_CUDNN_WORKSPACE_MBYTE:
            say_workspace_bound(int(workspace_limit))
    for key, value in (config.get("cuda_provider_options") or {}).items():
        options[str(key)] = str(value)      # the user's own onnxruntime options last
    if config.get("use_tensorrt"):
        options[TENSORRT_REQUEST] = tensorrt_provider_options(config)
    return options


# onnxruntime's cuDNN workspace bound with cudnn_conv_use_max_workspace=0
SMALL_CUDNN_WORKSPACE_MBYTE = 32


@functools.lru_cache(maxsize=None)
def say_workspace_bound(limit_mbyte):
    """Say once that onnxruntime's smallest cuDNN workspace bound is above `limit_mbyte`."""
    print(f"onnxjob: function_config.cudnn_buf_limit_mbyte({limit_mbyte}): onnxruntime bounds "
          f"cuDNN's workspaces at {SMALL_CUDNN_WORKSPACE_MBYTE} MiB at the least; that bound "
          "is used", file=sys.stderr)
    return limit_mbyte


# flow.config.device_memory_limit_mbyte, in bytes (None: no limit); set by Session.start
_memory_limit = [None]


def set_memory_limit(mbyte):
    """Bound the memory onnxruntime's arenas may take (flow.config.device_memory_limit_mbyte;
    None: unbounded): each CUDA session's arena, and the CPU arena the process's CPU
    sessions share (registered with the first of them, so the bound in force then stays)."""
    _memory_limit[0] = None if mbyte is None else int(mbyte) << 20


def memory_limit_bytes():
    """The arena bound set by `set_memory_limit`, in bytes, or None."""
    return _memory_limit[0]


def tensorrt_provider_options(config):
    """TensorRT EP options for a job with `function_config.use_tensorrt(True)`: its engines
    cached under onnxjob's cache folder (runtime/session_cache.py; none when the cache is
    off) and, for a job under float16 AMP or with `tensorrt.use_fp16()`, TensorRT free to
    run float32 layers in float16."""
    options = {}
    folder = session_cache.cache_dir()
    if folder:
        options["trt_engine_cache_enable"] = "1"
        options["trt_engine_cache_path"] = os.path.join(folder, "tensorrt")
    if config.get("tensorrt.use_fp16") or (
            config.get("enable_auto_mixed_precision") and
            config.get("mixed_precision_data_type", "float16") == "float16"):
        options["trt_fp16_enable"] = "1"
    return options


@functools.lru_cache(maxsize=None)
def say_tensorrt(message):
    """Say `message` (why a job with use_tensorrt(True) runs without TensorRT) once, on
    stderr."""
    print(f"onnxjob: function_config.use_tensorrt(True): {message}", file=sys.stderr)
    return message


def _tensorrt_providers(tensorrt, device, is_train):
    """The TensorRT EP entry (name, options) to put first for a session, or None, having
    said why (once) when a job asked for TensorRT and does not get it."""
    if tensorrt is None:
        return None
    runs_on = CUDA if device == "cuda" else CPU
    if is_train:
        say_tensorrt(f"TensorRT runs predict jobs only; train jobs run on {runs_on}")
        return None
    if TENSORRT not in ort.get_available_providers():
        say_tensorrt(f"onnxruntime's {TENSORRT} is not available here (this onnxruntime "
                     f"has {', '.join(ort.get_available_providers())}); the job runs on "
                     f"{runs_on}")
        return None
    if device != "cuda":
        say_tensorrt(f"TensorRT needs the GPU and this session runs on the CPU "
                     f"(no usable CUDA, or execution_provider('cpu') / ONNXJOB_DEVICE=cpu); "
                     f"the job runs on {CPU}")
        return None
    failure = tensorrt_start_failure()
    if failure is not None:
        say_tensorrt(f"{TENSORRT} failed to start ({failure}); the job runs on {CUDA}")
        return None
    if tensorrt.get("trt_engine_cache_path"):
        os.makedirs(tensorrt["trt_engine_cache_path"], exist_ok=True)
    return (TENSORRT, dict(tensorrt))


# NOTE: onnxruntime's optimizer runs ~45 graph transformers, each walking the whole graph
# at least twice (~10 ms a walk on ResNet50's train graph). These rewrite quantized (Q/DQ)
# graphs and LLM attention, which onnxjob never emits; leaving them out cut ResNet50's train
# session creation from 1.05-1.13 s to 0.81-0.88 s. (Unknown names are ignored.)
NEVER_MATCHING_TRANSFORMERS = [
    "DoubleQDQPairsRemover", "EnsureUniqueDQForNodeUnit", "QDQPropagationTransformer",
    "QDQSelectorActionTransformer", "QDQS8ToU8Transformer", "QDQFinalCleanupTransformer",
    "WeightBiasQuantization", "WhereDummyDq", "MatMulIntegerToFloatFusion",
    "DynamicQuantizeMatMulFusion", "MatMulNBitsFusion", "GroupQueryAttentionFusion",
    "GroupQueryAttentionPreNormFusion"]


# NOTE: these walk a train graph and never rewrite it: they fuse forward chains (layer norm,
# GELU, attention, bias + activation) whose inner values a train graph keeps for the
# backward pass. In the whole test suite's CPU train sessions (every zoo model, BERT,
# Wide & Deep, DCGAN, each op's gradient check) none of them modified a graph; ResNet50's
# train session spent ~270 ms in them.
TRAIN_NEVER_MATCHING_TRANSFORMERS = [
    "AttentionFusion", "BiasDropoutFusion", "BiasGeluFusion", "BiasSkipLayerNormFusion",
    "BiasSoftmaxFusion", "ConvActivationFusion",
    "EmbedLayerNormFusion", "FastGeluFusion", "GatherSliceToSplitFusion",
    "GatherToSliceFusion", "LayerNormFusionL1", "MatMulActivationFusion",
    "QuickGeluFusion", "SimplifiedLayerNormFusion", "SkipLayerNormFusion",
    "SliceConcatToSpaceToDepthFusion"]


def optimization_level(is_train, device):
    """onnxruntime's graph optimization level for a session.

    CPU train graphs stop at EXTENDED: the one thing ALL adds to them is the blocked
    (NCHWc) layout, which onnxruntime applies only to convolutions with constant weights,
    and a train graph feeds its weights (in ResNet50's it reorders the global average
    pool, nothing else). EXTENDED is kept for its MatMul + Transpose fusion (FusedMatMul):
    ResNet50's train step ran 3% slower at BASIC (bench_variants.py). Predict graphs keep
    ALL: frozen, their convolutions are blocked.
    """
    if is_train and device == "cpu":
        return ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def disabled_transformers(is_train, device):
    """The onnxruntime graph transformers a session leaves out (by name)."""
    # NOTE: EliminateDropout removes a Dropout whose mask is unused even in training mode;
    # train graphs must keep dropping, so it is disabled for them.
    disabled = (["EliminateDropout"] if is_train else []) + NEVER_MATCHING_TRANSFORMERS
    if is_train:
        # NOTE: onnxruntime's CSE merges a value made again after the step's peak
        # (passes/recompute_cheap_values.py) with the forward's, which then lives across
        # the peak: BERT-base's float32 step at batch 32 peaked at 3491 MiB with it and
        # 2335 without (its plan: 2362). The pipeline runs its own CSE before that pass.
        disabled += ["CommonSubexpressionElimination"]
    if is_train and device == "cpu":
        disabled += TRAIN_NEVER_MATCHING_TRANSFORMERS
    return disabled


def session_options(is_train, threads=None, device="cpu", deterministic=False,
                    shared_arena=True):
    """onnxjob's session options for a `device` session. `shared_arena=False`: the session
    keeps an arena of its own even where the sessions of its device share one (a session
    that captures CUDA graphs: `create_session`)."""
    opts = ort.SessionOptions()
    custom_op_libraries.register_in(opts)   # the libraries of custom ops a program defined
    # deterministic kernels (cuDNN algorithms, no atomics where onnxruntime has a choice)
    opts.use_deterministic_compute = bool(
        deterministic or settings.get("DETERMINISTIC"))
    opts.graph_optimization_level = optimization_level(is_train, device)
    # NOTE: sessions run their nodes in onnxruntime's default order (a depth-first walk back
    # from the outputs), which follows what the graph reads, but a CUDA train session,
    # which runs the optimized graph put back in the graph's own order (runtime/
    # graph_order.py, `optimized_session`). The priority-based order alone
    # (Kahn's algorithm, ties by node index) ran a CUDA-form train graph in its own order
    # only until onnxruntime's optimizer made a node (a fusion's Gemm or FusedMatMul): new
    # nodes take the highest indices, so while one waited, every node ready earlier in the
    # graph ran first, the update's passes over the variables and the values recomputed
    # after the peak among them. ResNet50's float32 step at batch 16 then peaked at 2505
    # MiB where its plan says 1335 (as run on the CPU EP with CUDA's options and profiled:
    # runtime/executed_plan.py); in the default order it peaked at 1328.
    threads = threads or settings.get("NUM_THREADS")
    if threads:
        opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    # Idle intra-op threads spin at most ONNXJOB_SPIN_US (100) microseconds before they
    # sleep: onnxruntime's default spinning kept both cores busy for tens of milliseconds
    # after a run, slowing whatever the caller did next (a data pipeline, PyTorch: its doc
    # MLP step took 10 ms instead of 1.4 right after an onnxjob step); a step's own ops
    # follow each other within microseconds, so they still find the threads awake.
    opts.add_session_config_entry("session.intra_op.spin_duration_us",
                                  str(settings.get("SPIN_US")))
    if is_train:
        # The memory pattern plans one block for every intermediate of the run and keeps it
        # beside the arena: a ResNet50 batch-32 train step on the CPU peaked at 7.2 GB with
        # it and 4.7 GB without (PyTorch: 4.2 GB), at the same step time
        # (bench/bench_memory.py). Off on every device, so that a step holds what
        # graph/memory_plan.py plans on the CPU and on CUDA alike.
        opts.enable_mem_pattern = False
    if not shared_arena:
        return opts
    if device == "cpu" and _exact_cpu_arena(memory_limit_bytes()) or \
            device == "cuda" and settings.get("CUDA_SHARED_ARENA") and \
            _shared_cuda_arena(memory_limit_bytes()):
        opts.add_session_config_entry("session.use_env_allocators", "1")
    return opts


# the shared arenas' registrations: {device: (limit it was made with, registered)}
_shared_arenas = {}
# (initial values are placed from a worker thread while sessions are made: one registration)
_shared_arenas_lock = threading.Lock()


def _shared_arena(device, register, limit):
    """Register, once per process, the arena `device`'s sessions share with
    `register(arena_config)`, bounded by `limit` bytes (None: unbounded); whether it is
    registered. The first registration's bound stays: a later, other bound is said once
    (only where the arena exists, so the line never names an arena that was refused)."""
    with _shared_arenas_lock:
        if device in _shared_arenas:
            made_with, registered = _shared_arenas[device]
            if registered and limit != made_with:
                _say_arena_bound(device.upper(), made_with)
            return registered
        try:
            register(_exact_arena_config(limit))
            registered = True
        except Exception as e:     # onnxruntime's own error types
            registered = False
            if device == "cuda":    # (a refused CPU arena: another CPU allocator is registered)
                print(f"onnxjob: onnxruntime did not make the shared CUDA arena "
                      f"({str(e).strip()[:200]}); each CUDA session keeps its own",
                      file=sys.stderr)
        _shared_arenas[device] = (limit, registered)
        return registered


def _exact_cpu_arena(limit=None):
    """Register, once per process, the CPU arena that onnxjob's CPU sessions share, bounded
    by `limit` bytes (`_shared_arena`); False where onnxruntime refuses (another CPU
    allocator is registered already).

    It grows by exactly the size requested (onnxruntime's default doubles each new region),
    so a step's regions are the sizes its tensors need and the next steps reuse them: a
    ResNet50 batch-32 train step peaked at 4.2 GB from the first step on, where each
    session's own doubling arena went 3.5, 3.8, 3.9, then 4.4 GB from the fourth step on
    (PyTorch: 4.1-4.3 GB; bench_memory.py). Step times were the same or 1-4% shorter.
    Shared, a predict job run between train steps reuses the train step's memory: ResNet50
    at batch 32, train + predict, peaked at 4.6 GB instead of 5.1 GB.
    """
    memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0,
                               ort.OrtMemType.DEFAULT)
    return _shared_arena(
        "cpu", functools.partial(ort.create_and_register_allocator, memory), limit)


def _exact_arena_config(limit):
    """The shared arenas' configuration: growth by exactly the size requested
    (kSameAsRequested), bounded by `limit` bytes (None: unbounded)."""
    config = {"arena_extend_strategy": 1}
    if limit:
        config["max_mem"] = int(limit)
    return ort.OrtArenaCfg(config)


def _shared_cuda_arena(limit=None):
    """Register, once per process, one CUDA arena (this process's GPU) that CUDA sessions
    share, growing by exactly the size requested and bounded by `limit` bytes as
    cuda_provider_options bounds each session's (ONNXJOB_CUDA_SHARED_ARENA, on by default;
    `_shared_arena`); False, said once, where onnxruntime refuses. With the region made
    ahead (runtime/arena_reserve.py) an H200 held 3.55 GiB for ResNet50's batch-64 AMP step
    instead of 4.44 (PyTorch: 4.02), BERT-base AMP 5.48 instead of 5.60, at the same step
    time; shared alone, without the region, it held the same as each session's own arena."""
    device_id = cuda_device_id() or 0
    memory = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device_id,
                               ort.OrtMemType.DEFAULT)
    return _shared_arena("cuda", functools.partial(
        ort.create_and_register_allocator_v2, CUDA, memory, {"device_id": str(device_id)}),
        limit)


@functools.lru_cache(maxsize=None)
def _say_arena_bound(kind, made_with):
    bound = "no bound" if made_with is None else f"{made_with >> 20} MiB"
    print(f"onnxjob: the {kind} sessions of this process share one arena, made by the first "
          f"of them with {bound}; flow.config.device_memory_limit_mbyte set since then does "
          f"not change it", file=sys.stderr)


def create_session(model_bytes, device, is_train, cuda_options=None, cuda_graph=False,
                   deterministic=False, cached=False, arena_region=None):
    """An InferenceSession on `device`, checked: no silent CPU fallback. `cuda_graph`
    asks the CUDA EP to capture the run as a CUDA graph (runtime/cuda_graph.py); `cached`
    (CPU sessions, and CUDA train sessions) reuses or stores onnxruntime's optimized model
    (runtime/session_cache.py). `arena_region()`, for a train session, gives the bytes of
    a region the shared arena makes before its first step, once per process (runtime/
    arena_reserve.py; 0: none).

    A session that captures CUDA graphs keeps an arena of its own: a replay writes its
    intermediates where the capture put them, memory the arena counts as free between
    runs (onnxruntime frees a run's intermediates as usual and does not keep the captured
    graph's apart). In an arena other sessions share, a value that outlives a run (a
    variable loaded or placed later, another job's new state) could be given that memory
    and be overwritten by the next replay; in the session's own arena nothing else
    allocates (its inputs and outputs are onnxjob's buffers, runtime/cuda_graph.py)."""
    opts = session_options(is_train, device=device, deterministic=deterministic,
                           shared_arena=not cuda_graph)
    if arena_region is not None and is_train:
        _reserve_arena(opts, device, arena_region, cuda_options)
    cuda_options = dict(cuda_options or {})
    tensorrt = _tensorrt_providers(cuda_options.pop(TENSORRT_REQUEST, None), device, is_train)
    if cuda_graph:
        if tensorrt is not None:
            # the caller says why and asks again without graphs (runtime/session.py)
            raise RuntimeError("CUDA graphs are not captured for a job run by TensorRT "
                               "(function_config.use_tensorrt)")
        cuda_options["enable_cuda_graph"] = "1"
    providers = [(CUDA, cuda_options), CPU] if device == "cuda" else [CPU]
    if tensorrt is not None:
        return _tensorrt_session(model_bytes, opts, [tensorrt] + providers,
                                 disabled_transformers(is_train, device))
    disabled = disabled_transformers(is_train, device)
    cache_path = None
    if cached and (device == "cpu" or in_graph_order(device, is_train)):
        cache_path = session_cache.cached_model_path(
            model_bytes, *_optimizer_choices(opts, is_train, providers, disabled))
    if cache_path is not None and os.path.isfile(cache_path):
        sess = _cached_session(cache_path, model_bytes, is_train, device, deterministic,
                               _uses_shared_arena(opts),
                               providers)
        if sess is not None:
            _check_on_cuda(sess, device)
            return sess
    written = keep = None
    if cache_path is not None and in_graph_order(device, is_train):
        # the cached model is the reordered one the session loads (graph_order.py): a
        # later process loads those same bytes, as this one does, with no optimizer run
        keep = functools.partial(session_cache.publish_bytes, path=cache_path)
    elif cache_path is not None:
        written = opts.optimized_model_filepath = session_cache.writing_to(cache_path)
    sess = optimized_session(model_bytes, opts, providers, disabled, device, is_train, keep)
    if written is not None:
        session_cache.publish(written, cache_path)
    _check_on_cuda(sess, device)
    return sess


def _reserve_arena(opts, device, arena_region, cuda_options):
    """One region of `arena_region()` bytes in the arena sessions with `opts` share
    (runtime/arena_reserve.py), when they share one and ONNXJOB_ARENA_RESERVE is on."""
    if not settings.get("ARENA_RESERVE") or arena_reserve.done(device) or \
            not _uses_shared_arena(opts):
        return
    cuda = {k: v for k, v in (cuda_options or {}).items() if k != TENSORRT_REQUEST}
    providers = [(CUDA, cuda), CPU] if device == "cuda" else [CPU]
    arena_reserve.reserve(device, arena_region(), session_options(False, device=device),
                          providers)


def shared_arena_options(device):
    """Options of a session on the arena `device`'s sessions share, or None where they
    share none (ONNXJOB_CUDA_SHARED_ARENA=0, a refused registration)."""
    opts = session_options(False, device=device)
    return opts if _uses_shared_arena(opts) else None


def _uses_shared_arena(opts):
    # onnxruntime raises for a key never set (CUDA sessions without the shared arena)
    try:
        return opts.get_session_config_entry("session.use_env_allocators") == "1"
    except RuntimeError:
        return False


def _check_on_cuda(sess, device):
    if device == "cuda" and CUDA not in sess.get_providers():
        raise DeviceUnavailableError(f"onnxruntime fell back to {sess.get_providers()} although "
                                     "the CUDA execution provider was requested")


def in_graph_order(device, is_train):
    """Whether a `device` session runs the optimized graph in the graph's own order
    (runtime/graph_order.py): CUDA train sessions."""
    return device == "cuda" and is_train


def optimized_session(model_bytes, opts, providers, disabled, device, is_train, keep=None):
    """The InferenceSession create_session makes for a `device` session, on `providers`
    (unchecked): a CUDA train session runs the optimized graph in the graph's own order
    (runtime/graph_order.py; `keep(bytes)` gets the reordered model it loaded), any other
    in onnxruntime's default order."""
    if not in_graph_order(device, is_train):
        return ort.InferenceSession(model_bytes, opts, providers=providers,
                                    disabled_optimizers=disabled)
    sess = graph_order.session_in_graph_order(model_bytes, opts, providers, disabled,
                                              keep=keep)
    if getattr(sess, "fallback_reason", None):
        _say_order_fallback(sess.fallback_reason)
    return sess


@functools.lru_cache(maxsize=None)
def _say_order_fallback(reason):
    print("onnxjob: onnxruntime could not load its optimized train graph in the graph's own "
          f"order ({reason}); the step runs in onnxruntime's default order, which may hold "
          "more memory than graph/memory_plan.py plans", file=sys.stderr)


def run_function(session, output_names):
    """feeds -> the outputs `output_names` of `session`. On a CPU-only session that is the
    binding's own `run`, without the checks InferenceSession.run makes in Python first
    (1-2 us a call, a few percent of a small model's batch-1 run; bench_serving.py): the
    feeds are NumPy arrays for every input (no OrtValue of another session, no WebGPU
    graph capture; a missing input still raises, from onnxruntime's C++), and a CPU
    session has no other execution provider to fall back to."""
    binding = getattr(getattr(session, "_sess", None), "run", None)
    if binding is None or session.get_providers() != [CPU]:
        return lambda feeds: session.run(output_names, feeds)
    output_names = list(output_names)
    return lambda feeds: binding(output_names, feeds, None)


def _tensorrt_session(model_bytes, opts, providers, disabled):
    """A session on `providers` (TensorRT, CUDA, CPU), on CUDA when TensorRT does not start
    (said once): onnxruntime's own fallback, which prints four lines, is off."""
    try:
        sess = ort.InferenceSession(model_bytes, opts, providers=providers,
                                    disabled_optimizers=disabled, enable_fallback=0)
    except (ValueError, RuntimeError) as e:     # onnxruntime's own error types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        say_tensorrt(f"{TENSORRT} failed to start ({reason[:200]}); the job runs on {CUDA}")
        sess = ort.InferenceSession(model_bytes, opts, providers=providers[1:],
                                    disabled_optimizers=disabled)
    else:
        if TENSORRT not in sess.get_providers():
            # e.g. libnvinfer not found: onnxruntime logs it and goes on without TensorRT
            say_tensorrt(f"onnxruntime could not load {TENSORRT} (TensorRT's libraries?) "
                         f"and runs the job on {sess.get_providers()[0]}")
    if CUDA not in sess.get_providers():
        raise DeviceUnavailableError(f"onnxruntime fell back to {sess.get_providers()} although "
                                     "the CUDA execution provider was requested")
    return sess


def cached_session_path(model_bytes, is_train, deterministic=False):
    """Where create_session(model_bytes, "cpu", is_train, cached=True) keeps the optimized
    model (it may not exist yet), or None when the cache is off."""
    opts = session_options(is_train, device="cpu", deterministic=deterministic)
    return session_cache.cached_model_path(model_bytes, *_optimizer_choices(
        opts, is_train, [CPU], disabled_transformers(is_train, "cpu")))


def _optimizer_choices(opts, is_train, providers, disabled):
    """The session choices that change the model onnxruntime's optimizer writes (the
    session cache's key). NOTE: the thread count is kept although no CPU transformer is
    known to read it: a miss costs one optimization, a wrong hit wrong results."""
    return (is_train, opts.use_deterministic_compute, str(opts.graph_optimization_level),
            opts.intra_op_num_threads, tuple(disabled), repr(providers))


def _cached_session(cache_path, model_bytes, is_train, device, deterministic, shared_arena,
                    providers):
    """A session on the cached optimized model at `cache_path`, or None when the file is
    not a valid entry for `model_bytes` (said in one line; the caller rebuilds it)."""
    cached_opts = session_options(is_train, device=device, deterministic=deterministic,
                                  shared_arena=shared_arena)
    cached_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # onnxruntime writes the optimized model in the order its session ran the nodes;
    # the priority-based order (Kahn's, ties by node index) runs them in that same order
    # again, where the default order (a depth-first walk) does not: a ResNet50 batch-32
    # train step from the cached model peaked at 4.7 GB with it and 3.8-3.9 GB as
    # optimized in memory or with this (bench_memory.py; results bit-identical)
    cached_opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    try:
        sess = ort.InferenceSession(cache_path, cached_opts, providers=providers)
    except Exception as e:      # onnxruntime's own error types: garbage, truncated
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        session_cache.warn_invalid(cache_path, f"onnxruntime cannot load it: {reason[:200]}")
        return None
    problem = (session_cache.stamp_problem(sess.get_modelmeta().custom_metadata_map,
                                           cache_path)
               or session_cache.io_problem(sess, model_bytes))
    if problem is not None:
        session_cache.warn_invalid(cache_path, problem)
        return None
    session_cache.touch(cache_path)
    return sess


_NODE_NAME = re.compile(r"node with name '([^']*)'")
# onnxruntime's words when an allocation fails: its arena's bound (BFCArena), the device's
# memory (cudaMalloc through the arena), cuBLAS/cuDNN workspaces, the host's malloc
_ARENA_BOUND = re.compile(r"Available memory of (\d+) is smaller than requested bytes of (\d+)")
_FAILED_REQUEST = re.compile(r"Failed to allocate memory for requested buffer of size (\d+)")
_OUT_OF_MEMORY = re.compile(r"out of memory|ALLOC_FAILED|bad_alloc|cudaErrorMemoryAllocation",
                            re.IGNORECASE)
_RUNNING_NODE = re.compile(r"while running (\w+) node\. Name:'([^']*)'")


def memory_failure(error):
    """When `error` (raised by an onnxruntime run) says an allocation failed: {"requested":
    bytes or None, "available": bytes left in the arena or None, "op": (op type, node
    name) or None}; else None."""
    text = str(error)
    bound, failed = _ARENA_BOUND.search(text), _FAILED_REQUEST.search(text)
    if not (bound or failed or _OUT_OF_MEMORY.search(text)):
        return None
    running = _RUNNING_NODE.search(text)
    return {"requested": int(bound.group(2)) if bound else
            int(failed.group(1)) if failed else None,
            "available": int(bound.group(1)) if bound else None,
            "op": running.groups() if running else None}


def run_error(error, job_name, model):
    """onnxruntime's failure of a node while running `model` (an onnx_ir Model), as a
    JobRunError at the user's line of the op (None when the message names no node of it:
    e.g. a node onnxruntime's optimizer made)."""
    running = _RUNNING_NODE.search(str(error))
    if not running:
        return None
    op_type, name = running.groups()
    node = _node_named(model, name)
    where = node.metadata_props.get("source") if node is not None else None
    if where is None:
        return None
    failure = node.metadata_props.get(FAILURE)     # (what the node's failure means)
    if failure is not None:
        return JobRunError(f"{where}: job {job_name!r}: {failure} (onnxruntime's {op_type}: "
                           f"{str(error).strip()})")
    return JobRunError(f"{where}: job {job_name!r}: {op_type} failed on this call's values: "
                       f"{str(error).strip()}")


def _node_named(model, name):
    """The node of `model`'s graph named `name`, or None."""
    return next((node for node in model.graph if node.name == name), None)


def session_error(error, model):
    """onnxruntime's refusal of a job graph, as a TraceError at the user's line of the op
    it names (or None when the message names no node of `model`)."""
    found = _NODE_NAME.search(str(error))
    node = _node_named(model, found.group(1)) if found else None
    if node is None:
        return None
    types = ", ".join(str(v.type) if v is not None else "-" for v in node.inputs)
    return TraceError(f"onnxruntime cannot run {node.op_type} on inputs ({types}): "
                      f"{str(error).strip()}",
                      location=node.metadata_props.get("source", "<unknown>"))


def to_device(array, device, fresh=False):
    """The stored form of a variable value on `device`: a CUDA OrtValue, or on the CPU an
    owned C-contiguous array (a copy, so later changes to `array` do not leak in).
    For values that outlive a step (initial, assigned and loaded values); a run's results
    are `from_host`'s. `fresh`: `array` was just made and nothing else holds it, so on the
    CPU it is kept as it is when C-contiguous (initial values: no second pass over it)."""
    if device == "cuda":
        # in the arena the sessions share where there is one (runtime/device_values.py)
        array = np.asarray(array, order="C")
        placed = device_values.place(array, "cuda", cuda_device_id(),
                                     functools.partial(shared_arena_options, "cuda"))
        return placed if placed is not None else \
            ort.OrtValue.ortvalue_from_numpy(array, "cuda", cuda_device_id())
    if fresh and isinstance(array, np.ndarray) and array.flags.c_contiguous:
        return array    # NOTE: not np.ascontiguousarray, which makes a 0-d array 1-d
    return np.array(array, order="C", copy=True)


def from_host(array, device):
    """Stored form of an array onnxruntime just returned (owned already: no copy on CPU)."""
    if device != "cuda":
        return array
    return ort.OrtValue.ortvalue_from_numpy(array, "cuda", cuda_device_id())


def host_array(stored):
    """A NumPy view of a stored variable value (copied from the device for CUDA)."""
    return stored if isinstance(stored, np.ndarray) else stored.numpy()
