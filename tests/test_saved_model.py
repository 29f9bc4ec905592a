"""flow.saved_model builds a versioned saved model of predict jobs (ONNX files, the
variables in OneFlow's layout, a meta file with the signatures); flow.serving's
InferenceSession loads and runs it with the same numbers as the job."""
import json
import os

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import JobArgumentError, UnsupportedAPIError

THIS_FILE = os.path.basename(__file__)


def make_job(lbns):
    @flow.global_function(type="predict")
    def mlp_predict(x: tp.Numpy.Placeholder((4, 3)),
                    scale: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        lbns["x"], lbns["scale"] = x.logical_blob_name, scale.logical_blob_name
        w = flow.get_variable("w", (3, 2), initializer=flow.random_normal_initializer())
        y = flow.math.sigmoid(flow.matmul(x, w)) * scale
        lbns["y"] = y.logical_blob_name
        return y
    return mlp_predict


def save(tmp_path, version=1):
    lbns = {}
    job = make_job(lbns)
    x = np.random.rand(4, 3).astype(np.float32)
    scale = np.array([2.0], np.float32)
    expected = job(x, scale)
    builder = flow.saved_model.ModelBuilder(str(tmp_path / "models"))
    signature = builder.ModelName("mlp").Version(version).AddFunction(job) \
        .AddSignature("regress")
    signature.Input("features", lbns["x"]).Input("scale", lbns["scale"])
    signature.Output("probability", lbns["y"])
    builder.Save()
    return x, scale, expected, flow.get_all_variables()["w"].numpy()


def test_save_writes_a_versioned_model(tmp_path):
    _, _, _, w = save(tmp_path)
    version = tmp_path / "models" / "1"
    assert sorted(os.listdir(version)) == ["mlp_predict.onnx", "saved_model.json", "variables"]
    meta = json.loads((version / "saved_model.json").read_text())
    assert meta["name"] == "mlp" and meta["version"] == 1
    assert meta["default_graph_name"] == "mlp_predict"
    graph = meta["graphs"]["mlp_predict"]
    assert graph["default_signature_name"] == "regress"
    assert graph["signatures"]["regress"]["outputs"] == {"probability": "output_0"}
    stored = np.frombuffer((version / "variables" / "w" / "out").read_bytes(), np.float32)
    np.testing.assert_array_equal(stored.reshape(3, 2), w)
    flow.clear_default_session()
    with pytest.raises(ValueError, match="already exist"):
        save(tmp_path)


def test_serving_runs_the_saved_model(tmp_path):
    x, scale, expected, _ = save(tmp_path)
    flow.clear_default_session()
    save(tmp_path, version=2)   # the latest version (other weights)
    flow.clear_default_session()
    session = flow.serving.InferenceSession()
    session.load_saved_model(str(tmp_path / "models"), model_version=1)
    session.launch()
    assert session.list_jobs() == ["mlp_predict"]
    assert session.list_inputs() == ("features", "scale")
    assert session.list_outputs() == ("probability",)
    assert session.input_info("features") == {"shape": (4, 3), "dtype": flow.float32}
    out = session.run("mlp_predict", features=x, scale=scale)
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="missing inputs"):
        session.run("mlp_predict", features=x)
    # another batch size than the saved job's: onnxjob's error, not onnxruntime's
    with pytest.raises(JobArgumentError, match=r"'features': got shape \(2, 3\), the saved "
                                               r"model takes \(4, 3\)"):
        session.run("mlp_predict", features=x[:2], scale=scale)
    # dtypes convert as a job's placeholders do (float64, integers and numbers written as
    # text to float32); other strings do not
    np.testing.assert_allclose(session.run("mlp_predict", features=x.astype(np.float64),
                                           scale=np.array([2]))[0], expected, rtol=1e-6)
    np.testing.assert_allclose(session.run("mlp_predict", features=x,
                                           scale=np.array(["2"]))[0], expected, rtol=1e-6)
    with pytest.raises(JobArgumentError, match="does not convert"):
        session.run("mlp_predict", features=x, scale=np.array(["two"]))
    session.close()
    latest = flow.serving.InferenceSession(flow.serving.SessionOption())
    latest.load_saved_model(str(tmp_path / "models"),
                            model_version=flow.serving.ModelVersionPolicy.LATEST)
    latest.launch()
    assert not np.allclose(latest.run("mlp_predict", features=x, scale=scale)[0], expected)


def test_signature_names_must_be_job_interfaces(tmp_path):
    lbns = {}
    job = make_job(lbns)
    job(np.zeros((4, 3), np.float32), np.ones(1, np.float32))
    builder = flow.saved_model.ModelBuilder(str(tmp_path / "m")).Version(1)
    builder.AddFunction(job).AddSignature("s").Input("x", "no_such_blob")
    with pytest.raises(ValueError, match="not a job input"):
        builder.Save()
    with pytest.raises(ValueError, match="version is not set"):
        flow.saved_model.ModelBuilder(str(tmp_path / "n")).Save()
    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}.*op lists"):
        flow.serving.InferenceSession().compile([])


def test_a_served_model_on_cuda_gets_onnxjob_s_cuda_options(tmp_path, monkeypatch):
    """The CUDA EP of a serving session gets onnxjob's options (ONNXJOB_CUDA_TF32=0, as the
    suite sets it): with onnxruntime's default TF32 matmuls the served MLP differed from
    its job by ~1e-3 on a GPU."""
    import onnxruntime as ort
    from onnxjob.runtime import backend
    x, scale, expected, _ = save(tmp_path)
    flow.clear_default_session()
    monkeypatch.setenv("ONNXJOB_CUDA_TF32", "0")
    real, calls = ort.InferenceSession, []

    def recording(model, options=None, providers=None, **kwargs):
        calls.append(providers)
        return real(model, options, providers=["CPUExecutionProvider"], **kwargs)
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", recording)
    session = flow.serving.InferenceSession()
    session.load_saved_model(str(tmp_path / "models"), model_version=1)
    session.launch()
    (providers,) = calls
    assert providers == [("CUDAExecutionProvider", backend.cuda_provider_options({})),
                         "CPUExecutionProvider"]
    assert providers[0][1]["use_tf32"] == "0"
    np.testing.assert_allclose(session.run("mlp_predict", features=x, scale=scale)[0],
                               expected, rtol=1e-6)
