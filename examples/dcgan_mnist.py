"""DCGAN on MNIST with OneFlow-Benchmark's generator and discriminator, unchanged.

    python examples/dcgan_mnist.py --epochs 2 --out dcgan_out

The model is Generative/dcgan.py + layers.py from OneFlow-Benchmark (found beside the
repository in ../shared/clients, or at $ONEFLOW_BENCHMARK), imported through onnxjob's
`oneflow` alias; the training loop is this file's: Adam steps on the discriminator and
the generator (each job trains only its own network), a progress bar with the losses and
images/s, a 4x4 grid of samples from fixed noise after every epoch (`epoch_N.png`), the
loss curves at the end (`losses.png`) and the generator exported as `generator.onnx`.
MNIST comes from `flow.data.load_mnist` ($ONNXJOB_MNIST or ./mnist.npz).
"""
import argparse
import os

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import import_oneflow_module
from loss_plot import save_loss_plot

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARK = os.environ.get("ONEFLOW_BENCHMARK", os.path.join(
    HERE, "..", "..", "shared", "clients", "oneflow-benchmark"))
Z_DIM = 100


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--limit", type=int, default=60000, help="training images used per epoch")
    p.add_argument("--out", default="dcgan_out")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def define_jobs(gan, batch, lr):
    """Discriminator and generator train steps, and sampling, on the upstream networks."""
    def adam():
        return flow.optimizer.Adam(flow.optimizer.PiecewiseConstantScheduler([], [lr]),
                                   beta1=0.5)

    def bce(logits, target_like):
        return flow.nn.sigmoid_cross_entropy_with_logits(target_like(logits), logits)

    @flow.global_function(type="train")
    def train_discriminator(z: tp.Numpy.Placeholder((batch, Z_DIM)),
                            images: tp.Numpy.Placeholder((batch, 1, 28, 28))) -> tp.Numpy:
        fake = gan.discriminator(gan.generator(z, trainable=False), trainable=True)
        real = gan.discriminator(images, trainable=True, reuse=True)
        loss = bce(fake, flow.zeros_like) + bce(real, flow.ones_like)
        adam().minimize(loss)
        return flow.math.reduce_mean(loss)

    @flow.global_function(type="train")
    def train_generator(z: tp.Numpy.Placeholder((batch, Z_DIM))) -> tp.Numpy:
        loss = bce(gan.discriminator(gan.generator(z, trainable=True), trainable=False),
                   flow.ones_like)
        adam().minimize(loss)
        return flow.math.reduce_mean(loss)

    @flow.global_function(type="predict")
    def sample(z: tp.Numpy.Placeholder((batch, Z_DIM))) -> tp.Numpy:
        return gan.generator(z, trainable=False)

    return train_discriminator, train_generator, sample


def save_grid(images, path):
    """The first 16 images in [-1, 1] as a 4x4 grid PNG (2x upscaled)."""
    from PIL import Image
    tiles = ((images[:16, 0] + 1.0) * 127.5).clip(0, 255).astype(np.uint8)
    grid = tiles.reshape(4, 4, 28, 28).transpose(0, 2, 1, 3).reshape(4 * 28, 4 * 28)
    Image.fromarray(grid, mode="L").resize((224, 224), Image.NEAREST).save(path)


def main():
    from tqdm import tqdm
    args = parse()
    os.makedirs(args.out, exist_ok=True)
    flow.config.seed(args.seed)
    dcgan = import_oneflow_module(os.path.join(BENCHMARK, "Generative"), "dcgan")
    gan = dcgan.DCGAN(argparse.Namespace(gpu_num_per_node=1, learning_rate=args.lr,
                                         batch_size=args.batch_size))
    train_discriminator, train_generator, sample = define_jobs(gan, args.batch_size, args.lr)

    (train_images, _), _ = flow.data.load_mnist(100, 100)  # batches of 100 divide 60000
    images = train_images.reshape(-1, 1, 28, 28)[:args.limit] * 2.0 - 1.0  # [0,1] -> [-1,1]
    steps = len(images) // args.batch_size
    rng = np.random.default_rng(args.seed)
    fixed_z = rng.standard_normal((args.batch_size, Z_DIM)).astype(np.float32)
    d_losses, g_losses = [], []
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(images))
        bar = tqdm(range(steps), desc=f"epoch {epoch}/{args.epochs}", unit="step")
        for step in bar:
            batch = images[order[step * args.batch_size:(step + 1) * args.batch_size]]
            z = rng.standard_normal((args.batch_size, Z_DIM)).astype(np.float32)
            d_losses.append(float(train_discriminator(z, batch)))
            g_losses.append(float(train_generator(z)))
            if step % 20 == 0:
                rate = bar.format_dict["rate"] or 0.0
                bar.set_postfix(d_loss=f"{d_losses[-1]:.3f}", g_loss=f"{g_losses[-1]:.3f}",
                                img_s=f"{rate * args.batch_size:.0f}")
        save_grid(sample(fixed_z), os.path.join(args.out, f"epoch_{epoch}.png"))
    save_loss_plot(os.path.join(args.out, "losses.png"),
                   {"discriminator": d_losses, "generator": g_losses})
    flow.export(sample, os.path.join(args.out, "generator.onnx"))
    print(f"final losses: discriminator {np.mean(d_losses[-100:]):.3f}, generator "
          f"{np.mean(g_losses[-100:]):.3f} (means of the last 100 steps); wrote "
          f"{args.out}/epoch_*.png, losses.png, generator.onnx")


if __name__ == "__main__":
    main()
