"""Exported models past protobuf's 2 GiB limit (onnxjob/io/model_file.py): written with
their weights beside the file as ONNX external data, checked from the file, and run by
onnxruntime. The limit is lowered here so a small job stands for a 2 GiB one (a real one
is oneflow_convert's test_large_array, two 1 GiB variables)."""
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.io import model_file
from onnxjob.io.export import job_model_proto

X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)


@pytest.fixture
def predict():
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
        w = flow.get_variable("w", (4, 3), initializer=flow.random_normal_initializer())
        return flow.math.tanh(flow.matmul(x, w))
    return predict


def _run(path):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: X})[0]


def test_the_payload_count_sees_every_weight(predict):
    proto = job_model_proto(predict)
    assert not model_file.too_large(proto)
    limit = model_file.PROTOBUF_LIMIT
    try:
        model_file.PROTOBUF_LIMIT = 4 * 3 * 4        # exactly the weight's bytes
        assert model_file.too_large(proto)
        model_file.PROTOBUF_LIMIT = 4 * 3 * 4 + 1
        assert not model_file.too_large(proto)
    finally:
        model_file.PROTOBUF_LIMIT = limit


def test_a_model_past_the_limit_is_written_with_external_data(tmp_path, predict,
                                                              monkeypatch):
    monkeypatch.setattr(model_file, "PROTOBUF_LIMIT", 16)
    want = predict(X)
    path = str(tmp_path / "big.onnx")
    with pytest.warns(UserWarning, match="2 GiB limit.*big.onnx.data") as caught:
        flow.export(predict, path)
    assert caught[0].filename == __file__
    assert os.path.getsize(path + ".data") == 4 * 3 * 4
    model = onnx.load(path, load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    np.testing.assert_allclose(_run(path), want, rtol=1e-6)


def test_oneflow_onnx_export_past_the_limit_and_as_a_proto(tmp_path, predict, monkeypatch):
    saved = str(tmp_path / "saved")
    flow.checkpoint.save(saved)
    want = predict(X)
    monkeypatch.setattr(model_file, "PROTOBUF_LIMIT", 16)
    path = str(tmp_path / "m.onnx")
    with pytest.warns(UserWarning, match="2 GiB limit"):
        flow.onnx.export(predict, saved, path)                 # external_data not asked
    assert os.path.isfile(path + ".data")
    np.testing.assert_allclose(_run(path), want, rtol=1e-6)
    asked = str(tmp_path / "asked.onnx")
    flow.onnx.export(predict, saved, asked, external_data=True)   # asked: no warning
    np.testing.assert_allclose(_run(asked), want, rtol=1e-6)
    # OneFlow's earlier form returns the ModelProto: checked from a scratch file, with
    # its weights left in the message
    proto = flow.onnx.export(predict, saved, False)
    assert all(t.raw_data for t in proto.graph.initializer)


def test_a_model_past_the_limit_that_fails_the_checker_still_raises(tmp_path, predict,
                                                                    monkeypatch):
    monkeypatch.setattr(model_file, "PROTOBUF_LIMIT", 16)
    def broken():
        proto = job_model_proto(predict)
        proto.graph.node[0].input[0] = "nowhere"
        return proto
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        model_file.save_checked(broken(), str(tmp_path / "bad.onnx"), external_data=True)
    with pytest.raises(onnx.checker.ValidationError, match="nowhere"):
        model_file.check_in_memory(broken())
