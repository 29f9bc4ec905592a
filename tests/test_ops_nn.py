"""flow.nn normalization functions and losses, flow.ctc_loss / flow.smooth_l1_loss, and
flow.layers.layer_norm / prelu: gradients (finite differences and PyTorch, one table),
forward values against PyTorch / NumPy / OneFlow's documented outputs, variables, dtypes."""
from typing import Tuple

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from onnxjob.ops.losses import ctc_loss, smooth_l1_loss
from gradcheck import (gradient_tests, labels,
                       normal, pos, sep, vjp)

torch = pytest.importorskip("torch", reason="PyTorch is the reference for gradients")
F = torch.nn.functional
nn = flow.nn


def forward(fn, inputs, train=False):
    """fn traced on placeholders for `inputs` and run once on onnxruntime: its outputs."""
    builder = GraphBuilder("forward", is_train=train)
    with tracing(builder):
        blobs = [builder.add_input(f"x{i}", x.shape, x.dtype) for i, x in enumerate(inputs)]
        outs = fn(*blobs)
        outs = list(outs) if isinstance(outs, tuple) else [outs]
        for i, b in enumerate(outs):
            b = op("Identity", b)
            b.value.name = f"out{i}"
            builder.graph.outputs.append(b.value)
    rng = np.random.default_rng(0)
    feeds = {n: spec.initializer.sample(spec.shape, spec.np_dtype, rng)
             for n, spec in builder.variable_specs.items()}
    feeds.update({f"x{i}": x for i, x in enumerate(inputs)})
    model = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"],
                                disabled_optimizers=["EliminateDropout"])
    res = sess.run(None, feeds)
    return res if len(res) > 1 else res[0]


# -- input makers ----------------------------------------------------------------------------

def unit(shape):
    """Probabilities away from 0 and 1."""
    return lambda rng: rng.uniform(0.05, 0.95, shape)


def simplex(shape):
    """Rows of the last axis summing to 1."""
    return lambda rng: rng.dirichlet(np.ones(shape[-1]), shape[:-1])


def const(value):
    return lambda rng: np.asarray(value)


def near(shape, scale=0.3):
    """Small values with distinct magnitudes, for differences that must stay off kinks."""
    def make(rng):
        return sep(shape)(rng) * scale
    return make


# -- PyTorch references ----------------------------------------------------------------------

def t_bn(x, m, v, o, s, axis=1, eps=1e-5):
    shape = [1] * x.dim()
    shape[axis] = -1
    return (x - m.view(shape)) / torch.sqrt(v.view(shape) + eps) * s.view(shape) + o.view(shape)


def t_reduce(loss, reduction):
    return {"none": loss, "mean": loss.mean(), "sum": loss.sum()}[reduction]


def t_kl(x, t, log_target=False):
    if log_target:
        return torch.exp(t) * (t - x)
    return torch.where(t > 0, t * (torch.log(t) - x), torch.zeros_like(t))


def t_ctc(lp, tg, il, tl, reduction="mean", blank=0, zero_infinity=False):
    return F.ctc_loss(lp, tg.long(), il.long(), tl.long(), blank=blank, reduction=reduction,
                      zero_infinity=zero_infinity)


def t_sparse_ce(lab, p):
    return -torch.log(p.gather(-1, lab.long().unsqueeze(-1)).squeeze(-1))


CTC_T, CTC_N, CTC_C, CTC_S = 6, 3, 5, 3
CTC_IN = [normal((CTC_T, CTC_N, CTC_C)),
          const(np.array([[1, 1, 2], [3, 4, 0], [2, 0, 0]], np.int32)),
          const(np.array([6, 5, 3], np.int32)), const(np.array([3, 2, 1], np.int32))]


def ctc_of_logits(reduction, blank=0):
    """The loss of log_softmax(logits): OneFlow's gradient rule is exact through it."""
    def fn(z, tg, il, tl):
        return ctc_loss(nn.logsoftmax(z, axis=-1), tg, il, tl, blank=blank, reduction=reduction)
    return fn


def t_ctc_of_logits(reduction, blank=0):
    return lambda z, tg, il, tl: t_ctc(torch.log_softmax(z, -1), tg, il, tl, reduction, blank)


# name, onnxjob fn, torch fn, input makers, differentiated inputs, float64 kernels exist
def on_cpu(fn):
    """`fn` traced under a CPU placement (OneFlow's CPU kernels where they differ)."""
    def placed(*args):
        with flow.scope.placement("cpu", "0:0"):
            return fn(*args)
    return placed


