"""The on-disk cache of onnxruntime's optimized models (onnxjob/runtime/session_cache.py)."""
import os

import numpy as np
import onnxruntime as ort

import onnxjob as flow
from onnxjob.runtime import session_cache
from onnxjob.runtime.session import default_session

from models import define_jobs, lenet, random_batch


def _lenet_losses(steps=3):
    flow.clear_default_session()
    flow.config.seed(3)
    train_job, _ = define_jobs(lenet)
    images, labels = random_batch()
    losses = [train_job(images, labels) for _ in range(steps)]
    return losses, default_session().runtimes["train_job"].model_bytes


def test_a_second_start_loads_the_optimized_model_and_trains_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    loaded_from = []
    real = ort.InferenceSession

    def recording(model, *args, **kwargs):
        loaded_from.append(model if isinstance(model, str) else "bytes")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    first, model_bytes = _lenet_losses()
    cached = session_cache.cached_model_path(model_bytes, True, False)
    assert os.path.isfile(cached), sorted(os.listdir(tmp_path))
    assert cached not in loaded_from
    loaded_from.clear()
    second, _ = _lenet_losses()
    assert cached in loaded_from, "the second start did not use the cached model"
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))     # where it would go otherwise
    assert session_cache.cached_model_path(b"model") is None
    _lenet_losses(steps=1)
    assert not os.listdir(tmp_path)


def test_the_cache_drops_the_least_recently_used_models(tmp_path):
    for age, name in enumerate(["old", "mid", "new"]):
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + age, 1000 + age))
    session_cache.touch(str(tmp_path / "old.onnx"))        # used just now
    session_cache._trim(str(tmp_path), 2000)
    assert sorted(os.listdir(tmp_path)) == ["new.onnx", "old.onnx"]
