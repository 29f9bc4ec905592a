"""`flow.function_config()` and the process-wide `flow.config` / `flow.env` setters."""
import copy
import difflib
import os
import socket
import types
import sys
import traceback
import warnings

import numpy as np

from onnxjob.errors import UnknownFlagError, missing_api
from onnxjob.frontend import ranks, views
from onnxjob.frontend.function_desc import FunctionDesc
from onnxjob.frontend.namespaces import ApiNamespace
from onnxjob.runtime.session import default_session
from onnxjob.source_info import user_location, warn_at_user_line

# OneFlow flags that only tune OneFlow's own runtime (kernels, memory planning, fusion,
# collective grouping): accepted and ignored, since they change no number a job computes.
_IGNORED_FLAGS = {
    "enable_cudnn", "cudnn_conv_force_fwd_algo",
    "cudnn_conv_force_bwd_data_algo", "cudnn_conv_force_bwd_filter_algo",
    "enable_cudnn_fused_normalization_add_relu", "enable_inplace_in_reduce_struct",
    "enable_reused_mem", "enable_nccl", "use_nccl_inter_node_communication",
    "all_reduce_group_num", "all_reduce_lazy_ratio", "all_reduce_group_size_warmup",
    "use_boxing_v2", "enable_fuse_add_to_output",
    "enable_fuse_cast_scale", "enable_gradients_stats_aggregation",
    "concurrency_width", "allow_cpu_return_op",
    "prune_parallel_cast_ops", "prune_cast_to_static_shape_ops",
    # flags of OneFlow 0.1-0.4 (and still accepted by 0.5, some printing "deprecated")
    "disable_all_reduce_sequence", "enable_all_reduce_group",
    "non_distributed_optimizer_group_size_mbyte", "do_parallel_cast_before_widening_type_cast",
    "prune_amp_white_identity_ops", "use_memory_allocation_algorithm_v2", "exp_run_conf",
    "enable_pseudo_chain_merge", "ratio_sequantial_optimizers",
    # read by no pass of OneFlow 0.5 (its SSP stages come from the scope: frontend/ssp.py)
    "ssp_partition_strategy", "ssp_partition_scope_ids",
}
# OneFlow flags that would change a job's numbers or memory semantics and that onnxjob
# does not implement: accepted (so old scripts run) with one warning per flag and process,
# naming what onnxjob does instead. A false value asks for OneFlow's default: no warning.
_UNSUPPORTED_FLAGS = {
    "enable_true_half_config_when_conv": "half convolutions run with onnxruntime's own "
                                         "accumulation type",
    "enable_float_compute_for_half_gemm": "half MatMul/Gemm run with onnxruntime's own "
                                          "accumulation type",
    "use_xla_jit": "XLA is not used; onnxruntime compiles the graph",
    "enable_keep_header_only": "every output keeps its data",
    "enable_non_distributed_optimizer": "each rank keeps the whole optimizer state",
    "optimizer_placement_optimization_mode": "each rank keeps the whole optimizer state",
    "optimizer_placement_optimization_threshold": "each rank keeps the whole optimizer state",
}
# OneFlow's other names of a flag above: the setter takes the same value
_FLAG_ALIASES = {"cudnn_conv_enable_true_half": "enable_true_half_config_when_conv"}
# OneFlow's names that set a flag above to the opposite of their value
_NEGATED_FLAGS = {"cudnn_conv_enable_pseudo_half": "enable_true_half_config_when_conv",
                  "enable_cudnn_conv_pseudo_half": "enable_true_half_config_when_conv"}
_warned_flags = set()


def _unknown_flag(name, known):
    """UnknownFlagError for `function_config.<name>` that OneFlow does not define,
    naming the user's line and the flags of that group (`known`): all of a small group,
    the close spellings of a large one."""
    if len(known) <= 12:
        hint = f"known here: {', '.join(sorted(known))}"
    else:
        close = difflib.get_close_matches(name.rpartition(".")[2], sorted(known), n=3)
        hint = (f"did you mean {' or '.join(close)}?" if close else
                "FunctionConfig's docstring lists the flags onnxjob adds to OneFlow's")
    return UnknownFlagError(
        f"{user_location()}: function_config.{name} is not a OneFlow function_config flag "
        f"({hint})")


