import os
import shutil
import tempfile

import pytest

import onnxjob as flow

HERE = os.path.dirname(os.path.abspath(__file__))
MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist.npz"))
_OWN_CACHE = []
_REPORTED = pytest.StashKey[list]()


def pytest_configure(config):
    """The run's own session cache (runtime/session_cache.py), removed at the end: the
    tests use it (a graph built twice is loaded from it) without filling the user's."""
    if "ONNXJOB_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="onnxjob-test-cache-"))
        os.environ["ONNXJOB_CACHE_DIR"] = _OWN_CACHE[0]
    # The suite checks float32 results against NumPy and PyTorch's CPU at float32
    # tolerances (1e-5); on a GPU onnxruntime's default TF32 convolutions and matmuls
    # (OneFlow's default too) round inputs to 10 mantissa bits and miss those by 1e-3.
    # test_cuda.py checks the TF32 switch itself; a run may still choose it explicitly.
    os.environ.setdefault("ONNXJOB_CUDA_TF32", "0")


def pytest_unconfigure(config):
    for folder in _OWN_CACHE:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def report_line(request):
    """A function that adds a line to the run's terminal summary, shown without `-s`
    (counts a test wants seen, e.g. how many of its cases compared values)."""
    return request.config.stash.setdefault(_REPORTED, []).append


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    lines = config.stash.get(_REPORTED, [])
    if lines:
        terminalreporter.section("reported by the tests")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts with an empty session, as OneFlow's tests do."""
    from onnxjob.frontend.config import process_config
    flow.clear_default_session()
    process_config.reset()
    yield
    flow.clear_default_session()
    process_config.reset()


@pytest.fixture
def mnist_path():
    if not os.path.isfile(MNIST):
        pytest.skip(f"MNIST not found at {MNIST} (the shared data folder must sit beside the repo)")
    return MNIST
