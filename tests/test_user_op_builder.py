"""flow.user_op_builder over onnxjob's table of OneFlow op types (onnxjob/ops/user_ops):
builder ops equal the flow functions they stand for (forward values from one table, and
gradients in train jobs), attribute typing, output order, op_name, module builders, and
errors that name the op type and the caller's line."""
import inspect
import os
from typing import Tuple

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import MissingGradientError, TraceError, UnsupportedAPIError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from onnxjob.ops import user_ops
from user_op_helpers import build

THIS_FILE = os.path.basename(__file__)
RNG = np.random.default_rng(0)




def run_graph(fn, arrays):
    """fn({arg: [Blob]}) traced on inputs shaped like `arrays` ({arg: [array]}) and run on
    onnxruntime: its outputs (a list of Blobs) as arrays."""
    builder = GraphBuilder("user_op_test")
    feeds = {}
    with tracing(builder):
        blobs = {}
        for arg, values in arrays.items():
            blobs[arg] = []
            for i, a in enumerate(values):
                blob = builder.add_input(f"{arg}{i}", a.shape, a.dtype)
                feeds[blob.name] = a
                blobs[arg].append(blob)
        for i, out in enumerate(fn(blobs)):
            out = op("Identity", out)
            out.value.name = f"out{i}"
            builder.graph.outputs.append(out.value)
    model = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION))
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def f32(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


def i32(*shape, high=4):
    return RNG.integers(0, high, shape).astype(np.int32)


# (op type, inputs, outputs, attrs, the same with flow functions)
CASES = [
    ("abs", {"x": [f32(3, 4)]}, [("y", 1)], {}, lambda b: [flow.math.abs(b["x"][0])]),
    ("sigmoid_v2", {"x": [f32(5)]}, [("y", 1)], {}, lambda b: [flow.math.sigmoid(b["x"][0])]),
    ("rsqrt", {"x": [f32(5, low=0.5)]}, [("y", 1)], {}, lambda b: [flow.math.rsqrt(b["x"][0])]),
    ("pow", {"x": [f32(4, low=0.5)], "y": [f32(4)]}, [("z", 1)], {},
     lambda b: [flow.math.pow(b["x"][0], b["y"][0])]),
    ("broadcast_add", {"x": [f32(2, 3)], "y": [f32(3)]}, [("z", 1)], {},
     lambda b: [flow.math.add(b["x"][0], b["y"][0])]),
    ("broadcast_greater", {"x": [f32(2, 3)], "y": [f32(2, 1)]}, [("z", 1)], {},
     lambda b: [flow.math.greater(b["x"][0], b["y"][0])]),
    ("scalar_add", {"in": [f32(3)]}, [("out", 1)],
     {"has_int_operand": True, "int_operand": 3, "has_float_operand": False,
      "float_operand": 0.0}, lambda b: [flow.math.add(b["in"][0], 3)]),
    ("scalar_mul_by_tensor", {"x": [f32(2, 3)], "scalar": [f32(1)]}, [("y", 1)], {},
     lambda b: [flow.math.multiply(b["x"][0], b["scalar"][0])]),
    ("clip_by_scalar", {"x": [f32(6)]}, [("y", 1)],
     {"floating_min": -0.5, "floating_max": 0.5},
     lambda b: [flow.clip_by_value(b["x"][0], -0.5, 0.5)]),
    ("reduce_sum", {"input_tensor": [f32(2, 3, 4)]}, [("output_tensor", 1)],
     {"axis": [0, 2], "keepdims": False},
     lambda b: [flow.math.reduce_sum(b["input_tensor"][0], axis=[0, 2])]),
    ("reduce_max", {"input_tensor": [f32(2, 3)]}, [("output_tensor", 1)],
     {"axis": [1], "keepdims": True},
     lambda b: [flow.math.reduce_max(b["input_tensor"][0], axis=[1], keepdims=True)]),
    ("leaky_relu", {"x": [f32(7)]}, [("y", 1)], {"alpha": 0.1},
     lambda b: [flow.nn.leaky_relu(b["x"][0], 0.1)]),
    ("hardtanh", {"in": [f32(7)]}, [("out", 1)], {"min_val": -1.0, "max_val": 0.5},
     lambda b: [flow.nn.hardtanh(b["in"][0], -1.0, 0.5)]),
    ("softmax", {"in": [f32(2, 5)]}, [("out", 1)], {}, lambda b: [flow.nn.softmax(b["in"][0])]),
    ("logsoftmax", {"in": [f32(2, 5)]}, [("prob", 1), ("out", 1)], {},
     lambda b: [flow.nn.softmax(b["in"][0]), flow.nn.logsoftmax(b["in"][0])]),
    ("argmax", {"in": [f32(3, 5)]}, [("out", 1)], {}, lambda b: [flow.math.argmax(b["in"][0])]),
    ("arg_sort", {"in": [f32(3, 5)]}, [("out", 1)], {"direction": "DESCENDING"},
     lambda b: [flow.argsort(b["in"][0], direction="DESCENDING")]),
    ("top_k", {"in": [f32(3, 5)]}, [("out", 1)], {"k": 2, "sorted": True},
     lambda b: [flow.math.top_k(b["in"][0], k=2)]),
    ("reshape", {"in": [f32(2, 6)]}, [("out", 1)], {"shape": (3, -1)},
     lambda b: [flow.reshape(b["in"][0], (3, 4))]),
    ("transpose", {"input": [f32(2, 3, 4)]}, [("output", 1)], {"perm": [2, 0, 1]},
     lambda b: [flow.transpose(b["input"][0], perm=[2, 0, 1])]),
    ("concat", {"in": [f32(2, 3), f32(2, 1), f32(2, 2)]}, [("out", 1)], {"axis": 1},
     lambda b: [flow.concat(b["in"], axis=1)]),
    ("slice", {"x": [f32(4, 5)]}, [("y", 1)], {"start": [1, 0], "stop": [4, 5], "step": [2, 2]},
     lambda b: [flow.slice_v2(b["x"][0], [(1, 4, 2), (0, 5, 2)])]),
    ("gather", {"in": [f32(5, 3)], "indices": [i32(4)]}, [("out", 1)], {"axis": 0},
     lambda b: [flow.gather(b["in"][0], b["indices"][0])]),
    ("expand", {"in": [f32(3, 1)]}, [("out", 1)],
     {"logical_in_shape": [3, 1], "logical_expand_shape": [2, 3, 4]},
     lambda b: [flow.expand(b["in"][0], [2, 3, 4])]),
    ("cast", {"in": [f32(4)]}, [("out", 1)], {"dtype": flow.int32},
     lambda b: [flow.cast(b["in"][0], flow.int32)]),
    ("where", {"condition": [i32(2, 3, high=2)], "x": [f32(2, 3)], "y": [f32(2, 3)]},
     [("out", 1)], {}, lambda b: [flow.where(b["condition"][0], b["x"][0], b["y"][0])]),
    ("one_hot", {"indices": [i32(4)]}, [("out", 1)],
     {"depth": 5, "floating_on_value": 2.0, "floating_off_value": -1.0, "dtype": flow.float},
     lambda b: [flow.one_hot(b["indices"][0], 5, 2.0, -1.0, dtype=flow.float)]),
    ("matmul", {"a": [f32(2, 3)], "b": [f32(4, 3)]}, [("out", 1)],
     {"transpose_b": True, "alpha": 0.5},
     lambda b: [flow.matmul(b["a"][0], b["b"][0], transpose_b=True, alpha=0.5)]),
    ("broadcast_matmul", {"a": [f32(2, 2, 3)], "b": [f32(3, 4)]}, [("out", 1)], {},
     lambda b: [flow.matmul(b["a"][0], b["b"][0])]),
    ("bias_add", {"a": [f32(2, 3, 4)], "b": [f32(3)]}, [("out", 1)], {"axis": 1},
     lambda b: [flow.nn.bias_add(b["a"][0], b["b"][0], "NCHW")]),
    ("conv2d", {"in": [f32(1, 2, 5, 5)], "weight": [f32(3, 2, 3, 3)]}, [("out", 1)],
     {"filters": 3, "padding_before": [1, 1], "data_format": "channels_first",
      "kernel_size": [3, 3], "strides": [2, 2], "dilation_rate": [1, 1]},
     lambda b: [flow.nn.conv2d(b["in"][0], b["weight"][0], 2, [[0, 0], [0, 0], [1, 1], [1, 1]])]),
    ("avg_pool_2d", {"x": [f32(1, 2, 5, 5)]}, [("y", 1)],
     {"padding": "customized", "padding_before": [1, 0], "padding_after": [1, 1],
      "data_format": "channels_first", "pool_size": [3, 3], "strides": [2, 2]},
     lambda b: [flow.nn.avg_pool2d(b["x"][0], 3, 2, [[0, 0], [0, 0], [1, 1], [0, 1]])]),
    ("max_pool_2d", {"x": [f32(1, 5, 5, 2)]}, [("y", 1)],
     {"padding": "same_upper", "data_format": "channels_last", "pool_size": [2, 2],
      "strides": [2, 2]},
     lambda b: [flow.nn.max_pool2d(b["x"][0], 2, 2, "SAME_UPPER", data_format="NHWC")]),
    ("tril", {"in": [f32(4, 4)]}, [("out", 1)],
     {"diagonal": -1, "floating_fill_value": 7.0, "is_floating_fill_value": True},
     lambda b: [flow.math.tril(b["in"][0], -1, 7.0)]),
    ("pad", {"x": [f32(2, 3)]}, [("y", 1)],
     {"padding_before": [1, 0], "padding_after": [0, 2], "floating_constant_value": 3.0},
     lambda b: [flow.pad(b["x"][0], [(1, 0), (0, 2)], 3.0)]),
    ("multi_square_sum", {"x": [f32(2, 3), f32(4)]}, [("y", 1)], {},
     lambda b: [flow.experimental.square_sum(b["x"][0]) +
                flow.experimental.square_sum(b["x"][1])]),
    ("add_n", {"in": [f32(3), f32(3), f32(3)]}, [("out", 1)], {},
     lambda b: [flow.math.add_n(b["in"])]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_builder_op_equals_its_flow_function(case):
    type_name, arrays, outputs, attrs, reference = case
    got = run_graph(lambda b: build(type_name, b, outputs, **attrs), arrays)
    want = run_graph(reference, arrays)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_values_against_numpy():
    x, y = f32(3, 4), f32(3, 4, low=0.5)
    fmod, lor = run_graph(lambda b: [
        build("broadcast_fmod", {"x": b["x"], "y": b["y"]}, [("z", 1)])[0],
        build("broadcast_logical_or", {"x": b["x"], "y": b["y"]}, [("z", 1)])[0]],
        {"x": [x], "y": [y]})
    np.testing.assert_allclose(fmod, np.fmod(x, y), rtol=1e-6)
    assert lor.dtype == np.int8 and (lor == 1).all()   # y is nonzero everywhere
    # split_like: the like blobs' sizes at axis; out_i = like_i's axes + in's trailing ones
    x = f32(3, 5, 2)
    first, rest = run_graph(lambda b: build(
        "split_like", {"in": b["x"], "like": [b["a"][0], b["c"][0]]}, [("out", 2)], axis=1),
        {"x": [x], "a": [f32(3, 2)], "c": [f32(3, 3)]})
    np.testing.assert_array_equal(first, x[:, :2])
    np.testing.assert_array_equal(rest, x[:, 2:])


def test_reduce_sum_like_and_fused_cast_scale():
    x = f32(2, 3, 4)
    like, same, scaled = run_graph(lambda b: [
        build("reduce_sum_like", {"x": b["x"], "like": [flow.math.reduce_sum(b["x"][0], [0, 2])]},
              [("y", 1)], axis=[0, 2])[0],
        build("reduce_sum_like", {"x": b["x"], "like": b["x"]}, [("y", 1)])[0],
        build("fused_cast_scale", {"x": b["x"], "scale_by_tensor": [
            flow.constant(0.5, dtype=flow.double, shape=(1,))]}, [("y", 1)], scale=3.0)[0]],
        {"x": [x]})
    np.testing.assert_allclose(like, x.sum((0, 2)), rtol=1e-5)
    np.testing.assert_array_equal(same, x)
    assert scaled.dtype == np.float64
    np.testing.assert_allclose(scaled, x.astype(np.float64) * 1.5, rtol=1e-12)


def test_layer_norm_outputs():
    x, gamma, beta = f32(2, 3, 4), f32(4), f32(4)
    y, mean, inv, normalized = run_graph(lambda b: build(
        "layer_norm", {"x": b["x"], "gamma": b["g"], "beta": b["b"]},
        [("y", 1), ("mean", 1), ("inv_variance", 1), ("normalized", 1)], center=True,
        scale=True, begin_norm_axis=1, begin_params_axis=-1, epsilon=1e-5),
        {"x": [x], "g": [gamma], "b": [beta]})
    rows = x.reshape(2, -1)
    np.testing.assert_allclose(mean, rows.mean(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(inv, 1 / np.sqrt(rows.var(1) + 1e-5), rtol=1e-4)
    want = (x - mean[:, None, None]) * inv[:, None, None]
    np.testing.assert_allclose(normalized, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y, want * gamma + beta, rtol=1e-4, atol=1e-5)


# -- through jobs ---------------------------------------------------------------------------------

def test_gradients_equal_the_flow_functions():
    """A train job through builder ops (matmul, bias_add, relu, reduce_sum) and one through
    the flow functions: the same watched gradients of the shared variable."""
    grads = {}

    def make(kind):
        def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
            w = flow.get_variable("w", (3, 5), initializer=flow.random_uniform_initializer())
            bias = flow.get_variable("b", (5,), initializer=flow.random_uniform_initializer())
            if kind == "builder":
                h = build("matmul", {"a": [x], "b": [w]}, [("out", 1)], name="mm")[0]
                h = build("bias_add", {"a": [h], "b": [bias]}, [("out", 1)], axis=1)[0]
                h = build("relu", {"in": [h]}, [("out", 1)])[0]
                loss = build("reduce_sum", {"input_tensor": [h]}, [("output_tensor", 1)],
                             axis=[1], keepdims=False)[0]
            else:
                h = flow.math.relu(flow.nn.bias_add(flow.matmul(x, w), bias))
                loss = flow.math.reduce_sum(h, axis=[1])
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                               momentum=0).minimize(loss)
            flow.watch_diff(w, lambda g: grads.setdefault(kind + "_w", g))
            flow.watch_diff(bias, lambda g: grads.setdefault(kind + "_b", g))
            return loss
        job.__name__ = f"{kind}_job"
        return flow.global_function(type="train")(job)

    jobs = [make("builder"), make("flow")]
    x = f32(4, 3)
    losses = [job(x) for job in jobs]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    np.testing.assert_allclose(grads["builder_w"], grads["flow_w"], rtol=1e-6)
    np.testing.assert_allclose(grads["builder_b"], grads["flow_b"], rtol=1e-6)
    assert np.abs(grads["flow_w"]).sum() > 0


def test_outputs_in_declared_order_and_op_name():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 5))) -> Tuple[tp.Numpy, tp.Numpy]:
        with flow.scope.namespace("block"):
            op_ = (flow.user_op_builder("lsm").Op("logsoftmax").Input("in", [x])
                   .Output("out").Output("prob").Build().InferAndTryRun())
        out, prob = op_.RemoteBlobList()
        assert out.op_name == prob.op_name == "block-lsm"
        assert list(op_.RemoteBlobDict()) == ["out", "prob"]
        return out, prob

    x = f32(2, 5)
    out, prob = job(x)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(prob, e / e.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(out, np.log(prob), rtol=1e-5, atol=1e-6)


def test_attr_auto_typing():
    t = user_ops.lookup("leaky_relu")
    assert t.convert_attr("alpha", 1) == 1.0 and isinstance(t.convert_attr("alpha", 1), float)
    assert t.convert_attr("alpha", 0.1) == float(np.float32(0.1))   # a float attr is float32
    assert user_ops.lookup("reshape").convert_attr("shape", [2, 3]) == (2, 3)
    assert user_ops.lookup("cast").convert_attr("dtype", flow.int8) is flow.int8
    assert user_ops.lookup("matmul").convert_attr("alpha", 0.1) == 0.1   # a double stays one
    lists = user_ops.lookup("TestListDataTypeAndListShapeAndListStringAttr")
    assert lists.convert_attr("out_shapes", [[1, 2], (3,)]) == [(1, 2), (3,)]
    for type_name, attr, bad in [("leaky_relu", "alpha", "0.1"), ("reshape", "shape", 3),
                                 ("cast", "dtype", np.float32), ("top_k", "k", 2 ** 31),
                                 ("top_k", "sorted", 1)]:
        with pytest.raises(TraceError, match=f"attribute '{attr}' is"):
            user_ops.lookup(type_name).convert_attr(attr, bad)
    # an unset attribute takes its default, or its type's zero value (OneFlow's T())
    assert user_ops.lookup("flatten").complete_attrs({})["end_dim"] == -1
    assert user_ops.lookup("transpose").complete_attrs({})["perm"] == []


def test_user_op_module_builder_and_find_or_create_module():
    class Add(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.builder = flow.consistent_user_op_module_builder("add_n")
            self.builder.InputSize("in", 2).Output("out")
            self.builder.user_op_module.InitOpKernel()

        def forward(self, x, y):
            return (self.builder.OpName(f"Add_{self.call_seq_no}").Input("in", [x, y])
                    .Build().InferAndTryRun().SoleOutputBlob())

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,)), y: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        adder = flow.find_or_create_module("Add", Add)
        z = adder(x, y)
        assert z.op_name == "Add_0"
        assert flow.find_or_create_module("Add", Add, reuse=True) is adder
        with pytest.raises(AssertionError, match="duplicated module_name"):
            flow.find_or_create_module("Add", Add)
        return adder(z, x)

    x, y = f32(3), f32(3)
    np.testing.assert_allclose(job(x, y), 2 * x + y, rtol=1e-6)
    with pytest.raises(ValueError, match="can't call"):
        flow.user_op_module_builder("relu").Op("relu")


# -- errors ---------------------------------------------------------------------------------------

def _line_of(marker):
    """The line of this file holding `marker` (inside a test body)."""
    source, start = inspect.findsource(inspect.currentframe())
    return next(i + 1 for i, text in enumerate(source) if marker in text)


def test_unknown_op_type_names_it_the_line_and_a_near_match():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        return flow.user_op_builder("r").Op("Relu").Input("in", [x])  # UNKNOWN-OP

    with pytest.raises(UnsupportedAPIError) as info:
        job(f32(3))
    message = str(info.value)
    assert f"{THIS_FILE}:{_line_of('# UNKNOWN-OP')}" in message
    assert "op type 'Relu' is not in onnxjob's table" in message
    assert "'relu' (flow.math.relu)" in message and "op_type_names()" in message
    # an op type onnxjob has only as a flow function (a host data op) says which
    with pytest.raises(UnsupportedAPIError, match="as flow.data.ofrecord_reader"):
        flow.user_op_builder("reader").Op("OFRecordReader")


def test_wrong_inputs_outputs_and_attrs_say_what_is_expected():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        with pytest.raises(TraceError) as extra:
            flow.user_op_builder("a").Op("relu").Input("x", [x])  # EXTRA-INPUT
        assert f"{THIS_FILE}:{_line_of('# EXTRA-INPUT')}" in str(extra.value)
        assert "has no input 'x'; it takes 'in' (1 blob)" in str(extra.value)
        with pytest.raises(TraceError) as missing:
            flow.user_op_builder("b").Op("matmul").Input("a", [x]).Output("out").Build()  # MISS
        assert f"{THIS_FILE}:{_line_of('# MISS')}" in str(missing.value)
        assert "needs input 'b' (1 blob)" in str(missing.value)
        with pytest.raises(TraceError, match="has no attribute 'beta'.*alpha: float"):
            flow.user_op_builder("c").Op("leaky_relu").Attr("beta", 1.0)
        with pytest.raises(TraceError, match="makes output 'y' .* not declared"):
            flow.user_op_builder("d").Op("leaky_relu").Input("x", [x]).Build()
        with pytest.raises(TraceError, match="needs attribute 'dtype'"):
            flow.user_op_builder("e").Op("cast").Input("in", [x]).Output("out").Build()
        with pytest.raises(TraceError, match=r"input 'in' \(2 or more blobs\) got 1"):
            flow.user_op_builder("f").Op("add_n").Input("in", [x])
        with pytest.raises(TraceError, match="call InferAndTryRun"):
            flow.user_op_builder("g").Op("relu").Input("in", [x]).Output("out").Build() \
                .RemoteBlobList()
        with pytest.raises(TraceError, match="declared 3"):
            halves = [flow.slice_v2(x, [(0, 1, 1)]), flow.slice_v2(x, [(1, 3, 1)])]
            build("split_like", {"in": [x], "like": halves}, [("out", 3)], axis=0)
        return x

    job(f32(3))


def test_table_lists_its_op_types():
    names = user_ops.op_type_names()
    assert len(names) >= 200 and names == sorted(names)
    assert {"relu", "conv2d", "split_like", "dynamic_loss_scale_schedule",
            "TestMultiInput"} <= set(names)
    assert "TestSource" in user_ops.op_type_names("oneflow_tests")
    assert sum(user_ops.sections().values()) == len(names)


def test_op_without_gradient_in_a_train_job_says_so():
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 3), initializer=flow.ones_initializer())
        y = build("TestReshape", {"in": [x * w]}, [("out", 1)], shape=(3, 2))[0]
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(y)
        return y

    with pytest.raises(MissingGradientError, match="TestReshape"):
        job(f32(2, 3))