def _warn_once(name, message):
    """Warn `message` at the user's line, once per flag `name` and process."""
    if name in _warned_flags:
        return
    _warned_flags.add(name)
    warn_at_user_line(message)


def _warn_unsupported(name, value):
    if value is False or value is None:
        return
    _warn_once(name, f"function_config.{name}({value!r}) is not supported by onnxjob and has "
                     f"no effect: {_UNSUPPORTED_FLAGS[name]}")


_HALF_TYPE_NAMES = {"float16": "float16", "half": "float16", "kFloat16": "float16",
                    "bfloat16": "bfloat16", "kBFloat16": "bfloat16"}


def _half_type_name(value):
    """"float16" or "bfloat16" for flow.float16 / flow.bfloat16 (or their names)."""
    name = getattr(value, "__name__", value)
    if not isinstance(name, str) or name not in _HALF_TYPE_NAMES:
        raise ValueError("mixed_precision_data_type takes flow.float16 or flow.bfloat16, "
                         f"got {value!r}")
    return _HALF_TYPE_NAMES[name]


class _QatConf:
    """`function_config.qat.<name>(value)`: OneFlow's QatConfig (job_conf.proto), read by
    onnxjob/ops/qat.py. Values are checked here, at the user's call."""

    def __init__(self, owner):
        self._owner = owner

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in QAT_DEFAULTS:
            raise _unknown_flag("qat." + name, QAT_DEFAULTS)

        def setter(value=True):
            self._owner.flags["qat." + name] = _qat_value(name, value)
        return setter


# OneFlow 0.5's QatConfig fields and defaults; None: no default (the moving-average
# observers then refuse to be built, as OneFlow's CHECK does)
QAT_DEFAULTS = {"per_channel_weight_quantization": False, "symmetric": True,
                "moving_min_max_momentum": 0.95, "moving_min_max_stop_update_after_iters": None,
                "target_backend": ""}
# "tensorrt7": OneFlow 0.4's spelling of its TensorRT backend (int8 conv2d only), renamed
# "tensorrt" (conv2d and matmul) in 0.5
QAT_BACKENDS = ("", "tensorrt", "cambricon", "tensorrt7")


def _qat_value(name, value):
    if name in ("per_channel_weight_quantization", "symmetric"):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"function_config.qat.{name} takes a bool, got {value!r}")
        return bool(value)
    if name == "moving_min_max_momentum":
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise TypeError(f"function_config.qat.{name} takes a float, got {value!r}")
        return float(np.float32(value))   # a float field of the proto
    if name == "moving_min_max_stop_update_after_iters":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"function_config.qat.{name} takes an int, got {value!r}")
        return int(value)
    if value not in QAT_BACKENDS:
        raise ValueError(f"function_config.qat.target_backend takes one of "
                         f"{', '.join(map(repr, QAT_BACKENDS))} (OneFlow's), got {value!r}")
    return value


class _TensorrtConf:
    """`function_config.tensorrt.<name>(value)`: OneFlow's TensorRT options (its XrtConfig);
    each turns `use_tensorrt` on, as OneFlow's setters do. `use_fp16`: TensorRT may run
    float32 layers in float16 (runtime/backend.py). `use_int8` and `int8_calibration(path)`
    ask for OneFlow's own int8 calibration (XRT's tables), which onnxruntime's TensorRT
    execution provider cannot read: the job runs TensorRT without int8, with one warning."""

    NAMES = ("use_fp16", "use_int8", "int8_calibration")

    def __init__(self, owner):
        self._owner = owner

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self.NAMES:
            raise _unknown_flag("tensorrt." + name, self.NAMES)

        def setter(value=True):
            flags = self._owner.flags
            if name == "int8_calibration":
                # OneFlow asserts this too: a calibration table is for int8 mode
                assert flags.get("tensorrt.use_int8"), \
                    "function_config.tensorrt.int8_calibration needs tensorrt.use_int8() first"
                flags["tensorrt.int8_calibration"] = value
                return
            flags["use_tensorrt"] = True
            flags["tensorrt." + name] = bool(value)
            if name == "use_int8" and value:
                _warn_once("tensorrt.use_int8", f"function_config.tensorrt.use_int8({value!r}): "
                           f"{_NO_INT8}")
        return setter


