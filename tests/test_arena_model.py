"""onnxruntime's arena as graph/arena_model.py models it, and the region a process's first
train step makes ahead (runtime/arena_reserve.py)."""
import numpy as np
import pytest

from onnxjob.graph import arena_model, memory_plan
from onnxjob.graph.arena_model import Arena
from onnxjob.runtime import arena_reserve, backend

from models import lenet_training

KIB, MIB = 1 << 10, 1 << 20


def test_requests_round_up_to_256_bytes_and_a_region_is_the_size_asked():
    arena = Arena("kSameAsRequested")
    arena.alloc(1000)
    assert (arena.reserved, arena.regions, arena.in_use) == (1024, 1, 1024)


def test_a_chunk_is_split_only_for_a_request_of_at_most_half_of_it():
    arena = Arena("kSameAsRequested")
    arena.free(arena.alloc(4 * KIB))
    half = arena.alloc(2 * KIB)                 # split: the other half stays free
    arena.alloc(2 * KIB)
    assert (arena.reserved, arena.in_use) == (4 * KIB, 4 * KIB)
    arena.free(half)
    arena.alloc(1 * KIB + 512)                  # 2 KiB < 2 * 1.5 KiB: the whole chunk
    assert arena.in_use == 4 * KIB and arena.reserved == 4 * KIB


def test_a_large_rest_is_split_off_even_from_a_close_fit():
    arena = Arena("kSameAsRequested", max_dead_bytes=1 * KIB)
    arena.free(arena.alloc(4 * KIB))
    arena.alloc(3 * KIB)                        # the 1 KiB rest reaches max_dead_bytes
    assert arena.in_use == 3 * KIB


def test_regions_never_merge_but_chunks_of_one_region_do():
    arena = Arena("kSameAsRequested")
    a, b = arena.alloc(MIB), arena.alloc(MIB)   # two regions of 1 MiB
    arena.free(a)
    arena.free(b)
    arena.alloc(2 * MIB)                        # fits in neither: a third region
    assert (arena.regions, arena.reserved) == (3, 4 * MIB)

    one = Arena("kSameAsRequested")
    one.free(one.alloc(2 * MIB))                # one region made ahead
    a, b = one.alloc(MIB), one.alloc(MIB)
    one.free(a)
    one.free(b)                                 # merged back into one free chunk
    one.alloc(2 * MIB)
    assert (one.regions, one.reserved) == (1, 2 * MIB)


def test_the_doubling_growth_starts_at_the_initial_chunk():
    arena = Arena("kNextPowerOfTwo", initial_chunk=MIB)
    arena.alloc(MIB)
    arena.alloc(MIB)                            # the next region is twice the last
    arena.alloc(5 * MIB)                        # doubled until it fits: 8 MiB
    assert arena.reserved == MIB + 2 * MIB + 8 * MIB and arena.regions == 3
    with pytest.raises(ValueError, match="strategy"):
        Arena("kOther")


@pytest.fixture(scope="module")
def lenet_plan():
    _, model_bytes = lenet_training(steps=1)
    import onnx
    import onnx_ir as ir
    graph = ir.serde.deserialize_model(onnx.ModelProto.FromString(model_bytes)).graph
    return memory_plan.plan(graph, "onnxruntime-default")


def test_the_planner_gives_outputs_buffers_that_are_already_there(lenet_plan):
    chains, reused = arena_model.planner_chains(lenet_plan)
    assert reused > 0 and len(chains) + reused == len(lenet_plan.lifetimes)
    assert sum(n for _, _, n in chains) < sum(n for _, _, n in lenet_plan.lifetimes.values())
    for start, end, nbytes in chains:
        assert start <= end and nbytes > 0


def test_a_step_s_arena_holds_at_least_its_plan_and_a_region_ahead_can_lose(lenet_plan):
    """LeNet's columns are a large share of its peak: with a region of its peak made ahead,
    one of them fits no free chunk and grows the arena by its whole size."""
    grown = arena_model.replay(lenet_plan)
    ahead = arena_model.replay(lenet_plan, reserved_first=lenet_plan.peak_bytes)
    assert grown.reserved_bytes >= lenet_plan.peak_bytes
    assert ahead.reserved_bytes > grown.reserved_bytes
    assert arena_model.replay(lenet_plan, planner_reuse=False).planner_reused == 0


