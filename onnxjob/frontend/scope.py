"""`flow.scope`: name spaces, placement (advisory) and logical views."""
import contextlib
import threading
import types

from onnxjob.errors import missing_api

from onnxjob.frontend.helpers import default_parallel_num, default_placement_on_cpus
from onnxjob.graph import tracer
from onnxjob.frontend.views import (consistent_view, consistent_view_enabled,  # noqa: F401
                                    is_view, mirrored_view, mirrored_view_enabled, only_view)
from onnxjob.graph.name_scope import (empty_stack, full_name, namespace,  # noqa: F401
                                      namespace_prefix)

_state = threading.local()


class _Placement:
    """Placement scope. Advisory: onnxjob runs a whole job on one execution provider."""

    def __init__(self, device_tag, machine_device_ids=None):
        if device_tag not in ("cpu", "gpu", "cuda"):
            raise ValueError(f"device tag must be 'cpu' or 'gpu', got {device_tag!r}")
        self.device_tag = device_tag
        self.machine_device_ids = machine_device_ids

    def __enter__(self):
        if not hasattr(_state, "placements"):
            _state.placements = []
        _state.placements.append(self)
        return self

    def __exit__(self, *exc):
        _state.placements.pop()
        return False


def placement(device_tag, machine_device_ids="0:0", hierarchy=None):
    """A placement scope: ops inside run on `device_tag` ("cpu" / "gpu") devices
    `machine_device_ids`, laid out as `hierarchy` (OneFlow's 2-D device grid, e.g. [2, 2]);
    advisory, onnxjob runs a job on one execution provider."""
    if hierarchy is not None and not (isinstance(hierarchy, (list, tuple)) and all(
            isinstance(d, int) and d > 0 for d in hierarchy)):
        raise ValueError(f"hierarchy must be a list of positive ints, got {hierarchy!r}")
    return _Placement(device_tag, machine_device_ids)


def current_placement():
    stack = getattr(_state, "placements", None)
    return stack[-1] if stack else None


def placement_asked(config=None):
    """The placement the program put the op being traced under: the innermost
    flow.scope.placement, else the job's `config` default_placement_scope (when there is
    a job); None for OneFlow's default placement."""
    if config is None:
        return current_placement()
    return current_placement() or config.get("default_placement_scope")


def oneflow_places_on_cpu(builder):
    """Whether OneFlow runs the op being traced on its CPU kernel: where the program placed
    it on CPUs (flow.scope.placement("cpu", ...), a CPU default_placement_scope) or asked
    for no GPU (flow.config.gpu_device_num(0), or cpu_device_num(n > 1) alone: a program
    for a CPU-only build, helpers.default_placement_on_cpus). A program that says nothing
    ran on GPUs in OneFlow, wherever onnxjob runs it; the kernels differ in a few numbers
    (batch norm's moving variance, an L1 regularizer at 0)."""
    job = getattr(builder, "job_function", None)
    placed = placement_asked(getattr(job, "config", None))
    if placed is not None:
        return str(placed.device_tag).lower() == "cpu"
    return default_placement_on_cpus()


def _device_list(devices):
    """[device ids] from an int, a "0-3" range string or a list of either."""
    if isinstance(devices, int):
        return [devices]
    if isinstance(devices, str):
        low, _, high = devices.partition("-")
        return list(range(int(low), int(high or low) + 1))
    return [d for entry in devices for d in _device_list(entry)]


def machine_device_lists(machine_device_ids):
    """{machine id: [device ids]} from OneFlow's forms: {0: [0, 1]}, "0:0-1" or a list
    of such strings; a machine written "@0" (a rank, as OneFlow's parallel_conf_util
    accepts it and its distribute_map writes it) is that machine."""
    if isinstance(machine_device_ids, dict):
        return {int(m): _device_list(d) for m, d in machine_device_ids.items()}
    table = {}
    for entry in [machine_device_ids] if isinstance(machine_device_ids, str) \
            else machine_device_ids:
        machine, _, devices = str(entry).rpartition(":")
        table.setdefault(int(machine.lstrip("@") or 0), []).extend(_device_list(devices))
    return table


def device_count(machine_device_ids):
    """How many devices "machine:devices" strings name ("0:0-3" is 4, ["0:0", "1:0-1"] 3),
    as OneFlow's parallel_num."""
    return sum(map(len, machine_device_lists(machine_device_ids).values()))


class _CallableStr(str):
    """A protobuf string field of OneFlow <= 0.4 that 0.5's binding made a method: read
    either way (`conf.device_tag`, `conf.device_tag()`)."""

    def __call__(self):
        return str(self)


def callable_str(value):
    """`value` as a string that also reads as a method call (_CallableStr)."""
    return _CallableStr(value)


class _CallableList(list):
    """A repeated protobuf field of OneFlow <= 0.4 that 0.5 made a method (see above)."""

    def __call__(self):
        return list(self)


