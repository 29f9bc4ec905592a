"""`flow.experimental` ops and helpers of OneFlow 0.5 that a job can use.

square_sum, logical_slice / logical_slice_assign on (consistent) variables,
ssp_variable_proxy's stale values, and reading / writing a variable by name between
runs (get_interface_blob_value / set_interface_blob_value).
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend import initializers
from onnxjob.frontend.variables import assign, get_variable
from onnxjob.graph.tracer import current_builder
from onnxjob.ops.casts import cast, identity
from onnxjob.ops.creation import ones_like
from onnxjob.ops.math import reduce_sum, square
from onnxjob.ops.selection import where
from onnxjob.ops.shapes import broadcast_like, expand_dims, reshape, squeeze
from onnxjob.ops.slicing import concat, slice_update, slice_v2


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
    read `value`, the variable's value buffer_size - 1 runs ago (its first value until
    then). A ring buffer of the older values is kept in a variable beside `var`
    ("<var>-ssp_ring", with "<var>-ssp_started")."""
    builder = current_builder("flow.experimental.ssp_variable_proxy")
    names = [n for n, b in builder.variables.items() if b is var]
    if not names:
        raise TraceError("flow.experimental.ssp_variable_proxy takes a variable of this job "
                         f"(flow.get_variable), got {getattr(var, 'name', var)!r}")
    if not isinstance(buffer_size, int) or buffer_size < 1:
        raise TraceError(f"flow.experimental.ssp_variable_proxy: buffer_size must be a "
                         f"positive int, got {buffer_size!r}")
    if buffer_size == 1:
        return var, identity(var, name=name)
    depth = buffer_size - 1
    ring = get_variable(f"{names[0]}-ssp_ring", (depth,) + tuple(var.shape),
                        dtype=dtypes.from_numpy(var.np_dtype), trainable=False,
                        initializer=initializers.zeros_initializer())
    started = get_variable(f"{names[0]}-ssp_started", (1,), dtype=dtypes.int8,
                           trainable=False, initializer=initializers.zeros_initializer())
    current = expand_dims(var, axis=0)
    first = broadcast_like(current, ring, broadcast_axes=[0])
    filled = where(cast(started, dtypes.bool_), ring, first)   # the first run: all w_0
    value = squeeze(slice_v2(filled, [(depth - 1, depth, 1)]), axis=[0])
    assign(ring, concat([current, slice_v2(filled, [(0, depth - 1, 1)])], axis=0)
           if depth > 1 else current)
    assign(started, ones_like(started))
    return var, identity(value, name=name)


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
