"""Data-parallel training on GPUs (runtime/distributed.py use_device, runtime/value_paths.py
DevicePath): which process group a rank makes and which GPU it binds, tested anywhere with
the GPUs faked; on a machine with CUDA and NCCL, a world of one rank over NCCL and two ranks
sharing one GPU (gloo's CUDA tensors) train as one CPU process does."""
import json
import re
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="data-parallel training needs torch.distributed "
                                            "(pip install 'onnxjob[distributed]')")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

from onnxjob.launch import free_port  # noqa: E402
from onnxjob.runtime import backend, distributed, value_paths  # noqa: E402
from test_distributed import loaded, run, write_script  # noqa: E402


def _fake_torch(gpus, nccl=True):
    """(torch, torch.distributed) stand-ins that see `gpus` GPUs."""
    bound = []
    cuda = types.SimpleNamespace(is_available=lambda: gpus > 0, device_count=lambda: gpus,
                                 set_device=bound.append)
    fake = types.SimpleNamespace(cuda=cuda, __version__="fake", bound=bound)
    return fake, types.SimpleNamespace(is_nccl_available=lambda: nccl)


@pytest.fixture
def ranks_env(monkeypatch):
    """Set this process's rank variables; the bound GPU and device are restored after."""
    monkeypatch.setattr(backend, "_cuda_device", [0])
    monkeypatch.setitem(distributed._group, "device", "cpu")

    def set_ranks(rank, local_rank, world, local_world):
        for name, value in {"RANK": rank, "LOCAL_RANK": local_rank, "WORLD_SIZE": world,
                            "LOCAL_WORLD_SIZE": local_world}.items():
            monkeypatch.setenv(name, str(value))
    return set_ranks


@pytest.mark.parametrize("gpus,local_rank,nccl,expected", [
    (4, 3, True, ("nccl", 3, None)),
    (2, 3, True, ("gloo", 1, "4 ranks on this machine share its 2 GPU(s)")),    # shared
    (4, 1, False, ("gloo", 1, "this torch has no NCCL")),
])
def test_a_rank_on_cuda_binds_its_gpu_and_picks_its_group(monkeypatch, ranks_env, gpus,
                                                          local_rank, nccl, expected):
    """LOCAL_RANK modulo the GPUs for torch and for onnxruntime's sessions and variables;
    NCCL unless ranks share a GPU (NCCL refuses that) or torch has no NCCL."""
    fake, dist = _fake_torch(gpus, nccl)
    monkeypatch.setattr(distributed, "_import_torch", lambda: (fake, dist))
    ranks_env(4 + local_rank, local_rank, 8, 4)
    distributed.use_device("cuda")
    name, gpu, why = expected
    assert fake.bound == [gpu] and backend.cuda_device_id() == gpu
    assert backend.cuda_provider_options({})["device_id"] == str(gpu)
    assert distributed._backend_name(fake, dist) == (name, why)


def test_a_rank_on_the_cpu_uses_gloo(ranks_env):
    ranks_env(1, 1, 2, 2)
    fake, dist = _fake_torch(4)
    distributed.use_device("cpu")
    assert distributed._backend_name(fake, dist) == ("gloo", None)
    assert backend.cuda_device_id() == 0 and "device_id" not in backend.cuda_provider_options({})


def test_cuda_ranks_without_a_cuda_torch_are_refused_by_name(monkeypatch, ranks_env):
    fake, dist = _fake_torch(0)
    monkeypatch.setattr(distributed, "_import_torch", lambda: (fake, dist))
    ranks_env(0, 0, 2, 2)
    with pytest.raises(RuntimeError, match=r"this torch has no CUDA .*ONNXJOB_DEVICE=cpu"):
        distributed.use_device("cuda")


# -- on a GPU -----------------------------------------------------------------------------

def _cuda_and_nccl():
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        return False
    return backend.cuda_usable()


needs_gpu = pytest.mark.skipif(not _cuda_and_nccl(), reason="needs CUDA and NCCL (a CUDA "
                               "build of torch with NCCL, onnxruntime-gpu and a GPU)")

# a GPU step against the CPU's: float32 on other kernels (cuDNN's convolutions), TF32 off
RTOL, ATOL = 2e-4, 2e-5
# (synchronized batch norm, which CUDA ranks do not default to (OneFlow's GPU batch norm
# normalizes each device's rows): compared with one process on the whole batch)
GPU_ENV = {"ONNXJOB_DEVICE": "cuda", "ONNXJOB_CUDA_TF32": "0", "ONNXJOB_DETERMINISTIC": "1",
           "ONNXJOB_SYNC_BATCH_NORM": "1"}
