"""Values that outlive a step made in the arena the sessions share (runtime/device_values.py):
on the CPU EP here (the CPU sessions share an arena too), on the GPU in test_cuda.py."""
import gc

import numpy as np
import onnxruntime as ort
import pytest

from onnxjob.runtime import backend, cuda_graph, device_values


def _place_on_cpu(array):
    return device_values.place(array, "cpu", 0,
                               lambda: backend.shared_arena_options("cpu"))


@pytest.fixture(autouse=True)
def fresh_sessions():
    device_values.reset()
    yield
    device_values.reset()


@pytest.mark.parametrize("make", [
    lambda: np.arange(12, dtype=np.float32).reshape(3, 4),
    lambda: np.float16([[0.5, -2.0]]),
    lambda: np.array(7, np.int64),                          # 0-d stays 0-d
    lambda: np.zeros((0, 5), np.int32),                     # empty
    lambda: np.array([True, False, True]),
    lambda: np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2],     # not contiguous
], ids=["float32", "float16", "0-d int64", "empty", "bool", "strided"])
def test_a_placed_value_is_a_copy_of_the_array(make):
    assert backend._exact_cpu_arena()
    source, expected = make(), make().copy()
    placed = _place_on_cpu(source)
    assert isinstance(placed, ort.OrtValue)
    assert placed.device_name().lower() == "cpu"
    assert tuple(placed.shape()) == expected.shape
    got = placed.numpy()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    if source.size:     # a copy: the source can change or go
        source[...] = 0 if source.dtype != np.bool_ else False
        del source
        gc.collect()
        np.testing.assert_array_equal(placed.numpy(), expected)


def test_without_a_shared_arena_nothing_is_placed(monkeypatch):
    """Sessions with their own arenas (ONNXJOB_CUDA_SHARED_ARENA=0, a refused
    registration): `place` says so and the caller keeps onnxruntime's constructor."""
    monkeypatch.setattr(backend, "_exact_cpu_arena", lambda limit=None: False)
    assert backend.shared_arena_options("cpu") is None
    assert _place_on_cpu(np.ones(3, np.float32)) is None


def test_lasting_cuda_values_go_to_the_shared_arena_and_per_step_ones_do_not(monkeypatch):
    """Wiring (this machine has no CUDA EP: the device calls are recorded): variables set
    or loaded (backend.to_device) and a CUDA graph's fixed buffers are placed in the shared
    arena; a run's results (backend.from_host: a host run's, a mirrored step's) are not."""
    placed, made = [], []
    monkeypatch.setattr(device_values, "place",
                        lambda array, device, device_id, options: placed.append(
                            (np.array(array), device)) or "placed")
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy",
                        staticmethod(lambda array, *where: made.append(where) or "made"))
    assert backend.to_device(np.ones((2, 2), np.float32), "cuda") == "placed"
    assert cuda_graph._device_value(np.zeros(3, np.int64)) == "placed"
    assert cuda_graph._device_buffer((4,), np.float16) == "placed"
    assert [(a.shape, a.dtype, d) for a, d in placed] == [
        ((2, 2), np.float32, "cuda"), ((3,), np.int64, "cuda"), ((4,), np.float16, "cuda")]
    assert not placed[2][0].any()
    assert backend.from_host(np.ones(2, np.float32), "cuda") == "made" and made


def test_the_cuda_fallback_is_onnxruntime_s_constructor(monkeypatch):
    made = []
    monkeypatch.setattr(device_values, "place", lambda array, device, device_id, options: None)
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy",
                        staticmethod(lambda array, *where: made.append(where) or "made"))
    assert backend.to_device(np.ones(2, np.float32), "cuda") == "made"
    assert cuda_graph._device_buffer((2,), np.float32) == "made"
    assert made[0][0] == "cuda" and made[1][0] == "cuda"
