"""Elementwise and broadcasting ops: shape rules and gradient rules.

onnxruntime's CPU kernels for many unary ops (Atan, Sinh, Erf, Elu, ...) take float32
only. Such an op is registered with a float64 formula: its `lower=` hook emits the
composite `onnxjob.<op>`, which computes the formula from ops that have float64 kernels
and keeps the op's own gradient rule. The special functions that are no ONNX op at all
(expm1, log1p, erfc, lgamma) are composites of the same kind.
"""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.registry import (any_dynamic, broadcast_shape, register, register_composite,
                                    same_as_input)
from onnxjob.graph.primitives.shape_ops import zeros_of
from onnxjob.graph.tracer import as_blob, op

# float16 as OneFlow takes it for its math ops: onnxruntime's CPU provider runs the
# float16 nodes it has no kernel for through float32 (its InsertCastTransformer)
FLOATS = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16))
_F16 = np.dtype(np.float16)
_F32 = (np.dtype(np.float32),)


def _c(value, like):
    """A constant of `like`'s dtype."""
    return as_blob(value, like=like)


def cast(x, np_dtype):
    """`x` as `np_dtype` (no node when it already is)."""
    if x.np_dtype == np.dtype(np_dtype):
        return x
    return op("Cast", x, to=dtypes.from_numpy(np_dtype).ir_dtype.value)


def _binary_infer(out_dtype=None):
    def infer(inputs, attrs, num_outputs):
        a, b = inputs
        if a.np_dtype != b.np_dtype:
            raise ValueError(f"dtypes differ: {a.np_dtype} and {b.np_dtype}")
        return [(broadcast_shape(a.shape, b.shape, bound=any_dynamic(inputs)),
                 out_dtype or a.np_dtype)]
    return infer


def _bool_infer(inputs, attrs, num_outputs):
    return [(broadcast_shape(*(x.shape for x in inputs), bound=any_dynamic(inputs)),
             np.dtype(bool))]


def _half_lower(op_type):
    """float16 arithmetic as float32 between explicit Casts, rounded to float16 after
    each op, as OneFlow's half kernels round. NOTE: onnxruntime's CPU provider has no
    float16 Add/Sub/Mul/Div; the float32 Casts it inserts around such a node are merged
    with the user's Cast(float32 -> float16) before it, so the input was never rounded
    (cast(x, half) + cast(y, half) came out in float32 precision). Casts in the graph
    itself are kept. Gradient rules are left as they are: OneFlow's half backward
    kernels compute in float32 and round once, as onnxruntime's inserted Casts do."""
    def lower(inputs, attrs, num_outputs):
        if any(x.np_dtype != _F16 for x in inputs):
            return None     # (mixed dtypes: the shape rule refuses them)
        if (inputs[0].builder.location_override or "").endswith("(backward)"):
            return None     # emitted by autodiff (graph/autodiff.py marks its location)
        wide = op(op_type, *(cast(x, np.float32) for x in inputs), **attrs)
        return [cast(wide, np.float16)]
    return lower


# -- binary -------------------------------------------------------------------------------
# Each rule returns gradients of the broadcast shape; the engine reduces them.
register("Add", _binary_infer(), lambda n, g, need: [g[0], g[0]], lower=_half_lower("Add"))
register("Sub", _binary_infer(), lambda n, g, need: [g[0], op("Neg", g[0]) if need[1] else None],
         lower=_half_lower("Sub"))
register("Mul", _binary_infer(), lambda n, g, need: [
    op("Mul", g[0], n.inputs[1]) if need[0] else None,
    op("Mul", g[0], n.inputs[0]) if need[1] else None], lower=_half_lower("Mul"))
register("Div", _binary_infer(), lambda n, g, need: [
    op("Div", g[0], n.inputs[1]) if need[0] else None,
    op("Neg", op("Div", op("Mul", g[0], n.outputs[0]), n.inputs[1])) if need[1] else None],
    lower=_half_lower("Div"))


def _minmax_grad(n, g, need):
    a, b = n.inputs
    pick_a = op("Equal", n.outputs[0], a)
    zero = _c(0, g[0])
    return [op("Where", pick_a, g[0], zero) if need[0] else None,
            op("Where", pick_a, zero, g[0]) if need[1] else None]


register("Max", _binary_infer(), _minmax_grad)
register("Min", _binary_infer(), _minmax_grad)


