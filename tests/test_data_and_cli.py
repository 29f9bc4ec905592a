"""load_mnist (spec §7), the export command line, and device selection errors."""
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.runtime import backend as runtime
from onnxjob.runtime.session import default_session
from onnxjob.errors import DeviceUnavailableError

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_load_mnist_shapes_dtypes_and_ranges(mnist_path, capsys):
    (xtr, ytr), (xte, yte) = flow.data.load_mnist(100, 100, out_dir=os.path.dirname(mnist_path))
    assert "already exist" in capsys.readouterr().out
    assert xtr.shape == (600, 100, 1, 28, 28) and ytr.shape == (600, 100)
    assert xte.shape == (100, 100, 1, 28, 28) and yte.shape == (100, 100)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int32
    assert 0.0 <= xtr.min() and xtr.max() <= 1.0
    (nhwc, _), _ = flow.data.load_mnist(50, 50, data_format="NHWC",
                                         out_dir=os.path.dirname(mnist_path))
    assert nhwc.shape == (1200, 50, 28, 28, 1)
    with pytest.raises(ValueError):
        flow.data.load_mnist(7, 100, out_dir=os.path.dirname(mnist_path))


def test_load_mnist_hash_mismatch(tmp_path, mnist_path):
    shutil.copy(mnist_path, tmp_path / "mnist.npz")
    with pytest.raises(Exception, match="sha256 verification failed"):
        flow.data.load_mnist(out_dir=str(tmp_path), hash_check="0" * 64)
    flow.data.load_mnist(out_dir=str(tmp_path), hash_check=None)


def test_load_mnist_downloads_when_missing(tmp_path, mnist_path, capsys):
    url = "file://" + os.path.abspath(mnist_path)
    (xtr, _), _ = flow.data.load_mnist(out_dir=str(tmp_path / "cache"), url=url)
    out = capsys.readouterr().out
    assert "downloading" in out and "Done!" in out and xtr.shape[0] == 600
    assert (tmp_path / "cache" / "mnist.npz").is_file()


def test_load_mnist_never_unpickles(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=np.array([object()]), y_train=np.zeros(1),
             x_test=np.zeros(1), y_test=np.zeros(1))
    with pytest.raises(ValueError, match="allow_pickle"):
        flow.data.load_mnist(out_dir=str(tmp_path), hash_check=None)


def test_export_command_line(tmp_path):
    script = tmp_path / "job_script.py"
    script.write_text(
        "import onnxjob as flow\nimport onnxjob.typing as tp\n\n"
        "@flow.global_function()\n"
        "def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:\n"
        "    w = flow.get_variable('w', (3, 4), initializer=flow.ones_initializer())\n"
        "    return flow.matmul(x, w)\n\n"
        "if __name__ == '__main__':\n    raise SystemExit('the main block must not run on export')\n")
    out = tmp_path / "m.onnx"
    subprocess.run([sys.executable, "-m", "onnxjob", "export", f"{script}:predict", "-o", str(out)],
                   check=True, cwd=ROOT, capture_output=True)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.full((2, 4), 3.0, np.float32))
    bad = subprocess.run([sys.executable, "-m", "onnxjob", "export", f"{script}:nope", "-o", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "no job function named 'nope'" in bad.stderr


@pytest.mark.skipif(runtime.cuda_usable(), reason="checks the error on machines without a usable GPU")
def test_asking_for_a_gpu_that_is_not_there_fails_clearly():
    config = flow.function_config()
    config.execution_provider("cuda")

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x

    with pytest.raises(DeviceUnavailableError, match="CUDA execution provider"):
        job(np.zeros(2, np.float32))


def test_placement_gpu_without_gpu_is_advisory():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0-1"):
            return x + 1

    assert np.array_equal(job(np.zeros(2, np.float32)), np.ones(2, np.float32))


@pytest.mark.skipif(not runtime.cuda_usable(), reason="needs a GPU usable by onnxruntime's CUDA EP")
def test_cuda_run_matches_cpu_reference(monkeypatch):
    from models import define_jobs, lenet, random_batch
    train_job, eval_job = define_jobs(lenet, {"train": False})
    images, labels = random_batch()
    out = eval_job(images)
    assert default_session().device == "cuda"
    weights = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    flow.clear_default_session()
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")
    _, eval_cpu = define_jobs(lenet, {"train": False})
    flow.load_variables(weights)
    np.testing.assert_allclose(eval_cpu(images), out, rtol=1e-3, atol=1e-3)
