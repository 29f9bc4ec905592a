"""`flow.quantization`: OneFlow's quantization-aware-training ops, with its kernels'
arithmetic.

Formulas: "google" (symmetric: scale = max|x| / (2^(b-1) - 1), zero point 0; affine:
scale = (max - min) / (2^b - 1), zero point -round(min / scale)) per layer or per channel
(axis 0), and "cambricon" (a power-of-two shift floor(log2 max|x|) - (b - 2), per layer).
fake_quantization rounds half to even and clamps to the b-bit range, then scales back;
its gradient passes the output's gradient to the input unchanged (straight through), as
OneFlow's. The moving-average observer keeps moving_max / moving_min variables (under
its name) that a train job updates (the first value taken as is, then
m * momentum + new * (1 - momentum)) and a predict job reads. `_moving_min_max` is that
kernel over given state, which quantization-aware training (ops/qat.py) uses too.
"""
import numbers

import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob.errors import TraceError, missing_api
from onnxjob.frontend import initializers, scope
from onnxjob.frontend.variables import assign, get_variable
from onnxjob.graph.registry import register_composite
from onnxjob.graph.tracer import as_blob, current_builder, int64_constant, op

_SCHEMES = ("symmetric", "affine")
_FORMULAS = ("google", "cambricon")


def _c(value, like):
    return as_blob(np.asarray(value, like.np_dtype), like=like)


def _check(x, bit, scheme, formula, api):
    if x.np_dtype not in (np.float32, np.float64):
        raise TraceError(f"{api} takes a float32 or float64 blob, got {x.np_dtype}")
    if not isinstance(bit, int) or not 1 < bit <= 8:
        raise TraceError(f"{api}: quantization_bit must be in [2, 8], got {bit!r}")
    if scheme not in _SCHEMES or formula not in _FORMULAS:
        raise TraceError(f"{api}: quantization_scheme must be one of {_SCHEMES} and "
                         f"quantization_formula one of {_FORMULAS}, got {scheme!r}, "
                         f"{formula!r}")


def _round_half_away(x):
    """std::round: halves away from zero."""
    return op("Mul", op("Sign", x), op("Floor", op("Add", op("Abs", x), _c(0.5, x))))


def _floor_log2(m):
    """floor(log2(m)) exactly (m > 0): the estimate from natural logs, corrected with
    exact powers of two."""
    wide = m if m.np_dtype == np.float64 else op("Cast", m, to=11)
    e = op("Floor", op("Div", op("Log", wide), _c(np.log(2.0), wide)))
    two = _c(2.0, wide)
    up = op("Cast", op("LessOrEqual", op("Pow", two, op("Add", e, _c(1.0, wide))), wide), to=11)
    down = op("Cast", op("Greater", op("Pow", two, e), wide), to=11)
    e = op("Sub", op("Add", e, up), down)
    return e if m.np_dtype == np.float64 else op("Cast", e, to=1)


def _scale(high, low, bit, scheme, formula):
    """The scale from the observed max and min (same shapes)."""
    if formula == "cambricon":
        return op("Sub", _floor_log2(op("Max", op("Abs", high), op("Abs", low))),
                  _c(bit - 2, high))
    if scheme == "symmetric":
        largest = op("Max", op("Abs", high), op("Abs", low))
        return op("Div", largest, _c(2.0 ** (bit - 1) - 1, high))
    return op("Div", op("Sub", high, low), _c(2.0 ** bit - 1, high))


def _zeros(like):
    return as_blob(np.zeros(like.shape, like.np_dtype), like=like)


@two_generations(("input", "quantization_bit", "quantization_scheme", "per_layer_quantization",
                  "name"), positional_is(3, bool))
