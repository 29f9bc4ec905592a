"""`flow.onnx.export(..., opset=N)` writes the opset asked for, as OneFlow's exporter did,
also where onnx's version converter has no adapter (onnxjob/io/opset_lowering.py): each
file is checked for its opset, passes onnx.checker with full shape inference, and
computes in onnxruntime what the job computes."""
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.io.opset_lowering import LoweringError, lower

THIS_FILE = os.path.basename(__file__)
RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
# halves (ties of round), a NaN for the comparisons
TIES = np.float32([[-2.5, -1.5, -0.5, 0.5], [1.5, 2.5, 3.5, np.nan], [0.49999997, 7.0, -7.5, 1e9]])


def _session(path):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def _export_and_run(tmp_path, body, x, opset):
    """`body` as a predict job on `x`, exported with `opset`: (job's result, file's
    result, the file's ops)."""
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        return body(a)

    saved = str(tmp_path / "saved")
    flow.checkpoint.save(saved)
    path = str(tmp_path / f"opset{opset}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no "keeps opset 17"
        flow.onnx.export(job, saved, path, opset=opset)
    model = onnx.load(path)
    assert [o.version for o in model.opset_import if o.domain == ""] == [opset]
    onnx.checker.check_model(model, full_check=True)
    session = _session(path)
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    return job(x), got, {n.op_type for n in model.graph.node}


def _weights(shape):
    return flow.get_variable("w", shape, initializer=flow.random_normal_initializer())


CASES = {
    # ops whose newer versions only widened types (no adapter down in onnx's converter)
    "div_sub_pow_identity": (10, X, lambda a: flow.identity(a / 3.0 - flow.math.pow(a, 2.0))),
    "equal_not_equal": (11, X.round(), lambda a: flow.cast(
        flow.math.equal(a, flow.math.round(a * 0 + 1)), flow.float)
        + flow.cast(flow.math.not_equal(a, a * 0), flow.float)),
    "gather_nd_reshape": (11, X, lambda a: flow.reshape(flow.gather_nd(
        a, flow.constant(1, shape=(2, 2, 1), dtype=flow.int32)), (2, -1))),
    "batch_norm": (9, X.reshape(2, 3, 2, 2), lambda a: flow.layers.batch_normalization(
        a, axis=1, training=False)),
    "max_pool_conv": (10, X.reshape(2, 3, 2, 2), lambda a: flow.nn.max_pool2d(
        flow.nn.conv2d(a, _weights((4, 3, 1, 1)), 1, "SAME"), 2, 1, "SAME")),
    # rewritten: no such op, or its meaning or inputs changed
    "round_half_to_even": (10, TIES, lambda a: flow.math.round(a)),
    "round_at_opset_9": (9, TIES, lambda a: flow.math.round(a * 3.0)),
    "less_or_equal_with_nan": (10, TIES, lambda a: flow.cast(
        flow.math.less_equal(a, 0.5), flow.float) * 2 + flow.cast(
        flow.math.greater_equal(a, 1.5), flow.float)),
    "softmax_over_a_middle_axis": (11, X, lambda a: flow.nn.softmax(a, axis=1)),
    "log_softmax_last_axis": (10, X, lambda a: flow.nn.logsoftmax(a, axis=-1)),
    "reduce_sum_squeeze_unsqueeze": (11, X, lambda a: flow.expand_dims(flow.squeeze(
        flow.math.reduce_sum(a, axis=1, keepdims=True), axis=[1]), axis=-1)),
    "split": (11, X, lambda a: flow.split(a, [1, 3], axis=2)[1]),
    "clip_and_pad": (10, X, lambda a: flow.pad(flow.clip_by_value(a, -0.5, 0.3),
                                               [[0, 0], [1, 0], [0, 2]], 1.5)),
    "dense_without_bias": (10, X.reshape(6, 4), lambda a: flow.layers.dense(
        a, 3, use_bias=False, name="fc")),
    "negative_axes_before_11": (10, X, lambda a: flow.concat(
        [flow.math.reduce_max(a, axis=-1, keepdims=True), a], axis=-1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_exported_job_is_written_in_the_opset_asked_for(tmp_path, case):
    opset, x, body = CASES[case]
    want, got, _ops = _export_and_run(tmp_path, body, x, opset)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_round_below_opset_11_rounds_half_to_even_everywhere():
    """The Floor-based Round on ties, on values whose x + 0.5 is not exact (0.49999997,
    2^23 + 1), on whole numbers past 2^23, infinities and NaN, in float and double."""
    for dtype, elem in ((np.float32, onnx.TensorProto.FLOAT),
                        (np.float64, onnx.TensorProto.DOUBLE)):
        x = np.array([-2.5, -1.5, -0.5, -0.0, 0.5, 1.5, 2.5, 0.49999997, 0.5000001, -3.7,
                      2.0 ** 23 + 1, 2.0 ** 23 - 0.5, 2.0 ** 52 + 1, 1e30, -1e30, np.inf,
                      -np.inf, np.nan], dtype)
        graph = helper.make_graph([helper.make_node("Round", ["x"], ["y"])], "round",
                                  [helper.make_tensor_value_info("x", elem, [len(x)])],
                                  [helper.make_tensor_value_info("y", elem, [len(x)])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                  ir_version=8)   # (onnxruntime 1.23 reads IR <= 11)
        for opset in (9, 10):
            lowered = lower(model, opset)
            assert "Round" not in {n.op_type for n in lowered.graph.node}
            session = ort.InferenceSession(lowered.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
            np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.round(x))


def test_an_op_with_no_form_in_the_opset_keeps_the_jobs_opset_with_a_warning(tmp_path):
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder((2, 3, 4))) -> tp.Numpy:
        return flow.layers.layer_norm(x, begin_norm_axis=-1, begin_params_axis=-1)

    flow.checkpoint.save(str(tmp_path / "model"))
    path = str(tmp_path / "ln.onnx")
    with pytest.warns(UserWarning, match="LayerNormalization does not exist in opset 11.*"
                                         "keeps opset 17") as caught:
        flow.onnx.export(predict, str(tmp_path / "model"), path, opset=11)
    assert caught[0].filename == __file__
    assert [o.version for o in onnx.load(path).opset_import if o.domain == ""] == [17]
    session = _session(path)
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: X})[0],
                               predict(X), rtol=1e-5, atol=1e-6)


def test_lowering_refuses_what_it_cannot_write_and_says_which_op():
    def model(node, inputs, opset=17):
        graph = helper.make_graph(
            [node], "m", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 3])
                          for n in inputs],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    # axes computed in the graph cannot become Squeeze-11's attribute
    squeeze = model(helper.make_node("Squeeze", ["x", "axes"], ["y"]), ["x"])
    squeeze.graph.input.append(helper.make_tensor_value_info("axes", onnx.TensorProto.INT64,
                                                             [1]))
    with pytest.raises(LoweringError, match="Squeeze: its axes must be a constant"):
        lower(squeeze, 11)
    # an attribute the old version lacks, set to something other than its default
    reshape = model(helper.make_node("Reshape", ["x", "s"], ["y"], allowzero=1), ["x"])
    reshape.graph.initializer.append(onnx.numpy_helper.from_array(np.int64([3, 2]), "s"))
    with pytest.raises(LoweringError, match="allowzero=1"):
        lower(reshape, 13)
    with pytest.raises(LoweringError, match="not below"):
        lower(reshape, 18)
