"""OneFlow-Benchmark's Wide & Deep (ClickThroughRate/WideDeepLearning/wdl_train_eval.py),
unchanged: its synthetic-data run, LazyAdam's sparse updates, a predict job that exports."""
import os
import runpy
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from upstream import upstream_dir

SMALL = ["--dataset_format=synthetic", "--batch_size=64", "--wide_vocab_size=1000",
         "--deep_vocab_size=1000", "--deep_embedding_vec_size=8", "--hidden_units_num=2",
         "--hidden_size=32", "--gpu_num_per_node=1"]


def script():
    pytest.importorskip("sklearn", reason="wdl_train_eval.py imports scikit-learn")
    return os.path.join(upstream_dir("ClickThroughRate", "WideDeepLearning"),
                        "wdl_train_eval.py")


def load_script(monkeypatch, *flags):
    """The script's namespace (its jobs registered, main() not run), parsed with `flags`."""
    from onnxjob.compat import install_oneflow_alias
    path = script()
    install_oneflow_alias()
    monkeypatch.setattr(sys, "argv", [path, *SMALL, *flags])
    return runpy.run_path(path, run_name="wdl_train_eval")


def test_the_script_trains_and_reports_auc(tmp_path):
    done = subprocess.run([sys.executable, "-m", "onnxjob", "run", script(), *SMALL,
                           "--max_iter=20", "--loss_print_every_n_iter=5", "--eval_interval=10",
                           "--eval_batchs=2"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    evals = [line.split() for line in done.stdout.splitlines() if "eval_auc" in line]
    assert [e[0] for e in evals] == ["10", "20"]
    assert all(0.0 <= float(e[-1]) <= 1.0 for e in evals)


def test_lazy_adam_moves_only_the_rows_looked_up(monkeypatch):
    namespace = load_script(monkeypatch)
    flow.config.seed(0)
    before = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    namespace["train_job"]().get()
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    # the synthetic sparse fields are zeros: only row 0 of each table is looked up
    for table in ("wide_embedding", "deep_embedding"):
        assert not np.array_equal(after[table][0], before[table][0])
        np.testing.assert_array_equal(after[table][1:], before[table][1:])
        for state in ("m", "v"):
            np.testing.assert_array_equal(after[f"{table}-{state}"][1:], 0)
    assert not np.array_equal(after["fc1-weight"], before["fc1-weight"])  # dense: all move
    # train and eval jobs share the variables: eval sees the trained ones
    loss, predict, labels = namespace["eval_job"]().get()
    assert predict.shape == (64, 1) and labels.numpy().dtype == np.int32


def test_a_predict_job_of_the_model_exports(monkeypatch, tmp_path):
    namespace = load_script(monkeypatch)
    model = namespace["_model"]

    @flow.global_function()
    def score(dense: tp.Numpy.Placeholder((64, 13)),
              wide: tp.Numpy.Placeholder((64, 2), dtype=flow.int32),
              deep: tp.Numpy.Placeholder((64, 26), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.sigmoid(model(dense, wide, deep))

    rng = np.random.default_rng(0)
    feeds = {"dense": rng.random((64, 13), dtype=np.float32),
             "wide": rng.integers(0, 1000, (64, 2)).astype(np.int32),
             "deep": rng.integers(0, 1000, (64, 26)).astype(np.int32)}
    scores = score(*feeds.values())
    assert scores.shape == (64, 1) and ((scores > 0) & (scores < 1)).all()
    path = str(tmp_path / "wdl.onnx")
    flow.export(score, path)
    fresh = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fresh.run(None, feeds)[0], scores, rtol=1e-5, atol=1e-7)


def test_loss_falls_on_a_fixed_batch(monkeypatch):
    """Upstream's model and CreateOptimizer (LazyAdam) on placeholders: 5 steps, one batch."""
    namespace = load_script(monkeypatch, "--learning_rate=0.01")
    model, create_optimizer, flags = (namespace[k] for k in ("_model", "CreateOptimizer",
                                                             "FLAGS"))

    config = flow.function_config()     # as upstream's train job: the tables row-sparse
    config.indexed_slices_optimizer_conf(
        dict(include_op_names=dict(op_name=["wide_embedding", "deep_embedding"])))

    @flow.global_function(type="train", function_config=config)
    def step(labels: tp.Numpy.Placeholder((64, 1), dtype=flow.int32),
             dense: tp.Numpy.Placeholder((64, 13)),
             wide: tp.Numpy.Placeholder((64, 2), dtype=flow.int32),
             deep: tp.Numpy.Placeholder((64, 26), dtype=flow.int32)) -> tp.Numpy:
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels, model(dense, wide, deep))
        create_optimizer(flags).minimize(loss)
        return flow.math.reduce_mean(loss)

    rng = np.random.default_rng(0)
    batch = (rng.integers(0, 2, (64, 1)).astype(np.int32), rng.random((64, 13), np.float32),
             rng.integers(0, 1000, (64, 2)).astype(np.int32),
             rng.integers(0, 1000, (64, 26)).astype(np.int32))
    flow.config.seed(0)
    losses = [float(step(*batch)) for _ in range(5)]
    assert losses[-1] < 0.9 * losses[0], losses


def test_the_script_reads_its_ofrecord_dataset(tmp_path):
    """--dataset_format=ofrecord: the upstream readers and raw decoders on part files."""
    from onnxjob.io import ofrecord
    rng = np.random.default_rng(0)
    records = [{"labels": rng.integers(0, 2, 1).astype(np.int32),
                "dense_fields": rng.random(13).astype(np.float32),
                "wide_sparse_fields": rng.integers(0, 1000, 2).astype(np.int32),
                "deep_sparse_fields": rng.integers(0, 1000, 26).astype(np.int32)}
               for _ in range(200)]
    ofrecord.write_dataset(str(tmp_path / "train"), records, data_part_num=2)
    ofrecord.write_dataset(str(tmp_path / "eval"), records[:64])
    flags = [f for f in SMALL if not f.startswith("--dataset_format")]
    done = subprocess.run([sys.executable, "-m", "onnxjob", "run", script(), *flags,
                           "--dataset_format=ofrecord", f"--train_data_dir={tmp_path / 'train'}",
                           "--train_data_part_num=2", "--train_part_name_suffix_length=5",
                           f"--eval_data_dir={tmp_path / 'eval'}", "--eval_data_part_num=1",
                           "--eval_part_name_suffix_length=5", "--max_iter=6",
                           "--loss_print_every_n_iter=3", "--eval_interval=6", "--eval_batchs=2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "load ofrecord data form" in done.stdout
    (auc_line,) = [line for line in done.stdout.splitlines() if "eval_auc" in line]
    assert 0.0 <= float(auc_line.split()[-1]) <= 1.0