def _elementwise_extremum(op_type, strictly):
    """OneFlow's elementwise_maximum / minimum (flow.math.maximum / minimum of two Blobs of
    one shape): x's gradient where x is strictly the larger (smaller), y's elsewhere, ties
    included (elementwise_maximum_minimum_kernel.h: if (x > y) dx = dz; else dy = dz)."""
    def grad(n, g, need):
        x, y = n.inputs
        x_wins = op(strictly, x, y)
        zero = _c(0, g[0])
        return [op("Where", x_wins, g[0], zero) if need[0] else None,
                op("Where", x_wins, zero, g[0]) if need[1] else None]
    register_composite(f"onnxjob.Elementwise{op_type}",
                       lambda inputs, attrs, k: [op(op_type, *inputs)], grad)


_elementwise_extremum("Max", "Greater")
_elementwise_extremum("Min", "Less")


def _pow_grad(n, g, need):
    """As OneFlow: d/dx = p x^(p-1); d/dp = log(x) x^p where x > 0, else 0."""
    x, p = n.inputs
    gx = gp = None
    if need[0]:
        gx = op("Mul", g[0], op("Mul", p, op("Pow", x, op("Sub", p, _c(1, p)))))
    if need[1]:
        positive = op("Greater", x, _c(0, x))
        log_x = op("Log", op("Where", positive, x, _c(1, x)))
        gp = op("Where", positive, op("Mul", g[0], op("Mul", n.outputs[0], log_x)), _c(0, g[0]))
    return [gx, gp]


def _pow_lower(inputs, attrs, num_outputs):
    """onnxruntime has no int8 Pow: int8 powers are taken in int32 and cast back."""
    x, p = inputs
    if x.np_dtype != np.int8 or p.np_dtype != np.int8:
        return None
    return [cast(op("Pow", cast(x, np.int32), cast(p, np.int32)), np.int8)]


register("Pow", _binary_infer(), _pow_grad, lower=_pow_lower)


def _mod_lower(inputs, attrs, num_outputs):
    """Floor modulo of floats (fmod=0): onnxruntime runs Mod on floats only as C fmod, so
    it is emitted as NumPy computes it: r = fmod(x, y), then r + y where r is nonzero and
    its sign differs from y's. (x - floor(x / y) * y would round: its error is relative
    to x, not to the small remainder.)"""
    x, y = inputs
    if attrs.get("fmod", 0) or not np.issubdtype(x.np_dtype, np.floating):
        return None
    r = op("Mod", x, y, fmod=1)
    zero = _c(0, r)
    wrong_sign = op("And", op("Not", op("Equal", r, zero)),
                    op("Not", op("Equal", op("Less", r, zero), op("Less", y, zero))))
    return [op("Where", wrong_sign, op("Add", r, y), r)]


# OneFlow's rule (broadcast_ops_grad.cpp, floor_mod and fmod): dz passes to x unchanged
# (x - floor(x / y) * y is x plus a step function of x), y gets none
register("Mod", _binary_infer(), lambda n, g, need: [g[0], None], lower=_mod_lower)
for _cmp in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
    register(_cmp, _binary_infer(np.dtype(bool)), None, differentiable=False)
for _logic in ("And", "Or", "Xor"):
    register(_logic, _bool_infer, None, differentiable=False)
register("Not", same_as_input(), None, differentiable=False)


def _where_infer(inputs, attrs, num_outputs):
    c, a, b = inputs
    if a.np_dtype != b.np_dtype:
        raise ValueError(f"dtypes differ: {a.np_dtype} and {b.np_dtype}")
    return [(broadcast_shape(c.shape, a.shape, b.shape, bound=any_dynamic(inputs)),
             a.np_dtype)]


def _where_grad(n, g, need):
    c = n.inputs[0]
    zero = _c(0, g[0])
    return [None, op("Where", c, g[0], zero) if need[1] else None,
            op("Where", c, zero, g[0]) if need[2] else None]


register("Where", _where_infer, _where_grad)


def _atan2_expand(inputs, attrs, num_outputs):
    """atan(x / y) moved to the quadrant of (y, x); y == 0 gives sign(x) * pi / 2."""
    x, y = inputs
    y_zero = op("Equal", y, _c(0, y))
    r = op("Atan", op("Div", x, op("Where", y_zero, _c(1, y), y)))
    turn = op("Where", op("GreaterOrEqual", x, _c(0, x)), _c(math.pi, x), _c(-math.pi, x))
    r = op("Where", op("Less", y, _c(0, y)), op("Add", r, turn), r)
    return [op("Where", y_zero, op("Mul", op("Sign", x), _c(math.pi / 2, x)), r)]


def _atan2_grad(n, g, need):
    x, y = n.inputs
    scaled = op("Div", g[0], op("Add", op("Mul", x, x), op("Mul", y, y)))
    return [op("Mul", scaled, y) if need[0] else None,
            op("Neg", op("Mul", scaled, x)) if need[1] else None]


