"""flow.math and the activations of flow.nn: forward values against NumPy, math and
PyTorch, every gradient in one table (finite differences in float64 and PyTorch
autograd), the dtypes OneFlow allows, OneFlow 0.5's semantics and errors."""
import math
import os
import typing

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from gradcheck import (gradient_tests, normal, pos,
                       sep, vjp)

torch = pytest.importorskip("torch", reason="PyTorch is the reference")
F = torch.nn.functional
THIS_FILE = os.path.basename(__file__)
DTYPES = [np.float32, np.float64, np.int8, np.int32, np.int64]
FLOATS = (np.float32, np.float64)


def forward(fn, *arrays):
    """Trace `fn` on inputs shaped like `arrays` into a graph and run it on onnxruntime."""
    builder = GraphBuilder("forward")
    with tracing(builder):
        blobs = [builder.add_input(f"x{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
        y = fn(*blobs)
        if y.producer is None:
            y = op("Identity", y)
        builder.graph.outputs.append(y.value)
    model = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {f"x{i}": a for i, a in enumerate(arrays)})[0]


def uniform(shape, lo, hi):
    return lambda rng: rng.uniform(lo, hi, shape)


def const(values, dtype=None):
    return lambda rng: np.asarray(values, dtype=dtype)


def _vectorized(f):
    return np.vectorize(f, otypes=[np.float64])


def _lgamma(v):
    return np.inf if v <= 0 and v == math.floor(v) else math.lgamma(v)


# -- unary: name -> (flow fn, float64 reference, inputs, float64 relative tolerance) -----
# 0: exact; NATIVE: onnxruntime's own float64 kernel (2e-14 relative, 1e-15 absolute); a
# number: onnxjob's float64 formula (relative only). float32 runs onnxruntime's float32
# kernels (1e-7 absolute), except the formulas computed in float64 (erfc, lgamma).
NATIVE = "native"
RNG = np.random.default_rng(0)
_WIDE = np.concatenate([RNG.normal(0, 3, 40), [0.0, 1e-20, -1e-9, 1e-300, 40.0, -40.0]])
UNARY = {
    "abs": (flow.math.abs, np.abs, _WIDE, 0),
    "acos": (flow.math.acos, np.arccos, np.r_[RNG.uniform(-1, 1, 40), 1, -1, 1 - 1e-12, 0], 1e-15),
    "acosh": (flow.math.acosh, np.arccosh, np.r_[RNG.uniform(1, 9, 40), 1, 1 + 1e-12, 1e12], 1e-15),
    "asin": (flow.math.asin, np.arcsin, np.r_[RNG.uniform(-1, 1, 40), 1, -1, 1e-20, 0], 1e-15),
    "asinh": (flow.math.asinh, np.arcsinh, np.r_[_WIDE, 1e12, -1e300], 1e-15),
    "atan": (flow.math.atan, np.arctan, np.r_[_WIDE, 1e12, -1e300, np.inf, -np.inf], 1e-15),
    "atanh": (flow.math.atanh, np.arctanh, np.r_[RNG.uniform(-1, 1, 40), 1e-20, 1 - 1e-12, 0],
              1e-15),
    "ceil": (flow.math.ceil, np.ceil, _WIDE, 0),
    "cos": (flow.math.cos, np.cos, _WIDE, NATIVE),
    "cosh": (flow.math.cosh, np.cosh, np.r_[_WIDE, 700.0, -700.0], 1e-15),
    "erf": (flow.math.erf, _vectorized(math.erf), np.r_[_WIDE, 2.0, 1.99999, 6.0, np.inf], 1e-15),
    "erfc": (flow.math.erfc, _vectorized(math.erfc), np.r_[_WIDE, 2.0, 6.0, 26.0, -np.inf],
             1e-13),
    "exp": (flow.math.exp, np.exp, _WIDE, NATIVE),
    "expm1": (flow.math.expm1, np.expm1, np.r_[_WIDE, 800.0, -800.0, 1e-10], 1e-15),
    "floor": (flow.math.floor, np.floor, _WIDE, 0),
    "lgamma": (flow.math.lgamma, _vectorized(_lgamma),
               np.r_[RNG.uniform(-20, 30, 60), 1.0, 2.0, 0.5, 1e-10, -2.5, 1e10, 0.0, -3.0, np.inf],
               1e-13),
    "log": (flow.math.log, np.log, np.r_[RNG.uniform(0, 9, 40), 0.0, 1e-300], NATIVE),
    "log1p": (flow.math.log1p, np.log1p, np.r_[RNG.uniform(-1, 9, 40), -1.0, 1e-20, 1e300], 1e-15),
    "log_sigmoid": (flow.math.log_sigmoid, lambda v: -np.logaddexp(0, -v), _WIDE * 30, 1e-15),
    "negative": (flow.math.negative, np.negative, _WIDE, 0),
    "reciprocal": (flow.math.reciprocal, np.reciprocal, _WIDE[:-4], NATIVE),
    "reciprocal_no_nan": (flow.math.reciprocal_no_nan,
                          lambda v: np.divide(1, v, out=np.zeros_like(v), where=v != 0),
                          _WIDE, NATIVE),
    "rint": (flow.math.rint, np.rint, np.r_[_WIDE, 0.5, 1.5, 2.5, -0.5], 0),
    "round": (flow.math.round, np.round, np.r_[_WIDE, 0.5, 1.5, 2.5, -2.5], 0),
    "rsqrt": (flow.math.rsqrt, lambda v: 1 / np.sqrt(v), RNG.uniform(0.01, 9, 40), NATIVE),
    "sigmoid": (flow.math.sigmoid, lambda v: 1 / (1 + np.exp(-v)), _WIDE, 1e-15),
    "sigmoid_v2": (flow.math.sigmoid_v2, lambda v: 1 / (1 + np.exp(-v)), _WIDE, 1e-15),
    "sign": (flow.math.sign, np.sign, _WIDE, 0),
    "sin": (flow.math.sin, np.sin, _WIDE, NATIVE),
    "sinh": (flow.math.sinh, np.sinh, np.r_[_WIDE, 1e-8, 700.0, -700.0], 1e-15),
    "softplus": (flow.math.softplus, lambda v: np.logaddexp(0, v), _WIDE * 30, 1e-15),
    "sqrt": (flow.math.sqrt, np.sqrt, RNG.uniform(0, 9, 40), NATIVE),
    "square": (flow.math.square, np.square, _WIDE, NATIVE),
    "tan": (flow.math.tan, np.tan, RNG.uniform(-1.5, 1.5, 40), 1e-15),
    "tanh": (flow.math.tanh, np.tanh, _WIDE, NATIVE),
    "tanh_v2": (flow.math.tanh_v2, np.tanh, _WIDE, NATIVE),
    "relu": (flow.math.relu, lambda v: np.maximum(v, 0), _WIDE, 0),
    "gelu": (flow.math.gelu, lambda v: 0.5 * v * (1 + _vectorized(math.erf)(v / math.sqrt(2))),
             _WIDE, NATIVE),
}


def _compare(y, expected, dtype, rtol, atol=0.0):
    """Equal non-finite values; finite ones within the tolerance of UNARY's note."""
    with np.errstate(over="ignore"):
        expected = expected.astype(dtype)
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(expected))
    np.testing.assert_array_equal(y[np.isinf(expected)], expected[np.isinf(expected)])
    if rtol == NATIVE:
        rtol, atol = 2e-14, 1e-15
    if dtype == np.float32 and rtol:
        rtol, atol = 2.4e-6, 1e-7
    np.testing.assert_allclose(y[finite], expected[finite], rtol=rtol * 8, atol=atol)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_values(name, dtype):
    """float64 to ~1 ulp where onnxruntime has no float64 kernel either (formulas)."""
    fn, ref, x, rtol = UNARY[name]
    with np.errstate(all="ignore"):
        x = x.astype(dtype)
        expected = ref(x.astype(np.float64))
    # NOTE: lgamma's zeros at 1 and 2 come out as +-1e-14 (the shifted recurrence cancels)
    _compare(forward(fn, x), expected, dtype, rtol, atol=1e-14 if name == "lgamma" else 0.0)


