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
    monkeypatch.setattr(backend, "_exact_cpu_arena", lambda limit=None: False)
    assert not _shares(backend.session_options(True))
    own = _lenet_losses()
    assert np.isfinite(shared).all() and shared == own


def test_a_refused_registration_leaves_sessions_their_own_arenas(monkeypatch, capsys):
    def refuse(*args):
        raise ort.capi.onnxruntime_pybind11_state.InvalidArgument("already registered")
    monkeypatch.setattr(ort, "create_and_register_allocator", refuse)
    monkeypatch.setattr(backend, "_shared_arenas", {})
    backend._say_arena_bound.cache_clear()
    assert backend._exact_cpu_arena() is False
    assert backend._shared_arenas == {"cpu": (None, False)}
    assert not _shares(backend.session_options(True))
    # a later bound names no arena that was never made, and nothing is registered again
    assert backend._exact_cpu_arena(256 << 20) is False
    assert capsys.readouterr().err == ""


def test_cuda_sessions_grow_their_arena_by_the_size_requested(monkeypatch):
    """The CUDA arena as the CPU's: exact growth, the same memory options on both
    devices, and flow.config.device_memory_limit_mbyte as its bound."""
    for is_train in (True, False):
        cpu = backend.session_options(is_train, device="cpu")
        cuda = backend.session_options(is_train, device="cuda")
        assert cpu.enable_mem_pattern == cuda.enable_mem_pattern == (not is_train)
        # (a CUDA train session then runs the graph's own order: runtime/graph_order.py)
        assert cuda.execution_order == cpu.execution_order == ort.ExecutionOrder.DEFAULT
    options = backend.cuda_provider_options({})
    assert options["arena_extend_strategy"] == "kSameAsRequested"
    assert "gpu_mem_limit" not in options
    monkeypatch.setattr(backend, "_memory_limit", [None])
    backend.set_memory_limit(512)
    assert backend.cuda_provider_options({})["gpu_mem_limit"] == str(512 << 20)


def test_cudnn_buf_limit_bounds_the_cudnn_workspace(capsys):
    assert "cudnn_conv_use_max_workspace" not in backend.cuda_provider_options({})
    options = backend.cuda_provider_options({"cudnn_buf_limit_mbyte": 1024})
    assert options["cudnn_conv_use_max_workspace"] == "0"
    assert capsys.readouterr().err == ""
    backend.cuda_provider_options({"cudnn_buf_limit_mbyte": 8})
    assert "at 32 MiB at the least" in capsys.readouterr().err


def test_a_job_s_own_cuda_provider_options_come_last():
    options = backend.cuda_provider_options(
        {"cuda_provider_options": {"prefer_nhwc": 1, "arena_extend_strategy": "kNextPowerOfTwo"}})
    assert options["prefer_nhwc"] == "1"
    assert options["arena_extend_strategy"] == "kNextPowerOfTwo"


def test_cuda_provider_options_takes_a_dict():
    import pytest
    import onnxjob as flow
    with pytest.raises(ValueError, match="takes a dict"):
        flow.function_config().cuda_provider_options("prefer_nhwc=1")


def test_oneflow_s_heuristic_search_flag_picks_cudnn_s_algorithm_search():
    """OneFlow's cudnn_conv_heuristic_search_algo, when a job sets it, is cuDNN's search;
    onnxjob's own cudnn_conv_algo_search wins where both are set."""
    import onnxjob as flow
    assert "cudnn_conv_algo_search" not in backend.cuda_provider_options({})
    for flag, search in ((True, "HEURISTIC"), (False, "EXHAUSTIVE")):
        config = flow.function_config()
        config.cudnn_conv_heuristic_search_algo(flag)
        assert config.function_desc.cudnn_conv_heuristic_search_algo is flag
        assert backend.cuda_provider_options(config)["cudnn_conv_algo_search"] == search
        config.cudnn_conv_algo_search("default")
        assert backend.cuda_provider_options(config)["cudnn_conv_algo_search"] == "DEFAULT"


def test_the_shared_cuda_arena_is_registered_once_with_the_first_bound(monkeypatch, capsys):
    """CUDA sessions share one arena per GPU (ONNXJOB_CUDA_SHARED_ARENA, on by default),
    registered once with flow.config.device_memory_limit_mbyte's bound; a bound asked for
    later cannot change it, and that is said once (onnxruntime's registration faked: this
    build has no CUDA EP)."""
    made = []

    def register(provider, memory, options, config):
        made.append((provider, config.max_mem, config.arena_extend_strategy))
    monkeypatch.setattr(ort, "create_and_register_allocator_v2", register)
    monkeypatch.setattr(backend, "_shared_arenas", {})
    backend._say_arena_bound.cache_clear()
    monkeypatch.setattr(backend, "_memory_limit", [None])
    backend.set_memory_limit(512)
    assert _shares(backend.session_options(True, device="cuda"))
    assert made == [(backend.CUDA, 512 << 20, 1)]
    backend.set_memory_limit(256)
    assert _shares(backend.session_options(False, device="cuda"))
    assert _shares(backend.session_options(True, device="cuda"))
    assert len(made) == 1
    said = capsys.readouterr().err
    assert said.count("CUDA sessions of this process share one arena") == 1
    assert "512 MiB" in said
    monkeypatch.setenv("ONNXJOB_CUDA_SHARED_ARENA", "0")
    assert not _shares(backend.session_options(True, device="cuda"))


def test_a_session_that_captures_cuda_graphs_keeps_its_own_arena():
    """A replay writes its intermediates where the capture put them, memory an arena counts
    as free between runs: a graph-capturing session must not share its arena with sessions
    whose results outlive a run (runtime/backend.py create_session). The choice is the
    session options', checked here on the CPU EP (a CUDA session gets the same options)."""
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8).SerializeToString()
    assert backend._exact_cpu_arena()
    assert _shares(backend.create_session(model, "cpu", True).get_session_options())
    captures = backend.create_session(model, "cpu", True, cuda_graph=True)
    assert not _shares(captures.get_session_options())
    assert not _shares(backend.session_options(True, device="cuda", shared_arena=False))
    np.testing.assert_array_equal(captures.run(None, {"x": np.float32([-1, 2])})[0], [0, 2])