_NO_INT8 = ("onnxruntime's TensorRT execution provider needs its own int8 calibration table, "
            "not OneFlow's; jobs run on TensorRT without int8 (float32, or float16 with "
            "function_config.tensorrt.use_fp16())")


def cache_int8_calibration():
    """`flow.tensorrt.cache_int8_calibration()`: OneFlow calibrates its TensorRT int8 jobs
    here; onnxjob's run without int8 (see _TensorrtConf), so there is nothing to calibrate.
    Said once, as OneFlow built without TensorRT prints and goes on."""
    _warn_once("flow.tensorrt.cache_int8_calibration",
               f"flow.tensorrt.cache_int8_calibration() does nothing: {_NO_INT8}")


def write_int8_calibration(path):
    """`flow.tensorrt.write_int8_calibration(path)`: OneFlow writes its int8 calibration
    tables to `path`; onnxjob has none (see cache_int8_calibration) and writes nothing."""
    _warn_once("flow.tensorrt.write_int8_calibration",
               f"flow.tensorrt.write_int8_calibration({path!r}) writes nothing: {_NO_INT8}")


# OneFlow's static memory allocation algorithms (MemoryAllocationAlgorithmConf) and whether
# each is on by default; onnxruntime plans a session's memory itself, so the white list is
# kept for the program to read back and changes nothing.
_STATIC_MEM_ALGOS = {"use_mem_size_first_algo": True, "use_mutual_exclusion_first_algo": True,
                     "use_time_line_algo": False}


class _StaticMemPolicyWhiteList:
    """`function_config.static_mem_alloc_policy_white_list.add / remove / has` and its
    `policy_*()` names, as OneFlow's; no effect on onnxruntime's memory planning."""

    def __init__(self, owner):
        self._owner = owner

    @staticmethod
    def policy_mem_size_first():
        return "use_mem_size_first_algo"

    @staticmethod
    def policy_mutual_exclusion_first():
        return "use_mutual_exclusion_first_algo"

    @staticmethod
    def policy_time_line():
        return "use_time_line_algo"

    def _policies(self):
        default = frozenset(p for p, on in _STATIC_MEM_ALGOS.items() if on)
        return self._owner.flags.get("static_mem_alloc_policies", default)

    def _set(self, policy, on):
        policies = self._policies() - {self._check(policy)}
        self._owner.flags["static_mem_alloc_policies"] = policies | ({policy} if on else set())

    @staticmethod
    def _check(policy):
        if policy not in _STATIC_MEM_ALGOS:
            raise ValueError(f"unknown static memory allocation policy {policy!r} (OneFlow's: "
                             f"{', '.join(_STATIC_MEM_ALGOS)})")
        return policy

    def has(self, policy):
        return self._check(policy) in self._policies()

    def add(self, policy):
        self._set(policy, True)

    def remove(self, policy):
        self._set(policy, False)


class _StaticMemAlgoWhiteList:
    """`function_config.static_mem_alloc_algo_white_list.show()`: OneFlow's algorithm names."""

    @staticmethod
    def show():
        return list(_STATIC_MEM_ALGOS)


_TRAIN_OLD_API = {"primary_lr", "secondary_lr", "model_update_conf", "loss_scale_factor",
                  "num_gradient_accumulation_steps"}
_TRAIN_UNSUPPORTED = {"optimizer_placement_optimization_mode",
                      "optimizer_placement_optimization_threshold"}


class _TrainConf:
    def __init__(self, owner):
        self._owner = owner

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        if name in _TRAIN_UNSUPPORTED:
            # OneFlow's second spelling of these flags
            return getattr(self._owner, name)
        if name not in _TRAIN_OLD_API:
            raise _unknown_flag("train." + name, _TRAIN_OLD_API | _TRAIN_UNSUPPORTED)

        def setter(value=True):
            if name != "num_gradient_accumulation_steps":
                print("WARNING: func_config.train.* has been deprecated. Please replace it by "
                      "the new optimizer api.")
                print("".join(traceback.format_stack(sys._getframe(1), limit=1)).rstrip())
            self._owner.train_conf[name] = value
            self._owner.job_type = self._owner.job_type or "train"
        return setter