register_composite("onnxjob.Atan2", _atan2_expand, _atan2_grad)

# -- unary --------------------------------------------------------------------------------


def _float_infer(op_type):
    def infer(inputs, attrs, num_outputs):
        x = inputs[0]
        if x.np_dtype not in FLOATS:
            raise TraceError(f"{op_type} takes float16, float32 or float64 values, got "
                             f"{x.np_dtype}")
        return [(x.shape, x.np_dtype)]
    return infer


def unary_math(op_type, grad, formula=None, native=FLOATS, native_on_cpu=None):
    """Register the float-only unary ONNX op `op_type`. onnxruntime runs it for the
    `native` dtypes (`native_on_cpu` where the job is not traced for CUDA, if given);
    other float dtypes emit the composite onnxjob.<op_type>, which computes
    `formula(x, attrs)` and has the same gradient rule."""
    if formula is None:
        register(op_type, _float_infer(op_type), grad)
        return
    name = f"onnxjob.{op_type}"
    register_composite(name, lambda inputs, attrs, k: [formula(inputs[0], attrs)], grad)

    def lower(inputs, attrs, num_outputs):
        x = inputs[0]
        kernels = native if native_on_cpu is None or x.builder.device == "cuda" \
            else native_on_cpu
        if x.np_dtype in kernels or x.np_dtype not in FLOATS or x.np_dtype == _F16:
            return None   # (float16: onnxruntime computes it in float32)
        return [op(name, x, **attrs)]
    register(op_type, _float_infer(op_type), grad, lower=lower)


def special_function(name, formula, grad):
    """Register the composite onnxjob.<name>: a function that is no ONNX op, computed
    by `formula(x)` (float32 and float64) with the gradient rule `grad`."""
    def expand(inputs, attrs, num_outputs):
        x = inputs[0]
        if x.np_dtype not in FLOATS:
            raise TraceError(f"{name} takes float16, float32 or float64 values, got "
                             f"{x.np_dtype}")
        if x.np_dtype == _F16:   # the formula in float32, as onnxruntime runs float16 ops
            return [cast(formula(cast(x, np.float32)), np.float16)]
        return [formula(x)]
    register_composite(f"onnxjob.{name}", expand, grad)


def _x(n):
    return n.inputs[0]


def _y(n):
    return n.outputs[0]


def _one_minus_square(x):
    return op("Sub", _c(1, x), op("Mul", x, x))


def _one_plus_square(x):
    return op("Add", _c(1, x), op("Mul", x, x))


register("Identity", same_as_input(), lambda n, g, need: [g[0]])
# its input's value, through which no gradient flows (an input OneFlow's op marks
# requires_grad(false): flow.nn.batch_normalization's statistics on a GPU)
register_composite("onnxjob.StopGradient", lambda inputs, attrs, n: [op("Identity", inputs[0])],
                   differentiable=False)
register("Neg", same_as_input(), lambda n, g, need: [op("Neg", g[0])])
def _abs_grad(n, g, need):
    """As OneFlow's abs gradient: 0 at x == 0, -dy where x < 0, else dy (NaN's too)."""
    x, zero = _x(n), _c(0, g[0])
    return [op("Where", op("Less", x, _c(0, x)), op("Neg", g[0]),
               op("Where", op("Equal", x, _c(0, x)), zero, g[0]))]


register("Abs", same_as_input(), _abs_grad)


def _relu_lower(inputs, attrs, num_outputs):
    """onnxruntime has no int64 Relu: it is max(x, 0)."""
    x = inputs[0]
    return [op("Max", x, _c(0, x))] if x.np_dtype == np.int64 else None


# NOTE: the ReLU gradient is Where(y > 0): one kernel on CUDA; for CPU jobs
# onnxjob/passes/relu_mask_as_mul.py turns it into a multiply by the mask, which is faster there.
register("Relu", same_as_input(), lambda n, g, need: [
    op("Where", op("Greater", _y(n), _c(0, g[0])), g[0], _c(0, g[0]))], lower=_relu_lower)
unary_math("LeakyRelu", lambda n, g, need: [
    op("Where", op("Greater", _x(n), _c(0, g[0])), g[0],
       op("Mul", g[0], _c(n.attrs.get("alpha", 0.01), g[0])))])
unary_math("Tanh", lambda n, g, need: [
    op("Mul", g[0], _one_minus_square(_y(n)))])
unary_math("Exp", lambda n, g, need: [op("Mul", g[0], _y(n))])
unary_math("Log", lambda n, g, need: [op("Div", g[0], _x(n))])
unary_math("Sqrt", lambda n, g, need: [
    op("Div", op("Mul", g[0], _c(0.5, g[0])), _y(n))])
