"""The device-resident data-parallel path (runtime/value_paths.py DevicePath: onnxruntime's
outputs to torch tensors by DLPack, collectives on the tensors, back by DLPack), run on the
CPU with CPU OrtValues, CPU tensors and gloo (the internal switch DLPACK_ON_CPU): every
conversion shares memory (no copy), and training equals the NumPy path's to the last bit.
On CUDA the same code runs with GPU buffers and NCCL (tests/test_distributed_cuda.py)."""
import gc
import json
import re
import textwrap

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxjob as flow
import onnxjob.typing as tp

torch = pytest.importorskip("torch", reason="the DLPack path hands values to torch "
                                            "(pip install 'onnxjob[distributed]')")
if not torch.distributed.is_available():
    pytest.skip("this PyTorch build has no torch.distributed", allow_module_level=True)

from onnxjob.launch import free_port  # noqa: E402
from onnxjob.runtime import distributed, value_paths  # noqa: E402
from test_distributed import NETS as DISTRIBUTED_NETS  # noqa: E402
from test_distributed import run, run_once, trained, write_script  # noqa: E402


def _identity_session(n):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_values_cross_without_a_copy():
    """An output bound by IOBinding becomes a tensor over its memory, a tensor (a view into
    a bucket included) an OrtValue over its memory, and a fed array is shared."""
    path = value_paths.DevicePath("cpu")
    array = np.arange(6, dtype=np.float32)
    fed = path.feed(array)
    assert fed.data_ptr() == array.ctypes.data
    out, = path.run(_identity_session(6), ["y"], {"x": fed})
    tensor = path.export(out)
    assert tensor.data_ptr() == out.data_ptr()
    np.testing.assert_array_equal(tensor.numpy(), array)
    bucket = torch.arange(10, dtype=torch.float32)
    view = bucket[4:10].reshape(2, 3)
    back = path.ort_value(view)
    assert back.data_ptr() == view.data_ptr() and back.shape() == [2, 3]
    np.testing.assert_array_equal(back.numpy(), view.numpy())


def test_exported_values_outlive_their_ortvalues():
    """The tensor keeps onnxruntime's buffer, and an OrtValue fed from an array keeps the
    array, alive after their own references are gone. (An OrtValue made by
    ortvalue_from_numpy does not: a tensor exported from it pointed at freed memory,
    which is why the CPU path feeds arrays through torch.)"""
    path = value_paths.DevicePath("cpu")
    n = 1 << 20
    out, = path.run(_identity_session(n), ["y"], {"x": path.feed(np.ones(n, np.float32))})
    from_session = path.export(out)
    from_feed = path.export(path.feed(np.full(n, 3, np.float32)))
    del out
    gc.collect()
    _ = np.full(n, 7, np.float32), np.zeros(4 * n, np.float32)    # reuse freed memory
    assert float(from_session.sum()) == n and float(from_feed.sum()) == 3 * n


def test_the_path_follows_the_device_and_the_switch(monkeypatch):
    assert isinstance(value_paths.for_device("cpu"), value_paths.HostPath)
    assert isinstance(value_paths.for_device("cuda", 1), value_paths.DevicePath)
    monkeypatch.setattr(value_paths, "DLPACK_ON_CPU", True)
    assert value_paths.for_device("cpu").device_resident
    with pytest.raises(ValueError, match="'cpu' or 'cuda', got 'npu'"):
        value_paths.for_device("npu")


# -- training: in this process at world size 1, and 2 ranks ------------------------------

NETS = {
    "mlp": textwrap.indent(textwrap.dedent(DISTRIBUTED_NETS["mlp"]), "    "),
    # synchronized batch norm: its statistics go through the staged collectives
    "conv_bn": """
    conv = flow.layers.conv2d(images, 8, 3, padding="SAME", kernel_initializer=init,
                              use_bias=False, name="conv1")
    normed = flow.layers.batch_normalization(conv, axis=1, momentum=0.9, name="bn1")
    flat = flow.reshape(flow.nn.relu(normed), [images.shape[0], -1])
    logits = flow.layers.dense(flat, 10, kernel_initializer=init, name="dense")""",
}


def _train(net, steps=3):
    """(losses, variables) of `net` trained `steps` steps in this process."""
    namespace = {"flow": flow, "tp": tp}
    exec(f"""
@flow.global_function(type="train")
def train_job(images: tp.Numpy.Placeholder((8, 1, 28, 28), dtype=flow.float),
              labels: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
    init = flow.truncated_normal(0.1)
{NETS[net]}
    loss = flow.math.reduce_mean(flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                       momentum=0.9).minimize(loss)
    return loss
""", namespace)
    flow.config.seed(5)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = rng.random((8, 1, 28, 28), dtype=np.float32)
        y = rng.integers(0, 10, 8).astype(np.int32)
        losses.append(float(namespace["train_job"](x, y)))
    variables = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    flow.clear_default_session()
    return losses, variables