CASES = [
    # normalization
    ("layer_norm_last_axis", lambda x, g, b: nn.layer_norm(x, g, b, begin_norm_axis=-1),
     lambda x, g, b: F.layer_norm(x, (6,), g, b, 1e-5),
     [normal((4, 6)), normal((6,)), normal((6,))], [1, 1, 1], True),
    ("layer_norm_last_axis_f32_rule", lambda x, g, b: nn.layer_norm(x, g, b, begin_norm_axis=-1),
     lambda x, g, b: F.layer_norm(x, (6,), g, b, 1e-5),
     [normal((4, 6)), normal((6,)), normal((6,))], [1, 1, 1], False),
    ("layer_norm_two_axes", lambda x, g, b: nn.layer_norm(x, g, b, 1, 1, epsilon=1e-3),
     lambda x, g, b: F.layer_norm(x, (3, 4), g, b, 1e-3),
     [normal((2, 3, 4)), normal((3, 4)), normal((3, 4))], [1, 1, 1], True),
    ("layer_norm_params_on_last_axis", lambda x, g, b: nn.layer_norm(x, g, b),
     lambda x, g, b: F.layer_norm(x, (3, 4), eps=1e-5) * g + b,
     [normal((2, 3, 4)), normal((4,)), normal((4,))], [1, 1, 1], True),
    ("layer_norm_params_wider", lambda x, g: nn.layer_norm(x, g, None, -1, 1),
     lambda x, g: F.layer_norm(x, (4,), eps=1e-5) * g,
     [normal((2, 3, 4)), normal((3, 4))], [1, 1], True),
    ("layer_norm_no_params", lambda x: nn.layer_norm(x), lambda x: F.layer_norm(x, (3, 4)),
     [normal((2, 3, 4))], [1], False),
    # OneFlow's CPU form (flow.math ops: every input has a gradient) ...
    ("batch_normalization_1d_stats", on_cpu(lambda x, m, v, o, s: nn.batch_normalization(
        x, m, v, o, s, variance_epsilon=1e-3, axis=1)), lambda *a: t_bn(*a, eps=1e-3),
     [normal((2, 3, 4)), normal((3,)), pos((3,)), normal((3,)), normal((3,))], [1] * 5, True),
    # ... and its GPU op (normalization, training=False): the statistics take no gradient
    ("batch_normalization_gpu_stats", lambda x, m, v, o, s: nn.batch_normalization(
        x, m, v, o, s, variance_epsilon=1e-3, axis=1), lambda *a: t_bn(*a, eps=1e-3),
     [normal((2, 3, 4)), normal((3,)), pos((3,)), normal((3,)), normal((3,))],
     [1, 0, 0, 1, 1], True),
    ("batch_normalization_of_moments", on_cpu(lambda x: nn.batch_normalization(
        x, *nn.moments(x, [0]), axis=1)), lambda x: F.batch_norm(x, None, None, training=True),
     [normal((5, 3))], [1], True),
    ("batch_normalization_last_axis_nd_stats", on_cpu(lambda x, o, s: nn.batch_normalization(
        x, *nn.moments(x, [0, 1], keepdims=True), o, s, axis=-1)),
     lambda x, o, s: F.batch_norm(x.reshape(-1, 3), None, None, s.reshape(3), o.reshape(3),
                                  True).reshape(2, 4, 3),
     [normal((2, 4, 3)), normal((1, 1, 3)), normal((1, 1, 3))], [1, 1, 1], True),
    ("moments_mean", lambda x: nn.moments(x, [1])[0], lambda x: x.mean(1), [normal((3, 4))],
     [1], True),
    ("moments_variance", lambda x: nn.moments(x, [0, 2], keepdims=True)[1],
     lambda x: x.var((0, 2), unbiased=False, keepdim=True), [normal((3, 4, 2))], [1], True),
    ("group_norm", lambda x: nn.GroupNorm(x, num_groups=2, affine=False),
     lambda x: F.group_norm(x, 2), [normal((2, 4, 3, 2))], [1], True),
    ("group_norm_f32_rule", lambda x: nn.GroupNorm(x, num_groups=2, eps=1e-3),
     lambda x: F.group_norm(x, 2, eps=1e-3), [normal((2, 4, 3))], [1], False),
    ("instance_norm1d", lambda x: nn.InstanceNorm1d(x), lambda x: F.instance_norm(x),
     [normal((2, 3, 5))], [1], True),
    ("instance_norm2d_f32_rule", lambda x: nn.InstanceNorm2d(x, affine=False),
     lambda x: F.instance_norm(x), [normal((2, 3, 2, 3))], [1], False),
    ("instance_norm3d", lambda x: nn.InstanceNorm3d(x, eps=1e-3),
     lambda x: F.instance_norm(x, eps=1e-3), [normal((1, 2, 2, 2, 3))], [1], True),
    ("layers_layer_norm", lambda x: flow.layers.layer_norm(x, begin_norm_axis=-1,
                                                           begin_params_axis=-1, name="ln"),
     lambda x: F.layer_norm(x, (5,)), [normal((6, 5))], [1], True),
    ("layers_prelu", lambda x: flow.layers.prelu(
        x, alpha_initializer=flow.constant_initializer(0.25), shared_axes=[2, 3]),
     lambda x: torch.where(x > 0, x, 0.25 * x), [sep((2, 3, 2, 2))], [1], True),
    ("fused_bias_add_gelu", lambda x, b: nn.fused_bias_add_gelu(x, b),
     lambda x, b: F.gelu(x + b.view(1, -1, 1)), [normal((2, 3, 4)), normal((3,))], [1, 1], True),
    ("fused_bias_add_gelu_nhwc", lambda x, b: nn.fused_bias_add_gelu(x, b, data_format="NHWC"),
     lambda x, b: F.gelu(x + b), [normal((2, 2, 2, 3)), normal((3,))], [1, 1], True),
    # losses
    ("mse_mean", nn.MSELoss, F.mse_loss, [normal((3, 4)), normal((3, 4))], [1, 1], True),
    ("mse_sum", lambda x, y: nn.MSELoss(x, y, reduction="sum"),
     lambda x, y: F.mse_loss(x, y, reduction="sum"), [normal((3, 4)), normal((3, 4))], [1, 1],
     True),
    ("l1_none", lambda x, y: nn.L1Loss(x, y, reduction="none"),
     lambda x, y: F.l1_loss(x, y, reduction="none"), [sep((3, 4)), const(np.zeros((3, 4)))],
     [1, 1], True),
    ("l1_mean", nn.L1Loss, F.l1_loss, [sep((3, 4)), const(np.full((3, 4), 0.02))], [1, 1], True),
    ("bce_mean", nn.BCELoss, F.binary_cross_entropy, [unit((3, 4)), unit((3, 4))], [1, 1], True),
    ("bce_weight_sum", lambda x, y, w: nn.BCELoss(x, y, w, reduction="sum"),
     lambda x, y, w: -(w * (y * torch.log(x) + (1 - y) * torch.log(1 - x))).sum(),
     [unit((3, 4)), unit((3, 4)), pos((3, 4))], [1, 1, 1], True),
    ("bce_with_logits", nn.BCEWithLogitsLoss, F.binary_cross_entropy_with_logits,
     [normal((3, 4)), unit((3, 4))], [1, 1], True),
    ("bce_with_logits_weights", lambda x, y, w, pw: nn.BCEWithLogitsLoss(
        x, y, w, pw, reduction="none"),
     lambda x, y, w, pw: w * ((1 - y) * x + (1 + (pw - 1) * y) * F.softplus(-x)),
     [normal((3, 4)), unit((3, 4)), pos((3, 4)), pos((4,))], [1, 1, 1, 1], True),
    ("kldiv_mean", nn.KLDivLoss, lambda x, t: t_kl(x, t).mean(),
     [normal((3, 4)), simplex((3, 4))], [1, 1], True),
    ("kldiv_one_hot_targets", lambda x, t: nn.KLDivLoss(x, t, reduction="none"), t_kl,
     [normal((3, 4)), const(np.eye(4)[[1, 3, 0]])], [1, 0], True),
    ("kldiv_log_target_sum", lambda x, t: nn.KLDivLoss(x, t, log_target=True, reduction="sum"),
     lambda x, t: t_kl(x, t, True).sum(), [normal((3, 4)), normal((3, 4))], [1, 1], True),
    ("margin_ranking", lambda a, b, y: nn.MarginRankingLoss(a, b, y, margin=0.1),
     lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=0.1),
     [sep((3, 4)), const(np.zeros((3, 4))), const(np.sign(np.arange(12) % 3 - 0.5).reshape(3, 4))],
     [1, 1, 1], True),
    ("triplet_p2", nn.TripletMarginLoss, F.triplet_margin_loss,
     [normal((4, 5)), normal((4, 5)), normal((4, 5))], [1, 1, 1], True),
    ("triplet_p3_swap_none", lambda a, p, n: nn.TripletMarginLoss(
        a, p, n, margin=3.0, p=3.0, swap=True, reduction="none"),
     lambda a, p, n: F.triplet_margin_loss(a, p, n, margin=3.0, p=3.0, swap=True,
                                           reduction="none"),
     [normal((4, 5)), normal((4, 5)), normal((4, 5))], [1, 1, 1], True),
    ("smooth_l1", lambda x, y: smooth_l1_loss(x, y), lambda x, y: F.smooth_l1_loss(
        x, y, reduction="none"), [near((3, 4), 40), const(np.zeros((3, 4)))], [1, 0], True),
    ("smooth_l1_beta", lambda x, y: smooth_l1_loss(x, y, beta=0.5),
     lambda x, y: F.smooth_l1_loss(x, y, reduction="none", beta=0.5),
     [near((3, 4), 20), const(np.full((3, 4), 0.0137))], [1, 0], True),
    ("smooth_l1_beta0", lambda x, y: smooth_l1_loss(x, y, beta=0.0),
     lambda x, y: F.smooth_l1_loss(x, y, reduction="none", beta=0.0),
     [sep((3, 4)), const(np.zeros((3, 4)))], [1, 0], True),
    ("sparse_cross_entropy", nn.sparse_cross_entropy, t_sparse_ce,
     [labels((4,), 5), simplex((4, 5))], [0, 1], True),
    ("sparse_cross_entropy_3d", nn.sparse_cross_entropy, t_sparse_ce,
     [labels((2, 3), 4), simplex((2, 3, 4))], [0, 1], True),
    ("sparse_softmax_ce", nn.sparse_softmax_cross_entropy_with_logits,
     lambda lab, x: F.cross_entropy(x, lab.long(), reduction="none"),
     [labels((4,), 6), normal((4, 6))], [0, 1], False),
    ("distributed_sparse_softmax_ce", nn.distributed_sparse_softmax_cross_entropy_with_logits,
     lambda lab, x: F.cross_entropy(x, lab.long(), reduction="none"),
     [labels((4,), 6), normal((4, 6))], [0, 1], False),
    ("softmax_ce", nn.softmax_cross_entropy_with_logits,
     lambda p, x: -(p * torch.log_softmax(x, -1)).sum(-1),
     [simplex((3, 5)), normal((3, 5))], [0, 1], True),    # (labels: no gradient, as OneFlow)
    ("sigmoid_ce", nn.sigmoid_cross_entropy_with_logits,
     lambda z, x: F.binary_cross_entropy_with_logits(x, z, reduction="none"),
     [unit((3, 4)), normal((3, 4))], [0, 1], True),
    ("ctc_mean", ctc_of_logits("mean"), t_ctc_of_logits("mean"), CTC_IN, [1, 0, 0, 0], True),
    ("ctc_sum_blank_last", ctc_of_logits("sum", blank=4), t_ctc_of_logits("sum", blank=4),
     [CTC_IN[0], const(np.array([[1, 1, 2], [3, 0, 0], [2, 0, 3]], np.int64))] + CTC_IN[2:],
     [1, 0, 0, 0], True),
]


