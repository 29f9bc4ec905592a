import os

import pytest

import onnxjob as flow

HERE = os.path.dirname(os.path.abspath(__file__))
MNIST = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data", "mnist.npz"))


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
