"""flow.data.load_mnist (spec §7): the MNIST npz as batched float32 images / int32 labels.

`load_mnist_subset` reads the small subset shipped in onnxjob/data (see its README.md),
which needs no download.
"""
import hashlib
import os
import sys

import numpy as np

from onnxjob import settings

ONEFLOW_URL = "https://oneflow-public.oss-cn-beijing.aliyuncs.com/datasets/mnist.npz"
ONEFLOW_SHA256 = "63d4344077849053dc3036b247fa012b2b381de53fd055a66b539dffd76cf08e"
# NOTE: the MNIST file shipped beside this project is a rebuild with the same arrays
# (test set byte-identical to LeCun's files) but not OneFlow's bytes; both hashes are
# accepted by default so the doc scripts run offline with their own hash check on.
KNOWN_SHA256 = {ONEFLOW_SHA256,
                "06af5dfe73b70e3bc1c36439982b18a8d76803db9b544f6fdf838a37fbb01b64"}


SUBSET_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                           "mnist_subset.npz")


class MNISTDownloadError(OSError):
    """The MNIST file could not be downloaded; the message is one line naming the URL and why."""


def _download(url, path):
    import urllib.error
    try:
        _fetch(url, path)
    except (urllib.error.URLError, OSError, ValueError) as e:
        try:
            os.remove(path + ".part")
        except OSError:
            pass
        reason = getattr(e, "reason", None) or e
        raise MNISTDownloadError(f"could not download MNIST from {url}: {reason}; set "
                                 f"ONNXJOB_MNIST to a local mnist.npz") from None


def _fetch(url, path):
    import urllib.request
    with urllib.request.urlopen(url, timeout=60) as response:
        total = int(response.headers.get("Content-Length", 0))
        print("File size: %.4f kb, downloading..." % (total / 1024))
        done = 0
        with open(path + ".part", "wb") as f:
            while True:
                chunk = response.read(1 << 16)
                if not chunk:
                    break
                f.write(chunk)
                done += len(chunk)
                if total:
                    bar = int(40 * done / total)
                    sys.stdout.write("\r[" + "#" * bar + " " * (40 - bar) + f"] {100 * done // total}%")
                    sys.stdout.flush()
        os.replace(path + ".part", path)
    print("\nDone!")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_mnist(train_batch_size=100, test_batch_size=100, data_format="NCHW", url=ONEFLOW_URL,
               hash_check=ONEFLOW_SHA256, out_dir="."):
    """((train_images, train_labels), (test_images, test_labels)), batched, unshuffled.

    Reads `out_dir/mnist.npz`; if absent, `$ONNXJOB_MNIST` names a local copy, else the
    file is downloaded from `url` (MNISTDownloadError when that fails). `hash_check=None`
    skips the sha256 check.
    """
    path = os.path.join(out_dir, "mnist.npz")
    if not os.path.isfile(path) and settings.get("MNIST"):
        path = settings.get("MNIST")
    if not os.path.isfile(path):
        os.makedirs(out_dir, exist_ok=True)
        _download(url, path)
    print("File mnist.npz already exist, path: %s" % path)
    if hash_check is not None:
        digest = _sha256(path)
        accepted = KNOWN_SHA256 if hash_check == ONEFLOW_SHA256 else {hash_check}
        if digest not in accepted:
            raise Exception("sha256 verification failed, remove %s and try again" % path)
    return _batched(path, train_batch_size, test_batch_size, data_format)


def load_mnist_subset(train_batch_size=100, test_batch_size=100, data_format="NCHW"):
    """load_mnist's arrays from the subset shipped with onnxjob: MNIST's first 6,000
    training and first 1,000 test images. No download, no hash check."""
    return _batched(SUBSET_PATH, train_batch_size, test_batch_size, data_format)


def _batched(path, train_batch_size, test_batch_size, data_format):
    with np.load(path, allow_pickle=False) as f:
        x_train, y_train, x_test, y_test = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    x_train = x_train.astype(np.float32) / 255.0
    x_test = x_test.astype(np.float32) / 255.0
    y_train = y_train.astype(np.int32)
    y_test = y_test.astype(np.int32)
    if data_format == "NCHW":
        img_shape = (1, 28, 28)
    else:
        img_shape = (28, 28, 1)
    train_images = x_train.reshape((-1, train_batch_size) + img_shape)
    train_labels = y_train.reshape(-1, train_batch_size)
    test_images = x_test.reshape((-1, test_batch_size) + img_shape)
    test_labels = y_test.reshape(-1, test_batch_size)
    return (train_images, train_labels), (test_images, test_labels)
