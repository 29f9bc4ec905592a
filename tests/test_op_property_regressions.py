"""Regression tests for what tests/test_op_properties.py found: graphs that traced and
then failed in onnxruntime (or ran with a wrong result), and shape errors that escaped
as Python errors without the user's line."""
import os

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
from onnxjob.errors import TraceError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing

THIS_FILE = os.path.basename(__file__)


def run(fn, *arrays):
    builder = GraphBuilder("regression")
    with tracing(builder):
        xs = [builder.add_input(f"x{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
        y = op("Identity", fn(*xs))
        builder.graph.outputs.append(y.value)
    proto = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {f"x{i}": a for i, a in enumerate(arrays)})[0]


def test_one_hot_of_a_0d_index():
    out = run(lambda i: flow.one_hot(i, 4, dtype=flow.float32), np.array(2, np.int32))
    np.testing.assert_array_equal(out, [0, 0, 1, 0])
    out = run(lambda i: flow.one_hot(i, 3, axis=0, dtype=flow.int64), np.array(0, np.int64))
    np.testing.assert_array_equal(out, [1, 0, 0])


def test_one_hot_axis_out_of_range_is_refused():
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+.*axis 3 is out of range"):
        run(lambda i: flow.one_hot(i, 4, axis=3), np.zeros((2,), np.int32))


def test_pad_reverse_slice_of_a_0d_blob():
    x = np.array(1.5, np.float32)
    assert run(lambda v: flow.pad(v, []), x) == 1.5
    assert run(lambda v: flow.reverse(v, []), x) == 1.5
    assert run(lambda v: flow.slice_v2(v, []), x) == 1.5


def test_slice_negative_begin_counts_from_the_end():
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    np.testing.assert_array_equal(run(lambda v: flow.slice(v, [None, -2], [None, 2]), x),
                                  x[:, 3:5])
    np.testing.assert_array_equal(run(lambda v: flow.slice(v, [-1, -5], [1, 3]), x), x[1:, :3])


def test_squeeze_with_no_axes_keeps_the_shape():
    x = np.ones((1, 3, 1), np.float32)
    assert run(lambda v: flow.squeeze(v, []), x).shape == (1, 3, 1)
    assert run(lambda v: flow.squeeze(v), x).shape == (3,)


def test_reshape_size_mismatch_names_the_line():
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: reshape: cannot reshape"):
        run(lambda v: flow.reshape(v, [2]), np.ones((), np.float32))


def test_reshape_and_flatten_of_a_zero_sized_blob():
    """A 0 in a reshape's resolved shape is a size of 0, as OneFlow reshapes an empty blob
    (reshape_op.cpp checks the element counts only): ONNX's default read it as "the
    input's size" and onnxruntime refused the run."""
    empty = np.ones((3, 0), np.float32)
    assert run(lambda v: flow.reshape(v, [-1, 3]), empty).shape == (0, 3)
    assert run(lambda v: flow.reshape(v, [0, 5]), empty).shape == (0, 5)
    assert run(lambda v: flow.flatten(v, start_dim=0, end_dim=1),
               np.ones((2, 0, 3), np.float32)).shape == (0, 3)


def test_matmul_of_a_vector_names_the_line():
    for shape_b in [(3,), ()]:
        with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: matmul: b must have rank >= 2"):
            run(lambda a, b: flow.matmul(a, b, transpose_b=True), np.ones((2, 3), np.float32),
                np.ones(shape_b, np.float32))


def test_integer_matmul_of_a_transpose_stays_a_matmul():
    """FoldTransposeIntoGemm made an int32 Gemm, which onnxruntime has no kernel for."""
    from onnxjob.passes import run_default_pipeline
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(12, dtype=np.int32).reshape(4, 3)
    builder = GraphBuilder("int_matmul")
    with tracing(builder):
        xs = [builder.add_input(f"x{i}", v.shape, v.dtype) for i, v in enumerate((a, b))]
        y = op("Identity", flow.matmul(*xs, transpose_b=True))
        builder.graph.outputs.append(y.value)
    model = ir.Model(builder.graph, ir_version=IR_VERSION)
    run_default_pipeline(model)
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x0": a, "x1": b})[0], a @ b.T)


def test_bias_add_checks_the_bias_shape():
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: bias_add: bias must have shape"):
        run(lambda v, b: flow.nn.bias_add(v, b), x, np.ones((1,), np.float32))
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: bias_add: bias must have shape"):
        run(lambda v, b: flow.nn.bias_add(v, b, data_format="NHWC"), x,
            np.ones((3,), np.float32))
    out = run(lambda v, b: flow.nn.bias_add(v, b, data_format="NHWC"), x,
              np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(out, x + np.arange(4))


@pytest.mark.parametrize("fn,ref,lo", [
    (flow.math.sqrt, np.sqrt, 0.1), (flow.math.exp, np.exp, -2), (flow.math.atan, np.arctan, -2),
    (flow.math.erf, None, -2), (flow.math.expm1, np.expm1, -2), (flow.math.log1p, np.log1p, -0.5),
    (flow.math.sigmoid, lambda v: 1 / (1 + np.exp(-v)), -3), (flow.nn.softmax, None, -2),
    (flow.math.reduce_logsumexp, lambda v: np.log(np.sum(np.exp(v))), -2),
    (flow.nn.elu, lambda v: np.where(v > 0, v, np.expm1(v)), -2)])
def test_float16_math_runs_in_float16(fn, ref, lo):
    """OneFlow takes float16 for its math ops: onnxjob traced a refusal ("Sqrt takes float32
    or float64, got float16"); onnxruntime computes them through float32."""
    x = np.linspace(lo, 2, 12).reshape(3, 4).astype(np.float16)
    out = run(fn, x)
    assert out.dtype == np.float16
    assert out.shape == (() if fn is flow.math.reduce_logsumexp else x.shape)
    if ref is not None:
        np.testing.assert_allclose(out.astype(np.float64), ref(x.astype(np.float64)),
                                   rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("fn, shapes_dtypes, match", [
    (flow.math.logical_and, [((3,), np.float32), ((3,), np.float64)],
     "the operands' dtypes differ: float32 and float64"),
    (flow.nn.sigmoid_cross_entropy_with_logits, [((1, 3), np.float32), ((2, 3), np.float32)],
     r"labels \(1, 3\) must have the input's shape \(2, 3\)"),
    (lambda v: flow.squeeze(v, [0, -2]), [((1, 3), np.float32)], "names an axis twice")])
def test_refused_as_oneflow_refuses(fn, shapes_dtypes, match):
    """OneFlow's shape and dtype rules refuse these (broadcast_logical_and's dtype check,
    sigmoid_cross_entropy's equal shapes, squeeze's once-per-axis check); onnxjob ran them."""
    arrays = [np.ones(s, d) for s, d in shapes_dtypes]
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: .*{match}"):
        run(fn, *arrays)


H = np.float16


@pytest.mark.parametrize("fn, inputs", [
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"), [((1, 2, 4, 4), H), ((3, 2, 3, 3), H)]),
    (lambda x: flow.nn.max_pool2d(x, 2, 2, "VALID"), [((1, 2, 4, 4), H)]),
    (lambda x, g, b: flow.nn.layer_norm(x, g, b, begin_norm_axis=1, begin_params_axis=1),
     [((2, 3, 4), H), ((3, 4), H), ((3, 4), H)]),
    (lambda x, t: flow.nn.MSELoss(x, t), [((2, 3), H), ((2, 3), H)]),
    (lambda y, z: flow.nn.sparse_softmax_cross_entropy_with_logits(y, z),
     [((2,), np.int32), ((2, 5), H)])])
def test_float16_where_oneflow_gpu_kernels_take_it(fn, inputs):
    """OneFlow's GPU kernels (cuDNN convolution and pooling, layer_norm, sparse softmax
    cross entropy) and the losses built of math ops take float16: onnxjob refused it."""
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 2, s).astype(d) if d == np.int32 else rng.uniform(-1, 1, s).astype(d)
          for s, d in inputs]
    half = run(fn, *xs)
    wide = run(fn, *[x.astype(np.float32) if x.dtype == H else x for x in xs])
    assert half.dtype == H
    np.testing.assert_allclose(half.astype(np.float32), wide, rtol=1e-2, atol=1e-2)


def test_batch_normalization_of_float16_takes_float32_statistics():
    """OneFlow's GPU normalization takes float32 statistics and parameters for a float16
    input (and refuses float16 ones): computed in float32, rounded once."""
    x = np.linspace(-2, 2, 24).reshape(2, 3, 4).astype(np.float16)
    mean, var = np.array([0.1, -0.2, 0.3], np.float32), np.array([1.0, 2.0, 0.5], np.float32)
    out = run(lambda v, m, s: flow.nn.batch_normalization(v, m, s, axis=1), x, mean, var)
    assert out.dtype == np.float16
    want = (x.astype(np.float32) - mean[:, None]) / np.sqrt(var[:, None] + 1e-5)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=1e-3, atol=1e-3)
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: .*float32 or float64"):
        run(lambda v, m, s: flow.nn.batch_normalization(v, m, s, axis=1), x,
            mean.astype(np.float16), var.astype(np.float16))