unary_math("Reciprocal", lambda n, g, need: [
    op("Neg", op("Mul", g[0], op("Mul", _y(n), _y(n))))])
unary_math("Cos", lambda n, g, need: [op("Neg", op("Mul", g[0], op("Sin", _x(n))))])
unary_math("Sin", lambda n, g, need: [op("Mul", g[0], op("Cos", _x(n)))])
def _flat_grad(n, g, need):
    """Zero: the functions are piecewise constant (OneFlow's floor, ceil, rint and sign
    gradients are zero too)."""
    return [zeros_of(g[0], g[0].shape, g[0].np_dtype)]


for _flat in ("Floor", "Ceil", "Round"):
    register(_flat, _float_infer(_flat), _flat_grad, differentiable=False)
register("Sign", same_as_input(), _flat_grad, differentiable=False)
register("IsNaN", lambda i, a, k: [(i[0].shape, np.dtype(bool))], None, differentiable=False)


# -- float64 formulas of the ops onnxruntime runs in float32 only -------------------------

def log1p_formula(x):
    """log(1 + x), accurate for small x: log(u) * x / (u - 1) with u = 1 + x (Kahan)."""
    one = _c(1, x)
    u = op("Add", one, x)
    ratio = op("Div", op("Mul", op("Log", u), x), op("Sub", u, one))
    ratio = op("Where", op("Equal", u, _c(np.inf, x)), u, ratio)
    return op("Where", op("Equal", u, one), x, ratio)


def expm1_formula(x):
    """exp(x) - 1, accurate for small x: (u - 1) * x / log(u) with u = exp(x) (Kahan)."""
    u = op("Exp", x)
    u_minus_1 = op("Sub", u, _c(1, x))
    ratio = op("Div", op("Mul", u_minus_1, x), op("Log", u))
    ratio = op("Where", op("Equal", u, _c(np.inf, x)), u, ratio)
    ratio = op("Where", op("Equal", u_minus_1, _c(-1, x)), _c(-1, x), ratio)
    return op("Where", op("Equal", u_minus_1, _c(0, x)), x, ratio)


def _atan_formula(x, attrs=None):
    """atan in float64: float32 Atan of |x| or 1/|x| (whichever is <= 1), refined by one
    Newton step on sin(y) - t cos(y) = 0, which doubles its ~7 correct digits."""
    ax = op("Abs", x)
    big = op("Greater", ax, _c(1, x))
    t = op("Where", big, op("Reciprocal", op("Where", big, ax, _c(1, x))), ax)
    y0 = cast(op("Atan", cast(t, np.float32)), np.float64)
    s, c = op("Sin", y0), op("Cos", y0)
    step = op("Div", op("Sub", s, op("Mul", t, c)), op("Add", c, op("Mul", t, s)))
    y1 = op("Sub", y0, step)
    y1 = op("Where", big, op("Sub", _c(math.pi / 2, x), y1), y1)
    return op("Mul", op("Sign", x), y1)


def _asin_formula(x, attrs=None):
    """asin(x) = 2 atan(x / (1 + sqrt((1 - x)(1 + x))))."""
    one = _c(1, x)
    root = op("Sqrt", op("Mul", op("Sub", one, x), op("Add", one, x)))
    return op("Mul", _c(2, x), _atan_formula(op("Div", x, op("Add", one, root))))


def _acos_formula(x, attrs=None):
    """acos(x) = 2 atan(sqrt((1 - x) / (1 + x))) (accurate near 1; atan(inf) at -1)."""
    one = _c(1, x)
    root = op("Sqrt", op("Div", op("Sub", one, x), op("Add", one, x)))
    return op("Mul", _c(2, x), _atan_formula(root))


_LARGE = 1e8  # above it, sqrt(x^2 + 1) == |x| in float64


def _asinh_formula(x, attrs=None):
    """sign(x) log1p(|x| + x^2 / (1 + sqrt(1 + x^2))); log(2|x|) for large |x|."""
    ax = op("Abs", x)
    small = op("Min", ax, _c(_LARGE, x))
    sq = op("Mul", small, small)
    near = log1p_formula(op("Add", small, op(
        "Div", sq, op("Add", _c(1, x), op("Sqrt", op("Add", _c(1, x), sq))))))
    far = op("Add", op("Log", ax), _c(math.log(2), x))
    return op("Mul", op("Sign", x), op("Where", op("Less", ax, _c(_LARGE, x)), near, far))