# every flag FunctionConfig takes (the sub-namespaces train.*, qat.*, tensorrt.* aside)
_FUNCTION_FLAGS = _IGNORED_FLAGS | set(_UNSUPPORTED_FLAGS) | {
    "enable_auto_mixed_precision", "mixed_precision_data_type", "default_data_type",
    "default_logical_view", "default_distribute_strategy", "default_placement_scope", "passes",
    "disable_passes", "dump_passes", "execution_provider", "cudnn_conv_algo_search",
    "enable_cuda_graph", "freeze_variables_after", "cudnn_buf_limit_mbyte", "enable_inplace",
    "cuda_provider_options", "cudnn_conv_use_deterministic_algo_only",
    "cudnn_conv_heuristic_search_algo", "indexed_slices_optimizer_conf", "prefetch",
    "default_initializer_conf",
    "dynamic_batch", "use_tensorrt", "all_reduce_fp16", "all_reduce_group_min_mbyte",
    "enable_ssp", "enable_qat", "enable_quantization_aware_training",
    "enable_fuse_model_update_ops"}     # L1's term at w = 0 (train/optimizer.py)


# flags named so are switches (OneFlow sets a protobuf bool field from the value)
_SWITCH_PREFIXES = ("enable_", "use_", "disable_", "prune_", "allow_")


