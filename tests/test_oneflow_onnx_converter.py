"""OneFlow's standalone ONNX converter (`oneflow_onnx`, job-function form) under the alias:
compat/oneflow_onnx_converter.py, on flow.onnx.export's code."""
import importlib
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
from zoo import cnns_dir, model_args, model_builder


@pytest.fixture
def converter():
    install_oneflow_alias()
    try:
        yield importlib.import_module("oneflow_onnx.oneflow2onnx.util")
    finally:
        uninstall_oneflow_alias()
        flow.clear_default_session()


def small_predict_job():
    flow.clear_default_session()

    @flow.global_function()
    def classify(images: tp.Numpy.Placeholder((2, 1, 8, 8))) -> tp.Numpy:
        conv = flow.layers.conv2d(images, 4, 3, padding="SAME", activation=flow.nn.relu,
                                  name="conv")
        return flow.nn.softmax(flow.layers.dense(flow.reshape(conv, (2, -1)), 3, name="fc"))
    return classify


def test_export_onnx_model_writes_model_onnx_with_the_saved_weights(tmp_path, converter):
    job = small_predict_job()
    images = np.random.default_rng(0).normal(size=(2, 1, 8, 8)).astype(np.float32)
    saved_output = job(images)
    flow.checkpoint.save(str(tmp_path / "weights"))
    # weights changed after saving: the file must hold the saved ones
    flow.load_variables({name: np.zeros_like(blob.numpy())
                         for name, blob in flow.get_all_variables().items()})
    path, cleanup = converter.export_onnx_model(job, flow_weight_dir=str(tmp_path / "weights"),
                                                onnx_model_path=str(tmp_path), opset=11)
    assert path == str(tmp_path / "model.onnx")
    model = onnx.load(path)
    assert {o.domain: o.version for o in model.opset_import}[""] == 11
    assert np.allclose(converter.run_onnx(path, ["CUDAExecutionProvider",
                                                 "CPUExecutionProvider"],
                                          {model.graph.input[0].name: images}),
                       saved_output, atol=1e-6)
    cleanup()
    assert not os.path.exists(path)


def test_without_a_weight_folder_the_current_weights_are_exported(tmp_path, converter):
    job = small_predict_job()
    images = np.ones((2, 1, 8, 8), np.float32)
    expected = job(images)
    path, _ = converter.export_onnx_model(job, onnx_model_path=str(tmp_path))
    flow.onnx.export(job, None, str(tmp_path / "current.onnx"))    # as flow.onnx.export
    for exported in (path, str(tmp_path / "current.onnx")):
        session = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
        assert np.allclose(session.run(None, {session.get_inputs()[0].name: images})[0],
                           expected, atol=1e-6)


def test_convert_to_onnx_and_check_compares_and_clears_the_session(tmp_path, converter):
    job = small_predict_job()
    job(np.zeros((2, 1, 8, 8), np.float32))
    flow.checkpoint.save(str(tmp_path / "weights"))
    converter.convert_to_onnx_and_check(job, flow_weight_dir=str(tmp_path / "weights"),
                                        onnx_model_path=str(tmp_path), explicit_init=True)
    assert os.path.isfile(tmp_path / "model.onnx")
    assert not flow.get_all_variables()      # the default session was cleared


def test_a_dynamic_batch_size_and_the_export_class(tmp_path, converter):
    flow2onnx = importlib.import_module("oneflow_onnx.oneflow2onnx.flow2onnx")
    job = small_predict_job()
    job(np.zeros((2, 1, 8, 8), np.float32))
    flow.checkpoint.save(str(tmp_path / "weights"))
    target = str(tmp_path / "dynamic.onnx")
    flow2onnx.Export(job, str(tmp_path / "weights"), target, dynamic_batch_size=True)
    dims = onnx.load(target).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and [d.dim_value for d in dims[1:]] == [1, 8, 8]
    session = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    assert session.run(None, {session.get_inputs()[0].name:
                              np.ones((5, 1, 8, 8), np.float32)})[0].shape == (5, 3)
    with pytest.raises(flow.errors.UnsupportedAPIError, match="shape_override"):
        flow2onnx.Export(job, str(tmp_path / "weights"), target, shape_override={"x": [1]})


def test_other_converter_modules_are_refused_by_name(converter):
    with pytest.raises(ModuleNotFoundError, match="oneflow_onnx.x2oneflow"):
        importlib.import_module("oneflow_onnx.x2oneflow")


_X2ONEFLOW = """
import oneflow
import oneflow as flow
import oneflow.typing as tp

FLOAT = oneflow._oneflow_internal.deprecated.GetProtoDtype4OfDtype(flow.float32)


def from_numbers(x):
    @flow.global_function()
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        return flow.math.relu(a)
    return job(x)
"""


def test_a_real_converter_package_s_other_modules_load_from_it(tmp_path, monkeypatch):
    """With pip's oneflow_onnx on sys.path, its modules onnxjob has no stand-in for (x2oneflow:
    ONNX models into job code on flow.* ops, reading OneFlow's dtype enum through
    oneflow._oneflow_internal) load from it; the exporter stays onnxjob's."""
    package = tmp_path / "oneflow_onnx"
    (package / "x2oneflow").mkdir(parents=True)
    (package / "oneflow2onnx").mkdir()
    (package / "__init__.py").write_text("")
    (package / "oneflow2onnx" / "__init__.py").write_text("")
    (package / "oneflow2onnx" / "util.py").write_text("raise ImportError('the real one')\n")
    (package / "x2oneflow" / "__init__.py").write_text(_X2ONEFLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    install_oneflow_alias()
    try:
        x2oneflow = importlib.import_module("oneflow_onnx.x2oneflow")
        assert x2oneflow.FLOAT == 2     # (data_type.proto's kFloat)
        x = np.array([[-1.0, 2.0]], np.float32)
        np.testing.assert_array_equal(x2oneflow.from_numbers(x), [[0.0, 2.0]])
        util = importlib.import_module("oneflow_onnx.oneflow2onnx.util")
        assert hasattr(util, "convert_to_onnx_and_check")
    finally:
        uninstall_oneflow_alias()
        flow.clear_default_session()


def test_resnet_to_onnx_runs_unchanged(tmp_path):
    """OneFlow-Benchmark's resnet_to_onnx.py: loads a ResNet50 checkpoint, converts it with
    oneflow_onnx's export_onnx_model and compares onnxruntime with the job on an image."""
    cnns = cnns_dir()
    (tmp_path / "data").mkdir()
    shutil.copy(os.path.join(cnns, "data", "tiger.jpg"), tmp_path / "data" / "tiger.jpg")
    flow.clear_default_session()
    resnet50 = model_builder("resnet50")

    @flow.global_function("predict")
    def InferenceNet(images: tp.Numpy.Placeholder((1, 3, 224, 224))) -> tp.Numpy:
        return flow.nn.softmax(resnet50(images, model_args(), training=False))
    InferenceNet(np.zeros((1, 3, 224, 224), np.float32))
    flow.checkpoint.save(str(tmp_path / "resnet_v15_of_best_model_val_top1_77318"))
    flow.clear_default_session()
    done = subprocess.run([sys.executable, "-m", "onnxjob", "run",
                           os.path.join(cnns, "resnet_to_onnx.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "Are the results equal? Yes" in done.stdout, done.stdout[-2000:]
    assert os.path.isfile(tmp_path / "onnx" / "model" / "model.onnx")