def _acosh_formula(x, attrs=None):
    """log1p(t + sqrt(t (t + 2))) with t = x - 1; log(2x) for large x."""
    t = op("Sub", op("Min", x, _c(_LARGE, x)), _c(1, x))
    near = log1p_formula(op("Add", t, op("Sqrt", op("Mul", t, op("Add", t, _c(2, x))))))
    far = op("Add", op("Log", x), _c(math.log(2), x))
    return op("Where", op("Less", x, _c(_LARGE, x)), near, far)


def _atanh_formula(x, attrs=None):
    """(log1p(x) - log1p(-x)) / 2."""
    diff = op("Sub", log1p_formula(x), log1p_formula(op("Neg", x)))
    return op("Mul", diff, _c(0.5, x))


def _sinh_formula(x, attrs=None):
    """sign(x) (e + e / (e + 1)) / 2 with e = expm1(|x|) for |x| <= 1 (no cancellation),
    (u - 1/u) / 2 with u = exp(|x|) above."""
    ax = op("Abs", x)
    e = expm1_formula(op("Min", ax, _c(1, x)))
    near = op("Add", e, op("Div", e, op("Add", e, _c(1, x))))
    u = op("Exp", ax)
    far = op("Sub", u, op("Reciprocal", u))
    half = op("Mul", op("Where", op("Greater", ax, _c(1, x)), far, near), _c(0.5, x))
    return op("Mul", op("Sign", x), half)


def _cosh_formula(x, attrs=None):
    u = op("Exp", op("Abs", x))
    return op("Mul", op("Add", u, op("Reciprocal", u)), _c(0.5, x))


def _tan_formula(x, attrs=None):
    return op("Div", op("Sin", x), op("Cos", x))


# erf(x) = 2/sqrt(pi) x exp(-x^2) sum_n (2 x^2)^n / (2n+1)!!  (all terms positive) below
# _ERF_SPLIT; erfc(x) = exp(-x^2) / sqrt(pi) / (x + (1/2) / (x + 1 / (x + (3/2) / ...)))
# (Laplace's continued fraction) above. NOTE: 30 series terms and 50 fraction levels
# give <= 4e-15 relative error against math.erf / math.erfc on [0, 6].
_ERF_SPLIT = 2.0
_ERF_SERIES = [1.0]
for _n in range(1, 31):
    _ERF_SERIES.append(_ERF_SERIES[-1] * 2.0 / (2 * _n + 1))
_ERFC_LEVELS = 50


def _erf_and_erfc_of_abs(x):
    """(erf(|x|), erfc(|x|), |x| < split) in float64, each accurate where it is small."""
    ax = op("Abs", x)
    near_x = op("Min", ax, _c(_ERF_SPLIT, x))
    t = op("Mul", near_x, near_x)
    series = _c(_ERF_SERIES[-1], x)
    for coefficient in reversed(_ERF_SERIES[:-1]):
        series = op("Add", op("Mul", series, t), _c(coefficient, x))
    near_erf = op("Mul", op("Mul", near_x, op("Exp", op("Neg", t))),
                  op("Mul", series, _c(2 / math.sqrt(math.pi), x)))
    far_x = op("Max", ax, _c(_ERF_SPLIT, x))
    fraction = far_x
    for k in range(_ERFC_LEVELS, 0, -1):
        fraction = op("Add", far_x, op("Div", _c(k / 2, x), fraction))
    far_erfc = op("Div", op("Exp", op("Neg", op("Mul", far_x, far_x))),
                  op("Mul", fraction, _c(math.sqrt(math.pi), x)))
    near = op("Less", ax, _c(_ERF_SPLIT, x))
    one = _c(1, x)
    erf = op("Where", near, near_erf, op("Sub", one, far_erfc))
    erfc = op("Where", near, op("Sub", one, near_erf), far_erfc)
    return erf, erfc


def _erf_formula(x, attrs=None):
    erf, _ = _erf_and_erfc_of_abs(x)
    return op("Mul", op("Sign", x), erf)


def _erfc_formula(x):
    """erfc in float64 (float32 inputs too: 1 - Erf loses all digits above x ~ 4)."""
    x64 = cast(x, np.float64)
    erf, erfc = _erf_and_erfc_of_abs(x64)
    negative = op("Less", x64, _c(0, x64))
    out = op("Where", negative, op("Add", _c(1, x64), erf), erfc)
    return cast(out, x.np_dtype)


def _erf_grad_factor(x):
    """2 / sqrt(pi) exp(-x^2)."""
    return op("Mul", _c(2 / math.sqrt(math.pi), x), op("Exp", op("Neg", op("Mul", x, x))))


def _softplus_formula(x, attrs=None):
    """The overflow-free log(1 + exp(-|x|)) + max(x, 0)."""
    tail = log1p_formula(op("Exp", op("Neg", op("Abs", x))))
    return op("Add", tail, op("Max", x, _c(0, x)))


