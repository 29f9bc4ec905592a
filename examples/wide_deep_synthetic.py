"""Wide & Deep on synthetic click data with OneFlow-Benchmark's model, unchanged.

    python examples/wide_deep_synthetic.py --steps 400 --out wdl_out

The model and optimizer are ClickThroughRate/WideDeepLearning/wdl_train_eval.py's `_model`
(a wide embedding sum plus a deep MLP over 26 embedded fields and 13 dense features) and
`CreateOptimizer` (LazyAdam: only the embedding rows a batch looks up move), from
OneFlow-Benchmark beside the repository (../shared/clients, or $ONEFLOW_BENCHMARK),
loaded through onnxjob's `oneflow` alias with small vocabularies.

The synthetic clicks follow a planted rule: every wide and deep id has a hidden weight,
the dense features a hidden direction, and a click happens with probability
sigmoid(sum of those). The script prints the held-out AUC (scikit-learn, as upstream
reports it) before and after training next to the AUC of the planted probabilities
themselves (the best any model can do), shows a progress bar, and writes the loss curve
(`losses.png`) and the scoring job as `wide_deep.onnx`.
"""
import argparse
import os
import runpy
import sys

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias
from loss_plot import save_loss_plot

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARK = os.environ.get("ONEFLOW_BENCHMARK", os.path.join(
    HERE, "..", "..", "shared", "clients", "oneflow-benchmark"))
VOCAB, DENSE, WIDE, DEEP = 2000, 13, 2, 26


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default="wdl_out")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def load_upstream(args):
    """wdl_train_eval.py's namespace, its flags parsed from small-vocabulary settings."""
    install_oneflow_alias()
    script = os.path.join(BENCHMARK, "ClickThroughRate", "WideDeepLearning", "wdl_train_eval.py")
    argv = sys.argv
    sys.argv = [script, "--dataset_format=synthetic", f"--batch_size={args.batch_size}",
                f"--wide_vocab_size={VOCAB}", f"--deep_vocab_size={VOCAB}",
                "--deep_embedding_vec_size=8", "--hidden_units_num=2", "--hidden_size=64",
                f"--learning_rate={args.lr}", "--deep_dropout_rate=0.1", "--gpu_num_per_node=1"]
    try:
        return runpy.run_path(script, run_name="wdl_train_eval")
    finally:
        sys.argv = argv


class PlantedClicks:
    """Batches of (labels, dense, wide ids, deep ids) whose clicks follow hidden weights."""

    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.wide_weight = rng.normal(0, 1.0, VOCAB)
        self.deep_weight = rng.normal(0, 0.35, VOCAB)
        self.dense_direction = rng.normal(0, 1.0, DENSE)

    def batch(self, rng, size):
        dense = rng.random((size, DENSE)).astype(np.float32)
        wide = rng.integers(0, VOCAB, (size, WIDE))
        deep = rng.integers(0, VOCAB, (size, DEEP))
        logit = (self.wide_weight[wide].sum(1) + self.deep_weight[deep].sum(1)
                 + (dense - 0.5) @ self.dense_direction)
        probability = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(size) < probability).astype(np.int32).reshape(size, 1)
        return labels, dense, wide.astype(np.int32), deep.astype(np.int32), probability


def define_jobs(upstream, flags, batch):
    model, create_optimizer = upstream["_model"], upstream["CreateOptimizer"]
    labels_def = tp.Numpy.Placeholder((batch, 1), dtype=flow.int32)
    dense_def = tp.Numpy.Placeholder((batch, DENSE))
    wide_def = tp.Numpy.Placeholder((batch, WIDE), dtype=flow.int32)
    deep_def = tp.Numpy.Placeholder((batch, DEEP), dtype=flow.int32)
    config = flow.FunctionConfig()
    config.indexed_slices_optimizer_conf(
        dict(include_op_names=dict(op_name=["wide_embedding", "deep_embedding"])))

    @flow.global_function("train", config)
    def train_step(labels: labels_def, dense: dense_def, wide: wide_def,
                   deep: deep_def) -> tp.Numpy:
        loss = flow.nn.sigmoid_cross_entropy_with_logits(labels, model(dense, wide, deep))
        create_optimizer(flags).minimize(loss)
        return flow.math.reduce_mean(loss)

    @flow.global_function()
    def score(dense: dense_def, wide: wide_def, deep: deep_def) -> tp.Numpy:
        return flow.math.sigmoid(model(dense, wide, deep))

    return train_step, score


def held_out_auc(score, batches):
    from sklearn.metrics import roc_auc_score
    labels = np.concatenate([b[0].reshape(-1) for b in batches])
    scores = np.concatenate([score(*b[1:4]).reshape(-1) for b in batches])
    planted = np.concatenate([b[4] for b in batches])
    return roc_auc_score(labels, scores), roc_auc_score(labels, planted)


def main():
    from tqdm import tqdm
    args = parse()
    os.makedirs(args.out, exist_ok=True)
    flow.config.seed(args.seed)
    upstream = load_upstream(args)
    train_step, score = define_jobs(upstream, upstream["FLAGS"], args.batch_size)
    clicks = PlantedClicks(args.seed)
    rng = np.random.default_rng(args.seed + 1)
    held_out = [clicks.batch(np.random.default_rng(10_000 + i), args.batch_size)
                for i in range(20)]
    auc_before, best = held_out_auc(score, held_out)
    losses = []
    bar = tqdm(range(args.steps), unit="step")
    for step in bar:
        losses.append(float(train_step(*clicks.batch(rng, args.batch_size)[:4])))
        if step % 20 == 0:
            rate = bar.format_dict["rate"] or 0.0
            bar.set_postfix(loss=f"{losses[-1]:.4f}", rows_s=f"{rate * args.batch_size:.0f}")
    auc_after, _ = held_out_auc(score, held_out)
    save_loss_plot(os.path.join(args.out, "losses.png"), {None: losses}, ylabel="log loss")
    flow.export(score, os.path.join(args.out, "wide_deep.onnx"))
    print(f"held-out AUC {auc_before:.4f} -> {auc_after:.4f} (the planted probabilities: "
          f"{best:.4f}); wrote {args.out}/losses.png, wide_deep.onnx")


if __name__ == "__main__":
    main()