def test_unary_ops_in_a_job_through_the_passes():
    """The same values through flow.global_function (graph passes included)."""
    x = RNG.uniform(0.1, 0.9, (2, 3))
    names = [n for n in UNARY if n not in ("acosh",)]

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((2, 3), dtype=flow.float64)) -> typing.Dict[str, tp.Numpy]:
        return {n: UNARY[n][0](a) for n in names}

    out = job(x)
    for n in names:
        np.testing.assert_allclose(out[n], UNARY[n][1](x), rtol=1e-13, err_msg=n)


# -- binary -------------------------------------------------------------------------------

def test_arithmetic_with_scalars_and_broadcasting():
    a = RNG.normal(size=(3, 4))
    b = RNG.uniform(0.5, 2, (4,))
    m = flow.math
    for fn, expected in [
            (lambda x, y: m.add(x, y), a + b), (lambda x, y: m.add(2, x), 2 + a),
            (lambda x, y: m.subtract(x, y), a - b), (lambda x, y: m.subtract(3.0, x), 3 - a),
            (lambda x, y: m.multiply(x, y), a * b), (lambda x, y: m.multiply(x, 1.5), a * 1.5),
            (lambda x, y: m.divide(x, y), a / b), (lambda x, y: m.divide(x, 4), a / 4),
            (lambda x, y: m.maximum(x, y), np.maximum(a, b)),
            (lambda x, y: m.minimum(x, y), np.minimum(a, b)),
            (lambda x, y: m.pow(y, x), b ** a), (lambda x, y: m.pow(x, 2), a ** 2),
            (lambda x, y: m.mod(x, y), np.mod(a, b)), (lambda x, y: m.mod(x, -y), np.mod(a, -b)),
            (lambda x, y: m.floordiv(x, y), np.floor_divide(a, b)),
            (lambda x, y: m.squared_difference(x, y), (a - b) ** 2),
            (lambda x, y: m.atan2(x, y), np.arctan2(a, b)),
            (lambda x, y: m.atan2(y, -x), np.arctan2(b, -a))]:
        np.testing.assert_allclose(forward(fn, a, b), expected, rtol=1e-14)


def test_divide_by_scalar_zero_and_scalar_dividend_follow_oneflow():
    """OneFlow multiplies by 1 / y with 1 / 0 taken as 0, and x / y by reciprocal_no_nan;
    its scalar_mul casts 1 / y to an integer Blob's dtype (0 for y = 2: with a warning)."""
    y = np.array([0.0, 2.0, -4.0])
    np.testing.assert_array_equal(forward(lambda v: flow.math.divide(v, 0), y), y * 0)
    np.testing.assert_array_equal(forward(lambda v: flow.math.divide(2, v), y), [0, 1, -0.5])
    ints = np.array([7, -7, 6], np.int32)
    with pytest.warns(UserWarning, match=r"multiplies by int\(0.5\) = 0"):
        np.testing.assert_array_equal(forward(lambda v: flow.math.divide(v, 2), ints), [0, 0, 0])
    np.testing.assert_array_equal(forward(lambda v: flow.math.divide(v, -1), ints), -ints)


def test_atan2_quadrants_and_axes():
    x = np.array([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, 2.0, -2.0, 0.0])
    y = np.array([1.0, -1.0, -1.0, 1.0, -1.0, 1.0, 0.0, 0.0, 0.0])
    for dtype in FLOATS:
        out = forward(flow.math.atan2, x.astype(dtype), y.astype(dtype))
        np.testing.assert_allclose(out, np.arctan2(x, y), rtol=1e-6 if dtype == np.float32
                                   else 1e-15)


def test_xdivy_xlogy_and_their_gradients_are_zero_where_x_is_zero():
    x = np.array([0.0, 0.0, 2.0, -3.0])
    y = np.array([0.0, -1.0, 4.0, 0.5])
    np.testing.assert_array_equal(forward(flow.math.xdivy, x, y), [0, 0, 0.5, -6])
    np.testing.assert_allclose(forward(flow.math.xlogy, x, y), [0, 0, 2 * np.log(4),
                                                                 -3 * np.log(0.5)])
    for fn, dx, dy in [(flow.math.xdivy, [0, 0, 1 / 4, 2], [0, 0, -2 / 16, 12]),
                       (flow.math.xlogy, [0, 0, np.log(4), np.log(0.5)], [0, 0, 0.5, -6])]:
        run, shape = vjp(fn, [x, y], [1, 1])
        _, (gx, gy) = run([x, y], np.ones(shape))
        np.testing.assert_allclose(gx, dx)
        np.testing.assert_allclose(gy, dy)


def test_pow_exponent_gradient_is_zero_for_non_positive_base():
    """As OneFlow: d x^p / dp = log(x) x^p only where x > 0."""
    x = np.array([-2.0, 0.0, 3.0])
    p = np.array([2.0, 2.0, 2.0])
    run, shape = vjp(flow.math.pow, [x, p], [1, 1])
    _, (gx, gp) = run([x, p], np.ones(shape))
    np.testing.assert_allclose(gx, [-4, 0, 6])
    np.testing.assert_allclose(gp, [0, 0, 9 * np.log(3)])


def test_comparisons_and_logical_and_return_int8():
    a = np.array([1.0, 2.0, 3.0, 0.0])
    b = np.array([2.0, 2.0, 2.0, 0.0])
    m = flow.math
    for fn, expected in [(m.equal, a == b), (m.not_equal, a != b), (m.less, a < b),
                         (m.less_equal, a <= b), (m.greater, a > b),
                         (m.greater_equal, a >= b), (m.logical_and, (a != 0) & (b != 0))]:
        out = forward(fn, a, b)
        assert out.dtype == np.int8, fn.__name__
        np.testing.assert_array_equal(out, expected.astype(np.int8))
    np.testing.assert_array_equal(forward(lambda x: m.greater(x, 1.5), a), [0, 1, 1, 0])


