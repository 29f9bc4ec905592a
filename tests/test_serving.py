"""Predict jobs for serving: `function_config.use_tensorrt(True)` (onnxruntime's TensorRT
execution provider where available, runtime/backend.py) and exported files with float16
weights (`flow.export(..., half_weights=True)`, io/half_weights.py).

This machine has no TensorRT: the provider list that a TensorRT machine would get is
checked by capturing what create_session hands to onnxruntime's InferenceSession."""
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from models import BATCH, lenet, mlp
from onnxjob.errors import DeviceUnavailableError
from onnxjob.runtime import backend, session_cache

TRT, CUDA, CPU = backend.TENSORRT, backend.CUDA, backend.CPU
# the CUDA EP options every session gets (runtime/backend.py cuda_provider_options)
ARENA = {"arena_extend_strategy": "kSameAsRequested"}


@pytest.fixture(autouse=True)
def fresh_messages():
    backend.say_tensorrt.cache_clear()
    yield
    backend.say_tensorrt.cache_clear()


def _images(seed=0, batch=BATCH):
    return np.random.default_rng(seed).random((batch, 1, 28, 28), dtype=np.float32)


def _config(tensorrt=True, amp=False):
    config = flow.function_config()
    config.use_tensorrt(tensorrt)
    if amp:
        config.enable_auto_mixed_precision(True)
    return config


def _define_pair(net, config, plain_config=None):
    """Two predict jobs of `net` on the same variables: one with `plain_config` (default:
    none), one with `config`."""
    @flow.global_function(type="predict", function_config=plain_config)
    def plain_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return net(images)

    @flow.global_function(type="predict", function_config=config)
    def trt_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return net(images)
    return plain_job, trt_job


def _tensorrt_lines(text):
    return [line for line in text.splitlines() if "use_tensorrt" in line]


# -- use_tensorrt on a machine without TensorRT ------------------------------------------------

def test_use_tensorrt_is_implemented_not_warned():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = _config()
    assert config.get("use_tensorrt") is True


@pytest.mark.parametrize("net", [mlp, lenet])
def test_without_tensorrt_one_line_and_same_results(net, capsys):
    if TRT in ort.get_available_providers():
        pytest.skip("this onnxruntime (onnxruntime-gpu) lists TensorRT whether or not its "
                    "libraries are there: the tests below fake that machine")
    # both jobs switch to their frozen sessions after 2 calls (runtime/frozen.py)
    plain_config = flow.function_config()
    plain_config.freeze_variables_after(2)
    config = _config()
    config.freeze_variables_after(2)
    plain_job, trt_job = _define_pair(net, config, plain_config)
    batches = [_images(0)] * 4 + [_images(1)]
    expected = [plain_job(x) for x in batches]
    results = [trt_job(x) for x in batches]
    lines = _tensorrt_lines(capsys.readouterr().err)
    assert len(lines) == 1, lines
    assert TRT in lines[0] and "not available" in lines[0] and CPU in lines[0]
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_train_job_says_tensorrt_is_for_predict_jobs(capsys):
    @flow.global_function(type="train", function_config=_config())
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    labels = np.zeros(BATCH, np.int32)
    for _ in range(2):
        train_job(_images(), labels)
    lines = _tensorrt_lines(capsys.readouterr().err)
    runs_on = CUDA if backend.cuda_usable() else CPU
    assert len(lines) == 1 and "predict jobs only" in lines[0] and runs_on in lines[0], lines