def _loss_scale_variables():
    counter = flow.get_variable("counter", (1,), dtype=flow.int64,
                                initializer=flow.constant_initializer(0, dtype=flow.int64))
    scale = flow.get_variable("scale", (1,), initializer=flow.constant_initializer(8.0))
    return counter, scale


def test_dynamic_loss_scale_schedule_updates_its_variables():
    @flow.global_function()
    def step(count: tp.Numpy.Placeholder((1,), dtype=flow.int64)) -> tp.Numpy:
        counter, scale = _loss_scale_variables()
        build("dynamic_loss_scale_schedule", {"count_not_finite": [count],
              "loss_scale": [scale], "good_step_counter": [counter]}, [],
              increment_period=2, multiplier=2.0)
        return count

    @flow.global_function()
    def fetch() -> Tuple[tp.Numpy, tp.Numpy]:
        return _loss_scale_variables()

    seen = []
    for n in (0, 0, 0, 3, 0):
        step(np.array([n], np.int64))
        seen.append(tuple(v.item() for v in fetch()))
    # good, good (the period: scale x2, counter 0), good, not finite (/2, 0), good
    assert seen == [(1, 8.0), (0, 16.0), (1, 16.0), (0, 8.0), (1, 8.0)]


def test_dynamic_loss_scale_schedule_needs_variables():
    @flow.global_function()
    def bad(count: tp.Numpy.Placeholder((1,), dtype=flow.int64)) -> tp.Numpy:
        scale = flow.constant(1.0, shape=(1,))
        counter = flow.constant(0, dtype=flow.int64, shape=(1,))
        build("dynamic_loss_scale_schedule", {"count_not_finite": [count],
              "loss_scale": [scale], "good_step_counter": [counter]}, [])
        return count

    with pytest.raises(TraceError, match="must be a variable"):
        bad(np.zeros(1, np.int64))