test_against_finite_differences, test_against_pytorch = gradient_tests(CASES)


@pytest.mark.parametrize("cpu", [False, True])
def test_batch_normalization_of_moments_differentiates_the_statistics_on_cpus_only(cpu):
    """flow.nn.batch_normalization(x, *moments(x)): on OneFlow's GPU op the statistics are
    constants of the gradient (dx = dy * scale / sqrt(var + eps)); its CPU form of
    flow.math ops differentiates them (a batch norm's full gradient)."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    dy = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    fn = lambda a: nn.batch_normalization(a, *nn.moments(a, [0]), axis=1,  # noqa: E731
                                          variance_epsilon=1e-3)
    run, _ = vjp(on_cpu(fn) if cpu else fn, [x], [1])
    _, (dx,) = run([x], dy)
    t = torch.tensor(x, requires_grad=True)
    mean, var = t.mean(0), t.var(0, unbiased=False)
    if not cpu:
        mean, var = mean.detach(), var.detach()
    ((t - mean) / torch.sqrt(var + 1e-3)).backward(torch.tensor(dy))
    np.testing.assert_allclose(dx, t.grad.numpy(), rtol=1e-4, atol=1e-5)


# -- forward values: OneFlow's documented examples ------------------------------------------

def test_oneflow_doc_examples():
    x = np.array([1, 2, 3, 4, 5], np.float32)
    mean, var = forward(lambda a: nn.moments(a, axes=[0]), [x])
    np.testing.assert_allclose([mean, var], [3.0, 2.0])
    out = forward(lambda a: nn.batch_normalization(a, *nn.moments(a, axes=[1]), axis=0),
                  [x[None]])
    np.testing.assert_allclose(out, [[-1.41421, -0.707105, 0.0, 0.707105, 1.41421]], rtol=1e-5)
    pred = np.array([0.1, 0.4, 0.3, 0.5, 0.9], np.float32)
    label = np.array([0.3, 0.9, 2.5, 0.4, 0.3], np.float32)
    np.testing.assert_allclose(forward(smooth_l1_loss, [pred, label]),
                               [0.02, 0.125, 1.7, 0.005, 0.18], rtol=1e-5)
    probs = np.array([[0.3, 0.7], [0.4, 0.6], [0.5, 0.5], [0.1, 0.9], [0.2, 0.8]], np.float32)
    lab = np.array([0, 1, 1, 0, 1], np.int32)
    np.testing.assert_allclose(forward(lambda p, l: nn.sparse_cross_entropy(l, p), [probs, lab]),
                               [1.2039728, 0.5108256, 0.6931472, 2.3025851, 0.22314353],
                               rtol=1e-6)


CTC_DOC_LOG_PROBS = np.array([
    [[-1.1031, -0.7998, -1.5200], [-0.9808, -1.1363, -1.1908]],
    [[-1.2258, -1.0665, -1.0153], [-1.1135, -1.2331, -0.9671]],
    [[-1.3348, -0.6611, -1.5118], [-0.9823, -1.2355, -1.0941]],
    [[-1.3850, -1.3273, -0.7247], [-0.8235, -1.4783, -1.0994]],
    [[-0.9049, -0.8867, -1.6962], [-1.4938, -1.3630, -0.6547]]], np.float32)


def test_ctc_loss_doc_example_in_a_job():
    @flow.global_function()
    def ctc_job(log_probs: tp.Numpy.Placeholder((5, 2, 3)),
                targets: tp.Numpy.Placeholder((2, 3), dtype=flow.int32),
                input_lengths: tp.Numpy.Placeholder((2,), dtype=flow.int32),
                target_lengths: tp.Numpy.Placeholder((2,), dtype=flow.int32)) -> tp.Numpy:
        return ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="none")

    loss = ctc_job(CTC_DOC_LOG_PROBS, np.array([[1, 2, 2], [1, 2, 2]], np.int32),
                   np.array([5, 5], np.int32), np.array([3, 3], np.int32))
    np.testing.assert_allclose(loss, [3.918017, 2.907672], rtol=1e-6)


def test_ctc_greedy_decoder_doc_example():
    @flow.global_function()
    def decode_job(log_probs: tp.Numpy.Placeholder((4, 2, 5)),
                   input_lengths: tp.Numpy.Placeholder((2,), dtype=flow.int64)
                   ) -> Tuple[tp.Numpy, tp.Numpy]:
        return nn.ctc_greedy_decoder(log_probs, input_lengths, merge_repeated=True)

    log_probs = np.array([
        [[-1.54, -1.20, -1.95, -1.65, -1.81], [-1.84, -1.74, -1.58, -1.55, -1.12]],
        [[-1.68, -1.48, -1.89, -1.30, -2.07], [-1.13, -1.45, -1.24, -1.61, -1.66]],
        [[-1.56, -1.40, -2.83, -1.67, -1.48], [-1.20, -2.01, -2.05, -1.95, -1.24]],
        [[-2.09, -1.76, -1.36, -1.67, -1.45], [-1.85, -1.48, -1.34, -2.16, -1.55]]], np.float32)
    decoded, neg_sum = decode_job(log_probs, np.array([4, 4]))
    np.testing.assert_array_equal(decoded, [[1, 3, 1, 2], [0, 2, 0, 0]])
    np.testing.assert_allclose(neg_sum, [[5.26], [4.79]], rtol=1e-6)


def _greedy_reference(lp, lengths, merge):
    t_len, batch, classes = lp.shape
    decoded = np.zeros((batch, t_len), np.int64)
    for b in range(batch):
        out, prev = [], -1
        for t in range(lengths[b]):
            k = int(np.argmax(lp[t, b]))
            if k != classes - 1 and not (merge and k == prev):
                out.append(k)
            prev = k
        decoded[b, :len(out)] = out
    neg = -np.array([[lp[:lengths[b], b].max(-1).sum()] for b in range(batch)])
    return decoded, neg


@pytest.mark.parametrize("merge", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ctc_greedy_decoder_against_numpy(merge, dtype):
    rng = np.random.default_rng(5)
    lp = np.log(rng.dirichlet(np.ones(3) * 0.3, (9, 4))).astype(dtype)  # many repeats
    lengths = np.array([9, 7, 1, 4], np.int32)
    decoded, neg = forward(lambda a, n: nn.ctc_greedy_decoder(a, n, merge_repeated=merge),
                           [lp, lengths])
    ref_decoded, ref_neg = _greedy_reference(lp, lengths, merge)
    np.testing.assert_array_equal(decoded, ref_decoded)
    np.testing.assert_allclose(neg, ref_neg, rtol=1e-6)


# -- CTC loss against PyTorch ------------------------------------------------------------------

def _ctc_inputs(rng, dtype, idx_dtype=np.int32):
    t_len, batch, classes = 7, 4, 5
    lp = np.log(rng.dirichlet(np.ones(classes), (t_len, batch))).astype(dtype)
    targets = np.array([[1, 2, 2, 3], [4, 4, 0, 9], [1, 7, 7, 7], [3, 1, 3, 2]], idx_dtype)
    in_len = np.array([7, 6, 2, 5], idx_dtype)
    tg_len = np.array([4, 2, 1, 0], idx_dtype)  # padding past the lengths is arbitrary
    return [lp, targets, in_len, tg_len]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ctc_loss_and_oneflow_gradient_rule_match_pytorch(reduction, dtype):
    """OneFlow's ctc_loss_grad is PyTorch's formula (exp(lp) - ...): compared with
    log_probs itself as the leaf. Padded target entries are out of range on purpose."""
    rng = np.random.default_rng(6)
    xs = _ctc_inputs(rng, dtype, np.int64 if dtype == np.float64 else np.int32)
    run, shape = vjp(lambda *a: ctc_loss(*a, reduction=reduction), xs, [1, 0, 0, 0])
    ct = rng.standard_normal(shape).astype(dtype)
    loss, (grad,) = run(xs, ct)
    lp = torch.tensor(xs[0], requires_grad=True)
    targets = torch.tensor(np.where(np.arange(4) < xs[3][:, None], xs[1], 0))
    ref = t_ctc(lp, targets, *(torch.tensor(a) for a in xs[2:]), reduction=reduction)
    ref.backward(torch.tensor(ct))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(loss, ref.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(grad, lp.grad.numpy(), rtol=tol, atol=tol)


def test_ctc_loss_gradient_for_targets_holding_the_blank_matches_onefow_and_pytorch():
    """OneFlow (like PyTorch) accepts labels equal to the blank; its kernel then drops the
    final blank's share of the last step's gradient (it assigns where it would add)."""
    rng = np.random.default_rng(9)
    lp = np.log(rng.dirichlet(np.ones(3), (6, 3))).astype(np.float32)
    targets = np.array([[0, 2], [2, 0], [2, 2]], np.int32)      # blank = 2
    in_len, tg_len = np.array([6, 5, 6], np.int32), np.array([2, 2, 2], np.int32)
    xs = [lp, targets, in_len, tg_len]
    run, shape = vjp(lambda *a: ctc_loss(*a, blank=2, reduction="none"), xs, [1, 0, 0, 0])
    loss, (grad,) = run(xs, np.ones(shape, np.float32))
    t_lp = torch.tensor(lp, requires_grad=True)
    ref = t_ctc(t_lp, torch.tensor(targets), torch.tensor(in_len), torch.tensor(tg_len),
                "none", blank=2)
    ref.sum().backward()
    np.testing.assert_allclose(loss, ref.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(grad, t_lp.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("zero_infinity", [True, False])
def test_ctc_loss_impossible_alignment(zero_infinity):
    """A target longer than its input has an infinite loss; zero_infinity zeroes the loss
    and its gradient (the other samples are unaffected)."""
    rng = np.random.default_rng(7)
    lp, targets, _, tg_len = _ctc_inputs(rng, np.float32)
    in_len = np.array([7, 1, 2, 5], np.int32)  # sample 1 needs 2 steps for its 2 labels
    run, shape = vjp(lambda *a: ctc_loss(*a, reduction="none", zero_infinity=zero_infinity),
                     [lp, targets, in_len, tg_len], [1, 0, 0, 0])
    loss, (grad,) = run([lp, targets, in_len, tg_len], np.ones(shape, np.float32))
    t_lp = torch.tensor(lp, requires_grad=True)
    ref = t_ctc(t_lp, torch.tensor(targets), torch.tensor(in_len), torch.tensor(tg_len),
                "none", zero_infinity=True)
    ref.sum().backward()
    if zero_infinity:
        np.testing.assert_allclose(loss, ref.detach().numpy(), rtol=1e-5)
        np.testing.assert_allclose(grad, t_lp.grad.numpy(), rtol=1e-5, atol=1e-6)
    else:
        assert np.isinf(loss[1]) and np.isfinite(np.delete(loss, 1)).all()
        np.testing.assert_allclose(np.delete(loss, 1), np.delete(ref.detach().numpy(), 1),
                                   rtol=1e-5)


def test_ctc_loss_rejects_bad_inputs():
    lp, targets, in_len, tg_len = _ctc_inputs(np.random.default_rng(8), np.float32)
    with pytest.raises(TraceError, match="blank=5"):
        forward(lambda *a: ctc_loss(*a, blank=5), [lp, targets, in_len, tg_len])
    with pytest.raises(TraceError, match="targets must be int32 or int64"):
        forward(lambda *a: ctc_loss(*a), [lp, targets.astype(np.float32), in_len, tg_len])
    with pytest.raises(TraceError, match="input_lengths must be"):
        forward(lambda *a: ctc_loss(*a), [lp, targets, in_len[:2], tg_len])
    with pytest.raises(TraceError, match="reduction must be one of"):
        forward(lambda *a: ctc_loss(*a, reduction="avg"), [lp, targets, in_len, tg_len])


# -- layers: variables, the BERT form, gradients of the variables ---------------------------

def _sgd_gradients(build, x, ct, initial):
    """(y, gradients of the variables in `initial`) from one plain SGD step (lr 1) of a
    train job minimizing sum(build(x) * ct), the variables loaded with `initial` first."""
    @flow.global_function(type="train")
    def step(a: tp.Numpy.Placeholder(x.shape), c: tp.Numpy.Placeholder(ct.shape)
             ) -> tp.Numpy:
        y = build(a)
        flow.optimizer.SGD(1.0, momentum=0).minimize(flow.math.reduce_sum(y * c))
        return y

    flow.load_variables(initial)
    y = step(x, ct)
    after = flow.get_all_variables()
    return y, {k: v - after[k].numpy() for k, v in initial.items()}


def test_layers_layer_norm_bert_form_is_one_node_with_exact_gradients():
    """BERT calls layer_norm(x, begin_norm_axis=-1, begin_params_axis=-1) on (batch*seq,
    hidden): one LayerNormalization node; x, gamma and beta gradients as PyTorch's."""
    builder = GraphBuilder("bert_ln")
    with tracing(builder):
        x = builder.add_input("x", (6, 8), np.float32)
        flow.layers.layer_norm(x, name="LayerNorm", trainable=True, begin_norm_axis=-1,
                               begin_params_axis=-1)
    kinds = [n.op_type for n in builder.graph]
    assert kinds.count("LayerNormalization") == 1 and len(kinds) == 1
    assert {n: s.shape for n, s in builder.variable_specs.items()} == {
        "LayerNorm-beta": (8,), "LayerNorm-gamma": (8,)}

    rng = np.random.default_rng(9)
    x, ct = rng.standard_normal((2, 6, 8)).astype(np.float32)
    gamma = rng.standard_normal(8).astype(np.float32)
    beta = rng.standard_normal(8).astype(np.float32)

    def build(blob):
        return flow.layers.layer_norm(blob, begin_norm_axis=-1, begin_params_axis=-1,
                                      name="LayerNorm")

    y, grads = _sgd_gradients(build, x, ct, {"LayerNorm-gamma": gamma, "LayerNorm-beta": beta})
    tx, tg, tb = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    ty = F.layer_norm(tx, (8,), tg, tb)
    (ty * torch.tensor(ct)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["LayerNorm-gamma"], tg.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["LayerNorm-beta"], tb.grad.numpy(), rtol=1e-4, atol=1e-5)


