"""BERT pretraining on synthetic tokens with OneFlow-Benchmark's BERT, unchanged.

    python examples/bert_pretrain.py --steps 1500 --out bert_out

The model, the two pretraining losses and the optimizer (LAMB, polynomial decay with
warmup, weight decay except biases and layer norms, clipping) are LanguageModeling/BERT's
pretrain.py, bert.py and util.py from OneFlow-Benchmark (beside the repository in
../shared/clients, or at $ONEFLOW_BENCHMARK), imported through onnxjob's `oneflow` alias.

The synthetic corpus has something to learn: a sentence repeats a random motif of 4 words
(of 100), 5 of the 32 tokens are masked (a masked word can be read off the motif's other
repeats), and the second sentence either repeats the first one's motif (next-sentence
label 0) or has its own (label 1). The script prints the masked-token accuracy and the
next-sentence accuracy on held-out batches before and after training, shows a progress
bar, and writes the loss curves (`losses.png`) and the encoder as `bert_encoder.onnx`.
"""
import argparse
import os
from typing import Tuple

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import import_oneflow_module
from loss_plot import save_loss_plot

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARK = os.environ.get("ONEFLOW_BENCHMARK", os.path.join(
    HERE, "..", "..", "shared", "clients", "oneflow-benchmark"))
MODEL = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
             intermediate_size=512, seq_length=32, vocab_size=1000, max_predictions_per_seq=5,
             type_vocab_size=2, max_position_embeddings=32, hidden_dropout_prob=0.1,
             attention_probs_dropout_prob=0.1)