class FunctionConfig:
    """Per-job configuration: `config.name(value)` records a flag (spec §4).

    Flags that only tune OneFlow's runtime are accepted and ignored; flags that would change
    numbers and are not implemented warn once (`_UNSUPPORTED_FLAGS`); unknown names raise
    UnsupportedAPIError naming the line.
    `enable_auto_mixed_precision(True)` computes the job in half precision
    (onnxjob/passes/auto_mixed_precision.py), `mixed_precision_data_type(flow.float16 |
    flow.bfloat16)` picks the half type (float16 by default, as OneFlow).
    `enable_qat(True)` (or `enable_quantization_aware_training`) traces the job with
    OneFlow's fake quantization, set up by `qat.symmetric(bool)`,
    `qat.per_channel_weight_quantization(bool)`, `qat.moving_min_max_momentum(float)`,
    `qat.moving_min_max_stop_update_after_iters(int)` and `qat.target_backend("" |
    "tensorrt" | "cambricon" | "tensorrt7")` (onnxjob/ops/qat.py, docs/quantization.md).
    onnxjob adds `passes(list)` (extra graph passes), `disable_passes(bool)`,
    `execution_provider("cpu"|"cuda")`, `cudnn_conv_algo_search(...)` (OneFlow's
    `cudnn_conv_heuristic_search_algo(bool)` picks HEURISTIC or EXHAUSTIVE where it is unset),
    `enable_cuda_graph(False)` (runtime/cuda_graph.py), OneFlow's
    `cudnn_conv_use_deterministic_algo_only(True)` (onnxruntime's deterministic compute),
    OneFlow's `cudnn_buf_limit_mbyte(n)` (a bound on cuDNN's workspaces: runtime/backend.py),
    OneFlow's `enable_inplace(False)` (a train step writes no variable in place:
    graph/in_place.py), `cuda_provider_options({name: value})` (onnxruntime's own CUDA EP
    options, over onnxjob's: runtime/backend.py),
    `freeze_variables_after(n)` (runtime/frozen.py), OneFlow's `use_tensorrt(True)` (predict
    jobs on onnxruntime's TensorRT EP where available: runtime/backend.py; `tensorrt.use_fp16()`
    lets it run float32 layers in float16, `tensorrt.use_int8()` / `int8_calibration(path)`
    warn that it runs without int8), OneFlow's `static_mem_alloc_policy_white_list.*` and
    `static_mem_alloc_algo_white_list.show()` (read back, no effect) and `prefetch(n)` (how many batches a
    job that makes its own data prepares ahead, runtime/pipeline.py; 0 = inline).
    `dynamic_batch(True)`: a predict job also takes fewer rows than its tp.Numpy
    placeholders' first dimension (the same count in every input) and returns that many
    rows; its graph has a symbolic batch axis (graph/dynamic_batch.py, docs/jobs.md).
    Data-parallel train jobs (runtime/data_parallel.py): `all_reduce_group_min_mbyte(m)`
    sizes the gradient buckets (16 MB by default), `all_reduce_fp16(True)` sends float32
    gradients as float16. `enable_ssp(True)`: a train job reads its trainable variables
    as they were ssp_num_stages - ssp_stage_id - 1 runs ago (frontend/ssp.py).
    """

    def __init__(self):
        self.flags = {}
        self.train_conf = {}
        self.job_type = None
        self.train = _TrainConf(self)
        self.qat = _QatConf(self)
        self.tensorrt = _TensorrtConf(self)
        self.static_mem_alloc_policy_white_list = _StaticMemPolicyWhiteList(self)
        self.static_mem_alloc_algo_white_list = _StaticMemAlgoWhiteList()

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        known = _FUNCTION_FLAGS
        if name not in known and name not in _FLAG_ALIASES and name not in _NEGATED_FLAGS:
            raise _unknown_flag(name, known)

        def setter(value=True):
            if name.startswith(_SWITCH_PREFIXES) and isinstance(value, (str, bytes)):
                # (OneFlow sets a protobuf bool, which refuses a string: "False" is truthy)
                raise TypeError(f"{user_location()}: function_config.{name} takes a bool, "
                                f"got the string {value!r}")
            if name == "default_distribute_strategy":
                print("WARNING: function_config.default_distribute_strategy has been deprecated. "
                      "Please use function_config.default_logical_view instead.")
            if name in ("default_logical_view", "default_distribute_strategy"):
                assert views.is_view(value), (
                    "default_logical_view takes flow.scope.mirrored_view() or "
                    "flow.scope.consistent_view()")
                self.flags["default_logical_view"] = value
                return
            if name in _UNSUPPORTED_FLAGS:
                _warn_unsupported(name, value)
            if name in _FLAG_ALIASES or name in _NEGATED_FLAGS:
                self._set_alias(name, value)
                return
            if name == "mixed_precision_data_type":
                value = _half_type_name(value)
            if name == "freeze_variables_after" and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"freeze_variables_after takes a count >= 0, got {value!r}")
            if name == "dynamic_batch":
                value = bool(value)
            if name == "cuda_provider_options" and not isinstance(value, dict):
                raise ValueError("cuda_provider_options takes a dict of onnxruntime CUDA EP "
                                 f"options, e.g. {{'prefer_nhwc': '1'}}, got {value!r}")
            if name in ("enable_qat", "enable_quantization_aware_training"):
                # OneFlow's two names of one flag
                self.flags["enable_qat"] = bool(value)
                return
            self.flags[name] = value
        return setter

    def _set_alias(self, name, value):
        """Another OneFlow name of a flag that onnxjob does not implement: warned as that
        name (what the user wrote), recorded under the flag's own name."""
        flag = _FLAG_ALIASES.get(name) or _NEGATED_FLAGS[name]
        flag_value = (not value) if name in _NEGATED_FLAGS else value
        if flag_value:
            _warn_once(flag, f"function_config.{name}({value!r}) is not supported by onnxjob "
                             f"and has no effect: {_UNSUPPORTED_FLAGS[flag]}")
        self.flags[flag] = flag_value

    @property
    def function_desc(self):
        """The flags read back: `config.function_desc.<flag>`, `.HasAttr`, `.IsTrainable()`
        (frontend/function_desc.py)."""
        return FunctionDesc(self)

    def clone(self):
        other = FunctionConfig()
        other.flags = dict(self.flags)
        other.train_conf = copy.deepcopy(self.train_conf)
        other.job_type = self.job_type
        return other

    def get(self, name, default=None):
        return self.flags.get(name, default)


ExecutionConfig = FunctionConfig


def function_config():
    return FunctionConfig()


class _ProcessConfig:
    """State behind flow.config.* and flow.env.* (frozen once the session runs)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.gpu_device_num = 1
        self.gpu_device_num_set = False
        self.cpu_device_num = 1
        self.machine_num = 1
        self.machines = []      # flow.env.machine's addresses (frontend/ranks.py)
        self.ctrl_port = None   # flow.env.ctrl_port
        self.legacy_model_io = False
        self.model_io_v2 = False    # (its own field in OneFlow: no effect on legacy io)
        self.debug_mode = False
        self.random_seed = None
        self.tf32 = None        # enable_tensor_float_32_compute; None: onnxruntime's default
        self.memory_limit_mbyte = None  # device_memory_limit_mbyte; None: unbounded
        self.log_dir = None     # flow.env.log_dir; None: OneFlow's ./log, not created here
        self.env_initialized = False


process_config = _ProcessConfig()


def current_resource():
    """The configured devices, as OneFlow's resource proto would list them."""
    return types.SimpleNamespace(gpu_device_num=process_config.gpu_device_num,
                                 cpu_device_num=process_config.cpu_device_num,
                                 machine_num=process_config.machine_num)