def test_tensorrt_available_but_session_on_cpu(monkeypatch, capsys):
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")
    monkeypatch.setattr(backend.ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    plain_job, trt_job = _define_pair(mlp, _config())
    images = _images()
    expected = plain_job(images)
    np.testing.assert_array_equal(trt_job(images), expected)
    np.testing.assert_array_equal(trt_job(images), expected)
    lines = _tensorrt_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "needs the GPU" in lines[0] and CPU in lines[0], lines


# -- the providers a TensorRT machine gets (InferenceSession captured) ---------------------------

@pytest.fixture
def no_tf32_choice(monkeypatch):
    """No TF32 choice made (conftest.py makes one for the suite): the CUDA options hold
    only what the job asked for."""
    monkeypatch.delenv("ONNXJOB_CUDA_TF32", raising=False)


class _Reporting:
    """A real CPU session that reports other providers (those a GPU machine would start)."""

    def __init__(self, session, providers):
        self._session, self._providers = session, providers

    def get_providers(self):
        return list(self._providers)

    def __getattr__(self, name):
        return getattr(self._session, name)


def _capture_sessions(monkeypatch, started):
    """Replace InferenceSession: record each call's providers and keyword arguments, then
    fall back to a real CPU session that reports `started(providers)` as its providers (or
    raises what `started` raises)."""
    real = ort.InferenceSession
    calls = []

    def fake(model, options=None, providers=None, **kwargs):
        calls.append((providers, kwargs))
        reported = started(providers)
        session = real(model, options, providers=[CPU],
                       disabled_optimizers=kwargs.get("disabled_optimizers"))
        return _Reporting(session, reported)

    monkeypatch.setattr(backend.ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    monkeypatch.setattr(backend.ort, "InferenceSession", fake)
    monkeypatch.setattr(backend, "tensorrt_start_failure", lambda: None)
    return calls




def _model_bytes(amp=False):
    from onnxjob.runtime.session import default_session
    config = flow.function_config()
    if amp:
        config.enable_auto_mixed_precision(True)

    @flow.global_function(type="predict", function_config=config)
    def predict(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return mlp(images)
    predict(_images())
    return default_session().runtimes["predict"].model_bytes


@pytest.mark.parametrize("amp", [False, True])
def test_tensorrt_first_then_cuda_then_cpu(monkeypatch, capsys, amp):
    model = _model_bytes(amp)
    calls = _capture_sessions(monkeypatch, lambda providers: [TRT, CUDA, CPU])
    options = backend.cuda_provider_options(_config(amp=amp), tf32=False)
    session = backend.create_session(model, "cuda", is_train=False, cuda_options=options)
    assert session.get_providers() == [TRT, CUDA, CPU]
    (providers, kwargs), = calls
    folder = session_cache.cache_dir()
    expected_trt = {"trt_engine_cache_enable": "1",
                    "trt_engine_cache_path": os.path.join(folder, "tensorrt")}
    if amp:
        expected_trt["trt_fp16_enable"] = "1"
    assert providers == [(TRT, expected_trt), (CUDA, dict(ARENA, use_tf32="0")), CPU]
    # the engine cache lies under onnxjob's cache folder, made ready for TensorRT
    cache_path = providers[0][1]["trt_engine_cache_path"]
    assert os.path.commonpath([cache_path, folder]) == folder and os.path.isdir(cache_path)
    assert kwargs["enable_fallback"] == 0     # onnxruntime's four-line fallback is off
    assert not _tensorrt_lines(capsys.readouterr().err)
    # the options dict itself is left as the caller made it
    assert backend.TENSORRT_REQUEST in options


def test_tensorrt_failing_to_start_falls_back_to_cuda_in_one_line(monkeypatch, capsys, no_tf32_choice):
    model = _model_bytes()

    def started(providers):
        if providers[0][0] == TRT:
            raise RuntimeError("TensorRT EP could not build the engine\nmore detail")
        return [CUDA, CPU]
    calls = _capture_sessions(monkeypatch, started)
    options = backend.cuda_provider_options(_config(), tf32=None)
    for _ in range(2):
        session = backend.create_session(model, "cuda", is_train=False, cuda_options=options)
        assert session.get_providers() == [CUDA, CPU]
    assert [p for p, _ in calls][:2] == [[(TRT, calls[0][0][0][1]), (CUDA, ARENA), CPU],
                                         [(CUDA, ARENA), CPU]]
    lines = _tensorrt_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "could not build the engine" in lines[0] and CUDA in lines[0]


def test_tensorrt_that_cannot_start_here_leaves_the_job_to_cuda_with_graphs(
        monkeypatch, capsys, no_tf32_choice):
    """onnxruntime-gpu lists TensorRT without its libraries: asked once, the job is then
    planned for the CUDA EP (CUDA graphs too) and one line says why."""
    model = _model_bytes()
    calls = _capture_sessions(monkeypatch, lambda providers: [CUDA, CPU])
    monkeypatch.setattr(backend, "tensorrt_start_failure",
                        lambda: "Please install TensorRT libraries")
    options = backend.cuda_provider_options(_config(), tf32=None)
    session = backend.create_session(model, "cuda", is_train=False, cuda_options=options,
                                     cuda_graph=True)
    assert session.get_providers() == [CUDA, CPU]
    assert [p for p, _ in calls] == [[(CUDA, dict(ARENA, enable_cuda_graph="1")), CPU]]
    lines = _tensorrt_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "Please install TensorRT" in lines[0] and CUDA in lines[0], lines


def test_tensorrt_start_probe_says_why_where_there_is_no_tensorrt():
    if TRT in ort.get_available_providers():
        pytest.skip("this onnxruntime lists TensorRT: whether it starts is what the probe finds")
    backend.tensorrt_start_failure.cache_clear()
    assert backend.tensorrt_start_failure() == "onnxruntime could not load it (TensorRT's libraries?)"


def test_tensorrt_silently_dropped_is_said_and_cpu_fallback_refused(monkeypatch, capsys, no_tf32_choice):
    model = _model_bytes()
    _capture_sessions(monkeypatch, lambda providers: [CUDA, CPU])
    options = backend.cuda_provider_options(_config(), tf32=None)
    backend.create_session(model, "cuda", is_train=False, cuda_options=options)
    lines = _tensorrt_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "could not load" in lines[0] and CUDA in lines[0]
    # neither TensorRT nor CUDA started: the usual refusal of a silent CPU fallback
    _capture_sessions(monkeypatch, lambda providers: [CPU])
    with pytest.raises(DeviceUnavailableError):
        backend.create_session(model, "cuda", is_train=False, cuda_options=options)


def test_tensorrt_and_cuda_graphs_and_train_sessions(monkeypatch, capsys, no_tf32_choice):
    model = _model_bytes()
    calls = _capture_sessions(monkeypatch, lambda providers: [p if isinstance(p, str) else p[0]
                                                              for p in providers])
    options = backend.cuda_provider_options(_config(), tf32=None)
    # the caller (runtime/session.py) says why and asks again without CUDA graphs
    with pytest.raises(RuntimeError, match="CUDA graphs"):
        backend.create_session(model, "cuda", is_train=False, cuda_options=options,
                               cuda_graph=True)
    assert not calls
    session = backend.create_session(model, "cuda", is_train=True, cuda_options=options)
    assert calls[-1][0] == [(CUDA, ARENA), CPU] and session.get_providers() == [CUDA, CPU]
    lines = _tensorrt_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "predict jobs only" in lines[0] and CUDA in lines[0]


def test_no_engine_cache_when_the_cache_is_off(monkeypatch):
    monkeypatch.setattr(session_cache, "cache_dir", lambda: None)
    assert backend.tensorrt_provider_options(_config()) == {}
    assert backend.tensorrt_provider_options(_config(amp=True)) == {"trt_fp16_enable": "1"}


# -- exported files with half weights -----------------------------------------------------------

def _run_file(path, images):
    session = ort.InferenceSession(path, providers=[CPU])
    return session.run(None, {session.get_inputs()[0].name: images})[0]


@pytest.mark.parametrize("net", [lenet, mlp])
def test_export_half_weights_under_amp(net, tmp_path):
    config = flow.function_config()
    config.enable_auto_mixed_precision(True)

    @flow.global_function(type="predict", function_config=config)
    def predict(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return net(images)

    images = _images()
    expected = predict(images)
    full, half = str(tmp_path / "full.onnx"), str(tmp_path / "half.onnx")
    flow.export(predict, full)
    flow.export(predict, half, half_weights=True)
    assert os.path.getsize(half) / os.path.getsize(full) < 0.6
    model = onnx.load(half)
    onnx.checker.check_model(model, full_check=True)
    types = {i.name: i.data_type for i in model.graph.initializer}
    weights = [n for n in types if "-weight" in n]
    assert weights and all(n.endswith("-weight/cast_f2h") for n in weights)
    assert all(types[n] == onnx.TensorProto.FLOAT16 for n in weights)
    assert not [n for n in model.graph.node
                if n.op_type == "Cast" and n.input[0].endswith("-weight")]
    got = _run_file(half, images)
    assert got.dtype == np.float32 and got.shape == expected.shape
    # the job's own half computation, run by other kernels (a frozen file): float16's
    # rounding, relative to the largest logit
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2 * scale)
    # the same half values reach the same nodes as from the float32 file's Casts
    np.testing.assert_allclose(got, _run_file(full, images), rtol=0, atol=1e-6 * scale)


def test_export_half_weights_refused_without_amp_and_for_train_jobs(tmp_path):
    @flow.global_function(type="predict")
    def predict(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return mlp(images)

    config = flow.function_config()
    config.enable_auto_mixed_precision(True)

    @flow.global_function(type="train", function_config=config)
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, mlp(images))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    predict(_images())
    with pytest.raises(ValueError, match="enable_auto_mixed_precision"):
        flow.export(predict, str(tmp_path / "p.onnx"), half_weights=True)
    with pytest.raises(ValueError, match="predict jobs"):
        flow.export(train_job, str(tmp_path / "t.onnx"), half_weights=True)
    assert not os.listdir(tmp_path)
