"""Op types of OneFlow's elementwise math, activations, reductions and sorting
(math_unary_elementwise_op.cpp, math_binary_*_ops.cpp, scalar_*_op.cpp, reduce_ops.cpp,
the activation ops, sort / top_k), built from flow.math and flow.nn."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import op
from onnxjob.ops import activations as act
from onnxjob.ops.casts import cast
from onnxjob.ops.creation import zeros_like
from onnxjob.ops.selection import _to_bool, where
from onnxjob.ops.shapes import reshape
from onnxjob.ops import math as fm
from onnxjob.ops.user_ops.spec import registrar

reg = registrar("math")

# -- unary elementwise: "x -> y" (MATH_UNARY_ELEMENTWISE_FUNC_SEQ) ----------------------------
_UNARY = {name: name for name in (
    "abs acos acosh asin asinh atan atanh ceil cos cosh erf erfc exp expm1 floor lgamma log "
    "log1p log_sigmoid negative reciprocal reciprocal_no_nan rint round rsqrt sign sin sinh "
    "softplus sqrt square tan tanh").split()}
_UNARY["sigmoid_v2"] = "sigmoid"


def _unary(fn):
    return lambda x, a: fn(x.one("x"))


for _type, _fn in _UNARY.items():
    reg(_type, "x -> y", _unary(getattr(fm, _fn)), flow=f"flow.math.{_fn}")


# -- binary elementwise of equal shapes: "x, y -> z" (MATH_BINARY_ELEMENTWISE_FUNC_SEQ) -------

def _same_shape(fn, type_name):
    def impl(x, a):
        x_, y_ = x.one("x"), x.one("y")
        if x_.shape != y_.shape:
            raise TraceError(f"flow.user_op_builder: op type {type_name!r} takes x and y of "
                             f"one shape, got {x_.shape} and {y_.shape} (the broadcast_* op "
                             "types broadcast)")
        return fn(x_, y_)
    return impl


for _type in ("pow", "atan2", "floordiv", "xdivy", "xlogy"):
    reg(_type, "x, y -> z", _same_shape(getattr(fm, _type), _type), flow=f"flow.math.{_type}")
reg("multiply", "x, y -> out", _same_shape(fm.multiply, "multiply"), flow="flow.math.multiply")
reg("elementwise_maximum", "x, y -> z", _same_shape(fm.maximum, "elementwise_maximum"),
    flow="flow.math.maximum")
reg("elementwise_minimum", "x, y -> z", _same_shape(fm.minimum, "elementwise_minimum"),
    flow="flow.math.minimum")
reg("add_n", "in*2 -> out", lambda x, a: fm.add_n(x["in"]), flow="flow.math.add_n")


# -- broadcasting binary: "x, y -> z" (MATH_BINARY_BROADCAST_*_FUNC_SEQ) ----------------------

def _fmod(x, y):
    """C's fmod: the remainder with the sign of x."""
    return op("Mod", x, y, fmod=1)


def _logical(onnx_op):
    def f(x, y):
        both = op(onnx_op, _to_bool(x), _to_bool(y))
        return cast(both, dtypes.int8)    # OneFlow's boolean dtype
    return f


_BROADCAST = {
    "broadcast_add": (fm.add, "flow.math.add"),
    "broadcast_sub": (fm.subtract, "flow.math.subtract"),
    "broadcast_mul": (fm.multiply, "flow.math.multiply"),
    "broadcast_div": (lambda x, y: op("Div", x, y), "flow.math.divide"),
    "broadcast_minimum": (fm.minimum, "flow.math.minimum"),
    "broadcast_maximum": (fm.maximum, "flow.math.maximum"),
    "broadcast_floor_mod": (fm.mod, "flow.math.mod"),
    "broadcast_fmod": (_fmod, None),
    "broadcast_pow": (fm.pow, "flow.math.pow"),
    "broadcast_equal": (fm.equal, "flow.math.equal"),
    "broadcast_not_equal": (fm.not_equal, "flow.math.not_equal"),
    "broadcast_greater": (fm.greater, "flow.math.greater"),
    "broadcast_greater_equal": (fm.greater_equal, "flow.math.greater_equal"),
    "broadcast_less": (fm.less, "flow.math.less"),
    "broadcast_less_equal": (fm.less_equal, "flow.math.less_equal"),
    "broadcast_logical_and": (fm.logical_and, "flow.math.logical_and"),
    "broadcast_logical_or": (_logical("Or"), None),
    "broadcast_logical_xor": (_logical("Xor"), None),
}
for _type, (_fn, _flow) in _BROADCAST.items():
    reg(_type, "x, y -> z", (lambda fn: lambda x, a: fn(x.one("x"), x.one("y")))(_fn),
        flow=_flow)


# -- with a scalar: an attribute (scalar_*_op.cpp) or a (1,) Blob (scalar_by_tensor_op.cpp) ---
_OPERAND = ("has_int_operand: bool, has_float_operand: bool, int_operand: int64, "
            "float_operand: double")


