"""The examples of OneFlow-Benchmark's models run end to end (a few steps each)."""
import os
import subprocess
import sys

import pytest

from upstream import ROOT, upstream_dir

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
MNIST = os.path.join(ROOT, "..", "..", "data", "mnist.npz")


def run_example(name, *args, cwd, env=None):
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, name), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_bert_pretrain(tmp_path):
    upstream_dir("LanguageModeling", "BERT")
    out = run_example("bert_pretrain.py", "--steps", "4", "--batch-size", "8", "--out", "out",
                      cwd=tmp_path)
    assert "masked-token accuracy" in out
    assert {"losses.png", "bert_encoder.onnx"} <= set(os.listdir(tmp_path / "out"))


def test_wide_deep_synthetic(tmp_path):
    upstream_dir("ClickThroughRate", "WideDeepLearning")
    pytest.importorskip("sklearn", reason="wdl_train_eval.py imports scikit-learn")
    out = run_example("wide_deep_synthetic.py", "--steps", "4", "--batch-size", "64",
                      "--out", "out", cwd=tmp_path)
    assert "held-out AUC" in out
    assert {"losses.png", "wide_deep.onnx"} <= set(os.listdir(tmp_path / "out"))


def test_dcgan_mnist(tmp_path):
    upstream_dir("Generative")
    if not os.path.isfile(MNIST):
        pytest.skip(f"MNIST is not at {MNIST}")
    # a batch size that does not divide the 60000 training images
    out = run_example("dcgan_mnist.py", "--limit", "128", "--batch-size", "64", "--out", "out",
                      cwd=tmp_path, env={"ONNXJOB_MNIST": MNIST})
    assert "final losses" in out
    assert {"epoch_1.png", "losses.png", "generator.onnx"} <= set(os.listdir(tmp_path / "out"))