class ParallelConf:
    """`Blob.parallel_conf`: the device tag ("cpu" or "gpu", OneFlow's names) and the
    "machine:devices" strings of the placement a blob was made under, as OneFlow 0.5's
    methods (`device_tag()`, `device_name()`) and <= 0.4's protobuf fields
    (`device_tag`, `device_name`)."""

    def __init__(self, device_tag, machine_device_ids):
        self._tag = "gpu" if device_tag == "cuda" else device_tag
        ids = machine_device_ids if machine_device_ids is not None else "0:0"
        self._names = [ids] if isinstance(ids, str) else list(ids)

    @property
    def device_tag(self):
        return _CallableStr(self._tag)

    @property
    def device_name(self):
        return _CallableList(self._names)

    def __repr__(self):
        return f"ParallelConf(device_tag={self._tag!r}, device_name={self._names})"


def placement_tracker(config, device):
    """() -> the ParallelConf of the placement in effect: the innermost
    flow.scope.placement, else the job's default_placement_scope, else the device the
    session runs on, with the devices flow.config configured (as OneFlow's default: the
    GPUs where there are, "0:0-3" for gpu_device_num(4)). One object per placement, shared
    by the blobs made under it."""
    from onnxjob.frontend.helpers import default_machine_device_ids
    made = {None: ParallelConf("gpu" if device == "cuda" else "cpu",
                               default_machine_device_ids())}

    def in_effect():
        scope = placement_asked(config)
        if scope not in made:
            made[scope] = ParallelConf(scope.device_tag, scope.machine_device_ids)
        return made[scope]
    return in_effect


def placed_device_count(builder):
    """How many devices the placement of the op `builder` traces spans ("0:0-3" is 4), as
    OneFlow's parallel_num: the innermost flow.scope.placement, else the job's
    default_placement_scope, else OneFlow's default placement (flow.config.gpu_device_num's
    GPUs, or cpu_device_num's CPUs, on each of machine_num machines)."""
    job = getattr(builder, "job_function", None)
    placed = placement_asked(getattr(job, "config", None))
    if placed is None:
        return default_parallel_num()
    return device_count(placed.machine_device_ids or "0:0")


def current_scope():
    """flow.current_scope() (flow.scope.current_scope(), its deprecated spelling): the
    scope of the op being traced as OneFlow's placement makes it: its device tag ("cpu"
    where the program placed it on CPUs or asked for no GPU, else "gpu": OneFlow's default
    placement, wherever onnxjob runs it; OneFlow's own layers branch on it) and its device
    count (the placement's, else the default placement's)."""
    builder = tracer.builder_or_none()
    tag = "cpu" if oneflow_places_on_cpu(builder) else "gpu"
    desc = types.SimpleNamespace(device_tag=tag, parallel_num=placed_device_count(builder))
    return types.SimpleNamespace(device_parallel_desc_symbol=desc)


# OneFlow 0.5's scope attributes (REGISTER_SCOPE_CONFIG_DEF) and their defaults.
# Activation checkpointing and pipeline stage hints trade memory or placement, so change
# no number; the SSP stages act with function_config.enable_ssp (frontend/ssp.py); the QAT
# switch `quantization_aware_training` leaves the ops built inside unquantized in a job
# with function_config.enable_qat (ops/qat.py).
SCOPE_ATTRS = {"checkpointing": False, "pipeline_stage_id_hint": 0,
               "quantization_aware_training": True, "ssp_num_stages": -1, "ssp_stage_id": -1}


class config:
    """`with flow.experimental.scope.config(checkpointing=True, ...):` sets scope attributes
    for the ops built inside; the names are checked (SCOPE_ATTRS) and
    `current_scope_attrs()` reads them back."""

    def __init__(self, **kwargs):
        for name in kwargs:
            assert name in SCOPE_ATTRS, (
                f"flow.experimental.scope.config: unknown scope attribute {name!r} (OneFlow "
                f"0.5 has {', '.join(SCOPE_ATTRS)})")
        self.attrs = kwargs

    def __enter__(self):
        if not hasattr(_state, "attrs"):
            _state.attrs = []
        _state.attrs.append(self.attrs)
        return self

    def __exit__(self, *exc):
        _state.attrs.pop()
        return False


def current_scope_attrs():
    """The scope attributes in effect: the defaults, overridden by the open config blocks."""
    out = dict(SCOPE_ATTRS)
    for attrs in getattr(_state, "attrs", []):
        out.update(attrs)
    return out


@contextlib.contextmanager
def job_body_scope(config):
    """The scope a job body is traced in: as OneFlow's compiler (MakeInitialScope from the
    job's config), no name space, placement or scope-attribute block of the caller applies,
    and the logical view is the config's default_logical_view. The caller's blocks are
    restored after, so a job first called inside `with flow.scope.namespace("x"):` (or
    from a thread that has one open) names its variables as anywhere else."""
    old_placements = getattr(_state, "placements", [])
    old_attrs = getattr(_state, "attrs", [])
    _state.placements, _state.attrs = [], []
    try:
        with empty_stack(), only_view(config.get("default_logical_view")):
            yield
    finally:
        _state.placements, _state.attrs = old_placements, old_attrs


__getattr__ = missing_api("flow.scope")