def _operand(a, type_name):
    if a["has_int_operand"]:
        return a["int_operand"]
    if a["has_float_operand"]:
        return a["float_operand"]
    raise TraceError(f"flow.user_op_builder: op type {type_name!r} needs has_int_operand or "
                     "has_float_operand set to True")


def _scalar(fn, type_name):
    return lambda x, a: fn(x.one("in"), _operand(a, type_name))


for _type, _fn in (("scalar_add", fm.add), ("scalar_mul", fm.multiply),
                   ("scalar_pow", fm.pow), ("scalar_floordiv", fm.floordiv)):
    reg(_type, "in -> out | " + _OPERAND, _scalar(_fn, _type), flow=f"flow.math.{_fn.__name__}")


def _by_tensor(fn, type_name):
    def impl(x, a):
        x_, s = x.one("x"), x.one("scalar")
        if int(np.prod(s.shape)) != 1 or s.np_dtype != x_.np_dtype:
            raise TraceError(f"flow.user_op_builder: op type {type_name!r} takes a one-element "
                             f"scalar of x's dtype {x_.np_dtype}, got {s.shape} {s.np_dtype}")
        return fn(x_, reshape(s, [1] * max(len(x_.shape), 1)))
    return impl


for _type, _fn in (("scalar_add_by_tensor", fm.add), ("scalar_sub_by_tensor", fm.subtract),
                   ("scalar_mul_by_tensor", fm.multiply),
                   ("scalar_div_by_tensor", lambda x, y: op("Div", x, y))):
    reg(_type, "x, scalar -> y", _by_tensor(_fn, _type))


# -- clipping (clip_by_value_op.cpp): the floating bounds for floats, the integral ones else --

def _clip(lo, hi):
    def impl(x, a):
        v = x.one("x")
        floating = np.issubdtype(v.np_dtype, np.floating)
        bound = (lambda k: a[f"floating_{k}"] if floating else a[f"integral_{k}"])
        return fm.clip_by_value(v, bound("min") if lo else None, bound("max") if hi else None)
    return impl


reg("clip_by_scalar", "x -> y | floating_min: double, integral_min: int64, "
    "floating_max: double, integral_max: int64", _clip(True, True), flow="flow.clip_by_value")
reg("clip_by_scalar_min", "x -> y | floating_min: double, integral_min: int64",
    _clip(True, False), flow="flow.clip_by_value")
reg("clip_by_scalar_max", "x -> y | floating_max: double, integral_max: int64",
    _clip(False, True), flow="flow.clip_by_value")


# -- reductions (reduce_ops.cpp): a non-empty axis list ---------------------------------------

def _reduce(fn, type_name):
    def impl(x, a):
        if not a["axis"]:
            raise TraceError(f"flow.user_op_builder: op type {type_name!r} needs a non-empty "
                             "axis list")
        return fn(x.one("input_tensor"), axis=a["axis"], keepdims=a["keepdims"])
    return impl


for _type in ("reduce_sum", "reduce_prod", "reduce_min", "reduce_max", "reduce_any",
              "reduce_all"):
    reg(_type, "input_tensor -> output_tensor | axis: list_int32, keepdims: bool",
        _reduce(getattr(fm, _type), _type), flow=f"flow.math.{_type}")


# -- activations ------------------------------------------------------------------------------
reg("relu", "in -> out", lambda x, a: fm.relu(x.one("in")), flow="flow.math.relu")
reg("relu_grad", "y, dy -> dx",
    lambda x, a: where(fm.greater(x.one("y"), 0), x.one("dy"), zeros_like(x.one("dy"))))
reg("sigmoid", "in -> out", lambda x, a: fm.sigmoid(x.one("in")), flow="flow.math.sigmoid")
reg("sigmoid_grad", "y, dy -> dx", lambda x, a: fm.sigmoid_grad(x.one("y"), x.one("dy")),
    flow="flow.math.sigmoid_grad")
reg("gelu", "in -> out", lambda x, a: fm.gelu(x.one("in")), flow="flow.math.gelu")
reg("gelu_grad", "x, dy -> dx", lambda x, a: fm.gelu_grad(x.one("x"), x.one("dy")),
    flow="flow.math.gelu_grad")
reg("leaky_relu", "x -> y | alpha: float", lambda x, a: act.leaky_relu(x.one("x"), a["alpha"]),
    flow="flow.nn.leaky_relu")
reg("elu", "in -> out | alpha: double", lambda x, a: act.elu(x.one("in"), a["alpha"]),
    flow="flow.nn.elu")
reg("hardsigmoid", "in -> out", lambda x, a: act.hardsigmoid(x.one("in")),
    flow="flow.nn.hardsigmoid")
