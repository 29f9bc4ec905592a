"""The CUDA path: device-resident variables, CUDA graph replays, and the notice when a GPU
is present but onnxruntime cannot use it. The GPU tests skip without a usable CUDA EP;
the notice tests run everywhere (they fake the machine)."""
import os

import numpy as np
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.runtime import backend, cuda_libraries
from onnxjob.runtime.session import default_session

from models import BATCH, lenet, random_batch

needs_cuda = pytest.mark.skipif(not backend.cuda_usable(),
                                reason="needs a GPU usable by onnxruntime's CUDA EP")


def define_lenet_jobs(cuda_graph, dropout=False):
    config = flow.function_config()
    config.execution_provider("cuda")
    config.enable_cuda_graph(cuda_graph)

    @flow.global_function(type="train", function_config=config)
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        logits = lenet(images, train=dropout)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
        lr = flow.optimizer.PiecewiseConstantScheduler([], [0.05])
        flow.optimizer.SGD(lr, momentum=0.9).minimize(loss)
        return loss

    @flow.global_function(type="predict", function_config=config)
    def eval_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)) -> tp.Numpy:
        return lenet(images)

    return train_job, eval_job


def train_and_predict(cuda_graph, initial=None, steps=5):
    """Alternate train steps and predictions on a few batches; return the losses, the
    predictions, the final variables and the train job's runtime."""
    flow.clear_default_session()
    flow.config.seed(7)
    train_job, eval_job = define_lenet_jobs(cuda_graph)
    if initial is not None:
        flow.load_variables(initial)
    losses, predictions = [], []
    for step in range(steps):
        images, labels = random_batch(step)
        losses.append(train_job(images, labels))
        if step % 2:
            predictions.append(eval_job(images))
    final = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    return losses, predictions, final, default_session().runtimes["train_job"]