class _Compiled:
    def __init__(self, graph):
        self.model = type("Model", (), {"graph": graph})()
        self.is_train, self.state_outputs = True, {}


def test_the_region_made_ahead_is_the_size_the_arena_model_holds_least_after(lenet_plan):
    graph = lenet_plan.order[0].graph
    chosen = arena_reserve.region_bytes(_Compiled(graph), "cpu")
    candidates = [0] + [int(lenet_plan.peak_bytes * f) for f in arena_reserve.CANDIDATES]
    held = [arena_model.replay(lenet_plan, reserved_first=n).reserved_bytes for n in candidates]
    assert chosen in candidates
    assert arena_model.replay(lenet_plan, reserved_first=chosen).reserved_bytes == min(held)
    assert chosen == 0      # (LeNet: see the test above)


def test_the_first_train_step_makes_the_chosen_region_once(monkeypatch):
    """Before a process's first train step, the shared CPU arena gets the region
    region_bytes chooses (once per process), and the step computes what it computes
    without it."""
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")
    made, chosen = [], []
    real_reserve, real_region = arena_reserve.reserve, arena_reserve.region_bytes

    def recording(device, nbytes, *args):
        made.append((device, nbytes))
        return real_reserve(device, nbytes, *args)

    def region_of_the_peak(compiled, device, in_place=()):
        real_region(compiled, device, in_place)     # (runs: what the session calls)
        chosen.append(arena_model.replay(memory_plan.plan(
            compiled.model.graph, "onnxruntime-default")).reserved_bytes)
        return chosen[-1]
    monkeypatch.setattr(arena_reserve, "reserve", recording)
    monkeypatch.setattr(arena_reserve, "region_bytes", region_of_the_peak)
    saved = dict(arena_reserve._reserved)
    try:
        monkeypatch.setenv("ONNXJOB_ARENA_RESERVE", "0")
        arena_reserve.reset()
        plain, _ = lenet_training()
        assert made == [] and chosen == []
        monkeypatch.setenv("ONNXJOB_ARENA_RESERVE", "1")
        with_region, _ = lenet_training()
        if not backend._exact_cpu_arena():
            pytest.skip("onnxruntime refused onnxjob's shared CPU arena in this process")
        assert made == [("cpu", chosen[0])] and arena_reserve.done("cpu")
        lenet_training()                        # once per process
        assert len(made) == 1
    finally:
        arena_reserve._reserved.clear()
        arena_reserve._reserved.update(saved)
    for a, b in zip(plain, with_region):
        np.testing.assert_array_equal(a, b)


def test_a_region_the_arena_cannot_make_is_skipped(monkeypatch):
    """A region past the arena's bound (or the device's memory) costs the layout only: no
    error at session creation."""
    saved = dict(arena_reserve._reserved)
    try:
        arena_reserve.reset()
        opts = backend.session_options(False, device="cpu")
        assert arena_reserve.reserve("cpu", 1 << 62, opts, [backend.CPU]) == 0
        assert arena_reserve.done("cpu")
    finally:
        arena_reserve._reserved.clear()
        arena_reserve._reserved.update(saved)


def test_the_region_is_made_of_few_enough_elements_for_cuda_kernels():
    """CUDA kernels index elements with 32-bit integers: the region is 8-byte elements,
    at most 2**31 - 1 of them; a larger one is not made."""
    assert arena_reserve.region_elements(2_800_000_000) == 350_000_000
    assert arena_reserve.region_elements(9) == 2 and arena_reserve.region_elements(0) == 0
    assert arena_reserve.region_elements(8 * 2 ** 31) == 0


def test_sessions_without_the_shared_arena_get_no_region():
    """CUDA sessions of their own arena (the default) never set the shared-allocator key,
    which onnxruntime refuses to read back: no region, no error."""
    import onnxruntime as ort
    assert not backend._uses_shared_arena(ort.SessionOptions())
    assert backend._uses_shared_arena(backend.session_options(True, device="cpu")) == \
        bool(backend._exact_cpu_arena())
