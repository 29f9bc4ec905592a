"""flow.math: elementwise math, reductions, top_k / sorting and segment sums.

Names, signatures, defaults and semantics follow OneFlow 0.5's single-client
flow.math (ops/math_*_ops.py, reduce_ops.py, sort_ops.py). As in OneFlow, comparisons
and logical ops return int8 (1 for true), argmax returns int64 and top_k / argsort
return int32 indices.
"""
import numbers

import numpy as np

from onnxjob.compat.generations import (positional_is, renamed_keywords, two_generations,
                                        written_for_0_4)
from onnxjob.compat.zero_d_inputs import as_vector, as_vectors
from onnxjob import dtypes
from onnxjob.errors import TraceError, missing_api
from onnxjob.graph.primitives.elementwise import FLOATS, cast, gelu_derivative
from onnxjob.graph.primitives.shape_ops import dim_of, shape_of, zeros_of
from onnxjob.graph.registry import broadcast_shape
from onnxjob.graph.tracer import (Blob, as_blob, by_tensor_shape, int64_constant,
                                  integer_reciprocal, op, reciprocal_no_nan_of)
from onnxjob.ops import qat
from onnxjob.ops import random as _random
from onnxjob.ops.legacy import count_not_finite  # noqa: F401  (flow.math.count_not_finite)
from onnxjob.source_info import warn_at_user_line

_INTS = (np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64))
_ARITHMETIC = FLOATS + _INTS


# -- helpers ------------------------------------------------------------------------------

def _named(blob, name):
    """`blob`, or an Identity called `name` (for results made of several nodes)."""
    return blob if name is None else op("Identity", blob, name=name)


def named_op(op_type, *inputs, name=None, **attrs):
    """op(op_type, ...) whose result is called `name` also where a lowering (float64
    formulas, ...) emitted other nodes in its place."""
    y = op(op_type, *inputs, name=name, **attrs)
    if name is not None and y.producer.op_type != op_type:
        y = op("Identity", y, name=name)
    return y


def _check_dtype(x, api, allowed=FLOATS):
    if hasattr(type(x), "as_graph_input"):     # a value of the data pipeline explains itself
        x = x.as_graph_input(api)
    if not isinstance(x, Blob):
        raise TraceError(f"{api} takes a Blob, got {type(x).__name__}")
    if x.np_dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TraceError(f"{api} takes {names} Blobs, got {x.np_dtype}")
    return x


def _zeros_like(x):
    return zeros_of(x, x.shape, x.np_dtype)


def _is_scalar(v):
    return isinstance(v, numbers.Number) and not isinstance(v, bool)


def _pair(x, y):
    """Two Blobs of one dtype; a Python scalar takes the other operand's dtype."""
    if isinstance(x, Blob):
        return x, as_blob(y, like=x)
    y_blob = as_blob(y)
    return as_blob(x, like=y_blob), y_blob


def _to_int8(condition):
    """OneFlow's boolean dtype: int8 1 / 0."""
    return cast(condition, np.int8)


