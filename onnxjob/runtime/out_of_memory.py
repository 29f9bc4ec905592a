"""The error a step raises when it cannot get memory: what it asked for, what it plans to
hold, and what to try, instead of onnxruntime's allocator message."""
from onnxjob.errors import DeviceMemoryError
from onnxjob.graph import memory_plan
from onnxjob.runtime import backend


def _size(nbytes):
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def _where(model, op):
    """' (<op> at <user file:line>)' for the node onnxruntime named (a node it fused is
    named "fused <the first node's name>"), or ''."""
    if op is None or model is None:
        return ""
    op_type, name = op
    name = name[len("fused "):] if name.startswith("fused ") else name
    for node in model.graph:
        if node.name == name:
            return f" ({op_type} at {node.metadata_props.get('source', '<unknown>')})"
    return f" ({op_type})"


def device_memory_error(job_name, device, failure, compiled, in_place=()):
    """A DeviceMemoryError for a step of `job_name` on `device` that failed with
    `failure` (backend.memory_failure's dict); `compiled`: the job's CompiledGraph,
    `in_place`: the variables its steps write in place."""
    model = compiled.model
    asked = failure["requested"]
    asked = f"asked for {_size(asked)}" if asked is not None else "could not allocate"
    left = failure["available"]
    left = f" with {_size(left)} left in onnxruntime's arena" if left is not None else ""
    limit = backend.memory_limit_bytes()
    bound = (f" (bound: flow.config.device_memory_limit_mbyte({limit >> 20}))"
             if limit else "")
    plan = memory_plan.plan_of(compiled, device, in_place)
    where = "the GPU" if device == "cuda" else "the CPU"
    return DeviceMemoryError(
        f"job {job_name!r} ran out of memory on {where}: a node{_where(model, failure['op'])} "
        f"{asked}{left}{bound}. The step plans {_size(plan.peak_bytes)} of intermediate "
        f"values at its peak beside {_size(plan.held_bytes)} of variables, state and inputs "
        f"and {_size(plan.output_bytes)} of outputs (onnxjob/graph/memory_plan.py). Try a "
        "smaller batch, function_config.enable_auto_mixed_precision(True) (activations in "
        "half precision), function_config.cudnn_buf_limit_mbyte(32) (smaller cuDNN "
        "workspaces) or a larger flow.config.device_memory_limit_mbyte. The variables are "
        "as before this step.")