@needs_cuda
def test_cuda_graph_steps_match_plain_cuda_steps():
    plain_losses, plain_predictions, plain_final, plain = train_and_predict(False)
    losses, predictions, final, graphed = train_and_predict(True)
    assert plain._graph is None and graphed._graph is not None, "graphs were not used"
    for ours, ref in zip(losses + predictions, plain_losses + plain_predictions):
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)
    for name, value in plain_final.items():
        np.testing.assert_allclose(final[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@needs_cuda
def test_a_cuda_train_session_runs_its_optimized_graph_in_the_graph_s_order(capfd):
    """runtime/graph_order.py on the CUDA EP: the optimized train graph, its nodes put back
    in the graph's order, loads with the optimizer off (no fallback to onnxruntime's own
    order) and trains."""
    losses, _, _, runtime = train_and_predict(False)
    assert not getattr(runtime.ort_session, "fallback_reason", None)
    assert "could not load its optimized train graph" not in capfd.readouterr().err
    assert np.isfinite(losses).all()


@needs_cuda
def test_a_second_cuda_start_loads_the_graph_ordered_model_from_the_cache(tmp_path, monkeypatch):
    """A CUDA train session's reordered model is cached (runtime/session_cache.py): the next
    start makes no optimizing session and trains the same."""
    from onnxjob.runtime import graph_order
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    first = train_and_predict(False)
    cached = [p for p in tmp_path.iterdir() if not p.name.endswith(".passes.onnx")]
    assert cached, sorted(p.name for p in tmp_path.iterdir())

    def no_optimizing_session(*args, **kwargs):
        raise AssertionError("the cached graph-ordered model was not used")
    monkeypatch.setattr(graph_order, "session_in_graph_order", no_optimizing_session)
    second = train_and_predict(False)
    for ours, ref in zip(second[0] + second[1], first[0] + first[1]):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@needs_cuda
def test_cuda_graph_buffers_follow_a_checkpoint_load():
    """Loading variables between replays must reach the captured graphs' buffers."""
    losses, _, after, _ = train_and_predict(True, steps=4)
    reloaded_losses, _, reloaded_after, _ = train_and_predict(True, steps=4)
    np.testing.assert_allclose(reloaded_losses, losses, rtol=1e-5)
    # now continue from `after` in a fresh session, and from the middle of a graph run
    flow.clear_default_session()
    train_job, _ = define_lenet_jobs(True)
    images, labels = random_batch(0)
    for _ in range(3):     # both captured graphs run, the store points into their buffers
        train_job(images, labels)
    flow.load_variables(after)
    first = train_job(images, labels)
    flow.clear_default_session()
    train_job, _ = define_lenet_jobs(False)
    flow.load_variables(after)
    np.testing.assert_allclose(first, train_job(images, labels), rtol=1e-4, atol=1e-5)
    assert np.isfinite(reloaded_after["conv1-weight"]).all()


@needs_cuda
def test_random_ops_run_without_cuda_graph_and_say_why(capfd):
    train_job, _ = define_lenet_jobs(True, dropout=True)
    images, labels = random_batch(0)
    a, b = train_job(images, labels), train_job(images, labels)
    assert default_session().runtimes["train_job"]._graph is None
    assert "runs without CUDA graphs: its random ops (Dropout)" in capfd.readouterr().err
    assert not np.array_equal(a, b)


@needs_cuda
def test_variables_stay_on_the_device_between_steps():
    train_job, _ = define_lenet_jobs(True)
    images, labels = random_batch(0)
    train_job(images, labels)
    train_job(images, labels)
    stored = default_session().variable_values
    assert all(isinstance(v, ort.OrtValue) and v.device_name().lower() == "cuda"
               for v in stored.values())


def test_gpu_without_cuda_provider_says_which_package(monkeypatch, capfd):
    monkeypatch.setattr(cuda_libraries, "gpu_present", lambda: True)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    monkeypatch.delenv("ONNXJOB_DEVICE", raising=False)
    backend.warn_gpu_unused.cache_clear()
    try:
        message = backend.warn_gpu_unused()
    finally:
        backend.warn_gpu_unused.cache_clear()
    assert "NVIDIA GPU" in message and "CPU-only build" in message
    assert message in capfd.readouterr().err


def test_gpu_with_missing_cuda_library_names_it(monkeypatch):
    monkeypatch.setattr(ort, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])

    def missing_cudnn(path, mode=0):
        if path.endswith("libonnxruntime_providers_cuda.so"):
            raise OSError("libcudnn.so.9: cannot open shared object file: "
                          "No such file or directory")

    monkeypatch.setattr(cuda_libraries.ctypes, "CDLL", missing_cudnn)
    reason = cuda_libraries.provider_load_error()
    assert "libcudnn.so.9 is not found" in reason and "LD_LIBRARY_PATH" in reason


def test_no_notice_without_a_gpu(monkeypatch):
    monkeypatch.setattr(cuda_libraries, "gpu_present", lambda: False)
    backend.warn_gpu_unused.cache_clear()
    try:
        assert backend.warn_gpu_unused() is None
    finally:
        backend.warn_gpu_unused.cache_clear()


def test_driver_library_found_as_find_library_finds_it(monkeypatch, tmp_path):
    """The loader-cache check agrees with ctypes.util.find_library here, and a libcuda on
    LD_LIBRARY_PATH counts."""
    import ctypes.util
    assert cuda_libraries._driver_library_installed() == \
        (ctypes.util.find_library("cuda") is not None)
    (tmp_path / "libcuda.so.1").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", f"/nonexistent:{tmp_path}")
    assert cuda_libraries._driver_library_installed()


@needs_cuda
@pytest.mark.parametrize("tf32", [True, False])
def test_tensor_float_32_switch_rounds_matmuls_only_when_on(tf32):
    """flow.config.enable_tensor_float_32_compute(False) gives float32 matmuls on the GPU
    (the suite runs that way: conftest.py); on, the inputs are rounded to TF32."""
    flow.config.enable_tensor_float_32_compute(tf32)
    config = flow.function_config()
    config.execution_provider("cuda")
    a = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((512, 256)).astype(np.float32)

    @flow.global_function(type="predict", function_config=config)
    def product(x: tp.Numpy.Placeholder(a.shape), y: tp.Numpy.Placeholder(b.shape)) -> tp.Numpy:
        return flow.matmul(x, y)

    error = np.abs(product(a, b) - a.astype(np.float64) @ b.astype(np.float64)).max()
    # float32 accumulation of 512 products: ~1e-5; TF32's 10-bit mantissa: ~1e-2
    assert (error > 1e-3) if tf32 else (error < 1e-4), error


PLACED = """
import sys
import numpy as np
import torch
from onnxjob.runtime import backend
backend.to_device(np.ones(1 << 10, np.float32), "cuda")         # sessions, handles: warm
free = torch.cuda.mem_get_info()[0]
values = [backend.to_device(np.full(1 << 20, i, np.float32), "cuda") for i in range(130)]
used = free - torch.cuda.mem_get_info()[0]
assert all(float(v.numpy()[-1]) == i for i, v in enumerate(values))
print(used >> 20)
"""


@needs_cuda
def test_variables_on_the_gpu_take_what_they_hold():
    """130 values of 4 MiB (a train job's variables, runtime/device_values.py): in the
    arena the sessions share, which grows by the size asked, the device's memory grows by
    about their 520 MiB, where onnxruntime's Python constructor's own arena (doubling
    regions) may reserve up to twice that. In a fresh process, so that no arena has room
    left by earlier tests."""
    import subprocess
    import sys
    pytest.importorskip("torch")
    ran = {}
    for shared in ("1", "0"):
        env = {**os.environ, "ONNXJOB_CUDA_SHARED_ARENA": shared}
        done = subprocess.run([sys.executable, "-c", PLACED], env=env, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        ran[shared] = int(done.stdout.split()[-1])
    print(f"device memory for 520 MiB of values: {ran['1']} MiB in the shared arena, "
          f"{ran['0']} MiB through onnxruntime's constructor")
    assert ran["1"] <= 520 * 1.1 + 32


def _graph_job_and_plain_job(with_graph, with_plain, steps=6):
    """A LeNet train job replayed as CUDA graphs and an MLP train job of its own variables
    that runs without graphs, either or both, stepped in turn: the graph job's losses and
    the final variables."""
    flow.clear_default_session()
    flow.config.seed(11)
    config = flow.function_config()
    config.execution_provider("cuda")
    config.enable_cuda_graph(False)
    if with_graph:
        graph_train, _ = define_lenet_jobs(True)

    @flow.global_function(type="train", function_config=config)
    def plain_train(x: tp.Numpy.Placeholder((BATCH, 64))) -> tp.Numpy:
        h = flow.layers.dense(x, 256, activation=flow.nn.relu, name="plain-fc1",
                              kernel_initializer=flow.random_normal_initializer(stddev=0.05))
        loss = flow.math.reduce_mean(flow.math.square(flow.layers.dense(h, 1, name="plain-fc2")))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                           momentum=0.9).minimize(loss)
        return loss

    rng = np.random.default_rng(0)
    losses = []
    for step in range(steps):
        if with_graph:
            images, labels = random_batch(step)
            losses.append(graph_train(images, labels))
        if with_plain:
            plain_train(rng.standard_normal((BATCH, 64)).astype(np.float32))
    if with_graph:
        assert default_session().runtimes["train_job"]._graph is not None
    return losses, {k: v.numpy() for k, v in flow.get_all_variables().items()}


@needs_cuda
def test_a_graph_job_and_a_plain_job_keep_each_other_s_values():
    """A plain job's new variables are kept across the graph job's replays: they must not
    be given memory a captured graph writes its intermediates into (a capturing session
    keeps an arena of its own, runtime/backend.py create_session). Each job, stepped in
    turn with the other, ends as it ends alone."""
    graph_losses, graph_alone = _graph_job_and_plain_job(True, False)
    _, plain_alone = _graph_job_and_plain_job(False, True)
    losses, both = _graph_job_and_plain_job(True, True)
    np.testing.assert_allclose(losses, graph_losses, rtol=1e-5, atol=1e-6)
    for name, value in {**graph_alone, **plain_alone}.items():
        np.testing.assert_allclose(both[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
