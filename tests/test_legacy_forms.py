"""Legacy OneFlow programs: the <= 0.4 positional orders beside 0.5's (the same graph and
numbers from both), a job function defined twice, and the modules and names such programs
import (flow.unittest, flow.distribute, record_pb2, initializer_conf_pb2, ...)."""
import importlib
import os
import struct
import sys
import unittest
from typing import Tuple

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from onnxjob.runtime.session import default_session

THIS_FILE = os.path.basename(__file__)
RNG = np.random.default_rng(0)


def traced(fn, *arrays):
    """(printable graph, output) of `fn` traced on inputs shaped like `arrays`."""
    builder = GraphBuilder("g")
    with tracing(builder):
        blobs = [builder.add_input(f"x{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
        y = fn(*blobs)
        if y.producer is None:
            y = op("Identity", y)
        builder.graph.outputs.append(y.value)
    model = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION))
    text = [(n.op_type, n.name, sorted((a.name, str(a)) for a in n.attribute))
            for n in model.graph.node]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return text, session.run(None, {f"x{i}": a for i, a in enumerate(arrays)})[0]


def same(old, new, *arrays):
    """Both calls give one graph and one result; returns (graph, result)."""
    old_graph, old_out = traced(old, *arrays)
    new_graph, new_out = traced(new, *arrays)
    assert old_graph == new_graph
    np.testing.assert_array_equal(old_out, new_out)
    return old_graph, old_out


IMAGE = RNG.standard_normal((2, 3, 8, 8)).astype(np.float32)
WEIGHT = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
MATRIX = RNG.standard_normal((3, 4)).astype(np.float32)
MATRIX_B = RNG.standard_normal((3, 5)).astype(np.float32)


# -- 1. the <= 0.4 positional orders --------------------------------------------------------

def test_conv2d_data_format_fifth_with_a_name_keyword():
    """OneFlow <= 0.4: (input, filters, strides, padding, data_format, dilations, groups,
    name); the name as a keyword used to be refused."""
    graph, out = same(
        lambda x, w: flow.nn.conv2d(x, w, 2, "SAME", "NCHW", 1, 1, name="c1"),
        lambda x, w: flow.nn.conv2d(x, w, 2, "SAME", None, "NCHW", 1, 1, name="c1"),
        IMAGE, WEIGHT)
    assert ("Conv", "c1") in [(t, n) for t, n, _ in graph]
    assert out.shape == (2, 4, 4, 4)
    same(lambda x, w: flow.nn.conv2d(x, w, 1, "VALID", "NCHW", 1, 1, "c2"),
         lambda x, w: flow.nn.conv2d(x, w, 1, "VALID", data_format="NCHW", name="c2"),
         IMAGE, WEIGHT)