def test_add_n_and_clip_by_value():
    xs = [RNG.normal(size=(2, 3)) for _ in range(4)]
    np.testing.assert_allclose(forward(lambda *b: flow.math.add_n(b), *xs), sum(xs))
    x = np.arange(-3, 4, dtype=np.int32)
    np.testing.assert_array_equal(forward(lambda v: flow.math.clip_by_value(v, -1, 2), x),
                                  np.clip(x, -1, 2))
    f = x.astype(np.float64) / 2
    np.testing.assert_array_equal(forward(lambda v: flow.math.clip_by_value(v, max_value=0.5),
                                          f), np.minimum(f, 0.5))
    np.testing.assert_array_equal(forward(lambda v: flow.clip_by_value(v, min_value=0), f),
                                  np.maximum(f, 0))


def test_broadcast_to_compatible_with_and_polyval():
    x = RNG.normal(size=(3, 1))
    out = forward(lambda v: flow.math.broadcast_to_compatible_with(v, [
        flow.constant(0.0, shape=(1, 4), dtype=flow.float64),
        flow.constant(0.0, shape=(2, 1, 1), dtype=flow.float64)]), x)
    np.testing.assert_array_equal(out, np.broadcast_to(x, (2, 3, 4)))
    np.testing.assert_allclose(forward(lambda v: flow.math.polyval([2.0, -1.0, 3.0], v), x),
                               np.polyval([2.0, -1.0, 3.0], x))
    np.testing.assert_array_equal(forward(lambda v: flow.math.polyval([], v), x), 0 * x)


# -- reductions ---------------------------------------------------------------------------
REDUCTIONS = {
    "reduce_sum": (flow.math.reduce_sum, np.sum),
    "reduce_mean": (flow.math.reduce_mean, np.mean),
    "reduce_max": (flow.math.reduce_max, np.max),
    "reduce_min": (flow.math.reduce_min, np.min),
    "reduce_prod": (flow.math.reduce_prod, np.prod),
    "reduce_euclidean_norm": (flow.math.reduce_euclidean_norm, lambda a, axis, keepdims: np.sqrt(
        np.sum(a * a, axis, keepdims=keepdims))),
    "reduce_logsumexp": (flow.math.reduce_logsumexp, lambda a, axis, keepdims: np.log(
        np.sum(np.exp(a), axis, keepdims=keepdims))),
    "reduce_std": (flow.math.reduce_std, np.std),
    "reduce_variance": (flow.math.reduce_variance, np.var),
    "two_stage_reduce_max": (flow.math.two_stage_reduce_max, np.max),
    "two_stage_reduce_min": (flow.math.two_stage_reduce_min, np.min),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reduction_values(name):
    fn, ref = REDUCTIONS[name]
    x = RNG.uniform(0.5, 1.5, (2, 3, 4))
    for axis, keepdims in [(None, False), (1, False), ([0, 2], True), (-1, True), ((0, 1), False)]:
        np_axis = tuple(axis) if isinstance(axis, list) else axis
        out = forward(lambda v: fn(v, axis=axis, keepdims=keepdims), x)
        np.testing.assert_allclose(out, ref(x, axis=np_axis, keepdims=keepdims), rtol=1e-13)


def test_reductions_over_no_axes():
    """axis=[]: the input for sum/max/min/prod/logsumexp; |x| for the norm; x != 0 for
    any/all; zeros for std/variance (as OneFlow's reduce_ops); the input over its element
    count for the mean (OneFlow's reduce_mean.py: reduce_sum times 1 / count, with a
    warning)."""
    x = np.array([[1.5, -2.0], [0.0, 3.0]])
    m = flow.math
    for fn in (m.reduce_sum, m.reduce_max, m.reduce_min, m.reduce_prod):
        np.testing.assert_array_equal(forward(lambda v: fn(v, axis=[]), x), x)
    with pytest.warns(UserWarning, match="divides by the element count 4"):
        np.testing.assert_array_equal(forward(lambda v: m.reduce_mean(v, axis=[]), x), x / 4)
    np.testing.assert_allclose(forward(lambda v: m.reduce_logsumexp(v, axis=[]), x), x)
    np.testing.assert_array_equal(forward(lambda v: m.reduce_euclidean_norm(v, axis=[]), x),
                                  np.abs(x))
    for fn in (m.reduce_any, m.reduce_all):
        np.testing.assert_array_equal(forward(lambda v: fn(v, axis=[]), x), x != 0)
    for fn in (m.reduce_std, m.reduce_variance):
        np.testing.assert_array_equal(forward(lambda v: fn(v, axis=[]), x), np.zeros((2, 2)))


def test_reduce_any_all_are_int8():
    x = np.array([[0, 0, 0], [0, 5, 0], [1, 2, 3]], np.int8)
    for fn, ref in [(flow.math.reduce_any, np.any), (flow.math.reduce_all, np.all)]:
        for axis, keepdims in [(None, False), (1, False), (0, True)]:
            out = forward(lambda v: fn(v, axis=axis, keepdims=keepdims), x)
            assert out.dtype == np.int8
            np.testing.assert_array_equal(out, ref(x, axis=axis, keepdims=keepdims))
        np.testing.assert_array_equal(forward(lambda v: fn(v, axis=1), x.astype(np.float32)),
                                      ref(x, axis=1))


def test_reduce_logsumexp_does_not_overflow():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1000.0]], np.float32)
    np.testing.assert_allclose(forward(lambda v: flow.math.reduce_logsumexp(v, axis=1), x),
                               [1000 + np.log(2), -1000 + np.log(2)], rtol=1e-6)


def test_reduced_shape_elem_cnt():
    x = np.zeros((2, 3, 5), np.float32)
    out = forward(lambda v: flow.math.reduced_shape_elem_cnt(v), x)
    assert out.dtype == np.int32 and out.shape == () and out == 30
    out = forward(lambda v: flow.math.reduced_shape_elem_cnt(v, axis=[0, 2], dtype=flow.float), x)
    assert out.dtype == np.float32 and out == 10


# -- arg-reductions, top k, sorting -------------------------------------------------------
TIES = np.array([[3, 1, 3, 2, 1, 3], [0, 5, 5, 4, 0, 1]], np.float32)


