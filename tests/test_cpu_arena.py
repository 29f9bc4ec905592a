"""The CPU arena onnxjob's CPU sessions share (runtime/backend.py: it grows by exactly
the size requested, so a ResNet50 step's memory stays flat; bench/bench_memory.py)."""
import numpy as np
import onnxruntime as ort

from onnxjob.runtime import backend
from models import lenet_training

KEY = "session.use_env_allocators"


def _shares(opts):
    try:
        return opts.get_session_config_entry(KEY) == "1"
    except RuntimeError:    # onnxruntime: no such entry
        return False


def _lenet_losses():
    losses, _ = lenet_training(seed=5)
    return [float(np.mean(loss)) for loss in losses]


def test_cpu_sessions_use_the_shared_arena():
    assert backend._exact_cpu_arena()
    assert _shares(backend.session_options(True)) and _shares(backend.session_options(False))
    assert not _shares(backend.session_options(True, device="cuda"))


def test_training_is_the_same_with_and_without_the_shared_arena(monkeypatch):
    shared = _lenet_losses()
    monkeypatch.setattr(backend, "_exact_cpu_arena", lambda: False)
    assert not _shares(backend.session_options(True))
    own = _lenet_losses()
    assert np.isfinite(shared).all() and shared == own


def test_a_refused_registration_leaves_sessions_their_own_arenas(monkeypatch):
    def refuse(*args):
        raise ort.capi.onnxruntime_pybind11_state.InvalidArgument("already registered")
    monkeypatch.setattr(ort, "create_and_register_allocator", refuse)
    assert backend._exact_cpu_arena.__wrapped__() is False