def _variables_of(fn, *shapes):
    """{name: shape} of the variables `fn` creates when traced on inputs of `shapes`."""
    builder = GraphBuilder("variables")
    with tracing(builder):
        fn(*[builder.add_input(f"x{i}", s, np.float32) for i, s in enumerate(shapes)])
    return {n: s.shape for n, s in builder.variable_specs.items()}


def test_layers_layer_norm_variables_and_defaults():
    assert _variables_of(lambda x: flow.layers.layer_norm(x), (2, 3, 4)) == {
        "LayerNorm-beta": (4,), "LayerNorm-gamma": (4,)}
    assert _variables_of(lambda x: flow.layers.layer_norm(x, begin_params_axis=1, name="a"),
                         (2, 3, 4)) == {"a-beta": (3, 4), "a-gamma": (3, 4)}
    assert _variables_of(lambda x: flow.layers.layer_norm(x, center=False, scale=False),
                         (2, 3)) == {}
    x = np.random.default_rng(10).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_allclose(forward(lambda a: flow.layers.layer_norm(a), [x]),
                               F.layer_norm(torch.tensor(x), (3, 4)).numpy(), atol=1e-5)


def test_layers_prelu_variable_and_alpha_gradient():
    assert _variables_of(lambda x: flow.layers.prelu(x), (2, 3, 4, 5)) == {
        "PRelu-alpha": (3, 4, 5)}
    assert _variables_of(lambda x: flow.layers.prelu(x, shared_axes=[2, 3], name="p1"),
                         (2, 3, 4, 5)) == {"p1-alpha": (3, 1, 1)}
    with pytest.raises(TraceError, match="shared axis 0"):
        _variables_of(lambda x: flow.layers.prelu(x, shared_axes=[0]), (2, 3))
    rng = np.random.default_rng(11)
    x = sep((2, 3, 4))(rng).astype(np.float32)
    ct = rng.standard_normal((2, 3, 4)).astype(np.float32)
    alpha = rng.uniform(0.1, 0.5, (3, 1)).astype(np.float32)
    y, grads = _sgd_gradients(lambda a: flow.layers.prelu(a, shared_axes=[2], name="pr"),
                              x, ct, {"pr-alpha": alpha})
    tx, ta = torch.tensor(x), torch.tensor(alpha, requires_grad=True)
    ty = torch.where(tx > 0, tx, ta * tx)
    (ty * torch.tensor(ct)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(grads["pr-alpha"], ta.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_group_and_instance_norm_variables():
    assert _variables_of(lambda x: nn.GroupNorm(x, num_groups=2, name="gn"), (2, 4, 3)) == {
        "gn_gamma": (1, 4, 1), "gn_beta": (1, 4, 1)}
    assert _variables_of(lambda x: nn.InstanceNorm2d(x, name="in"), (2, 3, 4, 4)) == {
        "in_gamma": (1, 3, 1), "in_beta": (1, 3, 1)}
    # unnamed ones are numbered per job in call order, so equal jobs share them
    names = _variables_of(lambda x: (nn.InstanceNorm1d(x), nn.InstanceNorm1d(x),
                                     nn.GroupNorm(x, 1), nn.InstanceNorm1d(x, affine=False)),
                          (2, 3, 4))
    assert sorted(names) == ["GroupNorm_0_beta", "GroupNorm_0_gamma", "InstanceNorm1D_0_beta",
                             "InstanceNorm1D_0_gamma", "InstanceNorm1D_1_beta",
                             "InstanceNorm1D_1_gamma"]


def test_group_norm_affine_variables_get_gradients():
    rng = np.random.default_rng(12)
    x, ct = rng.standard_normal((2, 2, 4, 3)).astype(np.float32)
    gamma = rng.standard_normal((1, 4, 1)).astype(np.float32)
    beta = rng.standard_normal((1, 4, 1)).astype(np.float32)
    y, grads = _sgd_gradients(lambda a: nn.GroupNorm(a, num_groups=2, name="gn"), x, ct,
                              {"gn_gamma": gamma, "gn_beta": beta})
    tx = torch.tensor(x)
    tg, tb = (torch.tensor(a.reshape(4), requires_grad=True) for a in (gamma, beta))
    ty = F.group_norm(tx, 2, tg, tb)
    (ty * torch.tensor(ct)).sum().backward()
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["gn_gamma"].reshape(4), tg.grad.numpy(), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(grads["gn_beta"].reshape(4), tb.grad.numpy(), rtol=1e-4,
                               atol=1e-5)


def test_fused_bias_add_dropout():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((40, 30)).astype(np.float32) + 5.0
    b = rng.standard_normal(30).astype(np.float32)
    fn = lambda a, c: nn.fused_bias_add_dropout(a, c, rate=0.5)  # noqa: E731
    np.testing.assert_allclose(forward(fn, [x, b]), x + b, rtol=1e-6)
    y = forward(fn, [x, b], train=True)
    kept = y != 0
    assert 0.35 < kept.mean() < 0.65
    np.testing.assert_allclose(y[kept], ((x + b) * 2)[kept], rtol=1e-6)
    nhwc = rng.standard_normal((2, 3, 3, 4)).astype(np.float32)
    out = forward(lambda a, c: nn.fused_bias_add_dropout(a, c, data_format="NHWC"),
                  [nhwc, b[:4]], train=True)
    np.testing.assert_allclose(out, nhwc + b[:4], rtol=1e-6)
    with pytest.raises(TraceError, match="data_format must be"):
        forward(lambda a, c: nn.fused_bias_add_gelu(a, c, data_format="CHW"), [x, b])


# -- dtypes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float64_forward_matches_pytorch(case):
    """Every op of the table also runs in float64 (onnxruntime kernels or lowerings)."""
    name, fn, torch_fn, makers, _, _ = case
    rng = np.random.default_rng(3)
    xs = [np.asarray(m(rng)) for m in makers]
    xs = [x.astype(np.float64) if x.dtype.kind == "f" else x for x in xs]
    got = forward(fn, xs)
    assert got.dtype == np.float64
    ref = torch_fn(*[torch.tensor(x) for x in xs]).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12)


# Every public function with inputs to sweep: (fn, float input shapes, integer extras).
SWEEP = {
    "batch_normalization": (nn.batch_normalization, [(2, 3, 4), (3,), (3,)], []),
    "layer_norm": (nn.layer_norm, [(2, 3)], []),
    "moments": (lambda x: nn.moments(x, [0])[0], [(2, 3)], []),
    "GroupNorm": (lambda x: nn.GroupNorm(x, 1), [(2, 3, 4)], []),
    "InstanceNorm1d": (nn.InstanceNorm1d, [(2, 3, 4)], []),
    "InstanceNorm2d": (nn.InstanceNorm2d, [(2, 3, 4, 2)], []),
    "InstanceNorm3d": (nn.InstanceNorm3d, [(2, 3, 4, 2, 2)], []),
    "fused_bias_add_gelu": (nn.fused_bias_add_gelu, [(2, 3), (3,)], []),
    "fused_bias_add_dropout": (nn.fused_bias_add_dropout, [(2, 3), (3,)], []),
    "layers.layer_norm": (flow.layers.layer_norm, [(2, 3)], []),
    "layers.prelu": (flow.layers.prelu, [(2, 3)], []),
    "MSELoss": (nn.MSELoss, [(2, 3), (2, 3)], []),
    "L1Loss": (nn.L1Loss, [(2, 3), (2, 3)], []),
    "BCELoss": (nn.BCELoss, [(2, 3), (2, 3)], []),
    "BCEWithLogitsLoss": (nn.BCEWithLogitsLoss, [(2, 3), (2, 3)], []),
    "KLDivLoss": (nn.KLDivLoss, [(2, 3), (2, 3)], []),
    "MarginRankingLoss": (nn.MarginRankingLoss, [(2, 3), (2, 3), (2, 3)], []),
    "TripletMarginLoss": (nn.TripletMarginLoss, [(2, 3), (2, 3), (2, 3)], []),
    "smooth_l1_loss": (smooth_l1_loss, [(2, 3), (2, 3)], []),
    "sparse_cross_entropy": (lambda p, l: nn.sparse_cross_entropy(l, p), [(2, 3)],
                             [np.array([0, 2], np.int32)]),
    "sparse_softmax_ce": (lambda x, l: nn.sparse_softmax_cross_entropy_with_logits(l, x),
                          [(2, 3)], [np.array([0, 2], np.int32)]),
    "distributed_sparse_softmax_ce": (
        lambda x, l: nn.distributed_sparse_softmax_cross_entropy_with_logits(l, x), [(2, 3)],
        [np.array([0, 2], np.int64)]),
    "softmax_ce": (lambda x, p: nn.softmax_cross_entropy_with_logits(p, x), [(2, 3), (2, 3)],
                   []),
    "sigmoid_ce": (lambda x, z: nn.sigmoid_cross_entropy_with_logits(z, x), [(2, 3), (2, 3)],
                   []),
    "ctc_loss": (ctc_loss, [(4, 2, 3)], [np.array([[1, 2], [2, 0]], np.int32),
                                         np.array([4, 3], np.int32), np.array([2, 1], np.int32)]),
    "ctc_greedy_decoder": (nn.ctc_greedy_decoder, [(4, 2, 3)], [np.array([4, 3])]),
}


def _sweep_inputs(shapes, extras, dtype):
    rng = np.random.default_rng(4)
    return [rng.uniform(0.2, 0.8, s).astype(dtype) for s in shapes] + extras


@pytest.mark.parametrize("name", SWEEP)
def test_dtype_sweep(name):
    """float32 and float64 run (and agree); int8, int32 and int64 are refused while
    tracing, naming the dtypes expected."""
    fn, shapes, extras = SWEEP[name]
    results = [forward(fn, _sweep_inputs(shapes, extras, dt)) for dt in (np.float32, np.float64)]
    for r32, r64 in zip(*[r if isinstance(r, list) else [r] for r in results]):
        if r64.dtype.kind == "f":
            assert (r32.dtype, r64.dtype) == (np.float32, np.float64)
        np.testing.assert_allclose(r32, r64, rtol=1e-5, atol=1e-6)
    for dt in (np.int8, np.int32, np.int64):
        with pytest.raises(TraceError, match="float32 or float64"):
            forward(fn, _sweep_inputs(shapes, extras, dt))


# -- errors -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, shapes, match", [
    (lambda a, b: nn.MSELoss(a, b, reduction="avg"), [(2, 3), (2, 3)], "reduction must be"),
    (nn.L1Loss, [(2, 3), (3, 2)], r"target \(3, 2\) must have the input's shape"),
    (lambda a, b, w: nn.BCELoss(a, b, w), [(2, 3), (2, 3), (3,)], "weight"),
    (lambda a, b, w: nn.BCEWithLogitsLoss(a, b, pos_weight=w), [(2, 3), (2, 3), (2,)],
     "one value per class"),
    (nn.TripletMarginLoss, [(3,), (3,), (3,)], r"takes \(N, D\) inputs"),
    (lambda a: nn.layer_norm(a, begin_norm_axis=2), [(2, 3)], "axis 2 is out of range"),
    (lambda a, g: nn.layer_norm(a, g), [(2, 3), (4,)], "gamma"),
    (lambda a, m, v: nn.batch_normalization(a, m, v), [(2, 3, 4), (3, 1), (3, 1)],
     "must be 1-D or of the rank of x"),
    (lambda a: nn.GroupNorm(a, num_groups=2), [(2, 3, 4)], "must divide the 3 channels"),
    (lambda a: nn.InstanceNorm2d(a), [(2, 3, 4)], "needs a 4-D input"),
    (lambda a: smooth_l1_loss(a, a, beta=-1.0), [(2,)], "beta must be >= 0"),
])
def test_bad_arguments_raise_trace_errors(fn, shapes, match):
    with pytest.raises(TraceError, match=match):
        forward(fn, [np.ones(s, np.float32) for s in shapes])


def test_bad_labels_raise_trace_errors():
    probs = np.full((2, 3), 1 / 3, np.float32)
    with pytest.raises(TraceError, match="labels must be int32 or int64"):
        forward(lambda p, l: nn.sparse_cross_entropy(l, p), [probs, np.zeros(2, np.float32)])
    with pytest.raises(TraceError, match=r"do not fit prediction \(2, 3\)"):
        forward(lambda p, l: nn.sparse_cross_entropy(l, p), [probs, np.zeros(3, np.int32)])
    # the logits' own shape (classes last) is named, not the class-first one ONNX computes on
    logits = np.zeros((2, 5, 4, 3), np.float32)
    with pytest.raises(TraceError, match=r"labels \(2,\) do not fit logits \(2, 5, 4, 3\) "
                                         r"\(expected \(2, 5, 4\)\)"):
        forward(lambda z, l: nn.sparse_softmax_cross_entropy_with_logits(l, z),
                [logits, np.zeros(2, np.int32)])
    with pytest.raises(TraceError, match="labels must be int32 or int64"):
        forward(lambda z, l: nn.sparse_softmax_cross_entropy_with_logits(l, z),
                [logits, np.zeros((2, 5, 4), np.float32)])
