"""BERT pretraining in PyTorch, keyed by the variable names of OneFlow-Benchmark's bert.py
and pretrain.py, and OneFlow 0.5's LAMB / AdamW updates as its kernels compute them.

The reference for onnxjob's numbers (tests/test_bert.py, bench/bench_bert.py). The forward
follows the upstream graph op by op: LayerNorm over the last axis (eps 1e-5), the exact
(erf) GELU, the additive attention mask (mask - 1) * 10000, the masked-LM loss weighted
and divided by the mean label weight + 1e-5, the next-sentence loss, reduce_mean of each
and their sum. Dropout is left out: the twin is compared with dropout probabilities 0.
Weights come from onnxjob (`flow.get_all_variables()`), so both run the same numbers.

The optimizer follows OneFlow 0.5 (v0.5.0 tag):
  learning rate   core/kernel/learning_rate_schedule_kernel.cpp: a linear warmup
                  (start_multiplier * lr ... lr over warmup_batches, the decay not applied
                  while warming up), then PolynomialDecay (lr - end) * (1 - t/N)^power + end
  clipping        core/job_rewriter/autograd.cpp ClipGradientByGlobalNorm: every gradient
                  times min(rsqrt(sum of squares of all gradients), 1 / clip_norm)
  weight decay    core/job_rewriter/optimizer.cpp GetOptimizerWeightDecayRate: the rate,
                  or 0 where an exclude pattern RE2::PartialMatch-es the variable name
  LAMB            user/kernels/model_update_kernel_util.{h,cpp} LambGradFunctor,
                  LambLRFunctor, LambUpdateFunctor; job_rewriter/lamb_optm.cpp creates
                  beta1_t / beta2_t initialised to beta1 / beta2
  AdamW           AdamUpdateFunctor (AdamW's default: no bias correction, factors 1)
"""
import math
import re

import torch
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-5
# util.CreateOptimizer's settings
UPSTREAM_EXCLUDES = ("bias", "LayerNorm", "layer_norm")
CLIP_NORM = 1.0


def parameter_names(num_hidden_layers, **_):
    """The trainable variables of PreTrain, as onnxjob names them (scope namespaces + name)."""
    def dense(prefix):
        return [prefix + "-weight", prefix + "-bias"]

    def norm(prefix):
        return [prefix + "-LayerNorm-gamma", prefix + "-LayerNorm-beta"]

    names = ["bert-embeddings-word_embeddings", "bert-embeddings-token_type_embeddings",
             "bert-embeddings-position_embeddings"] + norm("bert-embeddings")
    for i in range(num_hidden_layers):
        layer = f"bert-encoder-layer_{i}-"
        for part in ("query", "key", "value"):
            names += dense(layer + "attention-self-" + part)
        names += dense(layer + "attention-output-dense") + norm(layer + "attention-output")
        names += dense(layer + "intermediate-dense")
        names += dense(layer + "output-dense") + norm(layer + "output")
    names += dense("cls-predictions-transform-dense") + norm("cls-predictions-transform")
    names += ["cls-predictions-output_bias"] + dense("bert-pooler-dense")
    names += ["cls-seq_relationship-output_weights", "cls-seq_relationship-output_bias"]
    return names