def min_max_observer(input, quantization_bit=8, quantization_scheme="symmetric",
                     quantization_formula="google", per_layer_quantization=True, name=None):
    """(scale, zero_point) of `input` from its min and max: (1,) blobs, or (C,) per channel
    of axis 0 (per_layer_quantization=False, google formula only)."""
    api = "flow.quantization.min_max_observer"
    _check(input, quantization_bit, quantization_scheme, quantization_formula, api)
    if quantization_formula == "cambricon" and not per_layer_quantization:
        raise NotImplementedError("per-channel mode is not supported in cambricon scheme")
    outer = 1 if per_layer_quantization or quantization_formula == "cambricon" \
        else input.shape[0]
    rows = op("Reshape", input, int64_constant(input, [outer, -1]))
    high = op("ReduceMax", rows, axes=[1], keepdims=0)
    low = op("ReduceMin", rows, axes=[1], keepdims=0)
    scale = _scale(high, low, quantization_bit, quantization_scheme, quantization_formula)
    zero_point = _zeros(scale)
    if quantization_scheme == "affine" and quantization_formula == "google":
        zero_point = op("Neg", op("Round", op("Div", low, scale)))   # std::nearbyint
    return (op("Identity", scale, name=name and f"{name}_scale"),
            op("Identity", zero_point, name=name and f"{name}_zero_point"))


@two_generations(("input", "quantization_bit", "quantization_scheme", "momentum", "name"),
                 positional_is(3, numbers.Real))
def moving_average_min_max_observer(input, quantization_bit=8, quantization_scheme="symmetric",
                                    quantization_formula="google", momentum=0.95, name=None):
    """(scale, zero_point), (1,) blobs, from moving averages of `input`'s max and min that
    a train job updates each run and a predict job only reads (module docstring)."""
    api = "flow.quantization.moving_average_min_max_observer"
    _check(input, quantization_bit, quantization_scheme, quantization_formula, api)
    builder = current_builder(api)
    job = getattr(builder, "job_function", None)
    training = job.is_train if job is not None else builder.is_train
    name = name or builder.fresh_name("MovingAverageMinMaxObserver")
    dtype = input.np_dtype
    with scope.namespace(name):
        moving_max, moving_min = (
            get_variable(n, (1,), dtype=_flow_dtype(dtype), trainable=False,
                         initializer=initializers.zeros_initializer())
            for n in ("moving_max", "moving_min"))
        step = get_variable("current_train_step", (1,), dtype=_flow_dtype(np.int64),
                            trainable=False, initializer=initializers.zeros_initializer())
    # OneFlow's Python op: a step variable nothing increments and stop_update_after_iters=1
    return _moving_min_max(input, moving_max, moving_min, step, 1, training, quantization_bit,
                          quantization_scheme, quantization_formula, momentum)


def _moving_min_max(input, moving_max, moving_min, step, stop_update_after_iters, training,
                   bit, scheme, formula, momentum):
    """OneFlow's moving_average_min_max_observer kernel over the given state: in a train
    job, while step <= stop_update_after_iters, moving_max / moving_min (variables) take
    the batch's max and min (the first time as they are, then m * momentum + new * (1 -
    momentum), in float32) and are assigned their new values; (scale, zero_point) follow
    from the values after the update."""
    if training:
        flat = op("Reshape", input, int64_constant(input, [1, -1]))
        high = op("ReduceMax", flat, axes=[1], keepdims=0)
        low = op("ReduceMin", flat, axes=[1], keepdims=0)
        if scheme == "symmetric" or formula == "cambricon":
            high = low = op("Max", op("Abs", high), op("Abs", low))
        keep = _c(np.float32(momentum), high)
        take = _c(np.float32(1) - np.float32(momentum), high)
        update = op("LessOrEqual", step, int64_constant(step, [stop_update_after_iters]))

        def averaged(moving, new):
            mixed = op("Add", op("Mul", moving, keep), op("Mul", new, take))
            fresh = op("Where", op("Equal", moving, _c(0.0, moving)), new, mixed)
            return op("Where", update, fresh, moving)
        new_max = averaged(moving_max, high)
        new_min = new_max if high is low else averaged(moving_min, low)
        assign(moving_max, new_max)
        assign(moving_min, new_min)
        moving_max, moving_min = new_max, new_min
    scale = _scale(moving_max, moving_min, bit, scheme, formula)
    zero_point = _zeros(scale)
    if scheme == "affine" and formula == "google":
        zero_point = op("Neg", _round_half_away(op("Div", moving_min, scale)))  # std::round
    return scale, zero_point