def _elu_formula(x, attrs):
    alpha = _c(attrs.get("alpha", 1.0), x)
    negative = op("Mul", alpha, expm1_formula(op("Min", x, _c(0, x))))
    return op("Where", op("Greater", x, _c(0, x)), x, negative)


def _hard_sigmoid_formula(x, attrs):
    linear = op("Add", op("Mul", x, _c(attrs.get("alpha", 0.2), x)), _c(attrs.get("beta", 0.5), x))
    return op("Max", op("Min", linear, _c(1, x)), _c(0, x))


def _hard_swish_formula(x, attrs=None):
    return op("Mul", x, _hard_sigmoid_formula(x, {"alpha": 1 / 6, "beta": 0.5}))


def _elu_grad(n, g, need):
    alpha = _c(n.attrs.get("alpha", 1.0), g[0])
    x = _x(n)
    return [op("Where", op("Greater", x, _c(0, x)), g[0],
               op("Mul", g[0], op("Mul", alpha, op("Exp", x))))]


def _hard_sigmoid_grad(n, g, need):
    """alpha where 0 < alpha x + beta < 1 (OneFlow: 1/6 on the open interval (-3, 3))."""
    x = _x(n)
    alpha, beta = n.attrs.get("alpha", 0.2), n.attrs.get("beta", 0.5)
    # the interval's ends in x (-3 and 3 for OneFlow's 1/6, 1/2): alpha x + beta rounded
    # to float16 reaches 1 only past x = 3
    if alpha == 0:
        return [op("Mul", g[0], _c(0, x))]
    low, high = sorted((-beta / alpha, (1 - beta) / alpha))
    inside = op("And", op("Greater", x, _c(low, x)), op("Less", x, _c(high, x)))
    return [op("Where", inside, op("Mul", g[0], _c(alpha, x)), _c(0, x))]


def _hard_swish_grad(n, g, need):
    """0 for x <= -3, 1 for x >= 3, x / 3 + 1/2 between (OneFlow's hardswish_grad)."""
    x = _x(n)
    slope = op("Add", op("Div", x, _c(3, x)), _c(0.5, x))
    slope = op("Where", op("GreaterOrEqual", x, _c(3, x)), _c(1, x), slope)
    slope = op("Where", op("LessOrEqual", x, _c(-3, x)), _c(0, x), slope)
    return [op("Mul", g[0], slope)]


def _sigmoid_formula(x, attrs=None):
    """1 / (1 + exp(-x)), to a few ulps also where it is tiny."""
    return op("Reciprocal", op("Add", _c(1, x), op("Exp", op("Neg", x))))


# NOTE: onnxruntime's CPU Sigmoid kernels are approximations (float32: 1.5e-7 absolute
# error, but 17% relative at x = -15 and 0 from -18 down, where a log of it, a binary cross
# entropy, is inf; float64: 1e-13 relative, 0 below 1e-17): jobs not traced for CUDA get
# OneFlow's 1 / (1 + exp(-x)) (its GPU kernel's, cuda_dnn_interface.cu) for float32 and
# float64. The CUDA EP's float32 kernel computes that formula itself.
unary_math("Sigmoid", lambda n, g, need: [
    op("Mul", g[0], op("Mul", _y(n), op("Sub", _c(1, g[0]), _y(n))))], _sigmoid_formula, _F32,
    native_on_cpu=())
unary_math("Atan", lambda n, g, need: [op("Div", g[0], _one_plus_square(_x(n)))],
           _atan_formula, _F32)
unary_math("Asin", lambda n, g, need: [
    op("Div", g[0], op("Sqrt", _one_minus_square(_x(n))))], _asin_formula, _F32)
unary_math("Acos", lambda n, g, need: [
    op("Neg", op("Div", g[0], op("Sqrt", _one_minus_square(_x(n)))))], _acos_formula, _F32)
unary_math("Asinh", lambda n, g, need: [
    op("Div", g[0], op("Sqrt", _one_plus_square(_x(n))))], _asinh_formula, _F32)
unary_math("Acosh", lambda n, g, need: [op("Div", g[0], op("Sqrt", op(
    "Sub", op("Mul", _x(n), _x(n)), _c(1, g[0]))))], _acosh_formula, _F32)
unary_math("Atanh", lambda n, g, need: [op("Div", g[0], _one_minus_square(_x(n)))],
           _atanh_formula, _F32)