MASK = MODEL["vocab_size"] - 1  # the [MASK] token; sentences use the ids below it


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--out", default="bert_out")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def synthetic_batch(rng, batch, words=100, motif=4):
    """Arrays in PreTrain's argument order (see the module docstring for the corpus)."""
    seq, n_pred = MODEL["seq_length"], MODEL["max_predictions_per_seq"]
    half = seq // 2
    first = rng.integers(0, words, (batch, motif))
    unrelated = rng.integers(0, 2, batch)
    second = np.where(unrelated[:, None] == 1, rng.integers(0, words, (batch, motif)), first)
    ids = np.concatenate([np.tile(first, half // motif), np.tile(second, half // motif)], 1)
    positions = np.stack([np.sort(rng.choice(seq, n_pred, replace=False)) for _ in range(batch)])
    masked_ids = np.take_along_axis(ids, positions, axis=1)
    input_ids = ids.copy()
    np.put_along_axis(input_ids, positions, MASK, axis=1)
    token_type = (np.arange(seq)[None, :] >= half).repeat(batch, 0)
    return (input_ids.astype(np.int32), np.ones((batch, seq), np.int32),
            token_type.astype(np.int32), positions.astype(np.int32),
            masked_ids.astype(np.int32), np.ones((batch, n_pred), np.float32),
            unrelated.reshape(batch, 1).astype(np.int32))


def define_jobs(bert, pretrain, util, batch, opt_args):
    seq, n_pred = MODEL["seq_length"], MODEL["max_predictions_per_seq"]
    tokens = tp.Numpy.Placeholder((batch, seq), dtype=flow.int32)
    picks = tp.Numpy.Placeholder((batch, n_pred), dtype=flow.int32)
    weights = tp.Numpy.Placeholder((batch, n_pred), dtype=flow.float)
    labels = tp.Numpy.Placeholder((batch, 1), dtype=flow.int32)

    @flow.global_function(type="train")
    def train_job(input_ids: tokens, input_mask: tokens, token_type_ids: tokens,
                  positions: picks, masked_ids: picks, masked_weights: weights,
                  next_sentence: labels) -> tp.Numpy:
        total, mlm, nsp = pretrain.PreTrain(input_ids, input_mask, token_type_ids, positions,
                                            masked_ids, masked_weights, next_sentence,
                                            initializer_range=0.02, **MODEL)
        util.CreateOptimizer(opt_args).minimize(total)
        return flow.concat([flow.reshape(x, (1,)) for x in (total, mlm, nsp)], axis=0)

    config = {k: v for k, v in MODEL.items() if k != "max_predictions_per_seq"}

    @flow.global_function(type="predict")
    def predict_job(input_ids: tokens, input_mask: tokens, token_type_ids: tokens,
                    positions: picks) -> Tuple[tp.Numpy, tp.Numpy]:
        backbone = bert.BertBackbone(input_ids, input_mask, token_type_ids,
                                     initializer_range=0.02, **config)
        # the logits of upstream's masked-LM head (its loss needs labels we do not have)
        _, _, mlm_logits = pretrain._AddMaskedLanguageModelLoss(
            backbone.sequence_output(), backbone.embedding_table(), positions,
            flow.zeros_like(positions), flow.ones_like(flow.cast(positions, flow.float)),
            seq, MODEL["hidden_size"], MODEL["vocab_size"], n_pred,
            bert.GetActivation("gelu"), 0.02)
        pooled = pretrain.PooledOutput(backbone.sequence_output(), MODEL["hidden_size"], 0.02)
        unused_labels = flow.slice(flow.zeros_like(input_ids), [None, 0], [None, 1])
        _, _, nsp_logits = pretrain._AddNextSentenceOutput(pooled, unused_labels,
                                                           MODEL["hidden_size"], 0.02)
        return mlm_logits, nsp_logits

    return train_job, predict_job


def accuracies(predict_job, batches):
    mlm_hits = nsp_hits = mlm_total = nsp_total = 0
    for ids, mask, types, positions, masked, _, nsp in batches:
        mlm_logits, nsp_logits = predict_job(ids, mask, types, positions)
        mlm_hits += int((mlm_logits.argmax(-1) == masked.reshape(-1)).sum())
        mlm_total += masked.size
        nsp_hits += int((nsp_logits.argmax(-1) == nsp.reshape(-1)).sum())
        nsp_total += nsp.size
    return mlm_hits / mlm_total, nsp_hits / nsp_total


def main():
    from tqdm import tqdm
    args = parse()
    os.makedirs(args.out, exist_ok=True)
    flow.config.seed(args.seed)
    directory = os.path.join(BENCHMARK, "LanguageModeling", "BERT")
    bert, pretrain, util = (import_oneflow_module(directory, m) for m in ("bert", "pretrain",
                                                                           "util"))
    opt_args = argparse.Namespace(iter_num=args.steps, warmup_proportion=0.1,
                                  learning_rate=args.lr, weight_decay_rate=0.01,
                                  optimizer_type="lamb", use_fp16=False)
    train_job, predict_job = define_jobs(bert, pretrain, util, args.batch_size, opt_args)
    rng = np.random.default_rng(args.seed)
    held_out = [synthetic_batch(np.random.default_rng(10_000 + i), args.batch_size)
                for i in range(4)]
    mlm_before, nsp_before = accuracies(predict_job, held_out)
    losses = []
    bar = tqdm(range(args.steps), unit="step")
    for step in bar:
        losses.append(train_job(*synthetic_batch(rng, args.batch_size)).tolist())
        if step % 20 == 0:
            rate = bar.format_dict["rate"] or 0.0
            bar.set_postfix(loss=f"{losses[-1][0]:.3f}", mlm=f"{losses[-1][1]:.3f}",
                            seq_s=f"{rate * args.batch_size:.0f}")
    mlm_after, nsp_after = accuracies(predict_job, held_out)
    columns = np.asarray(losses)
    save_loss_plot(os.path.join(args.out, "losses.png"),
                   {label: columns[:, i] for i, label in
                    enumerate(("total", "masked LM", "next sentence"))})
    flow.export(predict_job, os.path.join(args.out, "bert_encoder.onnx"))
    print(f"held-out masked-token accuracy {mlm_before:.3f} -> {mlm_after:.3f}, "
          f"next-sentence accuracy {nsp_before:.3f} -> {nsp_after:.3f}; "
          f"wrote {args.out}/losses.png, bert_encoder.onnx")


if __name__ == "__main__":
    main()