def started_session(sync=False):
    """The default session, started (compiled, variables drawn with `flow.config.seed`)
    and, with `sync`, with every queued run and callback finished."""
    session = default_session()
    if not session.is_running:
        c = process_config
        ranks.before_session_start(c.cpu_device_num, c.machines, c.ctrl_port)
        _make_log_dir(c.log_dir)
    session.start(seed=process_config.random_seed, tf32=process_config.tf32,
                  memory_limit_mbyte=process_config.memory_limit_mbyte)
    if sync:
        session.sync()
    return session


def _make_log_dir(log_dir):
    """OneFlow's environment, started with the first session, creates `log_dir/<hostname>`
    for its logs; programs write their own files under a log_dir they named. (OneFlow's
    default ./log is left uncreated: onnxjob writes no log files.)"""
    if log_dir is not None:
        os.makedirs(os.path.join(log_dir, socket.gethostname()), exist_ok=True)


def _session_running():
    if default_session().is_running:
        print("Nothing happened because the session is running")
        return True
    return False


def _setter(apply):
    def setter(*args, **kwargs):
        if _session_running():
            return False
        apply(*args, **kwargs)
        return None
    return setter


# flow.config.* names of OneFlow 0.5 that tune OneFlow's own runtime: accepted, no effect.
_IGNORED_CONFIG = (
    "collect_act_event", "comm_net_worker_num", "compute_thread_pool_size",
    "disable_group_boxing_by_dst_parallel", "enable_mem_chain_merge",
    "enable_numa_aware_cuda_malloc_host", "load_library_now",
    "max_mdsave_worker_num", "nccl_use_compute_stream", "persistence_buf_byte",
    "rdma_mem_block_mbyte", "rdma_recv_msg_buf_mbyte", "reserved_device_mem_mbyte",
    "reserved_host_mem_mbyte", "thread_enable_local_message_queue", "use_rdma",
    # OneFlow 0.1's (where downloaded files are kept)
    "save_downloaded_file_to_local_fs")
_COLLECTIVE_BOXING = (
    "enable_fusion", "nccl_enable_all_to_all", "nccl_enable_mixed_fusion",
    "nccl_fusion_all_gather", "nccl_fusion_all_reduce", "nccl_fusion_all_reduce_use_buffer",
    "nccl_fusion_broadcast", "nccl_fusion_max_ops", "nccl_fusion_reduce",
    "nccl_fusion_reduce_scatter", "nccl_fusion_threshold_mb", "nccl_num_streams",
    "num_callback_threads")


def _ignored():
    return _setter(lambda *a, **k: None)


