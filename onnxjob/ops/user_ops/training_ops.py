"""Op types OneFlow's training machinery uses: reduce_sum_like (reduce_like_ops.cpp),
square sums and not-finite counts (square_sum_op.cpp, count_not_finite_op.cpp), the
dynamic loss-scale schedule (dynamic_loss_scale_schedule_op.cpp), fused_cast_scale and
the l1 / l2 gradient regularization."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend.variables import assign
from onnxjob.graph.tracer import current_builder
from onnxjob.ops.casts import cast, identity
from onnxjob.ops.selection import _to_bool
from onnxjob.ops.shapes import reshape
from onnxjob.ops import legacy
from onnxjob.ops import math as fm
from onnxjob.ops.experimental import square_sum
from onnxjob.ops.user_ops.spec import registrar
from onnxjob.train.update_rules import dynamic_loss_scale_schedule

reg = registrar("training")


def _where(type_name):
    return f"flow.user_op_builder: op type {type_name!r}"


def _reduce_sum_like(x, a):
    """x summed over `axis` to like's shape (empty axis: x itself, of like's shape); like
    gives only its shape (it gets no gradient)."""
    v, like, axis = x.one("x"), x.one("like"), a["axis"]
    if v.np_dtype != like.np_dtype:
        raise TraceError(f"{_where('reduce_sum_like')}: x ({v.np_dtype}) and like "
                         f"({like.np_dtype}) must share a dtype")
    if not axis:
        if v.shape != like.shape:
            raise TraceError(f"{_where('reduce_sum_like')}: with no axis, x {v.shape} must "
                             f"have like's shape {like.shape}")
        return identity(v)
    summed = fm.reduce_sum(v, axis=axis, keepdims=len(v.shape) == len(like.shape))
    if int(np.prod(summed.shape)) != int(np.prod(like.shape)):
        raise TraceError(f"{_where('reduce_sum_like')}: x {v.shape} summed over {axis} does "
                         f"not give like's shape {like.shape}")
    return reshape(summed, like.shape)


reg("reduce_sum_like", "x, like -> y | axis: list_int32", _reduce_sum_like,
    flow="flow.math.reduce_sum")


def _multi_square_sum(x, a):
    """(1,): the sum of the squares of every element of every x."""
    xs = x["x"]
    if any(b.np_dtype != xs[0].np_dtype for b in xs):
        raise TraceError(f"{_where('multi_square_sum')}: the x blobs must share a dtype, got "
                         f"{sorted({str(b.np_dtype) for b in xs})}")
    return fm.add_n([square_sum(b) for b in xs])


reg("square_sum", "x -> y", lambda x, a: square_sum(x.one("x")),
    flow="flow.experimental.square_sum")
reg("multi_square_sum", "x*1 -> y", _multi_square_sum, flow="flow.experimental.square_sum")
reg("count_not_finite", "x -> y", lambda x, a: legacy.count_not_finite(x.one("x")),
    flow="flow.count_not_finite")
reg("multi_count_not_finite", "x*1 -> y", lambda x, a: legacy.multi_count_not_finite(x["x"]),
    flow="flow.multi_count_not_finite")


reg("indexed_slices_reduce_sum", "x_indices, x_values -> y_indices, y_values, num_unique",
    lambda x, a: tuple(legacy.indexed_slices_reduce_sum(x.one("x_indices"), x.one("x_values"))),
    flow="flow.experimental.indexed_slices_reduce_sum")


def _variable(builder, blob, what, np_dtype):
    if blob.shape != (1,) or blob.np_dtype != np_dtype:
        raise TraceError(f"{_where('dynamic_loss_scale_schedule')}: {what} must be a (1,) "
                         f"{np.dtype(np_dtype)} blob, got {blob.shape} {blob.np_dtype}")
    if not any(b is blob for b in builder.variables.values()):
        raise TraceError(f"{_where('dynamic_loss_scale_schedule')}: {what} must be a variable "
                         "of this job (flow.get_variable): the op updates it in place")
    return blob


def _loss_scale_schedule(x, a):
    """The kernel's update of the loss scale and the good-step counter (variables, set
    after the run as flow.assign sets them): a step without not-finite values increments
    the counter and, at increment_period, multiplies the scale (up to FLT_MAX) and zeroes
    the counter; another zeroes the counter and divides the scale (not below 1)."""
    builder = current_builder("flow.user_op_builder")
    count = x.one("count_not_finite")
    if count.shape != (1,) or count.np_dtype != np.int64:
        raise TraceError(f"{_where('dynamic_loss_scale_schedule')}: count_not_finite must be "
                         f"a (1,) int64 blob, got {count.shape} {count.np_dtype}")
    scale = _variable(builder, x.one("loss_scale"), "loss_scale", np.float32)
    counter = _variable(builder, x.one("good_step_counter"), "good_step_counter", np.int64)
    finite = _to_bool(fm.equal(count, 0))
    new_scale, new_counter = dynamic_loss_scale_schedule(
        finite, scale, counter, a["increment_period"], a["multiplier"])
    assign(scale, new_scale)
    assign(counter, new_counter)


reg("dynamic_loss_scale_schedule", "count_not_finite, loss_scale, good_step_counter -> | "
    "increment_period: int64 = 2000, multiplier: float = 2.0", _loss_scale_schedule,
    flow="flow.optimizer.loss_scale.dynamic_loss_scale")


def _fused_cast_scale(x, a):
    """y = T(x) * T(scale_by_tensor * scale), T = scale_by_tensor's dtype; the product of
    the two scales is taken in double, as the kernel's."""
    v, by = x.one("x"), x.one("scale_by_tensor")
    if by.shape != (1,):
        raise TraceError(f"{_where('fused_cast_scale')}: scale_by_tensor must be (1,), got "
                         f"{by.shape}")
    out_dtype = dtypes.from_numpy(by.np_dtype)
    scale = cast(fm.multiply(cast(by, dtypes.float64), a["scale"]), out_dtype)
    return fm.multiply(cast(v, out_dtype), reshape(scale, [1] * max(len(v.shape), 1)))


reg("fused_cast_scale", "x, scale_by_tensor -> y | scale: double = 1.0", _fused_cast_scale)


def _l1_l2(x, a):
    """model_diff + l1 * sign(model) + l2 * model."""
    model, diff = x.one("model"), x.one("model_diff")
    out = diff
    if a["l1"]:
        out = fm.add(out, fm.multiply(fm.sign(model), a["l1"]))
    if a["l2"]:
        out = fm.add(out, fm.multiply(model, a["l2"]))
    return identity(out) if out is diff else out


reg("l1_l2_regularize_gradient", "model, model_diff -> out | l1: float = 0.0, l2: float = 0.0",
    _l1_l2, flow="flow.regularizers.l1_l2")
