"""OneFlow-Benchmark's BERT pretraining, unchanged: predict, train, export; against PyTorch.

pretrain.PreTrain, bert.BertBackbone and util.CreateOptimizer are imported through the
`oneflow` alias exactly as upstream wrote them (tests/bert_models.py); the model is a small
BERT (2 layers, hidden 128) on one fixed synthetic batch. The twin (tests/bert_twin.py)
computes the same graph and OneFlow 0.5's LAMB / AdamW kernels in PyTorch.
"""
import numpy as np
import onnxruntime as ort
import pytest

import onnxjob as flow
from onnxjob.runtime.session import default_session
from bert_models import SMALL, define_jobs, optimizer_args, synthetic_batch

BATCH = 8
PREDICT_INPUTS = ("input_ids", "input_mask", "token_type_ids")
UPSTREAM_DROPOUT = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def _trained_small_bert(steps=5):
    """A fresh session seeded 0: (predict_job, batch, the losses of `steps` train steps)."""
    flow.clear_default_session()
    flow.config.seed(0)  # initial values and dropout masks: the same run every time
    args = optimizer_args("lamb", learning_rate=5e-2, iter_num=100, warmup_proportion=0.02)
    train_job, predict_job = define_jobs(BATCH, UPSTREAM_DROPOUT, args)
    batch = synthetic_batch(BATCH)
    losses = [float(train_job(*batch)["total_loss"]) for _ in range(steps)]
    return predict_job, batch, losses


def test_small_bert_predicts_trains_and_exports(tmp_path):
    predict_job, batch, losses = _trained_small_bert()
    assert np.isfinite(losses).all(), losses
    assert np.mean(losses[-2:]) < 0.9 * losses[0], f"the loss did not fall: {losses}"
    again = _trained_small_bert()[2]
    if default_session().device == "cuda":
        # CUDA kernels that add with atomics (the embedding gradients' ScatterND) sum in
        # any order: a rerun agrees to rounding, not bit for bit
        np.testing.assert_allclose(again, losses, rtol=1e-4)
    else:
        assert again == losses, "flow.config.seed(0) did not reproduce the run"

    sequence = predict_job(*batch[:3])  # dropout is the identity in predict jobs
    assert sequence.shape == (BATCH, SMALL["seq_length"], SMALL["hidden_size"])
    assert np.isfinite(sequence).all()
    path = str(tmp_path / "bert.onnx")
    flow.export(predict_job, path)  # checked with onnx.checker, full_check=True
    fresh = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    exported = fresh.run(None, dict(zip(PREDICT_INPUTS, batch[:3])))[0]
    assert np.abs(exported - sequence).max() <= 1e-5 * np.abs(sequence).max()


def test_linear_warmup_of_zero_batches_is_no_warmup():
    """iter_num * warmup_proportion < 1 gives warmup.linear(0, 0): OneFlow warms up while
    train_step < warmup_batches, i.e. never, so step 0 already trains at the full rate."""
    flow.config.seed(0)
    args = optimizer_args("adam", learning_rate=1e-3, iter_num=5, warmup_proportion=0.1)
    train_job, _ = define_jobs(2, opt_args=args)
    batch = synthetic_batch(2)
    losses = [float(train_job(*batch)["total_loss"]) for _ in range(2)]
    assert losses[1] < losses[0], losses


# -- against the PyTorch twin (tests/bert_twin.py) -----------------------------------------

# NOTE: a large decay rate, so that the decay term shows in every update: with upstream's
# 0.01 a wrong decay rule moves the weight matrices' updates by ~1e-4, below float32 noise.
TWIN_DECAY = 1.0
# softmax over the keys ignores what the key bias adds to every score of a query: its exact
# gradient is 0, both sides get float32 rounding noise, and the update moves it by ~1e-8
ZERO_GRADIENT = ("-attention-self-key-bias",)


