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