def _binary(op_type, api, allowed=_ARITHMETIC, doc=None):
    def f(x, y, name=None):
        a, b = _pair(x, y)
        _check_dtype(a, api, allowed)
        return op(op_type, a, b, name=name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = doc or f"Broadcasting elementwise {op_type} (Python scalars are accepted)."
    return f


def _comparison(op_type, api):
    def f(x, y, name=None):
        a, b = _pair(x, y)
        _check_dtype(a, api, _ARITHMETIC)
        return _named(_to_int8(op(op_type, a, b)), name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = f"Broadcasting elementwise {op_type}, as int8 (1 where true)."
    return f


def _unary(op_type, api, doc, allowed=FLOATS):
    def f(x, name=None):
        _check_dtype(x, api, allowed)
        return named_op(op_type, x, name=name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = doc
    return f


def _special(composite, api, doc):
    def f(x, name=None):
        _check_dtype(x, api)
        return _named(op(composite, x), name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = doc
    return f


# -- binary -------------------------------------------------------------------------------

def add(x, y, name=None):
    """x + y with broadcasting (either may be a Python scalar)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.add", _ARITHMETIC)
    tracer = qat.active()
    if tracer is not None and isinstance(x, Blob) and isinstance(y, Blob):
        return tracer.add(a, b, name=name)   # an add_n for equal shapes, as OneFlow's
    # (2 frames up from by_tensor_shape: this function's caller, as in the three below)
    return by_tensor_shape(op("Add", a, b, name=name), x, y, True, 2)


def subtract(x, y, name=None):
    """x - y with broadcasting (either may be a Python scalar)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.subtract", _ARITHMETIC)
    return by_tensor_shape(op("Sub", a, b, name=name), x, y, False, 2)


def multiply(x, y, name=None):
    """x * y with broadcasting (either may be a Python scalar)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.multiply", _ARITHMETIC)
    return by_tensor_shape(op("Mul", a, b, name=name), x, y, True, 2)


def divide(x, y, name=None):
    """x / y with broadcasting.

    As OneFlow does for floats, a scalar divisor multiplies by its reciprocal (1 / 0 taken
    as 0) and a scalar dividend multiplies reciprocal_no_nan(y).
    """
    if _is_scalar(y) and isinstance(x, Blob) and x.np_dtype in FLOATS:
        return multiply(x, 0.0 if y == 0 else 1.0 / float(y), name=name)
    if _is_scalar(y) and isinstance(x, Blob):
        # an integer Blob: OneFlow's scalar_mul casts the reciprocal to the Blob's dtype
        return multiply(x, integer_reciprocal(
            "flow.math.divide: an integer Blob divided by a number", y), name=name)
    if _is_scalar(x) and isinstance(y, Blob) and y.np_dtype in FLOATS:
        return multiply(reciprocal_no_nan(y), x, name=name)
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.divide", _ARITHMETIC)
    return by_tensor_shape(op("Div", a, b, name=name), x, y, False, 2)


mod = _binary("Mod", "flow.math.mod",
              doc="Floor modulo x - floor(x / y) * y (the sign of y), with broadcasting.")
def _extremum(op_type, api):
    def f(x, y, name=None):
        a, b = _pair(x, y)
        _check_dtype(a, api, _ARITHMETIC)
        if a.shape == b.shape:  # OneFlow's elementwise op: a tie's gradient goes to y
            return _named(op(f"onnxjob.Elementwise{op_type}", a, b), name)
        return op(op_type, a, b, name=name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = (f"Broadcasting elementwise {op_type} (Python scalars are accepted); for two "
                 "Blobs of one shape, a tie's gradient goes to y, as OneFlow's.")
    return f


maximum = _extremum("Max", "flow.math.maximum")
minimum = _extremum("Min", "flow.math.minimum")
equal = _comparison("Equal", "flow.math.equal")
less = _comparison("Less", "flow.math.less")
less_equal = _comparison("LessOrEqual", "flow.math.less_equal")
greater = _comparison("Greater", "flow.math.greater")
greater_equal = _comparison("GreaterOrEqual", "flow.math.greater_equal")


def not_equal(x, y, name=None):
    """x != y with broadcasting, as int8 (1 where true)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.not_equal", _ARITHMETIC)
    return _named(_to_int8(op("Not", op("Equal", a, b))), name)


def logical_and(x, y, name=None):
    """Nonzero x and nonzero y, with broadcasting, as int8."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.logical_and", _ARITHMETIC)
    if a.np_dtype != b.np_dtype:   # OneFlow's broadcast_logical_and checks it
        raise TraceError(f"flow.math.logical_and: the operands' dtypes differ: {a.np_dtype} "
                         f"and {b.np_dtype}")
    both = op("And", cast(a, np.bool_), cast(b, np.bool_))
    return _named(_to_int8(both), name)


def pow(x, y, name=None):
    """x ** y: y a Blob (floats) or a Python scalar (any arithmetic dtype, as OneFlow's
    scalar_pow)."""
    allowed = _ARITHMETIC if _is_scalar(y) else FLOATS
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.pow", allowed)
    return op("Pow", a, b, name=name)


def atan2(x, y, name=None):
    """The angle of the point (y, x): atan(x / y) in the quadrant of (y, x)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.atan2")
    return _named(op("onnxjob.Atan2", a, b), name)


def floordiv(x, y, name=None):
    """floor(x / y) (no gradient, as in OneFlow)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.floordiv")
    return op("Floor", op("Div", a, b), name=name)


def xdivy(x, y, name=None):
    """x / y, and 0 where x == 0 (its gradients are 0 there too)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.xdivy")
    x_zero = op("Equal", a, as_blob(0, like=a))
    zero, one = as_blob(0, like=a), as_blob(1, like=a)
    # NOTE: y is replaced where x == 0 so that 0 / 0 puts no NaN into the gradients
    quotient = op("Div", a, op("Where", x_zero, one, b))
    return op("Where", x_zero, zero, quotient, name=name)


def xlogy(x, y, name=None):
    """x * log(y), and 0 where x == 0 (its gradients are 0 there too)."""
    a, b = _pair(x, y)
    _check_dtype(a, "flow.math.xlogy")
    x_zero = op("Equal", a, as_blob(0, like=a))
    return op("Mul", a, op("Log", op("Where", x_zero, as_blob(1, like=a), b)), name=name)


def squared_difference(x, y, name=None):
    """(x - y) ** 2 with broadcasting."""
    diff = subtract(x, y)
    _check_dtype(diff, "flow.math.squared_difference")
    return op("Mul", diff, diff, name=name)


def add_n(inputs, name=None):
    """The sum of a list of Blobs of one shape and dtype (0-d Blobs beside (1,) ones are
    one-element vectors: compat/zero_d_inputs.py)."""
    inputs = as_vectors(inputs, mixed_only=True)
    if not inputs:
        raise TraceError("flow.math.add_n takes a non-empty list of Blobs")
    for x in inputs[1:]:
        if x.shape != inputs[0].shape or x.np_dtype != inputs[0].np_dtype:
            raise TraceError(f"flow.math.add_n takes Blobs of one shape and dtype, got "
                             f"{inputs[0].shape} {inputs[0].np_dtype} and {x.shape} {x.np_dtype}")
    if len(inputs) == 1:
        return inputs[0]

    def total(*inputs):
        out = inputs[0]
        for x in inputs[1:-1]:
            out = op("Add", out, x)
        return op("Add", out, inputs[-1], name=name)
    return qat.int8_op("add_n", total, *inputs)


def clip_by_value(values, min_value=None, max_value=None, name=None):
    """min(max(values, min_value), max_value); either bound may be None (not both)."""
    if min_value is None and max_value is None:
        raise TraceError("clip_by_value: min_value and max_value cannot both be None")
    _check_dtype(values, "flow.math.clip_by_value", _ARITHMETIC)
    to_bound = float if values.np_dtype in FLOATS else int
    lo = as_blob(to_bound(min_value), like=values) if min_value is not None else None
    hi = as_blob(to_bound(max_value), like=values) if max_value is not None else None
    return op("Clip", values, lo, hi, name=name)


def broadcast_to_compatible_with(x, compatible, name=None):
    """`x` broadcast to the common shape of itself and the Blobs in `compatible`."""
    if not isinstance(compatible, (list, tuple)):
        raise TraceError("broadcast_to_compatible_with takes a list of Blobs as `compatible`")
    try:
        shape = broadcast_shape(x.shape, *(c.shape for c in compatible))
    except ValueError as e:
        raise TraceError(f"broadcast_to_compatible_with: {e}") from None
    if any(b.is_dynamic for b in [x, *compatible]):
        # run-time shapes: Expand broadcasts both ways, one Blob's shape at a time
        for c in compatible:
            x = op("Expand", x, shape_of(c))
        return op("Identity", x, name=name)
    if shape == x.shape:
        return op("Identity", x, name=name)
    return op("Expand", x, int64_constant(x, shape), name=name)


# -- unary --------------------------------------------------------------------------------

abs = _unary("Abs", "flow.math.abs", "|x| (ints too).", _ARITHMETIC)
acos = _unary("Acos", "flow.math.acos", "arccos(x).")
acosh = _unary("Acosh", "flow.math.acosh", "log(x + sqrt(x^2 - 1)).")
asin = _unary("Asin", "flow.math.asin", "arcsin(x).")
asinh = _unary("Asinh", "flow.math.asinh", "log(x + sqrt(x^2 + 1)).")
atan = _unary("Atan", "flow.math.atan", "arctan(x).")
atanh = _unary("Atanh", "flow.math.atanh", "log((1 + x) / (1 - x)) / 2.")
ceil = _unary("Ceil", "flow.math.ceil", "The smallest integer >= x.")
cos = _unary("Cos", "flow.math.cos", "cos(x).")
cosh = _unary("Cosh", "flow.math.cosh", "(e^x + e^-x) / 2.")
erf = _unary("Erf", "flow.math.erf", "The Gauss error function.")
erfc = _special("onnxjob.Erfc", "flow.math.erfc", "1 - erf(x), accurate where it is small.")
exp = _unary("Exp", "flow.math.exp", "e^x.")
expm1 = _special("onnxjob.Expm1", "flow.math.expm1", "e^x - 1, accurate for small x.")
floor = _unary("Floor", "flow.math.floor", "The largest integer <= x.")
lgamma = _special("onnxjob.Lgamma", "flow.math.lgamma", "log|Gamma(x)|.")
log = _unary("Log", "flow.math.log", "The natural logarithm.")
log1p = _special("onnxjob.Log1p", "flow.math.log1p", "log(1 + x), accurate for small x.")
negative = _unary("Neg", "flow.math.negative", "-x.")
reciprocal = _unary("Reciprocal", "flow.math.reciprocal", "1 / x.")
rint = _unary("Round", "flow.math.rint", "The nearest integer, halves to even.")
round = _unary("Round", "flow.math.round", "The nearest integer, halves to even (nearbyint).")
sigmoid = _unary("Sigmoid", "flow.math.sigmoid", "1 / (1 + e^-x).")
sigmoid_v2 = _unary("Sigmoid", "flow.math.sigmoid_v2", "1 / (1 + e^-x).")
sign = _unary("Sign", "flow.math.sign", "-1, 0 or 1 as x is negative, zero or positive.")
sin = _unary("Sin", "flow.math.sin", "sin(x).")
sinh = _unary("Sinh", "flow.math.sinh", "(e^x - e^-x) / 2.")
softplus = _unary("Softplus", "flow.math.softplus", "log(1 + e^x).")
sqrt = _unary("Sqrt", "flow.math.sqrt", "The square root.")
tan = _unary("Tan", "flow.math.tan", "tan(x).")
tanh = _unary("Tanh", "flow.math.tanh", "The hyperbolic tangent.")
tanh_v2 = _unary("Tanh", "flow.math.tanh_v2", "The hyperbolic tangent (deprecated name).")


def tanh_grad(y, dy, name=None):
    """OneFlow <= 0.2's flow.math.tanh_grad: the gradient through tanh from its output `y`
    and the output's gradient `dy`, dy * (1 - y * y)."""
    api = "flow.math.tanh_grad"
    y, dy = _check_dtype(y, api), _check_dtype(dy, api)
    one = as_blob(np.ones((), y.np_dtype), like=y)
    return _named(op("Mul", dy, op("Sub", one, op("Mul", y, y))), name)
_relu = _unary("Relu", "flow.math.relu", "max(x, 0) (ints too).", _ARITHMETIC)


def relu(x, name=None):
    """max(x, 0) (ints too). (Under QAT, the relu of a convolution chain: ops/qat.py.)"""
    site = qat.chain("relu", x)
    return qat.done(site, _relu(x, name=name))


def square(x, name=None):
    """x * x."""
    _check_dtype(x, "flow.math.square")
    return op("Mul", x, x, name=name)


def rsqrt(x, name=None):
    """1 / sqrt(x)."""
    _check_dtype(x, "flow.math.rsqrt")
    return op("Reciprocal", op("Sqrt", x), name=name)


def reciprocal_no_nan(x, name=None):
    """1 / x, and 0 where x == 0 (its gradient is 0 there too)."""
    _check_dtype(x, "flow.math.reciprocal_no_nan")
    return _named(reciprocal_no_nan_of(x), name)


def log_sigmoid(x, name=None):
    """log(1 / (1 + e^-x)) = -softplus(-x), without overflow."""
    _check_dtype(x, "flow.math.log_sigmoid")
    return op("Neg", op("Softplus", op("Neg", x)), name=name)


def gelu(x, name=None):
    """x * Phi(x) = x (1 + erf(x / sqrt(2))) / 2 (the exact GELU); its gradient reads x
    alone (graph/primitives/elementwise.py)."""
    _check_dtype(x, "flow.math.gelu")
    return op("onnxjob.Gelu", x, name=name)


def gelu_grad(x, dy, name=None):
    """dy * d gelu / dx = dy * (Phi(x) + x * phi(x))."""
    _check_dtype(x, "flow.math.gelu_grad")
    return op("Mul", dy, gelu_derivative(x), name=name)


def sigmoid_grad(y, dy, name=None):
    """dy * y * (1 - y), the gradient of sigmoid given its output y."""
    _check_dtype(y, "flow.math.sigmoid_grad")
    return op("Mul", dy, op("Mul", y, op("Sub", as_blob(1, like=y), y)), name=name)


def polyval(coeffs, x, name=None):
    """coeffs[0] * x^(n-1) + ... + coeffs[n-1], by Horner's rule (zeros for no coeffs)."""
    if not isinstance(coeffs, (list, tuple)):
        raise TraceError(f"polyval: coeffs must be a list, got {type(coeffs).__name__}")
    _check_dtype(x, "flow.math.polyval")
    p = _zeros_like(x)
    for c in coeffs:
        p = add(c, op("Mul", p, x))
    return _named(p, name)


# -- reductions ---------------------------------------------------------------------------

def _axes(x, axis, api):
    """`x` and OneFlow's reduction axes: None = all, an int, or a sequence (empty = none).
    A 0-d `x` given axes is the one-element vector OneFlow <= 0.4 had there
    (compat/zero_d_inputs.py), so a reduction of it over axis 0 is again 0-d."""
    if axis is None:
        return x, list(range(len(x.shape)))
    if isinstance(axis, numbers.Integral):
        axis = [axis]
    if not isinstance(axis, (list, tuple)):
        raise TraceError(f"{api}: axis must be None, an int or a list of ints, got {axis!r}")
    x = as_vector(x, where=bool(axis))
    for a in axis:
        if not -len(x.shape) <= a < len(x.shape):
            raise TraceError(f"{api}: axis {a} is out of range for a Blob of rank {len(x.shape)}")
    return x, [int(a) for a in axis]


def _reduce(op_type, api, allowed, doc):
    def f(input_tensor, axis=None, keepdims=False, name=None):
        _check_dtype(input_tensor, api, allowed)
        input_tensor, axes = _axes(input_tensor, axis, api)
        if not axes:
            return input_tensor
        if op_type == "ReduceSum":
            return named_op(op_type, input_tensor, int64_constant(input_tensor, axes),
                            keepdims=int(keepdims), name=name)
        return named_op(op_type, input_tensor, axes=axes, keepdims=int(keepdims), name=name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = doc
    return f


reduce_sum = _reduce("ReduceSum", "flow.math.reduce_sum", _ARITHMETIC,
                     "Sum over `axis` (None = all axes; `[]` returns the input).")


# OneFlow <= 0.4 named the input `input_blob` (reduce_mean) or `x` (max, min, prod)
@renamed_keywords(input_blob="input_tensor")
def reduce_mean(input_tensor, axis=None, keepdims=False, name=None):
    """Mean over `axis` (None = all axes). As OneFlow's (reduce_mean.py: reduce_sum times
    1 / count), `[]` divides the input by its element count, and an integer Blob's mean
    multiplies by int(1 / count), 0 for more than one element; both warn."""
    api = "flow.math.reduce_mean"
    _check_dtype(input_tensor, api, _ARITHMETIC)
    x, axes = _axes(input_tensor, axis, api)
    integer = x.np_dtype not in FLOATS
    if axes and not (integer and not x.is_dynamic):
        return named_op("ReduceMean", x, axes=axes, keepdims=int(keepdims), name=name)
    count = int(np.prod([x.shape[a] for a in axes] if axes else x.shape))
    if not axes and count != 1:     # (a 0-d input's mean is the input: nothing to say)
        warn_at_user_line(f"{api}(axis={axis!r}) reduces no axis and, as OneFlow's, divides "
                          f"by the element count {count} (the input itself is "
                          "flow.identity(x))")
    factor = integer_reciprocal(f"{api} of an integer Blob", count) if integer else \
        1.0 / max(count, 1)
    return multiply(reduce_sum(x, axes, keepdims) if axes else x, factor, name=name)


reduce_max = renamed_keywords(x="input_tensor")(_reduce(
    "ReduceMax", "flow.math.reduce_max", _ARITHMETIC,
    "Maximum over `axis` (None = all axes; `[]` returns the input)."))
reduce_min = renamed_keywords(x="input_tensor")(_reduce(
    "ReduceMin", "flow.math.reduce_min", _ARITHMETIC,
    "Minimum over `axis` (None = all axes; `[]` returns the input)."))
reduce_prod = renamed_keywords(x="input_tensor")(_reduce(
    "ReduceProd", "flow.math.reduce_prod", _ARITHMETIC,
    "Product over `axis` (None = all axes; `[]` returns the input)."))
reduce_logsumexp = _reduce("ReduceLogSumExp", "flow.math.reduce_logsumexp", FLOATS,
                           "log(sum(exp(x))) over `axis`, without overflow.")
two_stage_reduce_max = reduce_max  # one device: the plain reduction
two_stage_reduce_min = reduce_min


def reduce_euclidean_norm(input_tensor, axis=None, keepdims=False, name=None):
    """sqrt(sum(x^2)) over `axis` (None = all axes; `[]` gives |x|)."""
    api = "flow.math.reduce_euclidean_norm"
    _check_dtype(input_tensor, api)
    input_tensor, axes = _axes(input_tensor, axis, api)
    if not axes:
        return op("Abs", input_tensor, name=name)
    return op("ReduceL2", input_tensor, axes=axes, keepdims=int(keepdims), name=name)


def _reduce_logical(reduction, api):
    def f(x, axis=None, keepdims=False, name=None):
        _check_dtype(x, api, _ARITHMETIC)
        x, axes = _axes(x, axis, api)
        truth = _to_int8(cast(x, np.bool_))
        if not axes:  # as OneFlow: x != 0
            return _named(truth, name)
        return op(reduction, truth, axes=axes, keepdims=int(keepdims), name=name)
    f.__name__ = f.__qualname__ = api.rsplit(".", 1)[-1]
    f.__doc__ = (f"Whether {'any' if reduction == 'ReduceMax' else 'every'} element over "
                 "`axis` is nonzero, as int8.")
    return f


reduce_any = _reduce_logical("ReduceMax", "flow.math.reduce_any")
reduce_all = _reduce_logical("ReduceMin", "flow.math.reduce_all")


def reduce_variance(input_tensor, axis=None, keepdims=False, name=None):
    """mean((x - mean(x))^2) over `axis` (divides by the count; zeros for `axis=[]`)."""
    x = _check_dtype(input_tensor, "flow.math.reduce_variance")
    x, axes = _axes(x, axis, "flow.math.reduce_variance")
    if not axes:
        return _named(_zeros_like(x), name)
    # NOTE: OneFlow computes mean(x^2) - mean(x)^2; the centered form is the same value
    # without its cancellation
    centered = op("Sub", x, op("ReduceMean", x, axes=axes, keepdims=1))
    return op("ReduceMean", op("Mul", centered, centered), axes=axes, keepdims=int(keepdims),
              name=name)


def reduce_std(input_tensor, axis=None, keepdims=False, name=None):
    """sqrt(reduce_variance) over `axis` (zeros for `axis=[]`)."""
    x, axes = _axes(_check_dtype(input_tensor, "flow.math.reduce_std"), axis,
                    "flow.math.reduce_std")
    variance = reduce_variance(x, axes, keepdims)
    if not axes:
        return _named(variance, name)
    return op("Sqrt", variance, name=name)


def reduced_shape_elem_cnt(input_blob, axis=None, dtype=None, name=None):
    """The number of elements of `input_blob` over `axis` (all axes by default), as a
    0-d Blob of `dtype` (int32 by default)."""
    counted, axes = _axes(input_blob, axis, "flow.math.reduced_shape_elem_cnt")
    count = int(np.prod([counted.shape[a] for a in axes]))
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else np.dtype(np.int32)
    count_blob = as_blob(np.array(count, np_dtype), like=input_blob, dtype=np_dtype)
    return op("Identity", count_blob, name=name)


# -- arg-reductions, top k and sorting ----------------------------------------------------

def _axis(x, axis, api):
    if not -len(x.shape) <= axis < len(x.shape):
        raise TraceError(f"{api}: axis {axis} is out of range for a Blob of rank {len(x.shape)}")
    return axis % len(x.shape)


@two_generations(("input", "name"), positional_is(1, str))
def argmax(input, axis=-1, name=None):
    """Index of the (first) largest value along `axis`, as int64 (OneFlow 0.5's dtype);
    int32 for code written for OneFlow <= 0.4, whose argmax_op.cpp gave int32 (such a
    program compares it with int32 labels)."""
    _check_dtype(input, "flow.math.argmax", _ARITHMETIC)
    axis = _axis(input, axis, "flow.math.argmax")
    if written_for_0_4():
        index = op("ArgMax", input, axis=axis, keepdims=0)
        return op("Cast", index, to=dtypes.int32.ir_dtype.value, name=name)
    return op("ArgMax", input, axis=axis, keepdims=0, name=name)


def _top_k_is_old(args):
    """Whether a top_k call is OneFlow <= 0.4's `(input, k, sorted, name)`: a bool third or
    a string fourth argument, or a second argument that is no axis of the input (OneFlow
    0.5's own docstring example `top_k(x, 2)` on a 1-D x is such a call). An in-range int
    second argument is 0.5's axis."""
    if positional_is(2, bool)(args) or positional_is(3, str)(args):
        return True
    if len(args) < 2 or not isinstance(args[1], numbers.Integral) or isinstance(args[1], bool):
        return False
    rank = len(getattr(args[0], "shape", ()))
    return not -rank <= args[1] < rank


def _top_k_values_and_indices(input, axis, k, largest):
    """TopK of `k` (None: the whole axis); of a dynamic input, k is capped at the axis's
    run-time size."""
    if input.is_dynamic:
        k_blob = dim_of(input, axis)
        if k is not None and k < input.shape[axis]:
            k_blob = op("Min", k_blob, int64_constant(input, [k]))
    else:
        k_blob = int64_constant(input, [input.shape[axis] if k is None else k])
    return op("TopK", input, k_blob, axis=axis, largest=int(largest), sorted=1, num_outputs=2)


@two_generations(("input", "k", "sorted", "name"), _top_k_is_old)
def top_k(input, axis=-1, k=1, sorted=True, name=None):
    """int32 indices of the `k` largest values along `axis`, largest first (ties: the
    lower index first); k above the axis size takes all. `sorted=False` (any order in
    OneFlow) gives the same sorted order. OneFlow <= 0.4's `(input, k, sorted, name)` is
    accepted too: see `_top_k_is_old`."""
    _check_dtype(input, "flow.math.top_k", FLOATS + _INTS[1:])
    axis = _axis(input, axis, "flow.math.top_k")
    if not isinstance(k, numbers.Integral) or k < 1:
        raise TraceError(f"flow.math.top_k: k must be an int >= 1, got {k!r}")
    _, indices = _top_k_values_and_indices(input, axis, min(k, input.shape[axis]), True)
    return op("Cast", indices, to=dtypes.int32.ir_dtype.value, name=name)


def _sort_args(input, axis, direction, api):
    _check_dtype(input, api, FLOATS + _INTS[1:])
    if direction not in ("ASCENDING", "DESCENDING"):
        raise TraceError(f"{api}: direction must be 'ASCENDING' or 'DESCENDING', "
                         f"got {direction!r}")
    axis = _axis(input, axis, api)
    return _top_k_values_and_indices(input, axis, None, direction == "DESCENDING")


@two_generations(("input", "direction", "name"), positional_is(1, str))
def sort(input, axis=-1, direction="ASCENDING", name=None):
    """The values of `input` sorted along `axis` (flow.sort)."""
    values, _ = _sort_args(input, axis, direction, "flow.sort")
    return _named(values, name)


@two_generations(("input", "direction", "name"), positional_is(1, str))
def argsort(input, axis=-1, direction="ASCENDING", name=None):
    """int32 indices that sort `input` along `axis`, stable for ties (flow.argsort)."""
    _, indices = _sort_args(input, axis, direction, "flow.argsort")
    return op("Cast", indices, to=dtypes.int32.ir_dtype.value, name=name)


def in_top_k(targets, predictions, k, name=None):
    """int8: whether predictions[i, targets[i]] is among the k largest of row i (fewer than
    k values are strictly larger); 0 for targets out of range or rows with inf / NaN."""
    _check_dtype(targets, "flow.math.in_top_k", _INTS[1:])
    _check_dtype(predictions, "flow.math.in_top_k", (np.dtype(np.float32),))
    # a 0-d target for a batch of one: OneFlow <= 0.4's squeezed (1,) label
    targets = as_vector(targets, where=tuple(predictions.shape[:1]) == (1,))
    dynamic = targets.is_dynamic or predictions.is_dynamic  # (N agrees at run time)
    if len(targets.shape) != 1 or len(predictions.shape) != 2 \
            or targets.shape[0] != predictions.shape[0] and not dynamic:
        raise TraceError(f"flow.math.in_top_k takes targets (N,) and predictions (N, C), got "
                         f"{targets.shape} and {predictions.shape}")
    t = cast(targets, np.int64)
    valid = op("And", op("GreaterOrEqual", t, int64_constant(t, 0)),
               op("Less", t, dim_of(predictions, 1)))
    column = _column(op("Where", valid, t, int64_constant(t, 0)))
    target_value = op("GatherElements", predictions, column, axis=1)
    larger = op("ReduceSum", cast(op("Greater", predictions, target_value), np.int32),
                int64_constant(t, [1]), keepdims=0)
    finite = op("Not", op("IsNaN", op("Sub", predictions, predictions)))  # inf - inf is NaN
    all_finite = op("ReduceMin", cast(finite, np.int8), axes=[1], keepdims=0)
    hit = op("And", op("Less", larger, as_blob(np.int32(k), like=larger)),
             op("And", valid, cast(all_finite, np.bool_)))
    return _named(_to_int8(hit), name)


def _column(x):
    """(N,) -> (N, 1)."""
    return op("Unsqueeze", x, int64_constant(x, [1]))


# -- normalization, triangles, segment sums -----------------------------------------------

def l2_normalize(input, axis=None, epsilon=1e-12, name=None):
    """x / sqrt(max(sum(x^2 over `axis`), epsilon))."""
    _check_dtype(input, "flow.math.l2_normalize")
    if not isinstance(axis, numbers.Integral):
        raise TraceError(f"flow.math.l2_normalize: axis must be an int, got {axis!r}")
    axis = _axis(input, axis, "flow.math.l2_normalize")
    square_sum = op("ReduceSum", op("Mul", input, input), int64_constant(input, [axis]),
                    keepdims=1)
    norm = op("Sqrt", op("Max", square_sum, as_blob(float(epsilon), like=input)))
    return op("Div", input, norm, name=name)


def _tril_mask(x, diagonal):
    rows, cols = x.shape[-2:]
    keep = np.arange(cols)[None, :] - np.arange(rows)[:, None] <= diagonal
    return as_blob(keep, like=x, dtype=np.bool_)


def _fill_scalar(x, value):
    value = float(value) if x.np_dtype in FLOATS else int(value)
    return as_blob(value, like=x)


@two_generations(("x", "diagonal", "name"), positional_is(2, str))
def tril(x, diagonal=0, fill_value=0, name=None):
    """The lower triangle of the last two axes (column - row <= diagonal); the rest is
    fill_value."""
    _check_dtype(x, "flow.math.tril", _ARITHMETIC)
    if len(x.shape) < 2:
        raise TraceError(f"flow.math.tril takes a Blob of rank >= 2, got shape {x.shape}")
    return op("Where", _tril_mask(x, diagonal), x, _fill_scalar(x, fill_value), name=name)


def fused_scale_tril(x, diagonal=0, fill_value=0, scale=1, name=None):
    """tril(x * scale, diagonal, fill_value)."""
    _check_dtype(x, "flow.math.fused_scale_tril", _ARITHMETIC)
    if len(x.shape) < 2:
        raise TraceError(f"flow.math.fused_scale_tril takes a Blob of rank >= 2, got shape "
                         f"{x.shape}")
    scaled = op("Mul", x, _fill_scalar(x, scale))
    return op("Where", _tril_mask(x, diagonal), scaled, _fill_scalar(x, fill_value), name=name)


def fused_scale_tril_softmax_dropout(x, diagonal=0, fill_value=0, scale=1, rate=0.0,
                                     noise_shape=None, seed=None, name=None):
    """softmax(tril(x * scale, diagonal, fill_value)) over the last axis, then dropout:
    kept values (probability 1 - rate) are scaled by 1 / (1 - rate). As in OneFlow, the mask
    is drawn in predict jobs too (the op has no train-only switch)."""
    api = "flow.math.fused_scale_tril_softmax_dropout"
    _check_dtype(x, api, FLOATS)
    if not isinstance(rate, numbers.Real) or not 0.0 <= rate < 1.0:
        raise TraceError(f"{api}: rate must be in [0, 1), got {rate!r}")
    if noise_shape is not None:
        raise TraceError(f"{api}: noise_shape is not supported (as in OneFlow)")
    y = op("Softmax", fused_scale_tril(x, diagonal, fill_value, scale), axis=-1)
    if rate > 0:
        mask = _random.random_mask_like(x, rate, seed)
        keep = op("Mul", op("Cast", mask, to=dtypes.from_numpy(x.np_dtype).ir_dtype.value),
                  as_blob(1.0 / (1.0 - rate), like=y))
        y = op("Mul", y, keep)
    return _named(y, name)


def _segment_sum(data, segment_ids, num_segments, axis, api):
    """The segment sum; float16 data (OneFlow's GPU kernel takes it) is summed in float32
    and rounded once, onnxruntime's scatter-add having no float16 kernel."""
    if data.np_dtype == np.float16:
        wide = _segment_sum(cast(data, np.float32), segment_ids, num_segments, axis, api)
        return cast(wide, np.float16)
    _check_dtype(data, api, (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32),
                             np.dtype(np.int64)))
    _check_dtype(segment_ids, api + " segment_ids", _INTS[1:])
    if not 0 <= axis <= len(data.shape) - len(segment_ids.shape):
        raise TraceError(f"{api}: axis {axis} does not fit segment_ids {segment_ids.shape} "
                         f"into data {data.shape}")
    return op("onnxjob.UnsortedSegmentSum", data, segment_ids, axis=int(axis),
              num_segments=int(num_segments))


def unsorted_segment_sum(data, segment_ids, num_segments, axis=0, name=None):
    """out[..., s, ...] = sum of the data rows (axis `axis`) whose segment id is s; ids
    outside [0, num_segments) are skipped."""
    out = _segment_sum(data, segment_ids, num_segments, axis, "flow.math.unsorted_segment_sum")
    return _named(out, name)


def unsorted_segment_sum_like(data, segment_ids, like, axis=0, name=None):
    """unsorted_segment_sum with num_segments = like.shape[axis] (the result has like's
    shape)."""
    out = _segment_sum(data, segment_ids, like.shape[axis], axis,
                       "flow.math.unsorted_segment_sum_like")
    if out.shape != like.shape:
        raise TraceError(f"flow.math.unsorted_segment_sum_like: the sum has shape {out.shape}, "
                         f"like has {like.shape}")
    return _named(out, name)


def unsorted_batch_segment_sum(data, segment_ids, num_segments, name=None):
    """unsorted_segment_sum per batch: segment_ids (B..., N) index the axis after the
    batch axes of data (B..., N, ...)."""
    api = "flow.math.unsorted_batch_segment_sum"
    _check_dtype(data, api, FLOATS)
    _check_dtype(segment_ids, api + " segment_ids", _INTS[1:])
    batch = segment_ids.shape[:-1]
    if len(data.shape) < len(segment_ids.shape) or data.shape[:len(batch) + 1] \
            != segment_ids.shape:
        raise TraceError(f"{api}: segment_ids {segment_ids.shape} must be a prefix of data's "
                         f"shape {data.shape}")
    count = int(np.prod(batch))
    ids = cast(segment_ids, np.int64)
    # each batch gets its own num_segments ids; ids out of range go to -1 (skipped)
    offsets = (np.arange(count, dtype=np.int64) * num_segments).reshape(batch + (1,))
    valid = op("And", op("GreaterOrEqual", ids, int64_constant(ids, 0)),
               op("Less", ids, int64_constant(ids, num_segments)))
    flat_ids = op("Where", valid, op("Add", ids, as_blob(offsets, like=ids)),
                  int64_constant(ids, -1))
    rows = count * segment_ids.shape[-1]
    flat = op("Reshape", data, int64_constant(data, (rows,) + data.shape[len(batch) + 1:]))
    summed = op("onnxjob.UnsortedSegmentSum", flat,
                op("Reshape", flat_ids, int64_constant(ids, [rows])),
                axis=0, num_segments=count * int(num_segments))
    out_shape = batch + (int(num_segments),) + data.shape[len(batch) + 1:]
    return op("Reshape", summed, int64_constant(data, out_shape), name=name)


__getattr__ = missing_api("flow.math")