# the script reports the process group's backend on stderr
REPORT_BACKEND = """
import atexit
from onnxjob.runtime import distributed as _distributed
atexit.register(lambda: print("BACKEND " + str(_distributed._group["backend"]), file=sys.stderr))
"""
# a rank of one where the test sets WORLD_SIZE=1; a plain process elsewhere
ONE_RANK_STEP = REPORT_BACKEND + \
    '_distributed.STEP_AT_WORLD_SIZE_1 = "WORLD_SIZE" in os.environ\n'


def _same_training(tmp_path, script, other, one):
    np.testing.assert_allclose(json.loads(other.stdout), json.loads(one.stdout),
                               rtol=RTOL, atol=ATOL)
    gpu, cpu = loaded(script, tmp_path / "gpu"), loaded(script, tmp_path / "cpu")
    assert sorted(gpu) == sorted(cpu)
    for name, value in cpu.items():
        np.testing.assert_allclose(gpu[name], value, rtol=RTOL, atol=ATOL, err_msg=name)


@needs_gpu
def test_device_values_cross_to_torch_on_the_gpu_without_a_copy():
    import onnxruntime as ort
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    session = backend.create_session(model.SerializeToString(), "cuda", False)
    path = value_paths.DevicePath("cuda", 0)
    out, = path.run(session, ["y"], {"x": path.feed(np.array([-1, 2, -3, 4], np.float32))})
    assert out.device_name().lower() == "cuda"
    tensor = path.export(out)
    assert tensor.is_cuda and tensor.data_ptr() == out.data_ptr()
    doubled = path.ort_value(tensor * 2)
    assert isinstance(doubled, ort.OrtValue) and doubled.device_name().lower() == "cuda"
    np.testing.assert_array_equal(doubled.numpy(), [0, 4, 0, 8])


@needs_gpu
@pytest.mark.parametrize("net", ["mlp", "conv_bn"])
def test_one_rank_over_nccl_trains_as_one_cpu_process(tmp_path, net):
    """The device-resident step (gradients by DLPack to NCCL and back) at world size 1."""
    script = write_script(tmp_path, net, mean_loss=True, config=ONE_RANK_STEP)
    world = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    gpu = run(script, 1, tmp_path / "gpu", env={**GPU_ENV, **world})
    assert gpu.returncode == 0, gpu.stderr
    assert "BACKEND nccl" in gpu.stderr
    cpu = run(script, 1, tmp_path / "cpu")
    assert cpu.returncode == 0, cpu.stderr
    assert "BACKEND None" in cpu.stderr      # a plain session: no process group
    _same_training(tmp_path, script, gpu, cpu)


@needs_gpu
def test_two_ranks_sharing_one_gpu_train_as_one_cpu_process(tmp_path):
    """NCCL refuses two ranks on one GPU: they all-reduce gloo's CUDA tensors."""
    script = write_script(tmp_path, "conv_bn", mean_loss=True, config=REPORT_BACKEND)
    gpu = run(script, 2, tmp_path / "gpu", env={**GPU_ENV, "CUDA_VISIBLE_DEVICES": "0"})
    assert gpu.returncode == 0, gpu.stderr
    assert "gloo's CUDA tensors, not NCCL: 2 ranks on this machine share its 1 GPU(s)" in \
        gpu.stderr
    assert len(re.findall("BACKEND gloo", gpu.stderr)) == 2
    cpu = run(script, 1, tmp_path / "cpu")
    assert cpu.returncode == 0, cpu.stderr
    _same_training(tmp_path, script, gpu, cpu)


@pytest.mark.skipif(not _cuda_and_nccl() or torch.cuda.device_count() < 2,
                    reason="needs CUDA, NCCL and 2 GPUs")
def test_two_ranks_on_two_gpus_over_nccl(tmp_path):
    script = write_script(tmp_path, "conv_bn", mean_loss=True, config=REPORT_BACKEND)
    gpu = run(script, 2, tmp_path / "gpu", env=GPU_ENV)
    assert gpu.returncode == 0, gpu.stderr
    assert len(re.findall("BACKEND nccl", gpu.stderr)) == 2
    cpu = run(script, 1, tmp_path / "cpu")
    assert cpu.returncode == 0, cpu.stderr
    _same_training(tmp_path, script, gpu, cpu)
