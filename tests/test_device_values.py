"""Values that outlive a step made in the arena the sessions share (runtime/device_values.py):
on the CPU EP here (the CPU sessions share an arena too), on the GPU in test_cuda.py."""
import gc

import numpy as np
import onnxruntime as ort
import pytest

from onnxjob.runtime import backend, cuda_graph, device_values


@pytest.fixture(autouse=True)
def fresh_sessions():
    device_values.reset()
    yield
    device_values.reset()


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.float16([[0.5, -2.0]]),
    np.array(7, np.int64),                      # 0-d stays 0-d
    np.zeros((0, 5), np.int32),                 # empty
    np.array([True, False, True]),
    np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2],   # not contiguous
], ids=["float32", "float16", "0-d int64", "empty", "bool", "strided"])
def test_a_placed_value_is_a_copy_of_the_array(array):
    assert backend._exact_cpu_arena()
    source = array.copy()
    placed = device_values.place(source, "cpu")
    assert isinstance(placed, ort.OrtValue)
    assert placed.device_name().lower() == "cpu"
    assert tuple(placed.shape()) == array.shape
    got = placed.numpy()
    assert got.dtype == array.dtype
    np.testing.assert_array_equal(got, array)
    if source.size:     # a copy: the source can change or go
        source[...] = 0 if source.dtype != np.bool_ else False
        del source
        gc.collect()
        np.testing.assert_array_equal(placed.numpy(), array)


def test_zeros_have_the_shape_and_type_asked():
    assert backend._exact_cpu_arena()
    made = device_values.zeros((2, 3), np.float16, "cpu")
    assert made.numpy().dtype == np.float16 and made.numpy().shape == (2, 3)
    assert not made.numpy().any()


def test_without_a_shared_arena_nothing_is_placed(monkeypatch):
    """Sessions with their own arenas (ONNXJOB_CUDA_SHARED_ARENA=0, a refused
    registration): `place` says so and the caller keeps onnxruntime's constructor."""
    monkeypatch.setattr(backend, "_exact_cpu_arena", lambda limit=None: False)
    assert device_values.place(np.ones(3, np.float32), "cpu") is None
    assert device_values.zeros((2,), np.float32, "cpu") is None


def test_lasting_cuda_values_go_to_the_shared_arena_and_per_step_ones_do_not(monkeypatch):
    """Wiring (this machine has no CUDA EP: the device calls are recorded): variables set
    or loaded (backend.to_device) and a CUDA graph's fixed buffers are placed in the shared
    arena; a run's results (backend.from_host: a host run's, a mirrored step's) are not."""
    placed, made = [], []
    monkeypatch.setattr(device_values, "place",
                        lambda array, device, device_id=0: placed.append(
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
    monkeypatch.setattr(device_values, "place", lambda array, device, device_id=0: None)
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy",
                        staticmethod(lambda array, *where: made.append(where) or "made"))
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_shape_and_type",
                        staticmethod(lambda shape, dtype, *where: made.append(where) or "buf"))
    assert backend.to_device(np.ones(2, np.float32), "cuda") == "made"
    assert cuda_graph._device_buffer((2,), np.float32) == "buf"
    assert made[0][0] == "cuda" and made[1][0] == "cuda"
