"""Small OFRecord datasets written by the tests: MNIST digits as raw features or as PNG /
JPEG bytes, and RGB JPEGs laid out as OneFlow-Benchmark's ImageNet reader expects them
("encoded" bytes, "class/label" int32)."""
import io

import numpy as np
from PIL import Image

from onnxjob.io import ofrecord


def load_digits(mnist_path, count, split="train"):
    """(images (count, 28, 28) uint8, labels (count,) int32) of the MNIST npz."""
    data = np.load(mnist_path)
    return data[f"x_{split}"][:count], data[f"y_{split}"][:count].astype(np.int32)


def encode(pixels, fmt="PNG", quality=95):
    """The `fmt` bytes of an (H, W) or (H, W, 3) RGB uint8 image."""
    buffer = io.BytesIO()
    options = {"quality": quality} if fmt == "JPEG" else {}
    Image.fromarray(pixels).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def write_digits(data_dir, digits, labels, kind, data_part_num=1):
    """MNIST records: "images" raw (`kind` "raw": the bytes, plus "pixels" as an int32
    list) or encoded ("png", "jpeg"), and "labels" as an int64 list."""
    records = []
    for pixels, label in zip(digits, labels):
        features = {"labels": np.int64(label)}
        if kind == "raw":
            features["images"] = pixels.tobytes()
            features["pixels"] = pixels.astype(np.int32)
        else:
            features["images"] = encode(pixels, kind.upper())
        records.append(features)
    return ofrecord.write_dataset(str(data_dir), records, data_part_num)


def rgb_digits(digits, size):
    """MNIST digits upscaled to (size, size) and tinted into RGB images."""
    out = []
    for i, pixels in enumerate(digits):
        gray = np.asarray(Image.fromarray(pixels).resize((size, size), Image.BILINEAR))
        tint = np.array([1.0, 0.5 + 0.05 * (i % 10), 0.8], np.float32)
        out.append((gray[:, :, None] * tint).astype(np.uint8))
    return out


def write_imagenet_like(data_dir, images, labels, data_part_num=1):
    """OneFlow-Benchmark's ImageNet layout: JPEG "encoded", int32 "class/label"."""
    records = [{"encoded": encode(image, "JPEG"), "class/label": np.int32(label)}
               for image, label in zip(images, labels)]
    return ofrecord.write_dataset(str(data_dir), records, data_part_num)