def _flow_dtype(np_dtype):
    from onnxjob import dtypes
    return dtypes.from_numpy(np.dtype(np_dtype))


def _fake_quant_expand(inputs, attrs, num_outputs):
    x, scale, zero_point = inputs
    bit, scheme, formula = attrs["bit"], attrs["scheme"], attrs["formula"]
    if scale.shape and int(np.prod(scale.shape)) > 1:   # per channel: scale per row of axis 0
        shape = [scale.shape[0]] + [1] * (len(x.shape) - 1)
        scale = op("Reshape", scale, int64_constant(scale, shape))
        zero_point = op("Reshape", zero_point, int64_constant(zero_point, shape))
    if formula == "cambricon":
        float_type = 1 if x.np_dtype == np.float32 else 11
        shift = op("Cast", op("Cast", scale, to=6), to=float_type)   # static_cast<int32_t>
        scale = op("Pow", _c(2.0, scale), shift)
    if formula == "google" and scheme == "affine":
        lower, upper = 0.0, 2.0 ** bit - 1
        point = _round_half_away(zero_point)   # static_cast<uint8_t>(std::round(zero_point))
        point = op("Sub", point, op("Mul", op("Floor", op("Div", point, _c(256.0, point))),
                                    _c(256.0, point)))
        q = op("Round", op("Add", op("Div", x, scale), point))
        q = op("Min", op("Max", q, _c(lower, q)), _c(upper, q))
        return [op("Mul", op("Sub", q, point), scale)]
    upper = 2.0 ** (bit - 1) - 1
    q = op("Round", op("Div", x, scale))
    q = op("Min", op("Max", q, _c(-upper - 1, q)), _c(upper, q))
    return [op("Mul", q, scale)]


def _fake_quant_grad(n, g, need):
    """OneFlow's rule: the input's gradient is the output's (straight through)."""
    return [g[0], None, None]


register_composite("onnxjob.FakeQuantization", _fake_quant_expand, _fake_quant_grad)


def _fake_quantization_is_old(args):
    """OneFlow <= 0.3's sixth positional argument is the name; 0.4's is the formula."""
    return len(args) > 5 and isinstance(args[5], str) and args[5] not in ("google", "cambricon")


@two_generations(("input", "scale", "zero_point", "quantization_bit", "quantization_scheme",
                  "name"), _fake_quantization_is_old)
def fake_quantization(input, scale, zero_point, quantization_bit=8,
                      quantization_scheme="symmetric", quantization_formula="google", name=None):
    """`input` quantized to `quantization_bit` bits with `scale` and `zero_point` (an
    observer's) and turned back to floats; the gradient passes straight through."""
    api = "flow.quantization.fake_quantization"
    _check(input, quantization_bit, quantization_scheme, quantization_formula, api)
    count = int(np.prod(scale.shape))
    if count > 1 and (quantization_formula == "cambricon" or count != input.shape[0]):
        raise TraceError(f"{api}: a per-channel scale needs the google formula and one value "
                         f"per row of axis 0 ({input.shape[0]}), got {scale.shape}")
    return op("onnxjob.FakeQuantization", input, scale, zero_point, bit=quantization_bit,
              scheme=quantization_scheme, formula=quantization_formula, name=name)


# OneFlow 0.3's exported spelling
moving_average_min_maxObserver = moving_average_min_max_observer

__getattr__ = missing_api("flow.quantization")
