"""`flow.experimental` ops and helpers of OneFlow 0.5 that a job can use.

square_sum, logical_slice / logical_slice_assign on (consistent) variables,
ssp_variable_proxy without staleness, and reading / writing a variable by name between
runs (get_interface_blob_value / set_interface_blob_value).
"""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.frontend.variables import assign
from onnxjob.ops.array import identity, reshape, slice_update, slice_v2
from onnxjob.ops.math import reduce_sum, square


def square_sum(x, name=None):
    """The sum of the squares of all of `x`'s entries, as a (1,) blob."""
    return reshape(reduce_sum(square(x)), [1], name=name)


def logical_slice(x, slice_tup_list, name=None):
    """The slice of `x` (the whole, logical blob) given by a (start, stop, step) tuple per
    axis, as flow.slice_v2."""
    return slice_v2(x, slice_tup_list, name=name)


def logical_slice_assign(x, value, slice_tup_list, name=None):
    """Set the slice `slice_tup_list` of variable `x` to `value` after this run
    (x[start:stop:step] = value, the rest kept)."""
    assign(x, slice_update(x, value, slice_tup_list, name=name))


def ssp_variable_proxy(var, buffer_size=1, name=None):
    """(ref, value) of variable `var` for stale-synchronous pipelining: assign to `ref`,
    read `value`. With buffer_size 1 (no staleness) both are the variable's value this
    run; a ring buffer of older values (buffer_size > 1) belongs to OneFlow's multi-stage
    pipelines and is refused."""
    if buffer_size != 1:
        raise TraceError(f"flow.experimental.ssp_variable_proxy: buffer_size {buffer_size} "
                         "reads values buffer_size - 1 runs old (OneFlow's stale-synchronous "
                         "pipeline stages); onnxjob runs a job as one stage: use buffer_size=1")
    return var, identity(var, name=name)


def _session_and_spec(op_name, api):
    from onnxjob.frontend.config import started_session
    session = started_session(sync=True)
    if op_name not in session.variable_specs:
        raise KeyError(f"{api}: {op_name!r} is not a variable of this session's jobs (onnxjob's "
                       f"interface blobs are the variables, by name)")
    return session


def get_interface_blob_value(op_name):
    """The current value of variable `op_name` (a NumPy copy), between job runs."""
    session = _session_and_spec(op_name, "flow.experimental.get_interface_blob_value")
    return np.array(session.variable_numpy(op_name))


def set_interface_blob_value(op_name, ndarray):
    """Set variable `op_name` to `ndarray` (same shape and dtype), between job runs."""
    from onnxjob.io.checkpoint import load_variables
    _session_and_spec(op_name, "flow.experimental.set_interface_blob_value")
    load_variables({op_name: np.asarray(ndarray)}, ignore_mismatch=False)