class BertTwin:
    """`backbone(...)` -> sequence output; `pretrain(...)` -> (total, mlm, nsp) losses.

    `weights` maps onnxjob variable names to torch tensors; the inputs are the arrays (or
    tensors) a PreTrain job takes, in its argument order.
    """

    def __init__(self, weights, num_hidden_layers, num_attention_heads, **_):
        self.w = weights
        self.layers = num_hidden_layers
        self.heads = num_attention_heads

    def _dense(self, name, x):
        return x @ self.w[name + "-weight"] + self.w[name + "-bias"]

    def _layer_norm(self, prefix, x):
        p = prefix + "-LayerNorm-"
        return F.layer_norm(x, x.shape[-1:], self.w[p + "gamma"], self.w[p + "beta"],
                            eps=LAYER_NORM_EPS)

    def _embeddings(self, input_ids, token_type_ids):
        seq = input_ids.shape[1]
        x = self.w["bert-embeddings-word_embeddings"][input_ids.long()]
        x = x + self.w["bert-embeddings-token_type_embeddings"][token_type_ids.long()]
        x = x + self.w["bert-embeddings-position_embeddings"][:, :seq]
        return self._layer_norm("bert-embeddings", x)

    def _attention(self, prefix, x, additive_mask, batch, seq):
        hidden = x.shape[-1]
        size = hidden // self.heads

        def heads(t):
            return t.reshape(batch, seq, self.heads, size).permute(0, 2, 1, 3)

        q, k, v = (heads(self._dense(prefix + part, x)) for part in ("query", "key", "value"))
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(float(size))) + additive_mask
        context = torch.softmax(scores, dim=-1) @ v
        return context.permute(0, 2, 1, 3).reshape(-1, hidden)

    def backbone(self, input_ids, input_mask, token_type_ids):
        """BertBackbone.sequence_output(): (batch, seq, hidden)."""
        input_ids, input_mask, token_type_ids = map(torch.as_tensor,
                                                    (input_ids, input_mask, token_type_ids))
        batch, seq = input_ids.shape
        x = self._embeddings(input_ids, token_type_ids)
        hidden = x.shape[-1]
        additive_mask = (input_mask.float().reshape(batch, 1, 1, seq) - 1.0) * 10000.0
        x = x.reshape(-1, hidden)
        for i in range(self.layers):
            layer = f"bert-encoder-layer_{i}-"
            attention = self._attention(layer + "attention-self-", x, additive_mask, batch, seq)
            attention = self._dense(layer + "attention-output-dense", attention) + x
            attention = self._layer_norm(layer + "attention-output", attention)
            intermediate = F.gelu(self._dense(layer + "intermediate-dense", attention))
            x = self._dense(layer + "output-dense", intermediate) + attention
            x = self._layer_norm(layer + "output", x)
        return x.reshape(batch, seq, hidden)

    def masked_lm_logits(self, sequence_output, positions):
        """_AddMaskedLanguageModelLoss's logits: (batch * predictions, vocab)."""
        positions = torch.as_tensor(positions).long()
        hidden = sequence_output.shape[-1]
        index = positions.unsqueeze(-1).expand(-1, -1, hidden)
        x = torch.gather(sequence_output, 1, index).reshape(-1, hidden)
        x = F.gelu(self._dense("cls-predictions-transform-dense", x))
        x = self._layer_norm("cls-predictions-transform", x)
        return (x @ self.w["bert-embeddings-word_embeddings"].t()
                + self.w["cls-predictions-output_bias"])

    def pretrain(self, input_ids, input_mask, token_type_ids, masked_lm_positions,
                 masked_lm_ids, masked_lm_weights, next_sentence_labels):
        """PreTrain's (total_loss, mlm_loss, nsp_loss), scalars."""
        sequence_output = self.backbone(input_ids, input_mask, token_type_ids)
        weights = torch.as_tensor(masked_lm_weights)
        logits = self.masked_lm_logits(sequence_output, masked_lm_positions)
        labels = torch.as_tensor(masked_lm_ids).long().reshape(-1)
        per_example = F.cross_entropy(logits, labels, reduction="none").reshape(weights.shape)
        mean_weight = weights.sum() / weights.shape[0]
        mlm = ((per_example * weights).sum(-1) / (mean_weight + 1e-5)).mean()
        pooled = torch.tanh(self._dense("bert-pooler-dense", sequence_output[:, 0]))
        ns_logits = (pooled @ self.w["cls-seq_relationship-output_weights"].t()
                     + self.w["cls-seq_relationship-output_bias"])
        ns_labels = torch.as_tensor(next_sentence_labels).long().reshape(-1)
        nsp = F.cross_entropy(ns_logits, ns_labels, reduction="none").mean()
        return mlm + nsp, mlm, nsp


def upstream_learning_rate(step, args):
    """util.CreateOptimizer's rate at train step `step` (0 at the first call): linear warmup
    from 0 over int(iter_num * warmup_proportion) steps, then polynomial decay to 0."""
    warmup = int(args.iter_num * args.warmup_proportion)
    if step < warmup:
        return args.learning_rate * (step / warmup)
    t = min(step, args.iter_num)
    return args.learning_rate * (1.0 - t / args.iter_num)


def weight_decay_rate(name, rate, excludes=UPSTREAM_EXCLUDES):
    """The rate OneFlow gives variable `name`: 0 where an exclude pattern matches anywhere in
    the name (RE2::PartialMatch, i.e. re.search)."""
    return 0.0 if any(re.search(pattern, name) for pattern in excludes) else rate


def clip_by_global_norm(grads, clip_norm=CLIP_NORM):
    """OneFlow 0.5's global-norm clipping: g * min(rsqrt(sum of all g^2), 1 / clip_norm)."""
    # NOTE: that is clip_norm / max(norm, clip_norm) only for clip_norm == 1 (upstream's).
    square_sum = sum((g * g).sum() for g in grads.values())
    factor = torch.minimum(torch.rsqrt(square_sum), torch.tensor(1.0 / clip_norm))
    return {name: g * factor for name, g in grads.items()}


