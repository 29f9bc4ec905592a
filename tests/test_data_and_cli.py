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


def test_load_mnist_downloads_when_missing(tmp_path, mnist_path, capsys, monkeypatch):
    monkeypatch.delenv("ONNXJOB_MNIST", raising=False)   # a local copy would be read instead
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
    script.write_text(   # (np.float: the names NumPy removed are given back, as on `run`)
        "import numpy as np\nimport onnxjob as flow\nimport onnxjob.typing as tp\n\n"
        "ONE = np.float(1)\n\n"
        "@flow.global_function()\n"
        "def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:\n"
        "    w = flow.get_variable('w', (3, 4), initializer=flow.constant_initializer(ONE))\n"
        "    return flow.matmul(x, w)\n\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('the main block must not run on export')\n")
    out = tmp_path / "m.onnx"
    subprocess.run([sys.executable, "-m", "onnxjob", "export", f"{script}:predict", "-o",
                    str(out)], check=True, cwd=ROOT, capture_output=True)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.full((2, 4), 3.0, np.float32))
    bad = subprocess.run([sys.executable, "-m", "onnxjob", "export", f"{script}:nope", "-o",
                          str(out)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "no job function named 'nope'" in bad.stderr


@pytest.mark.skipif(runtime.cuda_usable(),
                    reason="checks the error on machines without a usable GPU")
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


def test_load_mnist_subset_ships_with_the_package():
    (xtr, ytr), (xte, yte) = flow.data.load_mnist_subset(100, 100)
    assert xtr.shape == (60, 100, 1, 28, 28) and ytr.shape == (60, 100)
    assert xte.shape == (10, 100, 1, 28, 28) and yte.shape == (10, 100)
    assert xtr.dtype == np.float32 and ytr.dtype == np.int32
    assert 0.0 <= xtr.min() <= xtr.max() <= 1.0
    assert set(np.unique(ytr)) == set(range(10))
    (nhwc, _), _ = flow.data.load_mnist_subset(50, 50, data_format="NHWC")
    assert nhwc.shape == (120, 50, 28, 28, 1)


def test_load_mnist_subset_is_the_start_of_the_full_set(mnist_path):
    (xtr, ytr), (xte, yte) = flow.data.load_mnist_subset(100, 100)
    (ftr, fytr), (fte, fyte) = flow.data.load_mnist(100, 100, out_dir=os.path.dirname(mnist_path))
    assert np.array_equal(xtr, ftr[:60]) and np.array_equal(ytr, fytr[:60])
    assert np.array_equal(xte, fte[:10]) and np.array_equal(yte, fyte[:10])


def test_failed_mnist_download_is_one_clear_error(tmp_path, monkeypatch):
    from onnxjob.io.mnist import MNISTDownloadError
    monkeypatch.delenv("ONNXJOB_MNIST", raising=False)
    url = "file://" + str(tmp_path / "absent.npz")
    with pytest.raises(MNISTDownloadError) as info:
        flow.data.load_mnist(out_dir=str(tmp_path / "cache"), url=url)
    message = str(info.value)
    assert "\n" not in message and url in message and "ONNXJOB_MNIST" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not any(p.name.endswith(".part") for p in (tmp_path / "cache").iterdir())


def test_quickstart_falls_back_to_the_shipped_subset(tmp_path):
    """Offline the quickstart says so in one line, trains on the subset and exports; no
    traceback."""
    from onnxjob.io import mnist
    env = {k: v for k, v in os.environ.items() if k != "ONNXJOB_MNIST"}
    code = ("import sys, runpy, urllib.error, onnxjob.io.mnist as m\n"
            "def offline(url, path):\n"
            "    raise urllib.error.URLError('no network here')\n"
            "m._fetch = offline\n"
            "sys.argv = ['quickstart.py', '--steps', '20', '--output', 'q.onnx']\n"
            f"sys.path.insert(0, {os.path.join(ROOT, 'examples')!r})\n"
            f"runpy.run_path({os.path.join(ROOT, 'examples', 'quickstart.py')!r}, "
            "run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == ("quickstart: could not download MNIST from " + mnist.ONEFLOW_URL +
                        ": no network here; set ONNXJOB_MNIST to a local mnist.npz")
    assert lines[1].startswith("quickstart: using the MNIST subset shipped with onnxjob")
    assert "trained 20 steps" in done.stdout and "test accuracy" in done.stdout
    assert onnx.load(str(tmp_path / "q.onnx")).graph.node


def test_both_onnxruntime_wheels_installed_warns_once(monkeypatch, capsys):
    from importlib import metadata
    versions = {"onnxruntime": "1.20.0", "onnxruntime-gpu": "1.20.0"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, "version", version)
    runtime.check_one_onnxruntime.cache_clear()
    try:
        message = runtime.check_one_onnxruntime()
        runtime.check_one_onnxruntime()
        err = capsys.readouterr().err
        assert err.count("onnxjob: both onnxruntime and onnxruntime-gpu are installed") == 1
        assert "pip uninstall -y onnxruntime onnxruntime-gpu" in message
        del versions["onnxruntime-gpu"]
        runtime.check_one_onnxruntime.cache_clear()
        assert runtime.check_one_onnxruntime() is None and capsys.readouterr().err == ""
    finally:
        runtime.check_one_onnxruntime.cache_clear()
