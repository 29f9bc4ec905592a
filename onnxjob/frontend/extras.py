"""Small top-level OneFlow names: constants, the current job's FunctionDesc, the empty
initializer, the job-set memory strategy, unique names and system assign."""
import itertools

from onnxjob.frontend.distribute import INVALID_BATCH_AXIS, INVALID_SPLIT_AXIS  # noqa: F401
from onnxjob.frontend.function_desc import FunctionDesc
from onnxjob.frontend.initializers import Initializer
from onnxjob.frontend.variables import assign
from onnxjob.graph.tracer import current_builder

_unique_ids = itertools.count()


def current_global_function_desc():
    """The FunctionDesc of the job being traced: its FunctionConfig's flags read back
    (`.HasAttr(flag)`, `.<flag>`) and `IsTrainable()`, whether it is a train job."""
    builder = current_builder("flow.current_global_function_desc")
    job = getattr(builder, "job_function", None)
    if job is None:
        raise RuntimeError("flow.current_global_function_desc: the graph being traced is not "
                           "a global function's")
    return FunctionDesc(job.config, trainable=job.is_train)


def empty_initializer(dtype=None):
    """OneFlow's initializer that leaves a variable's memory as allocated (for variables a
    checkpoint fills): onnxjob's allocations are zeroed, so the values start at 0."""
    return Initializer("constant", value=0)


_STRATEGIES = ("reuse_mem_priority", "parallelism_priority", "custom_parallelism")


def inter_job_reuse_mem_strategy(strategy_str, job_set=None, **kwargs):
    """How OneFlow shares memory between the jobs of a session ("reuse_mem_priority",
    "parallelism_priority" or "custom_parallelism" with job_name_groups=[[names]]): checked
    and accepted; each onnxjob job has its own onnxruntime session, so no job's numbers
    depend on it."""
    assert type(strategy_str) is str
    if strategy_str not in _STRATEGIES:
        raise ValueError(f"inter_job_reuse_mem_strategy: strategy must be one of "
                         f"{', '.join(_STRATEGIES)}, got {strategy_str!r}")
    if strategy_str == "custom_parallelism":
        assert kwargs.get("job_name_groups") is not None


def unique_str(prefix):
    """`prefix` followed by a number no earlier call of this process returned."""
    return f"{prefix}{next(_unique_ids)}"


def system_assign(ref, value, validate_shape=None, use_locking=None, name=None):
    """flow.assign(ref, value) (the variable takes `value` after this run); returns `ref`."""
    assign(ref, value, name=name)
    return ref