@pytest.fixture
def conversions(monkeypatch):
    """Counts value_paths' DLPack conversions, checking that each shares memory."""
    counts = {"to_torch": 0, "to_ort": 0}

    def checked(name, convert):
        def wrapped(value):
            out = convert(value)
            if name == "to_ort":
                assert value.is_contiguous(), "to_ort of a non-contiguous tensor copies"
            assert out.data_ptr() == value.data_ptr(), f"{name} copied"
            counts[name] += 1
            return out
        return wrapped
    monkeypatch.setattr(value_paths, "to_torch", checked("to_torch", value_paths.to_torch))
    monkeypatch.setattr(value_paths, "to_ort", checked("to_ort", value_paths.to_ort))
    return counts


@pytest.fixture
def one_rank(monkeypatch):
    """This process as a world of one rank run through the data-parallel step (gloo)."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")
    monkeypatch.setattr(distributed, "STEP_AT_WORLD_SIZE_1", True)


@pytest.mark.parametrize("net", ["mlp", "conv_bn"])
def test_one_rank_dlpack_path_equals_the_numpy_path(monkeypatch, one_rank, conversions, net):
    host = _train(net)
    assert conversions == {"to_torch": 0, "to_ort": 0}     # the NumPy path: none
    monkeypatch.setattr(value_paths, "DLPACK_ON_CPU", True)
    device = _train(net)
    assert conversions["to_torch"] > 0 and conversions["to_ort"] > 0
    assert device[0] == host[0]
    assert sorted(device[1]) == sorted(host[1])
    for name, value in host[1].items():
        np.testing.assert_array_equal(device[1][name], value, err_msg=name)
    # and both are the plain session's numbers (another graph: rounding apart)
    monkeypatch.setattr(distributed, "STEP_AT_WORLD_SIZE_1", False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    plain = _train(net)
    np.testing.assert_allclose(host[0], plain[0], rtol=1e-5)
    for name, value in plain[1].items():
        np.testing.assert_allclose(host[1][name], value, rtol=1e-4, atol=1e-5, err_msg=name)


# two ranks (`python -m onnxjob run --nproc 2`): the script switches the path on and
# checks every conversion for a copy, then reports how many it made
DLPACK_ON = """
from onnxjob.runtime import value_paths as _paths
_paths.DLPACK_ON_CPU = True
_counts = {"to_torch": 0, "to_ort": 0}
def _checked(name, convert):
    def wrapped(value):
        out = convert(value)
        if name == "to_ort":
            assert value.is_contiguous(), "to_ort of a non-contiguous tensor copies"
        assert out.data_ptr() == value.data_ptr(), name + " copied"
        _counts[name] += 1
        return out
    return wrapped
_paths.to_torch = _checked("to_torch", _paths.to_torch)
_paths.to_ort = _checked("to_ort", _paths.to_ort)
import atexit
atexit.register(lambda: print("DLPACK " + os.environ.get("RANK", "-") + " " + json.dumps(_counts),
                              file=sys.stderr))
"""


@pytest.mark.parametrize("net,config", [
    ("mlp", ""),
    ("conv_bn", ""),        # synchronized batch norm: all-gathers and all-reduces in stages
    ("conv_bn", "config.all_reduce_group_min_mbyte(0.0001)"),      # a bucket per few grads
    ("mlp", "config.all_reduce_fp16(True)"),
    # gradients added over the micro-batches as torch tensors, reduced once
    ("mlp", "config.train.num_gradient_accumulation_steps(2)")])
def test_two_ranks_dlpack_path_equals_the_numpy_path(tmp_path, net, config):
    (tmp_path / "host").mkdir()
    (tmp_path / "dlpack").mkdir()
    host_script = write_script(tmp_path / "host", net, mean_loss=True, config=config)
    # (the NumPy path's run is test_distributed.py's two-rank run of the same script)
    host, host_checkpoint = run_once(host_script, 2)
    assert host.returncode == 0, host.stderr
    dlpack_script = write_script(tmp_path / "dlpack", net, mean_loss=True,
                                 config=config + "\n" + DLPACK_ON)
    dlpack = run(dlpack_script, 2, tmp_path / "dlpack" / "ck")
    assert dlpack.returncode == 0, dlpack.stderr
    # (the ranks' lines may interleave on the shared stderr)
    reports = dict(re.findall(r"DLPACK (\d) (\{[^}]*\})", dlpack.stderr))
    assert sorted(reports) == ["0", "1"], dlpack.stderr
    for counts in reports.values():
        counts = json.loads(counts)
        assert counts["to_torch"] > 0 and counts["to_ort"] > 0, counts
    assert json.loads(dlpack.stdout) == json.loads(host.stdout)
    host_vars, dlpack_vars = trained(host_checkpoint), trained(tmp_path / "dlpack" / "ck")
    assert sorted(dlpack_vars) == sorted(host_vars)
    for name, value in host_vars.items():
        np.testing.assert_array_equal(dlpack_vars[name], value, err_msg=name)
