"""OneFlow-Benchmark's DCGAN (Generative/dcgan.py, layers.py), unchanged.

dcgan.py's own `load_mnist` reads all 70000 MNIST images from IDX files (downloading them
when absent) with NumPy aliases that NumPy 1.24 removed (`np.float`, `np.int`): under
`python -m onnxjob run`, which gives them back, it runs as written
(test_upstream_load_mnist_runs_unchanged_under_the_runner); the training tests take a
few images from the shared mnist.npz through a subclass instead, for time.
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from upstream import ROOT, import_upstream

MNIST = os.path.join(ROOT, "..", "..", "data", "mnist.npz")
BATCH, Z_DIM = 8, 100


def dcgan_module():
    pytest.importorskip("matplotlib", reason="dcgan.py imports matplotlib")
    pytest.importorskip("imageio", reason="dcgan.py imports imageio")
    if not os.path.isfile(MNIST):
        pytest.skip(f"MNIST is not at {MNIST}")
    return import_upstream("dcgan", "Generative")


def mnist_images(count):
    """The first `count` MNIST training images, (N, 1, 28, 28) in [-1, 1] as dcgan.py has them."""
    with np.load(MNIST) as f:
        images = f["x_train"][:count].astype(np.float32).reshape(-1, 1, 28, 28)
    return (images - 127.5) / 127.5


def test_upstream_load_mnist_runs_unchanged_under_the_runner(tmp_path):
    dcgan_module()
    folder = tmp_path / "data" / "mnist"
    folder.mkdir(parents=True)
    with np.load(MNIST) as f:
        parts = {"train": (f["x_train"], f["y_train"]), "t10k": (f["x_test"], f["y_test"])}
    for part, (images, labels) in parts.items():     # the IDX files dcgan.py reads
        (folder / f"{part}-images-idx3-ubyte").write_bytes(
            bytes(16) + images.astype(np.uint8).tobytes())
        (folder / f"{part}-labels-idx1-ubyte").write_bytes(
            bytes(8) + labels.astype(np.uint8).tobytes())
    driver = tmp_path / "load.py"
    driver.write_text(
        "import argparse, sys\n"
        f"sys.path.insert(0, {os.path.join(ROOT, 'Generative')!r})\n"
        "import dcgan\n"
        "gan = dcgan.DCGAN(argparse.Namespace(gpu_num_per_node=1, learning_rate=1e-4,\n"
        "                                     batch_size=16))\n"
        "x, y = gan.load_mnist()\n"
        "print('loaded', x.shape, x.dtype, y.shape, x.min(), x.max(), y.sum())\n")
    done = subprocess.run([sys.executable, "-m", "onnxjob", "run", str(driver)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "loaded (70000, 1, 28, 28) float64 (70000, 10) -1.0 1.0 70000.0" in done.stdout
    assert "numpy.float was removed in NumPy 1.24" in done.stderr


def make_gan(dcgan, batch=BATCH, lr=1e-4, eval_interval=100, limit=BATCH * 4):
    class LocalMnistDCGAN(dcgan.DCGAN):
        def load_mnist(self):
            return mnist_images(limit), None

    gan = LocalMnistDCGAN(argparse.Namespace(gpu_num_per_node=1, learning_rate=lr,
                                             batch_size=batch))
    gan.eval_interval = eval_interval
    return gan


def test_upstream_training_loop_runs(tmp_path, monkeypatch, capsys):
    """DCGAN.train as upstream wrote it: OneFlow's old job API (global_function(config),
    FixedTensorDef defaults, config.train.*, losses.add_loss, .get()), its image dumps
    (matplotlib) and its checkpoint."""
    dcgan = dcgan_module()
    monkeypatch.chdir(tmp_path)
    # upstream's image dump shows 16 samples, so batches of 16
    gan = make_gan(dcgan, batch=16, eval_interval=2, limit=16 * 4)
    gan.train(epochs=1, save=True)
    printed = [line for line in capsys.readouterr().out.splitlines() if "th batch" in line]
    assert len(printed) == 2 and "dloss:" in printed[0]
    assert sorted(os.listdir("gout")) == ["image_01_0002.png", "image_01_0004.png"]
    (snapshot,) = os.listdir("checkpoint")
    assert os.path.isfile(os.path.join("checkpoint", snapshot, "snapshot_done"))
    assert os.path.isdir(os.path.join("checkpoint", snapshot, "g_deconv2-weight"))


def define_jobs(gan, lr):
    """Discriminator and generator train steps and a sampling job on the upstream model."""
    def adam():
        return flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [lr]))

    @flow.global_function(type="train")
    def train_discriminator(z: tp.Numpy.Placeholder((BATCH, Z_DIM)),
                            images: tp.Numpy.Placeholder((BATCH, 1, 28, 28))) -> tp.Numpy:
        fake = gan.discriminator(gan.generator(z, trainable=False), trainable=True)
        real = gan.discriminator(images, trainable=True, reuse=True)
        loss = (flow.nn.sigmoid_cross_entropy_with_logits(flow.zeros_like(fake), fake)
                + flow.nn.sigmoid_cross_entropy_with_logits(flow.ones_like(real), real))
        adam().minimize(loss)
        return loss

    @flow.global_function(type="train")
    def train_generator(z: tp.Numpy.Placeholder((BATCH, Z_DIM))) -> tp.Numpy:
        logits = gan.discriminator(gan.generator(z, trainable=True), trainable=False)
        loss = flow.nn.sigmoid_cross_entropy_with_logits(flow.ones_like(logits), logits)
        adam().minimize(loss)
        return loss

    @flow.global_function(type="predict")
    def sample(z: tp.Numpy.Placeholder((BATCH, Z_DIM))) -> tp.Numpy:
        return gan.generator(z, trainable=False)

    return train_discriminator, train_generator, sample


def test_discriminator_and_generator_train_and_the_generator_exports(tmp_path):
    dcgan = dcgan_module()
    flow.config.seed(0)
    gan = make_gan(dcgan)
    train_discriminator, train_generator, sample = define_jobs(gan, lr=2e-4)
    rng = np.random.default_rng(0)
    z = rng.standard_normal((BATCH, Z_DIM)).astype(np.float32)
    images = mnist_images(BATCH)

    generator_before = flow.get_all_variables()["g_deconv3-weight"].numpy().copy()
    d_losses = [float(train_discriminator(z, images).mean()) for _ in range(5)]
    assert d_losses[-1] < 0.8 * d_losses[0], d_losses
    # the discriminator's job leaves the generator's weights alone (trainable=False there)
    np.testing.assert_array_equal(flow.get_all_variables()["g_deconv3-weight"].numpy(),
                                  generator_before)
    g_losses = [float(train_generator(z).mean()) for _ in range(5)]
    assert g_losses[-1] < g_losses[0], g_losses

    samples = sample(z)
    assert samples.shape == (BATCH, 1, 28, 28) and np.abs(samples).max() <= 1.0
    path = str(tmp_path / "generator.onnx")
    flow.export(sample, path)
    fresh = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fresh.run(None, {"z": z})[0], samples, rtol=1e-5, atol=1e-6)