def test_conv2d_nhwc_old_form_and_misuse():
    nhwc = IMAGE.transpose(0, 2, 3, 1).copy()
    w_nhwc = WEIGHT.transpose(0, 2, 3, 1).copy()
    same(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", "NHWC", 1, 1, name="c"),
         lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", data_format="NHWC", name="c"),
         nhwc, w_nhwc)
    with pytest.raises(TypeError, match="at most 8 positional"):
        traced(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", "NCHW", 1, 1, "c", 0), IMAGE, WEIGHT)
    with pytest.raises(TypeError, match="multiple values for name"):
        traced(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", "NCHW", 1, 1, "c", name="d"),
               IMAGE, WEIGHT)
    with pytest.raises(TraceError, match="fifth argument"):
        traced(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", 3), IMAGE, WEIGHT)


def test_matmul_name_fifth():
    graph, out = same(lambda a, b: flow.matmul(a, b, True, False, "mm"),
                      lambda a, b: flow.matmul(a, b, True, False, 1.0, "mm"), MATRIX, MATRIX_B)
    assert "mm" in [n for _, n, _ in graph]
    np.testing.assert_allclose(out, MATRIX.T @ MATRIX_B, rtol=1e-5)
    same(lambda a, b: flow.linalg.matmul(a, b, True, False, "mm"),
         lambda a, b: flow.linalg.matmul(a, b, True, False, 1.0, "mm"), MATRIX, MATRIX_B)


def test_transpose_name_fourth():
    graph, out = same(lambda x: flow.transpose(x, [1, 0], False, "t"),
                      lambda x: flow.transpose(x, [1, 0], False, False, "t"), MATRIX)
    assert ("Transpose", "t") in [(t, n) for t, n, _ in graph]
    np.testing.assert_array_equal(out, MATRIX.T)


def test_argmax_name_second():
    graph, out = same(lambda x: flow.math.argmax(x, "am"),
                      lambda x: flow.math.argmax(x, -1, "am"), MATRIX)
    np.testing.assert_array_equal(out, MATRIX.argmax(-1))
    assert "am" in [n for _, n, _ in graph]


def test_top_k_k_second():
    vector = np.array([1, 3, 8, 7, 2], np.float32)
    # OneFlow 0.5's own docstring example: top_k(x, 2) on a 1-D x means k=2
    _, out = same(lambda x: flow.math.top_k(x, 2), lambda x: flow.math.top_k(x, -1, 2), vector)
    np.testing.assert_array_equal(out, [2, 3])
    _, out = same(lambda x: flow.math.top_k(x, 2, True, "tk"),
                  lambda x: flow.math.top_k(x, -1, 2, True, "tk"), MATRIX)
    assert out.shape == (3, 2)
    # an int that is an axis of the input stays 0.5's axis
    _, out = traced(lambda x: flow.math.top_k(x, 0), MATRIX)
    np.testing.assert_array_equal(out, MATRIX.argmax(0)[None])


def test_sort_and_argsort_direction_second():
    _, out = same(lambda x: flow.sort(x, "DESCENDING"),
                  lambda x: flow.sort(x, -1, "DESCENDING"), MATRIX)
    np.testing.assert_array_equal(out, -np.sort(-MATRIX, -1))
    _, out = same(lambda x: flow.argsort(x, "ASCENDING", "as"),
                  lambda x: flow.argsort(x, -1, "ASCENDING", "as"), MATRIX)
    np.testing.assert_array_equal(out, np.argsort(MATRIX, -1, kind="stable"))


def test_tril_name_third():
    square = RNG.standard_normal((4, 4)).astype(np.float32)
    graph, out = same(lambda x: flow.math.tril(x, 1, "tr"),
                      lambda x: flow.math.tril(x, 1, 0, "tr"), square)
    np.testing.assert_array_equal(out, np.tril(square, 1))
    assert "tr" in [n for _, n, _ in graph]


def test_upsample_data_format_third():
    _, out = same(lambda x: flow.layers.upsample_2d(x, (2, 2), "NCHW", "nearest", "up"),
                  lambda x: flow.layers.upsample_2d(x, (2, 2), False, "NCHW", "nearest", "up"),
                  IMAGE)
    np.testing.assert_array_equal(out, IMAGE.repeat(2, 2).repeat(2, 3))


def test_quantization_observers_in_oneflow_0_3s_order():
    """0.3 had no quantization_formula: per_layer_quantization / momentum fourth, and
    fake_quantization's name sixth (0.4's sixth is the formula)."""
    x = RNG.standard_normal((4, 6)).astype(np.float32)

    def observe(old):
        def fn(t):
            if old:
                scale, zero = flow.quantization.min_max_observer(t, 8, "affine", False, "mm")
                return flow.quantization.fake_quantization(t, scale, zero, 8, "affine", "fq")
            scale, zero = flow.quantization.min_max_observer(t, 8, "affine", "google", False,
                                                             "mm")
            return flow.quantization.fake_quantization(t, scale, zero, 8, "affine", "google",
                                                       "fq")
        return fn

    graph, out = same(observe(True), observe(False), x)
    assert "mm_scale" in [n for _, n, _ in graph]     # the name reached the observer
    # per channel (per_layer_quantization=False) really reached the observer: 4 scales
    assert not np.allclose(out, x) and np.abs(out - x).max() < np.abs(x).max() / 100

    def run(observer, *args):
        flow.clear_default_session()

        @flow.global_function(type="predict")
        def job(t: tp.Numpy.Placeholder(x.shape)) -> Tuple[tp.Numpy, tp.Numpy]:
            return observer(t, *args)
        return job(x)

    old = run(flow.quantization.moving_average_min_max_observer, 8, "symmetric", 0.5, "ma")
    new = run(flow.quantization.moving_average_min_max_observer, 8, "symmetric", "google",
              0.5, "ma")
    spelled = run(flow.quantization.moving_average_min_maxObserver, 8, "symmetric", 0.5)
    for a, b in zip(old, new):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(old, spelled):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("optimizer", [flow.optimizer.LAMB, flow.optimizer.LARS])
def test_lamb_and_lars_take_grad_clipping_sixth_as_oneflow_0_3(optimizer):
    schedule = flow.optimizer.PiecewiseConstantScheduler([], [0.1])
    clip = flow.optimizer.grad_clipping.by_global_norm(1.0)
    old = optimizer(schedule, 0.9, 0.999 if optimizer is flow.optimizer.LAMB else 1e-9,
                    1e-6 if optimizer is flow.optimizer.LAMB else 1e-4, None, clip)
    assert old.grad_clipping is clip and old.weight_decay is None
    new = optimizer(schedule, 0.9, 0.999, 1e-6, None, 0.01)      # 0.4 / 0.5: weight_decay
    assert new.grad_clipping is None and new.weight_decay == 0.01


def test_batch_align_takes_its_name_fifth_as_oneflow_0_4():
    images = [RNG.integers(0, 255, (1, h, w, 3), dtype=np.uint8) for h, w in [(3, 4), (5, 2)]]

    def run(*args):
        flow.clear_default_session()
        config = flow.FunctionConfig()
        config.default_logical_view(flow.scope.mirrored_view())

        @flow.global_function(function_config=config)
        def job(x: tp.ListListNumpy.Placeholder((2, 5, 4, 3), dtype=flow.uint8)
                ) -> tp.ListNumpy:
            buffer = flow.tensor_list_to_tensor_buffer(x)
            return flow.image.batch_align(buffer, (6, 6, 3), flow.uint8, 2, *args)
        return job([images])[0]

    # 0.4's output is dynamic, as 0.5's default dynamic_out=True: the largest image's size
    # rounded up to the alignment
    old, new = run("align"), run(True, "align")
    np.testing.assert_array_equal(old, new)
    assert old.shape == (2, 6, 4, 3)
    np.testing.assert_array_equal(old[1, :5, :2], images[1][0])


def test_coco_reader_takes_its_name_eighth_as_oneflow_0_3():
    import inspect
    reader = flow.data.coco_reader
    assert reader.legacy_parameters[7] == "name"
    params = inspect.signature(reader).parameters
    assert list(params)[7] == "remove_images_without_annotations"


@pytest.mark.parametrize("reduce, old_name", [
    (flow.math.reduce_mean, "input_blob"), (flow.math.reduce_max, "x"),
    (flow.math.reduce_min, "x"), (flow.math.reduce_prod, "x"),
    (flow.math.two_stage_reduce_max, "x"), (flow.math.two_stage_reduce_min, "x")])
def test_reductions_take_oneflow_0_4s_keyword_for_the_input(reduce, old_name):
    _, out = same(lambda t: reduce(**{old_name: t}, axis=1, keepdims=True),
                  lambda t: reduce(input_tensor=t, axis=1, keepdims=True), MATRIX)
    assert out.shape == (3, 1)
    with pytest.raises(TypeError, match=rf"{THIS_FILE}:\d+: .*both input_tensor= and "
                                        rf"{old_name}="):
        traced(lambda t: reduce(**{old_name: t}, input_tensor=t), MATRIX)


def test_watch_and_eager_switch_take_oneflow_0_4s_keywords():
    seen = []
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        y = x * 2
        flow.watch(blob_watched=y, handler_or_prompt=lambda v: seen.append(v.numpy()))
        return y

    job(np.array([1, 2], np.float32))
    np.testing.assert_array_equal(seen[0], [2, 4])
    flow.enable_eager_execution(val=False)


def test_signatures_that_did_not_change_keep_their_order():
    """conv1d/3d, the pools, moments, layers.conv2d and layers.dense are the same in both
    generations: their positional orders are OneFlow's, unwrapped."""
    import inspect
    expected = {
        flow.nn.conv1d: ["input", "filters", "strides", "padding", "data_format", "dilations",
                         "groups", "name"],
        flow.nn.max_pool2d: ["input", "ksize", "strides", "padding", "data_format",
                             "ceil_mode", "name"],
        flow.nn.avg_pool2d: ["input", "ksize", "strides", "padding", "data_format",
                             "ceil_mode", "name"],
        flow.nn.moments: ["x", "axes", "keepdims", "name"],
        flow.layers.dense: ["inputs", "units", "activation", "use_bias", "kernel_initializer",
                            "bias_initializer", "kernel_regularizer", "bias_regularizer",
                            "trainable", "name", "model_distribute"],
    }
    for fn, params in expected.items():
        assert list(inspect.signature(fn).parameters) == params
        assert not hasattr(fn, "legacy_parameters")


def _write_records(path, records):
    with open(path, "wb") as f:
        for record in records:
            data = record.SerializeToString()
            f.write(struct.pack("<q", len(data)))
            f.write(data)


def test_record_pb2_files_read_by_the_ofrecord_reader_and_old_raw_decoder(tmp_path):
    """Records built with oneflow.core.record.record_pb2 (as OneFlow's tools write them)
    decode in a job; OFRecordRawDecoder's old 7-argument order (name seventh) works."""
    install_oneflow_alias()
    try:
        from oneflow.core.record import record_pb2
    finally:
        uninstall_oneflow_alias()
    records = [record_pb2.OFRecord(feature={
        "x": record_pb2.Feature(float_list=record_pb2.FloatList(value=[i, i + 0.5])),
        "y": record_pb2.Feature(int32_list=record_pb2.Int32List(value=[i]))})
        for i in range(4)]
    _write_records(tmp_path / "part-0", records)

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy]:
        rec = flow.data.ofrecord_reader(str(tmp_path), batch_size=4)
        x = flow.data.OFRecordRawDecoder(rec, "x", (2,), flow.float, False, False, "dx")
        y = flow.data.OFRecordRawDecoder(rec, "y", (1,), flow.int32, False, False, False, "dy")
        return x, y

    x, y = job()
    np.testing.assert_array_equal(x, [[i, i + 0.5] for i in range(4)])
    np.testing.assert_array_equal(y, [[i] for i in range(4)])

    flow.clear_default_session()

    @flow.global_function()
    def twice() -> tp.Numpy:  # the seventh positional is the old name: a name= too clashes
        rec = flow.data.ofrecord_reader(str(tmp_path), batch_size=4)
        return flow.data.OFRecordRawDecoder(rec, "x", (2,), flow.float, False, False, "dx",
                                            name="again")

    with pytest.raises(TypeError, match="multiple values for name"):
        twice()


@pytest.mark.parametrize("form", ["old", "new"])
def test_get_variable_distribute_ninth_or_nd_sbp_ninth(form):
    @flow.global_function()
    def job() -> tp.Numpy:
        if form == "old":  # <= 0.4: (..., random_seed, distribute, reuse)
            return flow.get_variable("w", (2,), flow.float, flow.constant_initializer(3.0),
                                     None, True, None, None, flow.distribute.broadcast(), True)
        return flow.get_variable("w", (2,), flow.float, flow.constant_initializer(3.0),
                                 None, True, None, None, None, flow.distribute.broadcast(), True)

    np.testing.assert_array_equal(job(), [3.0, 3.0])


def test_get_variable_rejects_a_non_scheme_distribute():
    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.get_variable("w", (2,), initializer=flow.zeros_initializer(),
                                 distribute="split")

    with pytest.raises(AssertionError, match="not a valid distribute policy"):
        job()


# -- 2. a job function defined twice --------------------------------------------------------

def test_a_later_job_of_the_same_name_replaces_the_earlier():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x + 1

    first = foo

    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:  # noqa: F811
        return x * 10

    @flow.global_function()
    def bar(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x

    assert list(default_session().jobs) == ["foo", "bar"]
    np.testing.assert_array_equal(foo(np.ones(2, np.float32)), [10, 10])
    with pytest.raises(RuntimeError, match=rf"{THIS_FILE}:\d+: job function 'foo' .* was "
                                           "replaced"):
        first(np.ones(2, np.float32))


def test_no_job_can_be_defined_once_the_session_runs():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x

    foo(np.ones(2, np.float32))
    with pytest.raises(NotImplementedError, match="no avaliable function found"):
        @flow.global_function()
        def foo(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:  # noqa: F811
            return x
    np.testing.assert_array_equal(foo(np.ones(2, np.float32)), [1, 1])


def test_a_job_made_a_train_job_by_minimize_trains_as_one_declared_so():
    """A job declared without type="train" (OneFlow's `global_function(func_config)`, a
    predict job) becomes a train job when its body calls minimize(), as in OneFlow; the max
    pool and the sparse cross entropy traced before that call still have gradients
    (OneFlow-Benchmark's 2021 benchmarks/cnn_benchmark/of_cnn_benchmarks.py)."""
    x = RNG.normal(size=(2, 1, 6, 6)).astype(np.float32)
    y = np.array([1, 2], np.int32)

    def trained(job_type):
        flow.clear_default_session()
        decorate = (flow.global_function(job_type) if job_type else
                    flow.global_function(flow.FunctionConfig()))

        def job(x: tp.Numpy.Placeholder((2, 1, 6, 6)),
                y: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
            w = flow.get_variable("w", (3, 1, 3, 3), initializer=flow.constant_initializer(0.1))
            h = flow.nn.max_pool2d(flow.nn.conv2d(x, w, 1, "SAME"), 2, 2, "VALID")
            logits = flow.layers.dense(flow.reshape(h, (2, -1)), 3, name="fc",
                                       kernel_initializer=flow.constant_initializer(0.05))
            loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                               momentum=0).minimize(loss)
            return loss

        train = decorate(job)
        losses = [train(x, y) for _ in range(2)]
        return losses, {k: v.numpy() for k, v in flow.get_all_variables().items()}

    losses, variables = trained(None)
    expected_losses, expected = trained("train")
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-6)
    assert losses[1].mean() < losses[0].mean()
    for name, value in expected.items():
        np.testing.assert_allclose(variables[name], value, rtol=1e-6, err_msg=name)


# -- 3. modules and names --------------------------------------------------------------------

@pytest.fixture
def oneflow_alias():
    install_oneflow_alias()
    yield
    uninstall_oneflow_alias()


def test_every_new_module_imports_under_both_spellings(oneflow_alias):
    for prefix in ("oneflow", "oneflow.compatible.single_client"):
        for name, expected in (("unittest", flow.unittest), ("unittest.env", flow.unittest.env),
                               ("distribute", flow.distribute)):
            assert importlib.import_module(f"{prefix}.{name}") is expected
    from oneflow.compatible.single_client.unittest import env
    from oneflow.core.job import initializer_conf_pb2
    from oneflow.core.record import record_pb2
    assert env.device_num() == 1 and env.node_size() == 1
    assert initializer_conf_pb2.kAverage == 2
    assert initializer_conf_pb2.VarianceNorm.Value("kFanOut") == 1
    assert record_pb2.Int64List(value=[1]).value == [1]


def test_unittest_helpers(monkeypatch):
    assert flow.unittest.env.eager_execution_enabled() is False
    run_here = flow.unittest.skip_unless_1n1d()
    assert run_here(len) is len
    skipped = flow.unittest.skip_unless_1n2d()(lambda self: None)
    assert getattr(skipped, "__unittest_skip__", False)
    monkeypatch.setenv("ONEFLOW_TEST_DEVICE_NUM", "2")
    assert flow.unittest.env.device_num() == 2
    assert flow.unittest.skip_unless_1n2d()(len) is len

    @flow.unittest.num_nodes_required(2)
    def test_two():
        pass
    assert test_two.__oneflow_test_case_num_nodes_required__ == 2


def test_unittest_testcase_starts_with_an_empty_session():
    @flow.global_function()
    def leftover(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x

    class Case(flow.unittest.TestCase):
        def test_job(self):
            assert not default_session().jobs

            @flow.global_function()
            def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
                return x * 2

            np.testing.assert_array_equal(job(np.ones(2, np.float32)), [2, 2])

    result = unittest.TextTestRunner(stream=open(os.devnull, "w")).run(Case("test_job"))
    assert result.wasSuccessful(), result.failures + result.errors


def test_register_test_cases(tmp_path):
    (tmp_path / "test_one.py").write_text(
        "def test_a(test_case):\n    test_case.assertEqual(1, 1)\n"
        "def helper():\n    pass\n")
    scope = {}
    flow.unittest.register_test_cases(scope, str(tmp_path), lambda n: n == 1)
    case = scope["test_one"]
    assert issubclass(case, unittest.TestCase) and hasattr(case, "test_a")
    assert not hasattr(case, "helper")


def test_distribute_schemes_and_strategies(capsys):
    assert flow.distribute.split(1) == flow.distribute.split(1) != flow.distribute.split(0)
    assert repr(flow.distribute.broadcast()) == "flow.distribute.broadcast()"
    with pytest.raises(AssertionError):
        flow.distribute.split(1.0)
    flow.distribute.assert_is_valid_distribute(flow.distribute.auto())
    assert flow.distribute.mirrored_strategy() is flow.scope.mirrored_view()
    assert flow.distribute.consistent_strategy() is flow.scope.consistent_view()
    assert "use oneflow.compatible.single_client.scope.mirrored_view" in capsys.readouterr().out
    with flow.scope.mirrored_view():
        assert flow.distribute.mirrored_strategy_enabled()
    assert flow.distribute.consistent_strategy_enabled()
    config = flow.function_config()
    config.default_distribute_strategy(flow.distribute.mirrored_strategy())
    assert config.function_desc.default_logical_view is flow.scope.mirrored_view()


@pytest.mark.parametrize("kind, fill, check", [
    ("constant_conf", lambda c: setattr(c, "value", 2.5), lambda v: np.all(v == 2.5)),
    ("random_uniform_conf", lambda c: (setattr(c, "min", 4), setattr(c, "max", 5)),
     lambda v: v.min() >= 4 and v.max() <= 5 and v.std() > 0),
    ("truncated_normal_conf", lambda c: setattr(c, "mean", 10),
     lambda v: np.all(np.abs(v - 10) < 2 * 0.05 + 1e-6)),  # std default 0.05
    ("xavier_conf", lambda c: (setattr(c, "variance_norm", 2), setattr(c, "data_format", "")),
     lambda v: np.all(np.abs(v) <= np.sqrt(3 / 50) + 1e-6)),  # fan_avg of (50, 50)
])
def test_initializer_conf_messages_initialize_variables(oneflow_alias, kind, fill, check):
    from oneflow.core.job import initializer_conf_pb2
    conf = initializer_conf_pb2.InitializerConf()
    getattr(conf, kind).SetInParent()
    fill(getattr(conf, kind))

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.get_variable("w", (50, 50), initializer=conf)

    assert check(job())


def test_range_and_empty_initializer_confs_as_oneflow_kernel(oneflow_alias):
    # OneFlow's RangeInitializer: start + j * stride at index j of `axis` (default -1),
    # the same across the other axes; empty_conf leaves the (zeroed) allocation
    from oneflow.core.job import initializer_conf_pb2 as pb
    confs = {"r": pb.InitializerConf(range_conf=pb.RangeInitializerConf(start=0.5, stride=2)),
             "r0": pb.InitializerConf(range_conf=pb.RangeInitializerConf(stride=-1, axis=0)),
             "i": pb.InitializerConf(int_range_conf=pb.IntRangeInitializerConf(start=3)),
             "e": pb.InitializerConf(empty_conf=pb.EmptyInitializerConf())}

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        return (flow.get_variable("r", (2, 3), initializer=confs["r"]),
                flow.get_variable("r0", (2, 3), initializer=confs["r0"]),
                flow.get_variable("i", (4,), dtype=flow.int32, initializer=confs["i"]),
                flow.get_variable("e", (2,), initializer=confs["e"]))

    r, r0, i, e = job()
    np.testing.assert_array_equal(r, [[0.5, 2.5, 4.5]] * 2)
    np.testing.assert_array_equal(r0, [[0, 0, 0], [-1, -1, -1]])
    assert i.dtype == np.int32
    np.testing.assert_array_equal(i, [3, 4, 5, 6])
    np.testing.assert_array_equal(e, [0, 0])


def test_manual_seed_makes_initial_values_repeat():
    def draw():
        flow.clear_default_session()
        flow.manual_seed(123)

        @flow.global_function()
        def job() -> tp.Numpy:
            return flow.get_variable("w", (8,), initializer=flow.random_normal_initializer())

        return job()

    np.testing.assert_array_equal(draw(), draw())


def test_no_grad_is_a_context_manager_and_decorator():
    @flow.no_grad()
    def double(v):
        return v * 2

    with flow.no_grad():
        assert double(3) == 6


def test_simple_checkpoint_manager_saves_lists_and_restores(tmp_path):
    def build():
        @flow.global_function()
        def job() -> tp.Numpy:
            return flow.get_variable("w", (3,), initializer=flow.random_normal_initializer())
        return job

    job = build()
    manager = flow.train.SimpleCheckPointManager(str(tmp_path / "ckpt"), prefix="snap_")
    assert manager.list_checkpoints() == [] and manager.latest_checkpoint() is None
    manager.initialize_or_restore()  # none yet: saves the initial values
    saved = job()
    (tmp_path / "ckpt" / "snap_incomplete").mkdir()  # no snapshot_done: not listed
    assert len(manager.list_checkpoints()) == 1
    manager.save()
    names = manager.list_checkpoints()
    assert len(names) == 2 and names == sorted(names) and manager.latest_checkpoint() == names[-1]
    assert os.path.isfile(tmp_path / "ckpt" / names[-1] / "w" / "out")

    flow.clear_default_session()
    job = build()
    flow.train.SimpleCheckPointManager(str(tmp_path / "ckpt"), prefix="snap_") \
        .initialize_or_restore()
    np.testing.assert_array_equal(job(), saved)


def test_function_config_reads_flags_back():
    config = flow.function_config()
    desc = config.function_desc
    assert desc.enable_cudnn is True and desc.concurrency_width == 128
    assert not desc.HasAttr("concurrency_width")
    config.concurrency_width(64)
    config.enable_auto_mixed_precision()
    assert desc.concurrency_width == 64 and desc.enable_auto_mixed_precision is True
    assert desc.HasAttr("concurrency_width")
    assert desc.IsTrainable() is False
    config.train.primary_lr(0.1)
    assert config.function_desc.IsTrainable() is True
    with pytest.raises(AssertionError):
        desc.no_such_flag  # noqa: B018
    train = flow.function_config()

    @flow.global_function(type="train", function_config=train)
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x
    assert train.function_desc.IsTrainable()


def test_nn_module_is_onnxjob_0_3s_lazy_helper():
    class Scale(flow.nn.Module):
        def __init__(self, factor):
            super().__init__()
            self.factor = factor

        def forward(self, x):
            return x * self.factor

    scale = Scale(3.0)
    assert scale.module_name.startswith("Module_") and Scale(1.0).module_name != scale.module_name
    assert flow.nn.Module("named").module_name == "named"

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return scale(scale(x))

    np.testing.assert_array_equal(job(np.ones(2, np.float32)), [9, 9])
    assert scale.call_seq_no == 2
    with pytest.raises(AssertionError, match="do not override __call__"):
        class Bad(flow.nn.Module):
            def __call__(self, x):
                return x


def test_unprovided_names_are_refused_naming_the_line_and_why():
    with pytest.raises(UnsupportedAPIError,
                       match=rf"{THIS_FILE}:\d+: flow.experimental.eager_assign_121 .*eager"):
        flow.experimental.eager_assign_121  # noqa: B018
    with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: flow.distribute.nope"):
        flow.distribute.nope  # noqa: B018
    with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: flow.linalg.svd"):
        flow.linalg.svd  # noqa: B018


def test_a_legacy_script_runs_under_python_m_onnxjob(tmp_path):
    """An unchanged <= 0.4-style script: old conv2d order, a redefined job, flow.unittest,
    flow.distribute and record_pb2 imports."""
    script = tmp_path / "legacy.py"
    script.write_text(
        "import numpy as np\n"
        "import oneflow as flow\n"
        "import oneflow.typing as tp\n"
        "import oneflow.unittest\n"
        "from oneflow.core.record import record_pb2\n"
        "@flow.global_function()\n"
        "def job(x: tp.Numpy.Placeholder((1, 1, 4, 4))) -> tp.Numpy:\n"
        "    return x\n"
        "@flow.global_function()\n"
        "def job(x: tp.Numpy.Placeholder((1, 1, 4, 4))) -> tp.Numpy:\n"
        "    w = flow.get_variable('w', (1, 1, 3, 3), initializer=flow.ones_initializer(),\n"
        "                          distribute=flow.distribute.broadcast())\n"
        "    return flow.nn.conv2d(x, w, 1, 'SAME', 'NCHW', 1, 1, name='conv')\n"
        "assert flow.unittest.env.device_num() == 1\n"
        "print(job(np.ones((1, 1, 4, 4), np.float32))[0, 0, 1, 1])\n")
    import subprocess
    done = subprocess.run([sys.executable, "-m", "onnxjob", "run", str(script)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "9.0"


def test_a_tensor_list_result_reads_with_oneflow_0_2_s_ndarray_lists():
    """OneFlow <= 0.2's LocalBlob spelled numpy_lists() ndarray_lists() (local_blob.py)."""
    flow.clear_default_session()

    @flow.global_function()
    def echo(x=flow.MirroredTensorListDef((2, 5))):
        return x

    first = np.ones((1, 5), np.float32)
    result = echo([[first]]).get()
    lists = result.ndarray_lists()
    assert len(lists) == 1 and len(lists[0]) == 1
    np.testing.assert_array_equal(lists[0][0], first)
    np.testing.assert_array_equal(result.numpy_lists()[0][0], first)
    flow.clear_default_session()