unary_math("Sinh", lambda n, g, need: [op("Mul", g[0], op("Cosh", _x(n)))], _sinh_formula, _F32)
unary_math("Cosh", lambda n, g, need: [op("Mul", g[0], op("Sinh", _x(n)))], _cosh_formula, _F32)
unary_math("Tan", lambda n, g, need: [op("Mul", g[0], _one_plus_square(_y(n)))],
           _tan_formula, _F32)
unary_math("Erf", lambda n, g, need: [op("Mul", g[0], _erf_grad_factor(_x(n)))],
           _erf_formula, _F32)
unary_math("Softplus", lambda n, g, need: [op("Mul", g[0], op("Sigmoid", _x(n)))],
           _softplus_formula, _F32)
unary_math("Elu", _elu_grad, _elu_formula, _F32)
unary_math("HardSigmoid", _hard_sigmoid_grad, _hard_sigmoid_formula, _F32)
unary_math("HardSwish", _hard_swish_grad, _hard_swish_formula, _F32)

special_function("Expm1", expm1_formula, lambda n, g, need: [
    op("Mul", g[0], op("Add", _y(n), _c(1, g[0])))])
special_function("Log1p", log1p_formula, lambda n, g, need: [
    op("Div", g[0], op("Add", _x(n), _c(1, g[0])))])
special_function("Erfc", _erfc_formula, lambda n, g, need: [
    op("Neg", op("Mul", g[0], _erf_grad_factor(_x(n))))])


def gelu_formula(x):
    """x * Phi(x) = x (1 + erf(x / sqrt(2))) / 2 (the exact GELU), in the form onnxruntime's
    GeluFusion makes one Gelu kernel of (x / sqrt(2), not x * (1 / sqrt(2)): one pass over
    x instead of five, on the CPU and CUDA EPs)."""
    return op("Mul", op("Mul", x, op("Add", op("Erf", op("Div", x, _c(math.sqrt(2), x))),
                                    _c(1, x))), _c(0.5, x))


def gelu_derivative(x):
    """d gelu / dx = Phi(x) + x * phi(x)."""
    cdf = op("Mul", _c(0.5, x), op("Add", _c(1, x), op(
        "Erf", op("Mul", x, _c(0.7071067811865476, x)))))
    pdf = op("Mul", _c(0.3989422804014327, x),
             op("Exp", op("Mul", op("Mul", x, x), _c(-0.5, x))))
    return op("Add", cdf, op("Mul", x, pdf))


# NOTE: one composite with its own gradient, which reads x alone: the autodiff of the
# formula's parts kept three of its intermediates for the backward beside x's consumers
# (BERT-base at batch 32 under AMP: 864 MiB of its planned peak, graph/memory_plan.py)
special_function("Gelu", gelu_formula, lambda n, g, need: [
    op("Mul", g[0], gelu_derivative(_x(n)))])


# -- lgamma and its derivative digamma (computed in float64) ------------------------------
# Both shift x >= 1/2 up by 10 (recurrences) and use the asymptotic series there, whose
# first omitted term is below 1e-15 at z = 10; x < 1/2 uses the reflection formulas.
_SHIFT = 10
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_LGAMMA_SERIES = [1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188, -691 / 360360]
_DIGAMMA_SERIES = [-1 / 12, 1 / 120, -1 / 252, 1 / 240, -1 / 132, 691 / 32760]


def _odd_series(z, coefficients, power):
    """sum_k coefficients[k] / z^(power + 2k)."""
    inv_sq = op("Reciprocal", op("Mul", z, z))
    total = _c(coefficients[-1], z)
    for coefficient in reversed(coefficients[:-1]):
        total = op("Add", op("Mul", total, inv_sq), _c(coefficient, z))
    return op("Mul", total, op("Pow", op("Reciprocal", z), _c(float(power), z)))


def _shifted(x):
    """(z, small): z = x + 10 where x < 10 (x is clamped to [1/2, inf) first)."""
    x = op("Max", x, _c(0.5, x))
    small = op("Less", x, _c(float(_SHIFT), x))
    return op("Where", small, op("Add", x, _c(float(_SHIFT), x)), x), small, x


def _lgamma_positive(x):
    z, small, x = _shifted(x)
    stirling = op("Add", op("Sub", op("Mul", op("Sub", z, _c(0.5, z)), op("Log", z)), z),
                  _c(_HALF_LOG_2PI, z))
    stirling = op("Add", stirling, _odd_series(z, _LGAMMA_SERIES, 1))
    xc = op("Min", x, _c(float(_SHIFT), x))
    product = xc
    for k in range(1, _SHIFT):
        product = op("Mul", product, op("Add", xc, _c(float(k), x)))
    return op("Sub", stirling, op("Where", small, op("Log", product), _c(0, x)))