class LambTwin:
    """OneFlow 0.5's lamb_update per variable (float32):

    beta1_t *= beta1; beta2_t *= beta2           (state initialised to beta1, beta2)
    m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2
    adam = (m / (1 - beta1_t)) / (sqrt(v / (1 - beta2_t)) + eps)
    ratio = ||w|| / ||adam|| if both > 0 else 1   (the decay term not in the norm)
    w -= lr * ratio * (adam + weight_decay * w)
    """

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-6, weight_decay=0.0,
                 excludes=UPSTREAM_EXCLUDES):
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.weight_decay, self.excludes = weight_decay, excludes
        self.state = {}

    def update(self, name, w, g, lr, step):
        """Update the tensor `w` in place with the gradient `g` and the float rate `lr`
        (`step` unused: the kernel counts with its beta1_t / beta2_t state)."""
        zeros = torch.zeros_like(w)
        m, v, beta1_t, beta2_t = self.state.get(
            name, (zeros, zeros, torch.tensor(self.beta1), torch.tensor(self.beta2)))
        beta1_t, beta2_t = beta1_t * self.beta1, beta2_t * self.beta2
        m = self.beta1 * m + (1 - self.beta1) * g
        v = self.beta2 * v + (1 - self.beta2) * g * g
        adam = (m / (1 - beta1_t)) / (torch.sqrt(v / (1 - beta2_t)) + self.epsilon)
        self.state[name] = (m, v, beta1_t, beta2_t)
        w_norm, adam_norm = torch.sqrt((w * w).sum()), torch.sqrt((adam * adam).sum())
        ratio = w_norm / adam_norm if w_norm > 0 and adam_norm > 0 else torch.tensor(1.0)
        rate = torch.tensor(lr, dtype=torch.float32) * ratio
        decay = weight_decay_rate(name, self.weight_decay, self.excludes)
        w -= rate * (adam + decay * w)


class AdamWTwin:
    """OneFlow 0.5's adam_update per variable (float32), bias correction off by default:

    m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2
    w = w - (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps) - lr * weight_decay * w
    with bc1 = 1 - beta1^(t+1), bc2 = 1 - beta2^(t+1) when corrected, else 1.
    """

    def __init__(self, beta1=0.9, beta2=0.999, epsilon=1e-8, do_bias_correction=False,
                 weight_decay=0.0, excludes=UPSTREAM_EXCLUDES):
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.do_bias_correction = do_bias_correction
        self.weight_decay, self.excludes = weight_decay, excludes
        self.state = {}

    def update(self, name, w, g, lr, step):
        """Update the tensor `w` in place with the gradient `g` and the float rate `lr` at
        train step `step` (0 at the first call)."""
        zeros = torch.zeros_like(w)
        m, v = self.state.get(name, (zeros, zeros))
        m = self.beta1 * m + (1 - self.beta1) * g
        v = self.beta2 * v + (1 - self.beta2) * g * g
        self.state[name] = (m, v)
        bc1 = bc2 = 1.0
        if self.do_bias_correction:
            bc1 = 1.0 - self.beta1 ** (step + 1)
            bc2 = 1.0 - self.beta2 ** (step + 1)
        lr32 = torch.tensor(lr, dtype=torch.float32)
        denom = torch.sqrt(v) / math.sqrt(bc2) + self.epsilon
        decay = weight_decay_rate(name, self.weight_decay, self.excludes)
        w.copy_(w - (lr32 / bc1) * (m / denom) - lr32 * decay * w)


class UpstreamOptimizerTwin:
    """util.CreateOptimizer(args) in PyTorch: the schedule, clipping by global norm 1.0,
    and LAMB or AdamW with weight decay excluded from biases and LayerNorm parameters."""

    def __init__(self, args):
        self.args = args
        self.train_step = 0
        if args.optimizer_type == "lamb":
            self.optimizer = LambTwin(0.9, 0.999, 1e-6, args.weight_decay_rate)
        else:
            self.optimizer = AdamWTwin(epsilon=1e-6, weight_decay=args.weight_decay_rate)

    def step(self, weights):
        """One train step on `weights` (leaf tensors holding .grad); clears the grads."""
        lr = upstream_learning_rate(self.train_step, self.args)
        grads = clip_by_global_norm({k: w.grad for k, w in weights.items() if w.grad is not None})
        with torch.no_grad():
            for name, g in grads.items():
                self.optimizer.update(name, weights[name], g, lr, self.train_step)
                weights[name].grad = None
        self.train_step += 1
