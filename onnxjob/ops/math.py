"""flow.math: elementwise math, reductions and arg-reductions."""
from onnxjob import dtypes
from onnxjob.errors import missing_api
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op


def _pair(x, y):
    if isinstance(x, Blob):
        return x, as_blob(y, like=x)
    y_blob = as_blob(y)
    return as_blob(x, like=y_blob), y_blob


def _binary(op_type):
    def f(x, y, name=None):
        a, b = _pair(x, y)
        return op(op_type, a, b, name=name)
    f.__name__ = op_type.lower()
    f.__doc__ = f"Broadcasting elementwise {op_type} (Python scalars are accepted)."
    return f


add = broadcast_add = _binary("Add")
subtract = broadcast_sub = _binary("Sub")
multiply = broadcast_mul = _binary("Mul")
divide = broadcast_div = _binary("Div")
floor_mod = mod = _binary("Mod")  # floor modulo (Python's %), floats included
maximum = broadcast_maximum = _binary("Max")
minimum = broadcast_minimum = _binary("Min")
pow = _binary("Pow")
equal = broadcast_equal = _binary("Equal")
less = broadcast_less = _binary("Less")
less_equal = _binary("LessOrEqual")
greater = broadcast_greater = _binary("Greater")
greater_equal = _binary("GreaterOrEqual")


def not_equal(x, y, name=None):
    return op("Not", equal(x, y), name=name)


def add_n(inputs, name=None):
    out = inputs[0]
    for x in inputs[1:]:
        out = op("Add", out, x)
    return out


def _unary(op_type):
    def f(x, name=None):
        return op(op_type, x, name=name)
    f.__name__ = op_type.lower()
    f.__doc__ = f"Elementwise {op_type}."
    return f


relu = _unary("Relu")
sigmoid = _unary("Sigmoid")
tanh = _unary("Tanh")
exp = _unary("Exp")
log = _unary("Log")
sqrt = _unary("Sqrt")
abs = _unary("Abs")
negative = _unary("Neg")
reciprocal = _unary("Reciprocal")
floor = _unary("Floor")
ceil = _unary("Ceil")
round = _unary("Round")
sign = _unary("Sign")
erf = _unary("Erf")
softplus = _unary("Softplus")


def square(x, name=None):
    return op("Mul", x, x, name=name)


def rsqrt(x, name=None):
    return op("Reciprocal", op("Sqrt", x), name=name)


def gelu(x, name=None):
    half = as_blob(0.5, like=x)
    return x * half * (as_blob(1.0, like=x) + erf(x * as_blob(0.7071067811865476, like=x)))


def leaky_relu(x, alpha=0.2, name=None):
    return op("LeakyRelu", x, alpha=float(alpha), name=name)


def clip_by_value(values, min_value=None, max_value=None, name=None):
    lo = as_blob(min_value, like=values) if min_value is not None else None
    hi = as_blob(max_value, like=values) if max_value is not None else None
    return op("Clip", values, lo, hi, name=name)


clip = clip_by_value


def _axes(x, axis):
    """OneFlow's reduction axes: None = all, an int, or a sequence (empty = none)."""
    if axis is None:
        return list(range(len(x.shape)))
    if isinstance(axis, int):
        return [axis]
    return list(axis)


def reduce_sum(input_tensor, axis=None, keepdims=False, name=None):
    """Sum over `axis`; `axis=[]` reduces nothing and returns the input, as in OneFlow."""
    axes = _axes(input_tensor, axis)
    if not axes:
        return input_tensor
    return op("ReduceSum", input_tensor, int64_constant(input_tensor, axes),
              keepdims=int(keepdims), name=name)


def _reduce_attr(op_type):
    def f(input_tensor, axis=None, keepdims=False, name=None):
        axes = _axes(input_tensor, axis)
        if not axes:
            return input_tensor
        return op(op_type, input_tensor, axes=axes, keepdims=int(keepdims), name=name)
    f.__name__ = op_type
    f.__doc__ = f"{op_type} over `axis` (None = all axes; `[]` returns the input)."
    return f


reduce_mean = _reduce_attr("ReduceMean")
reduce_max = _reduce_attr("ReduceMax")
reduce_min = _reduce_attr("ReduceMin")
reduce_prod = _reduce_attr("ReduceProd")


def argmax(input, axis=-1, name=None):
    """Index of the largest value along `axis`, as int32 (OneFlow's dtype)."""
    return op("Cast", op("ArgMax", input, axis=axis, keepdims=0, name=name),
              to=dtypes.int32.ir_dtype.value)


def top_k(input, k=1, sorted=True, name=None):
    """int32 indices of the `k` largest values along the last axis (largest first)."""
    if k == 1:
        return argmax(input, axis=-1, name=name)
    if not 1 <= k <= input.shape[-1]:
        from onnxjob.errors import TraceError
        raise TraceError(f"top_k: k={k} must be in [1, {input.shape[-1]}]")
    _values, indices = op("TopK", input, int64_constant(input, [k]), axis=-1, largest=1,
                          sorted=1, num_outputs=2, name=name)
    return op("Cast", indices, to=dtypes.int32.ir_dtype.value)


def softmax(logits, axis=None, name=None):
    return op("Softmax", logits, axis=-1 if axis is None else axis, name=name)


def log_softmax(logits, axis=None, name=None):
    return op("LogSoftmax", logits, axis=-1 if axis is None else axis, name=name)


def square_sum(x, name=None):
    return reduce_sum(square(x), name=name)


__getattr__ = missing_api("flow.math")
