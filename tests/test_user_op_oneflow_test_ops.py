"""The op types OneFlow's library registers for its own tests (test_ops.cpp), built with
flow.user_op_builder, against their C++ kernels' semantics (test_kernels.cpp)."""
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.ops import user_ops
from onnxjob.ops.user_ops.oneflow_test_ops import mt19937_uniform
from user_op_helpers import build

RNG = np.random.default_rng(1)




def test_the_section_holds_these_op_types():
    assert set(user_ops.op_type_names("oneflow_tests")) == {
        "ccrelu", "ccrelu_grad", "cpu_only_relu_test", "TestReshape", "TestSource",
        "TestMultiOutputOrder", "TestSourceMultiGpuFixedOutNum", "TestMultiInput",
        "TestMultiInputGrad", "TestDynamicSource", "TestRandomSource", "TestDataTypeAttr",
        "TestListDataTypeAndListShapeAndListStringAttr", "test_user_op_attr_auto_type"}


def test_ccrelu_forward_and_its_registered_gradient():
    grads = {}

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        w = flow.get_variable("w", (3, 4), initializer=flow.ones_initializer())
        y = build("ccrelu", {"in": [x * w]})[0]
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(y)
        flow.watch_diff(w, lambda g: grads.setdefault("w", g))
        return y

    x = RNG.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(job(x), np.maximum(x, 0))
    # ccrelu_grad: dy where y > 0; the watched diff is the sum-seeded one
    np.testing.assert_allclose(grads["w"], np.where(x > 0, x, 0), rtol=1e-6)


def test_grad_ops_by_hand_and_cpu_only_relu():
    @flow.global_function()
    def job(y: tp.Numpy.Placeholder((5,)), dy: tp.Numpy.Placeholder((5,))
            ) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        dx = build("ccrelu_grad", {"y": [y], "dy": [dy]}, [("dx", 1)])[0]
        relu = build("cpu_only_relu_test", {"in": [y]})[0]
        d1, d2 = build("TestMultiInputGrad", {"x1": [y], "x2": [y], "y_diff": [dy]},
                       [("x1_diff", 1), ("x2_diff", 1)])
        return dx, relu, d1, d2

    y, dy = np.array([-1, 0, 2, -3, 4], np.float32), np.arange(5, dtype=np.float32)
    dx, relu, d1, d2 = job(y, dy)
    np.testing.assert_array_equal(dx, [0, 0, 2, 0, 4])
    np.testing.assert_array_equal(relu, np.maximum(y, 0))
    np.testing.assert_array_equal(d1, np.ones(5))
    np.testing.assert_array_equal(d2, np.full(5, 2.0))


@pytest.mark.parametrize("loss_scale", [None, 4.0])
def test_test_multi_input_gradient_ignores_the_incoming_one(loss_scale):
    """x1_diff = ones and x2_diff = twos whatever reaches y (OneFlow's test: a (3, 3) loss,
    so the update divides them by 9, and by the loss scale when there is one)."""
    seen = {}

    @flow.global_function(type="train")
    def job() -> tp.Numpy:
        x1, x2 = (flow.get_variable(n, (3, 3), initializer=flow.constant_initializer(v))
                  for n, v in (("x1", 1.0), ("x2", 5.0)))
        loss = build("TestMultiInput", {"x1": [x1], "x2": [x2]}, [("y", 1)])[0]
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.9]), momentum=0,
                           loss_scale_factor=loss_scale).minimize(loss)
        flow.watch_diff(x1, lambda g: seen.setdefault("x1", g))
        flow.watch_diff(x2, lambda g: seen.setdefault("x2", g))
        return loss

    np.testing.assert_array_equal(job(), np.ones((3, 3)))
    np.testing.assert_allclose(seen["x1"], np.ones((3, 3)))
    np.testing.assert_allclose(seen["x2"], np.full((3, 3), 2.0))
    step = 0.9 / 9 / (loss_scale or 1.0)
    np.testing.assert_allclose(job(), np.full((3, 3), 1.0 - step), rtol=1e-6)