def test_builtin_op_declared_once_and_applied_to_a_job_s_blobs():
    """OneFlow 0.5's flow.builtin_op: declared once (inputs, outputs, attributes), then
    called on blobs with more attributes; each call is one op of the type."""
    scaled_add = (flow.builtin_op("scalar_add").Input("in").Output("out")
                  .Attr("has_float_operand", True).Build())
    concat = flow.builtin_op("concat", "joined").Input("in", 2).Output("out").Attr("axis", 1).op

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3))) -> Tuple[tp.Numpy, tp.Numpy]:
        (y,) = scaled_add(x, float_operand=2.5)
        (z,) = scaled_add(y, float_operand=-1.0)
        (both,) = concat(y, z, max_dim_size=6)
        assert both.op_name == "joined"
        return y, both

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y, both = job(x)
    np.testing.assert_allclose(y, x + 2.5)
    np.testing.assert_allclose(both, np.concatenate([x + 2.5, x + 1.5], axis=1))
    flow.clear_default_session()
    with pytest.raises(TraceError, match=r"takes 2 input blob\(s\) \(in x2\), got 1"):
        @flow.global_function()
        def wrong(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
            return concat(x)[0]
        wrong(x)
    with pytest.raises(UnsupportedAPIError, match="not_an_op"):
        flow.builtin_op("not_an_op")