def _digamma_positive(x):
    z, small, x = _shifted(x)
    asymptotic = op("Sub", op("Log", z), op("Div", _c(0.5, z), z))
    asymptotic = op("Add", asymptotic, _odd_series(z, _DIGAMMA_SERIES, 2))
    xc = op("Min", x, _c(float(_SHIFT), x))
    harmonic = op("Reciprocal", xc)
    for k in range(1, _SHIFT):
        harmonic = op("Add", harmonic, op("Reciprocal", op("Add", xc, _c(float(k), x))))
    return op("Sub", asymptotic, op("Where", small, harmonic, _c(0, x)))


def _pi_x_reduced(x, period):
    """pi * (x - period * round(x / period)): the same sine/tangent as pi x, computed
    without the rounding error of pi x for large |x|."""
    turns = op("Round", op("Div", x, _c(float(period), x)))
    return op("Mul", op("Sub", x, op("Mul", turns, _c(float(period), x))), _c(math.pi, x))


def _lgamma_formula(x):
    """log|Gamma(x)|; x < 1/2: log(pi / |sin(pi x)|) - lgamma(1 - x); inf at the poles
    and at inf."""
    x64 = cast(x, np.float64)
    one = _c(1, x64)
    reflect = op("Less", x64, _c(0.5, x64))
    mirrored = op("Sub", one, x64)
    positive = _lgamma_positive(op("Where", reflect, mirrored, x64))
    sine = op("Abs", op("Sin", _pi_x_reduced(x64, 2)))
    reflected = op("Sub", op("Sub", _c(math.log(math.pi), x64), op("Log", sine)), positive)
    out = op("Where", reflect, reflected, positive)
    pole = op("And", op("LessOrEqual", x64, _c(0, x64)), op("Equal", op("Floor", x64), x64))
    pole = op("Or", pole, op("Equal", x64, _c(np.inf, x64)))
    return cast(op("Where", pole, _c(np.inf, x64), out), x.np_dtype)


def digamma(x):
    """psi(x) = d lgamma / dx; x < 1/2: psi(1 - x) - pi / tan(pi x)."""
    x64 = cast(x, np.float64)
    reflect = op("Less", x64, _c(0.5, x64))
    positive = _digamma_positive(op("Where", reflect, op("Sub", _c(1, x64), x64), x64))
    angle = _pi_x_reduced(x64, 1)
    cotangent = op("Div", op("Cos", angle), op("Sin", angle))
    reflected = op("Sub", positive, op("Mul", cotangent, _c(math.pi, x64)))
    return cast(op("Where", reflect, reflected, positive), x.np_dtype)


special_function("Lgamma", _lgamma_formula, lambda n, g, need: [
    op("Mul", g[0], digamma(_x(n)))])


# -- clip and cast ------------------------------------------------------------------------

def _clip_grad(n, g, need):
    """As OneFlow's clip_by_scalar_grad: 0 where x < min or x > max, else gy (also where x
    is NaN, which compares false)."""
    x = _x(n)
    outside = None
    if len(n.inputs) > 1 and n.inputs[1] is not None:
        outside = op("Less", x, n.inputs[1])
    if len(n.inputs) > 2 and n.inputs[2] is not None:
        above = op("Greater", x, n.inputs[2])
        outside = above if outside is None else op("Or", outside, above)
    gx = g[0] if outside is None else op("Where", outside, _c(0, g[0]), g[0])
    return [gx, None, None][:len(n.inputs)]


register("Clip", same_as_input(), _clip_grad)


def _hardtanh_expand(inputs, attrs, num_outputs):
    x = inputs[0]
    return [op("Clip", x, _c(attrs["min_val"], x), _c(attrs["max_val"], x))]


def _hardtanh_grad(n, g, need):
    """As OneFlow's hardtanh_grad: gy where y != min and y != max (0 at the bounds, unlike
    Clip; gy where y is NaN)."""
    y = _y(n)
    at_bound = op("Or", op("Equal", y, _c(n.attrs["min_val"], y)),
                  op("Equal", y, _c(n.attrs["max_val"], y)))
    return [op("Where", at_bound, _c(0, g[0]), g[0])]


register_composite("onnxjob.Hardtanh", _hardtanh_expand, _hardtanh_grad)


def _cast_infer(inputs, attrs, num_outputs):
    from onnx_ir import DataType
    return [(inputs[0].shape, DataType(attrs["to"]).numpy())]


def _cast_grad(n, g, need):
    """The diff cast back to the input's dtype, integers included (as OneFlow's cast);
    none for a boolean input."""
    x = _x(n)
    if x.np_dtype == np.bool_:
        return [None]
    return [cast(g[0], x.np_dtype)]


register("Cast", _cast_infer, _cast_grad)