class _ConfigModule:
    """flow.config: process-wide settings; ignored (with a message) once running."""

    @staticmethod
    def _gpu(n):
        """n > 1 in a plain `python script.py`: n data-parallel ranks with a GPU each
        where onnxruntime's CUDA EP and n GPUs are usable, else one device for this
        process, said once with why (frontend/ranks.py)."""
        assert isinstance(n, int), "gpu_device_num takes an int"
        process_config.gpu_device_num = n
        process_config.gpu_device_num_set = True
        ranks.on_gpu_device_num(n, process_config.machines, process_config.ctrl_port)

    @staticmethod
    def _cpu(n):
        """n > 1 in a plain `python script.py`: n data-parallel ranks (frontend/ranks.py)."""
        c = process_config
        c.cpu_device_num = int(n)
        ranks.on_cpu_device_num(c.cpu_device_num, c.machines, c.ctrl_port)

    @staticmethod
    def _memory_limit(mbyte):
        """A step that needs more raises DeviceMemoryError; None: no bound."""
        if mbyte is not None and (isinstance(mbyte, bool) or not isinstance(mbyte, int)
                                  or mbyte <= 0):
            raise ValueError(f"device_memory_limit_mbyte takes a count of MiB > 0 or None, "
                             f"got {mbyte!r}")
        process_config.memory_limit_mbyte = mbyte

    def __init__(self):
        c = process_config
        self.gpu_device_num = _setter(self._gpu)
        self.cpu_device_num = _setter(self._cpu)
        self.machine_num = _setter(lambda n: setattr(c, "machine_num", int(n)))
        self.enable_legacy_model_io = _setter(lambda v=True: setattr(c, "legacy_model_io", bool(v)))
        self.legacy_model_io_enabled = lambda: c.legacy_model_io
        self.enable_debug_mode = _setter(lambda v=True: setattr(c, "debug_mode", bool(v)))
        self.load_library = _setter(lambda path: warnings.warn(
            f"flow.config.load_library({path!r}): custom OneFlow kernels cannot run on onnxruntime"))
        self.enable_model_io_v2 = _setter(lambda v=True: setattr(c, "model_io_v2", bool(v)))
        self.seed = _setter(lambda s: setattr(c, "random_seed", int(s)))
        # TF32 convolutions and matmuls on the CUDA EP (on by default there, as in OneFlow)
        self.enable_tensor_float_32_compute = _setter(lambda v=True: setattr(c, "tf32", bool(v)))
        # a bound on the memory onnxruntime's arenas take (runtime/backend.py set_memory_limit)
        self.device_memory_limit_mbyte = _setter(self._memory_limit)
        for name in _IGNORED_CONFIG:
            setattr(self, name, _ignored())
        self.collective_boxing = ApiNamespace(
            "flow.config.collective_boxing", **{n: _ignored() for n in _COLLECTIVE_BOXING})

    # a static method: the module-level hook takes the name only. OneFlow before 0.1 set
    # job flags here (flow.config.default_data_type(...)): said where they went
    __getattr__ = staticmethod(missing_api("flow.config", {
        name: f"OneFlow before 0.1 set job flags on flow.config; since 0.1 they are "
              f"flow.FunctionConfig()'s (func_config.{name}(...), passed to "
              f"flow.global_function)" for name in _FUNCTION_FLAGS | {"train"}}))


def _rendezvous(variable, value):
    """Set a torch.distributed rendezvous variable unless the launcher already did."""
    os.environ.setdefault(variable, str(value))


class _EnvModule:
    """flow.env: machine settings. `machine([{"addr": ...}, ...])` and `ctrl_port(p)` give
    a data-parallel run's rendezvous (MASTER_ADDR = the first machine, MASTER_PORT = the
    port; runtime/distributed.py) where the launcher set none; in a plain `python
    script.py`, several machines start their ranks (frontend/ranks.py). `log_dir(path)`
    creates `path/<hostname>` when the session starts, as OneFlow's environment does.
    The rest is accepted and ignored."""

    def __init__(self):
        # disable_setting (OneFlow 0.1): later env.* calls are refused there; here they
        # are accepted, as they change nothing once the session runs
        for name in ("data_port", "grpc_use_no_signal", "disable_setting",
                     "logtostderr", "logbuflevel", "init_bootstrap_confs", "all_device_placement"):
            setattr(self, name, _ignored())
        self.machine = _setter(self._machine)
        self.log_dir = _setter(self._log_dir)
        self.ctrl_port = _setter(self._ctrl_port)

    @staticmethod
    def _log_dir(path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"{user_location()}: flow.env.log_dir takes a str path, got "
                            f"{type(path).__name__}")
        process_config.log_dir = os.fspath(path)

    @staticmethod
    def _ctrl_port(port):
        process_config.ctrl_port = int(port)
        _rendezvous("MASTER_PORT", int(port))

    @staticmethod
    def _machine(*machines):
        """OneFlow's forms: a list or tuple of {"addr": ...} dicts or addresses, or them
        as separate arguments."""
        if len(machines) == 1 and isinstance(machines[0], (list, tuple)):
            machines = machines[0]
        addrs = [m["addr"] if isinstance(m, dict) else m for m in machines]
        if addrs:
            _rendezvous("MASTER_ADDR", addrs[0])
        ranks.on_machines(addrs)
        process_config.machines = addrs

    __getattr__ = staticmethod(missing_api("flow.env"))

    @staticmethod
    def init():
        process_config.env_initialized = True
        return True

    # (OneFlow's flow.env.current_resource is flow.current_resource)
    current_resource = staticmethod(current_resource)


config = _ConfigModule()
env = _EnvModule()