def _norm_relative(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _twin_run(optimizer_type):
    """Two train steps of onnxjob and of the twin from the same weights: step 0 at the
    warmup's rate 0 (moments only), step 1 at 0.9 * lr. Returns what both computed."""
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    from bert_twin import BertTwin, UpstreamOptimizerTwin, parameter_names
    flow.config.seed(0)
    args = optimizer_args(optimizer_type, learning_rate=1e-2, iter_num=10,
                          warmup_proportion=0.1, weight_decay_rate=TWIN_DECAY)
    train_job, predict_job = define_jobs(BATCH, opt_args=args)
    batch = synthetic_batch(BATCH)
    sequence = predict_job(*batch[:3])
    names = parameter_names(**SMALL)
    before = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    ours = [train_job(*batch) for _ in range(2)]
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}

    weights = {k: torch.tensor(before[k], requires_grad=True) for k in names}
    twin, optimizer = BertTwin(weights, **SMALL), UpstreamOptimizerTwin(args)
    with torch.no_grad():
        twin_sequence = twin.backbone(*batch[:3]).numpy()
    theirs = []
    for _ in range(2):
        total, mlm, nsp = twin.pretrain(*batch)
        theirs.append({"total_loss": total.item(), "mlm_loss": mlm.item(), "nsp_loss": nsp.item()})
        total.backward()
        optimizer.step(weights)
    twin_after = {k: w.detach().numpy() for k, w in weights.items()}
    return {"names": names, "sequence": (sequence, twin_sequence), "losses": (ours, theirs),
            "before": before, "after": (after, twin_after)}


@pytest.mark.parametrize("optimizer_type", ["lamb", "adam"], ids=["lamb", "adamw"])
def test_bert_matches_pytorch_twin(optimizer_type):
    """Forward, the three losses, and every variable after util.CreateOptimizer's step."""
    run = _twin_run(optimizer_type)
    ours, theirs = run["sequence"]
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    for step_ours, step_theirs in zip(*run["losses"]):
        for key, value in step_theirs.items():
            assert abs(float(step_ours[key]) - value) <= 1e-5 * abs(value), (key, step_ours, value)

    before, (after, twin_after) = run["before"], run["after"]
    weights_off, updates_off = {}, {}
    for name in run["names"]:
        ours_update, twin_update = after[name] - before[name], twin_after[name] - before[name]
        if name.endswith(ZERO_GRADIENT):
            assert np.abs(ours_update).max() < 1e-6 and np.abs(twin_update).max() < 1e-6, name
            continue
        weights_error = _norm_relative(after[name], twin_after[name])
        if weights_error > 1e-4:
            weights_off[name] = weights_error
        # the update itself: a wrong rule hides in the weights (~1e-2 of them move)
        update_error = _norm_relative(ours_update, twin_update)
        if update_error > 1e-3:
            updates_off[name] = update_error
    assert not weights_off, f"weights after the step differ (relative norm): {weights_off}"
    assert not updates_off, f"updates differ (relative norm): {updates_off}"


def test_run_pretraining_reads_its_ofrecord_dataset(tmp_path):
    """The unchanged run_pretraining.py, fed by flow.data.ofrecord_reader + decoders."""
    import subprocess
    import sys
    from onnxjob.io import ofrecord
    from upstream import upstream_dir
    script = upstream_dir("LanguageModeling", "BERT") + "/run_pretraining.py"
    rng = np.random.default_rng(0)
    records = []
    for _ in range(16):
        records.append({
            "input_ids": rng.integers(0, 1000, 32), "input_mask": np.ones(32, np.int64),
            "segment_ids": (np.arange(32) >= 16).astype(np.int64),
            "masked_lm_positions": np.sort(rng.choice(32, 5, replace=False)),
            "masked_lm_ids": rng.integers(0, 1000, 5),
            "masked_lm_weights": np.ones(5, np.float32),
            "next_sentence_labels": rng.integers(0, 2, 1)})
    ofrecord.write_dataset(str(tmp_path / "data"), records, part_name_suffix_length=-1)
    done = subprocess.run(
        [sys.executable, "-m", "onnxjob", "run", script, f"--data_dir={tmp_path / 'data'}",
         "--data_part_num=1", "--iter_num=3", "--batch_size_per_device=4", "--seq_length=32",
         "--max_predictions_per_seq=5", "--num_hidden_layers=2", "--num_attention_heads=2",
         "--vocab_size=1000", "--max_position_embeddings=32", "--type_vocab_size=2",
         "--loss_print_every_n_iter=1", "--optimizer_type=lamb",
         f"--model_save_dir={tmp_path / 'out'}", "--save_last_snapshot=True"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("step: ")]
    assert len(steps) == 3 and "total_loss" in steps[0], done.stdout[-2000:]
    assert (tmp_path / "out" / "snapshot_last_snapshot" / "snapshot_done").is_file()