reg("hardswish", "in -> out", lambda x, a: act.hardswish(x.one("in")), flow="flow.nn.hardswish")
reg("hardtanh", "in -> out | min_val: double, max_val: double",
    lambda x, a: act.hardtanh(x.one("in"), a["min_val"], a["max_val"]), flow="flow.nn.hardtanh")
reg("mish", "in -> out", lambda x, a: act.mish(x.one("in")), flow="flow.nn.mish")
reg("silu", "in -> out", lambda x, a: act.swish(x.one("in"), 1.0), flow="flow.nn.swish")
reg("softmax", "in -> out", lambda x, a: act.softmax(x.one("in")), flow="flow.nn.softmax")
reg("softmax_grad", "y, dy -> dx", lambda x, a: act.softmax_grad(x.one("y"), x.one("dy")),
    flow="flow.nn.softmax_grad")
reg("logsoftmax", "in -> prob, out",
    lambda x, a: (act.softmax(x.one("in")), act.logsoftmax(x.one("in"))),
    flow="flow.nn.logsoftmax")


def _tf_prelu(x, a):
    """x where x > 0, else alpha * x (alpha broadcast from the right), as the kernel."""
    v, alpha = x.one("x"), x.one("alpha")
    return where(fm.greater(v, 0), v, fm.multiply(v, alpha))


reg("tf_prelu", "x, alpha -> y", _tf_prelu, flow="flow.layers.prelu")


# -- argmax, sorting, top_k (argmax_op.cpp, sort_op.cpp, arg_sort_op.cpp, top_k_op.cpp) -------
reg("argmax", "in -> out", lambda x, a: fm.argmax(x.one("in")), flow="flow.math.argmax")
reg("sort", "in -> out | direction: string",
    lambda x, a: fm.sort(x.one("in"), direction=a["direction"]), flow="flow.sort")
reg("arg_sort", "in -> out | direction: string",
    lambda x, a: fm.argsort(x.one("in"), direction=a["direction"]), flow="flow.argsort")
reg("top_k", "in -> out | k: int32, sorted: bool",
    lambda x, a: fm.top_k(x.one("in"), axis=-1, k=a["k"], sorted=a["sorted"]),
    flow="flow.math.top_k")
reg("in_top_k", "targets, predictions -> out | k: int32",
    lambda x, a: fm.in_top_k(x.one("targets"), x.one("predictions"), a["k"]),
    flow="flow.math.in_top_k")


def _l2_normalize(x, a):
    v = x.one("x")
    square_sum = fm.reduce_sum(fm.square(v), axis=[a["axis"]], keepdims=True)
    return fm.l2_normalize(v, axis=a["axis"], epsilon=a["epsilon"]), square_sum


reg("l2_normalize", "x -> y, square_x_sum | axis: int32, epsilon: float", _l2_normalize,
    flow="flow.math.l2_normalize")
reg("tril", "in -> out | diagonal: int64, floating_fill_value: double = 0.0, "
    "integer_fill_value: int64 = 0, is_floating_fill_value: bool = False",
    lambda x, a: fm.tril(x.one("in"), a["diagonal"], a["floating_fill_value"]
                         if a["is_floating_fill_value"] else a["integer_fill_value"]),
    flow="flow.math.tril")
reg("fused_scale_tril", "in -> out | diagonal: int64, floating_fill_value: double = 0.0, "
    "integer_fill_value: int64 = 0, is_floating_fill_value: bool = False, "
    "floating_scale_value: double = 1.0, integer_scale_value: int64 = 1, "
    "is_floating_scale_value: bool = False",
    lambda x, a: fm.fused_scale_tril(
        x.one("in"), a["diagonal"],
        a["floating_fill_value"] if a["is_floating_fill_value"] else a["integer_fill_value"],
        a["floating_scale_value"] if a["is_floating_scale_value"] else a["integer_scale_value"]),
    flow="flow.math.fused_scale_tril")

# -- segment sums (unsorted_segment_sum_op.cpp, unsorted_batch_segment_sum_op.cpp) ------------
reg("unsorted_segment_sum", "data, segment_ids -> out | axis: int64, num_segments: int64",
    lambda x, a: fm.unsorted_segment_sum(x.one("data"), x.one("segment_ids"),
                                         a["num_segments"], axis=a["axis"]),
    flow="flow.math.unsorted_segment_sum")
reg("unsorted_segment_sum_like", "data, segment_ids, like -> out | axis: int64",
    lambda x, a: fm.unsorted_segment_sum_like(x.one("data"), x.one("segment_ids"),
                                              x.one("like"), axis=a["axis"]),
    flow="flow.math.unsorted_segment_sum_like")
reg("unsorted_batch_segment_sum", "data, segment_ids -> out | num_segments: int64",
    lambda x, a: fm.unsorted_batch_segment_sum(x.one("data"), x.one("segment_ids"),
                                               a["num_segments"]),
    flow="flow.math.unsorted_batch_segment_sum")