def test_argmax_is_int64_first_of_ties():
    out = forward(flow.math.argmax, TIES)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.argmax(TIES, -1))
    np.testing.assert_array_equal(forward(lambda v: flow.math.argmax(v, axis=0), TIES),
                                  np.argmax(TIES, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_top_k_indices(dtype):
    x = TIES.astype(dtype)
    stable_desc = np.argsort(-x, -1, kind="stable")
    for k in (1, 3, 6, 9):  # k above the axis size takes all, as OneFlow's min(k, n)
        out = forward(lambda v: flow.math.top_k(v, k=k), x)
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, stable_desc[:, :min(k, 6)])
    out = forward(lambda v: flow.math.top_k(v, axis=0, k=1), x)
    np.testing.assert_array_equal(out, np.argsort(-x, 0, kind="stable")[:1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_sort_and_argsort_are_stable(dtype):
    x = TIES.astype(dtype)
    for direction, key in [("ASCENDING", x), ("DESCENDING", -x)]:
        for axis in (-1, 0):
            order = np.argsort(key, axis, kind="stable")
            idx = forward(lambda v: flow.math.argsort(v, axis, direction), x)
            assert idx.dtype == np.int32
            np.testing.assert_array_equal(idx, order)
            np.testing.assert_array_equal(forward(lambda v: flow.math.sort(v, axis, direction), x),
                                          np.take_along_axis(x, order, axis))


def test_in_top_k():
    pred = np.array([[0.1, 0.5, 0.5, 0.2], [0.3, 0.3, 0.3, 0.3], [0.9, 0.0, 0.0, 0.0],
                     [0.1, np.inf, 0.2, 0.3], [0.5, 0.1, 0.2, 0.3]], np.float32)
    targets = np.array([2, 3, 1, 0, 7], np.int32)
    # fewer than k strictly larger values: ties count as in (row 1), inf / NaN rows never
    for k, expected in [(1, [1, 1, 0, 0, 0]), (2, [1, 1, 1, 0, 0]), (4, [1, 1, 1, 0, 0])]:
        out = forward(lambda t, p: flow.math.in_top_k(t, p, k), targets, pred)
        assert out.dtype == np.int8
        np.testing.assert_array_equal(out, expected)


# -- l2_normalize, tril, segment sums -----------------------------------------------------

def test_l2_normalize():
    x = RNG.normal(size=(3, 4))
    for axis in (0, -1):
        out = forward(lambda v: flow.math.l2_normalize(v, axis=axis), x)
        np.testing.assert_allclose(out, x / np.linalg.norm(x, axis=axis, keepdims=True))
    out = forward(lambda v: flow.math.l2_normalize(v, axis=1, epsilon=100.0), x)
    np.testing.assert_allclose(out, x / 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tril_and_fused_scale_tril(dtype):
    x = np.arange(2 * 3 * 4).reshape(2, 3, 4).astype(dtype)
    rows, cols = np.indices((3, 4))
    for diagonal in (0, 1, -1):
        keep = cols - rows <= diagonal
        np.testing.assert_array_equal(
            forward(lambda v: flow.math.tril(v, diagonal, fill_value=7), x), np.where(keep, x, 7))
        np.testing.assert_array_equal(forward(lambda v: flow.math.tril(v, diagonal), x),
                                      np.where(keep, x, 0))
        np.testing.assert_array_equal(
            forward(lambda v: flow.math.fused_scale_tril(v, diagonal, 1, 2), x),
            np.where(keep, x * 2, 1).astype(dtype))


SEG_IDS = np.array([1, 0, 3, 1, -1, 9], np.int32)  # -1 and 9 are out of range: skipped


def _segment_sum_np(data, ids, n, axis=0):
    data = np.moveaxis(data, axis, 0)
    out = np.zeros((n,) + data.shape[ids.ndim:], data.dtype)
    for i, s in enumerate(ids.reshape(-1)):
        if 0 <= s < n:
            out[s] += data.reshape((-1,) + data.shape[ids.ndim:])[i]
    return np.moveaxis(out, 0, axis)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_unsorted_segment_sums(dtype):
    data = RNG.integers(-5, 5, (6, 3)).astype(dtype)
    out = forward(lambda d, i: flow.math.unsorted_segment_sum(d, i, 4), data, SEG_IDS)
    np.testing.assert_array_equal(out, _segment_sum_np(data, SEG_IDS, 4))
    data3 = RNG.integers(-5, 5, (2, 3, 2, 5)).astype(dtype)
    ids2 = np.array([[0, 2], [2, 1], [4, 0]], np.int64)
    out = forward(lambda d, i: flow.math.unsorted_segment_sum(d, i, 3, axis=1), data3, ids2)
    expected = np.stack([_segment_sum_np(np.moveaxis(data3[b], 0, 0), ids2, 3)
                         for b in range(2)])
    np.testing.assert_array_equal(out, expected)
    like = np.zeros((5, 3), dtype)
    out = forward(lambda d, i, l: flow.math.unsorted_segment_sum_like(d, i, l), data, SEG_IDS,
                  like)
    np.testing.assert_array_equal(out, _segment_sum_np(data, SEG_IDS, 5))


def test_unsorted_batch_segment_sum():
    data = RNG.normal(size=(2, 4, 3))
    ids = np.array([[0, 2, 2, 5], [1, 1, -1, 0]], np.int32)
    out = forward(lambda d, i: flow.math.unsorted_batch_segment_sum(d, i, 3), data, ids)
    expected = np.stack([_segment_sum_np(data[b], ids[b], 3) for b in range(2)])
    np.testing.assert_allclose(out, expected)


# -- activations --------------------------------------------------------------------------
ACTIVATIONS = [
    ("relu", flow.nn.relu, F.relu), ("relu6", flow.nn.relu6, F.relu6),
    ("elu", flow.nn.elu, F.elu), ("elu_alpha", lambda x: flow.nn.elu(x, 0.5),
                                  lambda x: F.elu(x, 0.5)),
    ("hardsigmoid", flow.nn.hardsigmoid, F.hardsigmoid),
    ("hardswish", flow.nn.hardswish, F.hardswish),
    ("hardtanh", flow.nn.hardtanh, F.hardtanh),
    ("hardtanh_bounds", lambda x: flow.nn.hardtanh(x, -0.5, 2.0),
     lambda x: F.hardtanh(x, -0.5, 2.0)),
    ("leaky_relu", flow.nn.leaky_relu, lambda x: F.leaky_relu(x, 0.2)),
    ("mish", flow.nn.mish, F.mish), ("swish", flow.nn.swish, F.silu),
    ("swish_beta", lambda x: flow.nn.swish(x, 1.5), lambda x: x * torch.sigmoid(1.5 * x)),
    ("gelu", flow.nn.gelu, F.gelu), ("sigmoid", flow.nn.sigmoid, torch.sigmoid),
    ("softmax", flow.nn.softmax, lambda x: torch.softmax(x, -1)),
    ("softmax_axis0", lambda x: flow.nn.softmax(x, axis=0), lambda x: torch.softmax(x, 0)),
    ("logsoftmax", flow.nn.logsoftmax, lambda x: torch.log_softmax(x, -1)),
    ("log_softmax_axis0", lambda x: flow.nn.log_softmax(x, 0), lambda x: torch.log_softmax(x, 0)),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", ACTIVATIONS, ids=[c[0] for c in ACTIVATIONS])
def test_activation_values(case, dtype):
    _, fn, torch_fn = case
    x = np.r_[np.linspace(-8, 8, 33), -3.0, 3.0, 6.0, -1.0, 1.0, 60.0, -60.0].reshape(5, 8)
    x = x.astype(dtype)
    expected = torch_fn(torch.tensor(x, dtype=torch.float64)).numpy()
    # float32: onnxruntime's kernels (1e-7 absolute); leaky_relu's alpha is a float32
    # attribute in ONNX as in OneFlow, so its float64 slope is float32(0.2)
    rtol, atol = (1e-6, 1e-6) if dtype == np.float32 else (1e-14, 1e-15)
    if case[0] == "leaky_relu" and dtype == np.float64:
        expected = F.leaky_relu(torch.tensor(x), float(np.float32(0.2))).numpy()
    np.testing.assert_allclose(forward(fn, x), expected, rtol=rtol, atol=atol)


def test_softmax_grad():
    y = forward(flow.nn.softmax, RNG.normal(size=(3, 5)))
    dy = RNG.normal(size=(3, 5))
    for axis in (None, 0):
        out = forward(lambda a, b: flow.nn.softmax_grad(a, b, axis), y, dy)
        ax = -1 if axis is None else axis
        np.testing.assert_allclose(out, y * (dy - np.sum(dy * y, ax, keepdims=True)))


def test_gelu_grad_and_sigmoid_grad():
    x, dy = RNG.normal(size=(3, 4)), RNG.normal(size=(3, 4))
    tx = torch.tensor(x, requires_grad=True)
    F.gelu(tx).backward(torch.tensor(dy))
    np.testing.assert_allclose(forward(flow.math.gelu_grad, x, dy), tx.grad.numpy(), rtol=1e-12)
    y = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(forward(flow.math.sigmoid_grad, y, dy), dy * y * (1 - y))


def test_hardtanh_gradient_is_zero_at_the_bounds():
    """As OneFlow's hardtanh_grad (y != min and y != max), unlike clip_by_value's."""
    x = np.array([-2.0, -1.0, 0.5, 1.0, 3.0])
    run, shape = vjp(flow.nn.hardtanh, [x], [1])
    _, (g,) = run([x], np.ones(shape))
    np.testing.assert_array_equal(g, [0, 0, 1, 0, 0])
    run, shape = vjp(lambda v: flow.math.clip_by_value(v, -1.0, 1.0), [x], [1])
    _, (g,) = run([x], np.ones(shape))
    np.testing.assert_array_equal(g, [0, 1, 1, 1, 0])


# -- gradients ----------------------------------------------------------------------------

def _with_zeros(rng):
    """Rows with no zero, one zero, two zeros: ReduceProd's three gradient cases."""
    x = rng.uniform(0.5, 1.5, (3, 4))
    x[1, 2] = 0.0
    x[2, [0, 3]] = 0.0
    return x


def _torch_segment_sum(data, ids, n, axis=0):
    ids = ids.long().reshape(-1)
    valid = (ids >= 0) & (ids < n)
    moved = torch.movedim(data, axis, 0).reshape((ids.shape[0], -1))
    out = torch.zeros((n, moved.shape[1]), dtype=data.dtype).index_add(0, ids[valid],
                                                                      moved[valid])
    rest = torch.movedim(data, axis, 0).shape[1:]
    return torch.movedim(out.reshape((n,) + tuple(rest)), 0, axis)


def _tril_torch(x, diagonal, fill, scale=1.0):
    mask = torch.ones(x.shape[-2:], dtype=torch.bool).tril(diagonal)
    return torch.where(mask, x * scale, torch.tensor(fill, dtype=x.dtype))


M = flow.math
# name, onnxjob fn, torch fn, input makers, differentiated inputs, float64 kernels exist
CASES = [
    ("abs", M.abs, torch.abs, [sep((3, 4))], [1], True),
    ("acos", M.acos, torch.acos, [uniform((3, 4), -0.9, 0.9)], [1], True),
    ("acosh", M.acosh, torch.acosh, [uniform((3, 4), 1.2, 4)], [1], True),
    ("asin", M.asin, torch.asin, [uniform((3, 4), -0.9, 0.9)], [1], True),
    ("asinh", M.asinh, torch.asinh, [uniform((3, 4), -4, 4)], [1], True),
    ("atan", M.atan, torch.atan, [uniform((3, 4), -4, 4)], [1], True),
    ("atanh", M.atanh, torch.atanh, [uniform((3, 4), -0.9, 0.9)], [1], True),
    ("cos", M.cos, torch.cos, [normal((3, 4))], [1], True),
    ("cosh", M.cosh, torch.cosh, [normal((3, 4))], [1], True),
    ("erf", M.erf, torch.erf, [normal((3, 4))], [1], True),
    ("erfc", M.erfc, torch.erfc, [uniform((3, 4), -3, 3)], [1], True),
    ("exp", M.exp, torch.exp, [normal((3, 4))], [1], True),
    ("expm1", M.expm1, torch.expm1, [normal((3, 4))], [1], True),
    ("lgamma", M.lgamma, torch.lgamma, [uniform((3, 4), 0.2, 6)], [1], True),
    ("lgamma_negative", M.lgamma, torch.lgamma, [uniform((3, 4), -2.9, -2.1)], [1], True),
    ("log", M.log, torch.log, [pos((3, 4))], [1], True),
    ("log1p", M.log1p, torch.log1p, [uniform((3, 4), -0.5, 3)], [1], True),
    ("log_sigmoid", M.log_sigmoid, F.logsigmoid, [normal((3, 4))], [1], True),
    ("negative", M.negative, torch.neg, [normal((3, 4))], [1], True),
    ("reciprocal", M.reciprocal, torch.reciprocal, [pos((3, 4))], [1], True),
    ("reciprocal_no_nan", M.reciprocal_no_nan, torch.reciprocal, [pos((3, 4))], [1], True),
    ("rsqrt", M.rsqrt, torch.rsqrt, [pos((3, 4))], [1], True),
    ("sigmoid", M.sigmoid, torch.sigmoid, [normal((3, 4))], [1], True),
    ("sigmoid_v2", M.sigmoid_v2, torch.sigmoid, [normal((3, 4))], [1], True),
    ("sin", M.sin, torch.sin, [normal((3, 4))], [1], True),
    ("sinh", M.sinh, torch.sinh, [normal((3, 4))], [1], True),
    ("softplus", M.softplus, F.softplus, [normal((3, 4))], [1], True),
    ("sqrt", M.sqrt, torch.sqrt, [pos((3, 4))], [1], True),
    ("square", M.square, torch.square, [normal((3, 4))], [1], True),
    ("tan", M.tan, torch.tan, [uniform((3, 4), -1.2, 1.2)], [1], True),
    ("tanh", M.tanh, torch.tanh, [normal((3, 4))], [1], True),
    ("tanh_v2", M.tanh_v2, torch.tanh, [normal((3, 4))], [1], True),
    # OneFlow <= 0.2's flow.math.tanh_grad(y, dy): the gradient through tanh from its output
    ("tanh_grad", M.tanh_grad, lambda y, dy: dy * (1 - y * y),
     [uniform((3, 4), -0.9, 0.9), normal((3, 4))], [1, 1], True),
    ("relu", M.relu, torch.relu, [sep((3, 4))], [1], True),
    ("gelu", M.gelu, F.gelu, [normal((3, 4))], [1], True),
    ("add_scalar", lambda a: M.add(a, 2.0), lambda a: a + 2, [normal((3, 4))], [1], True),
    ("subtract_from_scalar", lambda a: M.subtract(3.0, a), lambda a: 3 - a, [normal((3, 4))],
     [1], True),
    ("multiply", M.multiply, torch.mul, [normal((3, 4)), normal((4,))], [1, 1], True),
    ("divide", M.divide, torch.div, [normal((3, 4)), pos((3, 1))], [1, 1], True),
    ("divide_by_scalar", lambda a: M.divide(a, 4.0), lambda a: a / 4, [normal((3, 4))], [1],
     True),
    ("divide_scalar_by", lambda a: M.divide(2.0, a), lambda a: 2 / a, [pos((3, 4))], [1], True),
    ("maximum", M.maximum, torch.maximum, [sep((3, 4)), normal((3, 4))], [1, 1], True),
    ("minimum", M.minimum, torch.minimum, [sep((3, 4)), normal((1, 4))], [1, 1], True),
    ("pow", M.pow, torch.pow, [pos((3, 4)), normal((3, 4))], [1, 1], True),
    ("pow_scalar", lambda a: M.pow(a, 3), lambda a: a ** 3, [normal((3, 4))], [1], True),
    ("atan2", M.atan2, torch.atan2, [normal((3, 4)), normal((3, 4))], [1, 1], True),
    ("xlogy", M.xlogy, torch.xlogy, [normal((3, 4)), pos((3, 4))], [1, 1], True),
    ("xdivy", M.xdivy, torch.div, [normal((3, 4)), pos((3, 4))], [1, 1], True),
    ("squared_difference", M.squared_difference, lambda a, b: (a - b) ** 2,
     [normal((3, 4)), normal((4,))], [1, 1], True),
    ("clip_by_value", lambda a: M.clip_by_value(a, -0.2, 0.3), lambda a: a.clamp(-0.2, 0.3),
     [sep((3, 4))], [1], True),
    ("add_n", lambda a, b, c: M.add_n([a, b, c]), lambda a, b, c: a + b + c,
     [normal((3, 4))] * 3, [1, 1, 1], True),
    ("broadcast_to_compatible_with",
     lambda a, b: M.broadcast_to_compatible_with(a, [b]) * b, lambda a, b: a.expand(3, 4) * b,
     [normal((1, 4)), normal((3, 1))], [1, 1], True),
    ("polyval", lambda a: M.polyval([1.5, -2.0, 0.5, 3.0], a),
     lambda a: ((1.5 * a - 2.0) * a + 0.5) * a + 3.0, [normal((3, 4))], [1], True),
    ("l2_normalize", lambda a: M.l2_normalize(a, axis=1), lambda a: F.normalize(a, dim=1),
     [normal((3, 4))], [1], True),
    ("reduce_sum", lambda a: M.reduce_sum(a, axis=[0, 2], keepdims=True),
     lambda a: a.sum((0, 2), keepdim=True), [normal((2, 3, 4))], [1], True),
    ("reduce_mean", lambda a: M.reduce_mean(a, axis=1), lambda a: a.mean(1), [normal((3, 4))],
     [1], True),
    ("reduce_max", lambda a: M.reduce_max(a, axis=0), lambda a: a.max(0).values,
     [sep((3, 4))], [1], True),
    ("reduce_min_all", M.reduce_min, torch.min, [sep((3, 4))], [1], True),
    ("reduce_prod", lambda a: M.reduce_prod(a, axis=1), lambda a: a.prod(1), [pos((3, 4))],
     [1], True),
    ("reduce_prod_zeros", lambda a: M.reduce_prod(a, axis=1, keepdims=True),
     lambda a: a.prod(1, keepdim=True), [_with_zeros], [1], True),
    ("reduce_prod_all", M.reduce_prod, torch.prod, [uniform((2, 3), 0.5, 1.5)], [1], True),
    ("reduce_euclidean_norm", lambda a: M.reduce_euclidean_norm(a, axis=0),
     lambda a: torch.linalg.vector_norm(a, dim=0), [normal((3, 4))], [1], True),
    ("reduce_logsumexp", lambda a: M.reduce_logsumexp(a, axis=-1),
     lambda a: torch.logsumexp(a, -1), [normal((3, 4))], [1], True),
    ("reduce_std", lambda a: M.reduce_std(a, axis=1), lambda a: a.std(1, unbiased=False),
     [normal((3, 4))], [1], True),
    ("reduce_variance", lambda a: M.reduce_variance(a, axis=[0, 1]),
     lambda a: a.var((0, 1), unbiased=False), [normal((3, 4, 2))], [1], True),
    ("tril", lambda a: M.tril(a, -1), lambda a: torch.tril(a, -1), [normal((2, 3, 4))], [1],
     True),
    ("tril_fill", lambda a: M.tril(a, 1, 2.5), lambda a: _tril_torch(a, 1, 2.5),
     [normal((3, 4))], [1], True),
    ("fused_scale_tril", lambda a: M.fused_scale_tril(a, 0, -1.0, 3.0),
     lambda a: _tril_torch(a, 0, -1.0, 3.0), [normal((4, 4))], [1], True),
    ("unsorted_segment_sum", lambda d, i: M.unsorted_segment_sum(d, i, 4),
     lambda d, i: _torch_segment_sum(d, i, 4), [normal((6, 3)), const(SEG_IDS)], [1, 0], True),
    ("unsorted_segment_sum_axis1",
     lambda d, i: M.unsorted_segment_sum(d, i, 3, axis=1),
     lambda d, i: _torch_segment_sum(d, i, 3, axis=1),
     [normal((2, 4, 5)), const([2, 0, 2, 1], np.int64)], [1, 0], True),
    ("unsorted_segment_sum_like",
     lambda d, i, like: M.unsorted_segment_sum_like(d, i, like),
     lambda d, i, like: _torch_segment_sum(d, i, 5),
     [normal((6, 3)), const(SEG_IDS), normal((5, 3))], [1, 0, 0], True),
    ("unsorted_batch_segment_sum", lambda d, i: M.unsorted_batch_segment_sum(d, i, 3),
     lambda d, i: torch.stack([_torch_segment_sum(d[b], i[b], 3) for b in range(2)]),
     [normal((2, 4, 3)), const([[0, 2, 2, 5], [1, 1, -1, 0]], np.int32)], [1, 0], True),
    ("sort", lambda a: flow.math.sort(a), lambda a: torch.sort(a, -1).values, [sep((3, 4))], [1],
     True),
    ("sort_descending_axis0", lambda a: flow.math.sort(a, 0, "DESCENDING"),
     lambda a: torch.sort(a, 0, descending=True).values, [sep((3, 4))], [1], True),
] + [(f"nn.{name}", fn, torch_fn, [uniform((4, 6), -8, 8)], [1], True)
     for name, fn, torch_fn in ACTIVATIONS] + [
    ("softmax_grad", lambda y, dy: flow.nn.softmax_grad(y, dy),
     lambda y, dy: (dy - (dy * y).sum(-1, keepdim=True)) * y,
     [normal((3, 4)), normal((3, 4))], [1, 1], True),
]


test_gradient_against_finite_differences, test_gradient_against_pytorch = gradient_tests(CASES)


def test_segment_sum_gradient_skips_rows_out_of_range():
    data = RNG.normal(size=(6, 2))
    run, shape = vjp(lambda d: flow.math.unsorted_segment_sum(
        d, flow.constant(SEG_IDS, dtype=flow.int32), 4), [data], [1])
    ct = RNG.normal(size=shape)
    _, (g,) = run([data], ct)
    np.testing.assert_array_equal(g, np.r_[ct[[1, 0, 3, 1]], np.zeros((2, 2))])


def test_lgamma_gradient_is_digamma_to_1e_12():
    x = np.r_[RNG.uniform(-9.9, -0.1, 20), RNG.uniform(0.05, 40, 20), 1e6]
    x = x[np.abs(x - np.round(x)) > 0.05]
    run, shape = vjp(flow.math.lgamma, [x], [1])
    _, (g,) = run([x], np.ones(shape))
    np.testing.assert_allclose(g, torch.digamma(torch.tensor(x)).numpy(), rtol=1e-12)


# -- dtypes -------------------------------------------------------------------------------
_ARITH = DTYPES  # float32, float64, int8, int32, int64


def _sweep_input(dtype, positive=False):
    if positive:
        x = [[0.5, 2.0, 1.5], [1.25, 3.0, 0.75]] if dtype in FLOATS else [[1, 2, 3], [4, 5, 1]]
    else:
        x = [[1.0, -2.0, 3.0], [0.0, 4.0, -1.0]]
    return np.array(x).astype(dtype)


# name: (fn, numpy reference in the input dtype, OneFlow's dtypes, positive inputs only)
SWEEP = {
    "add": (lambda a: M.add(a, a), lambda a: a + a, _ARITH, False),
    "subtract": (lambda a: M.subtract(a, 1), lambda a: a - 1, _ARITH, False),
    "multiply": (lambda a: M.multiply(a, a), lambda a: a * a, _ARITH, False),
    "divide": (lambda a: M.divide(a, a), lambda a: a // a if a.dtype.kind == "i" else a / a,
               _ARITH, True),
    "maximum": (lambda a: M.maximum(a, 2 * a), lambda a: np.maximum(a, 2 * a), _ARITH, False),
    "minimum": (lambda a: M.minimum(a, 2 * a), lambda a: np.minimum(a, 2 * a), _ARITH, False),
    "mod": (lambda a: M.mod(a, 3 * a - 1), lambda a: np.mod(a, 3 * a - 1), _ARITH, True),
    "pow_scalar": (lambda a: M.pow(a, 2), lambda a: a ** 2, _ARITH, False),
    "pow": (lambda a: M.pow(a, a), lambda a: a ** a, FLOATS, True),
    "atan2": (lambda a: M.atan2(a, a), lambda a: np.arctan2(a, a), FLOATS, True),
    "floordiv": (lambda a: M.floordiv(a, a), lambda a: np.floor(a / a), FLOATS, True),
    "xdivy": (lambda a: M.xdivy(a, a), lambda a: a / a, FLOATS, True),
    "xlogy": (lambda a: M.xlogy(a, a), lambda a: a * np.log(a), FLOATS, True),
    "squared_difference": (lambda a: M.squared_difference(a, 1), lambda a: (a - 1) ** 2, FLOATS,
                           False),
    "equal": (lambda a: M.equal(a, 1), lambda a: (a == 1).astype(np.int8), _ARITH, False),
    "not_equal": (lambda a: M.not_equal(a, 1), lambda a: (a != 1).astype(np.int8), _ARITH,
                  False),
    "greater": (lambda a: M.greater(a, 1), lambda a: (a > 1).astype(np.int8), _ARITH, False),
    "logical_and": (lambda a: M.logical_and(a, a), lambda a: (a != 0).astype(np.int8), _ARITH,
                    False),
    "add_n": (lambda a: M.add_n([a, a, a]), lambda a: a + a + a, _ARITH, False),
    "clip_by_value": (lambda a: M.clip_by_value(a, -1, 2), lambda a: np.clip(a, -1, 2), _ARITH,
                      False),
    "abs": (M.abs, np.abs, _ARITH, False),
    "relu": (M.relu, lambda a: np.maximum(a, 0), _ARITH, False),
    "reduce_sum": (lambda a: M.reduce_sum(a, axis=1), lambda a: a.sum(1, dtype=a.dtype), _ARITH,
                   False),
    # (an integer mean is OneFlow's reduce_sum times int(1 / count): 0 here, with a warning)
    "reduce_mean": (lambda a: M.reduce_mean(a, axis=0),
                    lambda a: (a.sum(0) / 2).astype(a.dtype) if a.dtype.kind == "f"
                    else (a.sum(0) * 0).astype(a.dtype), _ARITH, False),
    "reduce_max": (lambda a: M.reduce_max(a), np.max, _ARITH, False),
    "reduce_min": (lambda a: M.reduce_min(a, axis=[0, 1]), np.min, _ARITH, False),
    "reduce_prod": (lambda a: M.reduce_prod(a, axis=1), lambda a: a.prod(1, dtype=a.dtype),
                    _ARITH, False),
    "reduce_any": (lambda a: M.reduce_any(a, axis=1), lambda a: a.any(1).astype(np.int8),
                   _ARITH, False),
    "reduce_all": (lambda a: M.reduce_all(a, axis=1), lambda a: a.all(1).astype(np.int8),
                   _ARITH, False),
    "reduce_euclidean_norm": (lambda a: M.reduce_euclidean_norm(a, 1),
                              lambda a: np.sqrt((a * a).sum(1)), FLOATS, False),
    "reduce_logsumexp": (lambda a: M.reduce_logsumexp(a, 1),
                         lambda a: np.log(np.exp(a).sum(1)), FLOATS, False),
    "reduce_std": (lambda a: M.reduce_std(a, 1), lambda a: a.std(1), FLOATS, False),
    "reduce_variance": (lambda a: M.reduce_variance(a, 1), lambda a: a.var(1), FLOATS, False),
    "argmax": (M.argmax, lambda a: np.argmax(a, -1), _ARITH, False),
    "top_k": (lambda a: M.top_k(a, k=2), lambda a: np.argsort(-a, -1, kind="stable")[:, :2],
              [np.float32, np.float64, np.int32, np.int64], False),
    "sort": (lambda a: M.sort(a), lambda a: np.sort(a, -1),
             [np.float32, np.float64, np.int32, np.int64], False),
    "argsort": (lambda a: M.argsort(a), lambda a: np.argsort(a, -1, kind="stable"),
                [np.float32, np.float64, np.int32, np.int64], False),
    "tril": (lambda a: M.tril(a), np.tril, _ARITH, False),
    "fused_scale_tril": (lambda a: M.fused_scale_tril(a, scale=2), lambda a: np.tril(a * 2),
                         _ARITH, False),
    "l2_normalize": (lambda a: M.l2_normalize(a, 1),
                     lambda a: a / np.sqrt((a * a).sum(1, keepdims=True)), FLOATS, False),
    "polyval": (lambda a: M.polyval([1.0, 2.0], a), lambda a: a + 2, FLOATS, False),
    "unsorted_segment_sum": (
        lambda a: M.unsorted_segment_sum(a, flow.constant([1, 1], dtype=flow.int32), 2),
        lambda a: np.stack([np.zeros(3, a.dtype), a.sum(0, dtype=a.dtype)]),
        [np.float32, np.float64, np.int32, np.int64], False),
    "softmax": (flow.nn.softmax, lambda a: np.exp(a) / np.exp(a).sum(-1, keepdims=True), FLOATS,
                False),
    "logsoftmax": (flow.nn.logsoftmax,
                   lambda a: a - np.log(np.exp(a).sum(-1, keepdims=True)), FLOATS, False),
    "leaky_relu": (flow.nn.leaky_relu, lambda a: np.where(a > 0, a, 0.2 * a), FLOATS, False),
    "elu": (flow.nn.elu, lambda a: np.where(a > 0, a, np.expm1(a)), FLOATS, False),
    "hardsigmoid": (flow.nn.hardsigmoid, lambda a: np.clip(a / 6 + 0.5, 0, 1), FLOATS, False),
    "hardswish": (flow.nn.hardswish, lambda a: a * np.clip(a / 6 + 0.5, 0, 1), FLOATS, False),
    "hardtanh": (flow.nn.hardtanh, lambda a: np.clip(a, -1, 1), FLOATS, False),
    "relu6": (flow.nn.relu6, lambda a: np.clip(a, 0, 6), FLOATS, False),
    "mish": (flow.nn.mish, lambda a: a * np.tanh(np.logaddexp(0, a)), FLOATS, False),
    "swish": (flow.nn.swish, lambda a: a / (1 + np.exp(-a)), FLOATS, False),
}
SWEEP.update({name: (fn, lambda a, ref=ref: ref(a), FLOATS, name in (
    "acosh", "log", "rsqrt", "sqrt", "lgamma")) for name, (fn, ref, _, _) in UNARY.items()
    if name not in SWEEP})


@pytest.mark.parametrize("dtype", DTYPES, ids=[np.dtype(d).name for d in DTYPES])
# (integer quotients by a number warn, as OneFlow's casts to 0 are a trap: expected here)
@pytest.mark.filterwarnings("ignore:.*multiplies by int")
@pytest.mark.parametrize("name", list(SWEEP))
def test_dtype_sweep(name, dtype):
    """Each dtype OneFlow accepts runs and matches NumPy; the others raise TraceError."""
    fn, ref, allowed, positive = SWEEP[name]
    x = _sweep_input(dtype, positive)
    if name in ("acosh",) and dtype in FLOATS:
        x = x + 1
    if dtype not in allowed:
        with pytest.raises(TraceError):
            forward(fn, x)
        return
    out = forward(fn, x)
    with np.errstate(all="ignore"):
        expected = np.asarray(ref(x))
    if dtype in FLOATS:
        np.testing.assert_allclose(out, expected.astype(out.dtype),
                                   rtol=1e-6 if dtype == np.float32 else 1e-13, atol=1e-7)
    else:
        np.testing.assert_array_equal(out, expected.astype(out.dtype))
        assert out.dtype == expected.dtype or expected.dtype == np.int8 or name in (
            "argmax", "top_k", "argsort")


# -- signatures and errors ----------------------------------------------------------------

def test_oneflow_names_and_missing_ones():
    for name in ("sort", "argsort"):
        assert callable(getattr(flow.math, name))
    for name in ("softmax", "broadcast_add", "floor_mod", "square_sum"):
        with pytest.raises(UnsupportedAPIError):
            getattr(flow.math, name)
    from onnxjob.ops import activations
    for name in activations.__all__:
        assert callable(getattr(flow.nn, name)), name


def test_names_reach_lowered_ops():
    """A user name is kept also where a float64 formula replaced the ONNX op."""
    builder = GraphBuilder("names")
    with tracing(builder):
        x = builder.add_input("x", (3,), np.float64)
        flow.math.sinh(x, name="my_sinh")
        flow.nn.elu(x, name="my_elu")
        flow.math.reduce_sum(flow.cast(x, flow.int8), name="my_sum")
    names = {node.name for node in builder.graph}
    assert {"my_sinh", "my_elu", "my_sum"} <= names


def test_float_only_op_on_ints_names_the_api_and_line():
    with pytest.raises(TraceError) as e:
        forward(flow.math.sin, np.ones(3, np.int32))
    assert "flow.math.sin" in str(e.value) and "int32" in str(e.value)
    assert THIS_FILE in str(e.value)


@pytest.mark.parametrize("call, message", [
    (lambda x: flow.math.top_k(x, k=0), "k must be an int >= 1"),
    (lambda x: flow.math.top_k(x, axis=2), "out of range"),
    (lambda x: flow.math.sort(x, direction="UP"), "ASCENDING"),
    (lambda x: flow.math.reduce_sum(x, axis=3), "out of range"),
    (lambda x: flow.math.clip_by_value(x), "cannot both be None"),
    (lambda x: flow.nn.hardtanh(x, 1.0, -1.0), "larger than"),
    (lambda x: flow.math.tril(flow.reshape(x, [6])), "rank >= 2"),
    (lambda x: flow.math.add_n([x, flow.reshape(x, [3, 2])]), "one shape"),
    (lambda x: flow.math.l2_normalize(x), "axis must be an int"),
    (lambda x: flow.math.unsorted_segment_sum(x, flow.constant([0, 1, 1], dtype=flow.int32), 2),
     "segment_ids"),
    (lambda x: flow.math.add(x, flow.cast(x, flow.float64)), "dtypes differ"),
])
def test_bad_arguments_raise_trace_errors(call, message):
    with pytest.raises(TraceError, match=message) as e:
        forward(call, np.ones((2, 3), np.float32))
    assert THIS_FILE in str(e.value)


def test_a_train_job_minimizes_through_new_gradients():
    """reduce_prod, lgamma and atan2 gradients inside a real train job."""
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 3), initializer=flow.constant_initializer(1.5))
        loss = flow.math.reduce_prod(w * x, axis=1) + flow.math.reduce_sum(
            flow.math.lgamma(w) + flow.math.atan2(w, x), axis=1)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    x = np.full((2, 3), 2.0, np.float32)
    first = train(x)
    second = train(x)
    assert np.all(second < first)

