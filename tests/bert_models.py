"""OneFlow-Benchmark's BERT (pretrain.py, bert.py, util.py), imported unchanged through the
`oneflow` alias, and the small-BERT jobs the tests and the benchmark define with it.

The files live in ../shared/clients/oneflow-benchmark/LanguageModeling/BERT (see upstream.py).
"""
import argparse
from typing import Dict

import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from upstream import import_upstream

BERT = ("LanguageModeling", "BERT")

# the small BERT of the tests (PreTrain's keyword arguments, dropout off by default)
SMALL = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2,
         "intermediate_size": 512, "seq_length": 32, "vocab_size": 1000,
         "max_predictions_per_seq": 5, "type_vocab_size": 2, "max_position_embeddings": 32,
         "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def bert_modules():
    """(bert, pretrain, util): the unchanged upstream modules (skipping the calling test
    when ../shared is absent)."""
    return tuple(import_upstream(name, *BERT) for name in ("bert", "pretrain", "util"))


def optimizer_args(optimizer_type="lamb", learning_rate=1e-3, iter_num=100,
                   warmup_proportion=0.1, weight_decay_rate=0.01):
    """The `args` namespace util.CreateOptimizer reads (run_pretraining.py's flags)."""
    return argparse.Namespace(iter_num=iter_num, warmup_proportion=warmup_proportion,
                              learning_rate=learning_rate, weight_decay_rate=weight_decay_rate,
                              optimizer_type=optimizer_type, use_fp16=False)


def _placeholders(batch, seq, predictions):
    """(per token, per prediction int32, per prediction float32, per example int32): the
    annotations of a PreTrain job, with the dtypes run_pretraining.py's decoder gives."""
    return (tp.Numpy.Placeholder((batch, seq), dtype=flow.int32),
            tp.Numpy.Placeholder((batch, predictions), dtype=flow.int32),
            tp.Numpy.Placeholder((batch, predictions), dtype=flow.float),
            tp.Numpy.Placeholder((batch, 1), dtype=flow.int32))


def define_train_job(batch, config=None, opt_args=None, function_config=None):
    """A train job of upstream pretrain.PreTrain with `config` (SMALL's keys overridden):
    train_job(*synthetic_batch arrays) -> {"total_loss", "mlm_loss", "nsp_loss"}; it
    minimizes the total loss with util.CreateOptimizer(opt_args), under `function_config`
    (a flow.function_config(), or the default one)."""
    _, pretrain, util = bert_modules()
    config = dict(SMALL, **(config or {}))
    opt_args = opt_args or optimizer_args()
    tokens, picks, pick_weights, labels = _placeholders(batch, config["seq_length"],
                                                        config["max_predictions_per_seq"])

    @flow.global_function(type="train", function_config=function_config)
    def train_job(input_ids: tokens, input_mask: tokens, token_type_ids: tokens,
                  masked_lm_positions: picks, masked_lm_ids: picks,
                  masked_lm_weights: pick_weights,
                  next_sentence_labels: labels) -> Dict[str, tp.Numpy]:
        total, mlm, nsp = pretrain.PreTrain(input_ids, input_mask, token_type_ids,
                                            masked_lm_positions, masked_lm_ids,
                                            masked_lm_weights, next_sentence_labels,
                                            initializer_range=0.02, **config)
        util.CreateOptimizer(opt_args).minimize(total)
        return {"total_loss": total, "mlm_loss": mlm, "nsp_loss": nsp}

    return train_job


def define_predict_job(batch, config=None):
    """A predict job of upstream bert.BertBackbone: predict_job(input_ids, input_mask,
    token_type_ids) -> the sequence output (batch, seq, hidden)."""
    bert, _, _ = bert_modules()
    config = dict(SMALL, **(config or {}))
    config.pop("max_predictions_per_seq")
    tokens = _placeholders(batch, config["seq_length"], 1)[0]

    @flow.global_function(type="predict")
    def predict_job(input_ids: tokens, input_mask: tokens,
                    token_type_ids: tokens) -> tp.Numpy:
        backbone = bert.BertBackbone(input_ids, input_mask, token_type_ids,
                                     initializer_range=0.02, **config)
        return backbone.sequence_output()

    return predict_job


def define_jobs(batch, config=None, opt_args=None):
    """(train_job, predict_job) sharing their variables (see the two functions above)."""
    return define_train_job(batch, config, opt_args), define_predict_job(batch, config)


def synthetic_batch(batch, config=None, seed=0):
    """One fixed pretraining batch: the arrays in train_job's argument order."""
    config = dict(SMALL, **(config or {}))
    seq, predictions = config["seq_length"], config["max_predictions_per_seq"]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(seq // 2, seq + 1, batch)
    input_mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    input_ids = rng.integers(0, config["vocab_size"], (batch, seq)).astype(np.int32) * input_mask
    token_type_ids = (np.arange(seq)[None, :] >= lengths[:, None] // 2).astype(np.int32)
    token_type_ids *= input_mask
    positions = np.stack([np.sort(rng.choice(int(n), predictions, replace=False))
                          for n in lengths]).astype(np.int32)
    masked_ids = rng.integers(0, config["vocab_size"], (batch, predictions)).astype(np.int32)
    weights = np.ones((batch, predictions), np.float32)
    weights[:, -1] = rng.integers(0, 2, batch)  # some rows predict fewer tokens
    labels = rng.integers(0, 2, (batch, 1)).astype(np.int32)
    return input_ids, input_mask, token_type_ids, positions, masked_ids, weights, labels