def test_reshape_and_multi_output_order():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3, 2))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        r = build("TestReshape", {"in": [x]}, shape=(2, 3))[0]
        out1, out2 = build("TestMultiOutputOrder", {"in": [x]}, [("out1", 1), ("out2", 1)])
        return r, out1, out2

    x = RNG.standard_normal((3, 2)).astype(np.float32)
    r, out1, out2 = job(x)
    np.testing.assert_array_equal(r, x.reshape(2, 3))
    np.testing.assert_array_equal(out1, x)
    np.testing.assert_array_equal(out2, np.zeros((3, 4), np.float32))

    flow.clear_default_session()

    @flow.global_function()
    def bad(x: tp.Numpy.Placeholder((3, 2))) -> tp.Numpy:
        with pytest.raises(TraceError, match="must have in's rank 2"):
            build("TestReshape", {"in": [x]}, shape=(6,))
        with pytest.raises(TraceError, match="takes float32"):
            build("TestMultiOutputOrder", {"in": [flow.cast(x, flow.double)]},
                  [("out1", 1), ("out2", 1)])
        return x

    bad(x)


def test_sources():
    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        with flow.scope.placement("cpu", "0:0-1"):
            two = build("TestSourceMultiGpuFixedOutNum", out_num=10)[0]
        with flow.scope.placement("cpu", "0:0-2"):
            three = build("TestSourceMultiGpuFixedOutNum", out_num=10)[0]
        return build("TestSource")[0], two, three

    source, two, three = job()
    np.testing.assert_array_equal(source, np.arange(5.0))
    assert source.dtype == np.float32
    np.testing.assert_array_equal(two, np.append(np.arange(5.0), np.arange(5.0)))
    np.testing.assert_array_equal(three, [0, 1, 2, 3, 0, 1, 2, 0, 1, 2])


def test_dynamic_source():
    @flow.global_function()
    def job():
        out = build("TestDynamicSource")[0]
        assert out.is_dynamic and out.shape == (5,)
        return out

    np.testing.assert_array_equal(job().get().numpy_list()[0], np.arange(3.0))


def test_random_source_carries_its_generator_over_runs():
    """OneFlow's own expectation (test_TestRandomSource.py): the first ten floats of
    std::mt19937(0) through uniform_real_distribution<float>, five per run."""
    @flow.global_function()
    def job():
        return build("TestRandomSource", seed=0)[0]

    first, second = job().get().numpy(), job().get().numpy()
    np.testing.assert_allclose(first, [0.5488136, 0.59284467, 0.7151894, 0.8442659,
                                       0.6027634], atol=1e-7)
    np.testing.assert_allclose(second, [0.85794574, 0.54488325, 0.84725183, 0.42365485,
                                        0.62356377], atol=1e-7)
    draw = mt19937_uniform(2 ** 32 + 7)   # std::mt19937 takes the seed modulo 2**32
    np.testing.assert_array_equal(draw(3), mt19937_uniform(7)(3))


@pytest.mark.parametrize("dtype", [flow.float32, flow.double, flow.int8, flow.int64,
                                   flow.uint8])
def test_data_type_attrs(dtype):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))):
        out = build("TestDataTypeAttr", {"in": [x]}, output_type=dtype)[0]
        lists = build("TestListDataTypeAndListShapeAndListStringAttr", {"in": [x]},
                      [("out", 3)], out_shapes=[(4,), [1, 2], (3, 3)],
                      out_types=[dtype, flow.int32, flow.float], string_list=["a"])
        auto = build("test_user_op_attr_auto_type", {"in": [x]}, int1=1, int2=2)[0]
        return (out, *lists, auto)

    out, a, b, c, auto = (r.numpy() for r in job(np.ones((2, 3), np.float32)).get())
    np_dtype = dtype.np_dtype
    assert out.dtype == np_dtype and out.shape == (2, 3) and not out.any()
    assert [(v.shape, v.dtype) for v in (a, b, c)] == [
        ((4,), np_dtype), ((1, 2), np.int32), ((3, 3), np.float32)]
    assert auto.shape == (2, 3) and auto.dtype == np.float32


def test_attribute_checks_of_the_test_ops():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        with pytest.raises(TraceError, match="attribute 'int1' is int32"):
            flow.user_op_builder("t").Op("test_user_op_attr_auto_type").Attr("int1", 1.5)
        with pytest.raises(TraceError, match="string_list at least one string"):
            build("TestListDataTypeAndListShapeAndListStringAttr", {"in": [x]}, [("out", 3)],
                  out_shapes=[(1,)] * 3, out_types=[flow.float] * 3, string_list=[])
        with pytest.raises(TraceError, match=r"output 'out' \(3 blobs\) was declared with 2"):
            flow.user_op_builder("u").Op("TestListDataTypeAndListShapeAndListStringAttr") \
                .Output("out", 2)
        return x

    job(np.ones(2, np.float32))
