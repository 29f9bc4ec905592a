"""Stale-synchronous pipelining: `function_config.enable_ssp(True)` in a train job.

As OneFlow 0.5's AddSspVariableProxy pass: every trainable variable is read, by the ops
outside the optimizer, through `ssp_variable_proxy` with buffer_size = ssp_num_stages -
ssp_stage_id from the scope the variable was made in (flow.experimental.scope.config):
the forward and backward see the variable as it was buffer_size - 1 runs ago (its first
value until then), and the gradient taken there updates the variable itself.
"""
from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend import scope
from onnxjob.graph.tracer import op
from onnxjob.ops.experimental import ssp_variable_proxy


def start(builder, job):
    """Make `builder` read the variables of `job` stale (`stale_read`) when it is a train
    job under enable_ssp (frontend/job_function.py, before its body is traced)."""
    if job.is_train and bool(job.config.get("enable_ssp", False)):
        builder.variable_reader = stale_read


def stale_read(builder, name, var):
    """What the job's ops read for variable `name` (Blob `var`) under enable_ssp: its
    stale value (one per variable and job) where it is trainable and floating, else `var`."""
    spec = builder.variable_specs[name]
    if not (spec.trainable and dtypes.is_floating(var.np_dtype)):
        return var
    reads = builder.__dict__.setdefault("ssp_reads", {})
    if name not in reads:
        attrs = scope.current_scope_attrs()
        stages, stage = attrs["ssp_num_stages"], attrs["ssp_stage_id"]
        if not (isinstance(stages, int) and isinstance(stage, int) and 0 <= stage < stages):
            raise TraceError(
                f"function_config.enable_ssp: variable {name!r} is made outside a "
                "flow.experimental.scope.config(ssp_num_stages=n, ssp_stage_id=i) block with "
                f"0 <= i < n (got ssp_num_stages={stages}, ssp_stage_id={stage}), as OneFlow "
                "requires")
        _, value = ssp_variable_proxy(var, buffer_size=stages - stage)
        reads[name] = op("onnxjob.SspStaleRead", var, value)
    return reads[name]
