"""Every gradient rule, from one table: central finite differences (float64 where
onnxruntime has the kernel) and PyTorch autograd (float32, <= 1e-5 relative)."""
import numpy as np
import pytest

import onnxjob as flow
from onnxjob.graph.tracer import op
from onnxjob.settings import SettingsError
from gradcheck import (check_case_against_pytorch, gradient_tests, labels,
                       normal, pos, sep, vjp)

torch = pytest.importorskip("torch", reason="PyTorch is the reference for gradients")
F = torch.nn.functional


# name, onnxjob fn, torch fn, input makers, differentiated inputs, float64 kernels exist
CASES = [
    ("add_broadcast", lambda a, b: a + b, lambda a, b: a + b, [normal((3, 4)), normal((4,))], [1, 1], True),
    ("sub", lambda a, b: a - b, lambda a, b: a - b, [normal((3, 4)), normal((3, 1))], [1, 1], True),
    ("mul", lambda a, b: a * b, lambda a, b: a * b, [normal((3, 4)), normal((1, 4))], [1, 1], True),
    ("div", lambda a, b: a / b, lambda a, b: a / b, [normal((3, 4)), pos((3, 4))], [1, 1], True),
    ("relu", flow.math.relu, torch.relu, [sep((3, 4))], [1], True),
    ("sigmoid", flow.math.sigmoid, torch.sigmoid, [normal((3, 4))], [1], True),
    ("tanh", flow.math.tanh, torch.tanh, [normal((3, 4))], [1], True),
    ("exp", flow.math.exp, torch.exp, [normal((3, 4))], [1], True),
    ("log", flow.math.log, torch.log, [pos((3, 4))], [1], True),
    ("sqrt", flow.math.sqrt, torch.sqrt, [pos((3, 4))], [1], True),
    ("square", flow.math.square, torch.square, [normal((3, 4))], [1], True),
    ("neg", lambda a: -a, lambda a: -a, [normal((3, 4))], [1], True),
    ("abs", flow.math.abs, torch.abs, [sep((3, 4))], [1], True),
    ("maximum", flow.math.maximum, torch.maximum, [sep((3, 4)), normal((3, 4))], [1, 1], True),
    ("matmul", flow.matmul, torch.matmul, [normal((3, 4)), normal((4, 5))], [1, 1], True),
    ("matmul_tb", lambda a, b: flow.matmul(a, b, transpose_b=True), lambda a, b: a @ b.T,
     [normal((3, 4)), normal((5, 4))], [1, 1], True),
    ("gemm_dense", lambda x, w, b: op("Gemm", x, w, b, transB=1), lambda x, w, b: x @ w.T + b,
     [normal((3, 4)), normal((5, 4)), normal((5,))], [1, 1, 1], True),
    ("reshape", lambda a: flow.reshape(a, [4, -1]), lambda a: a.reshape(4, -1), [normal((2, 6))], [1], True),
    ("transpose", lambda a: flow.transpose(a, [2, 0, 1]), lambda a: a.permute(2, 0, 1), [normal((2, 3, 4))], [1], True),
    ("concat", lambda a, b: flow.concat([a, b], axis=1), lambda a, b: torch.cat([a, b], 1),
     [normal((2, 3)), normal((2, 5))], [1, 1], True),
    ("slice", lambda a: flow.slice(a, [None, 1], [None, 2]), lambda a: a[:, 1:3], [normal((3, 5))], [1], True),
    ("gather_axis0", lambda a: flow.gather(a, [2, 0, 2]), lambda a: a[[2, 0, 2]], [normal((4, 3))], [1], True),
    ("gather_axis1", lambda a: flow.gather(a, [1, 1], axis=1), lambda a: a[:, [1, 1]], [normal((4, 3))], [1], True),
    ("reduce_sum", lambda a: flow.math.reduce_sum(a, axis=1), lambda a: a.sum(1), [normal((3, 4))], [1], True),
    ("reduce_mean_keep", lambda a: flow.math.reduce_mean(a, axis=[0], keepdims=True),
     lambda a: a.mean(0, keepdim=True), [normal((3, 4))], [1], True),
    ("reduce_max", lambda a: flow.math.reduce_max(a, axis=1), lambda a: a.max(1).values, [sep((3, 4))], [1], True),
    ("softmax", flow.nn.softmax, lambda a: torch.softmax(a, -1), [normal((3, 5))], [1], True),
    ("log_softmax", flow.nn.log_softmax, lambda a: torch.log_softmax(a, -1), [normal((3, 5))], [1], True),
    ("sparse_softmax_ce", lambda lab, x: flow.nn.sparse_softmax_cross_entropy_with_logits(lab, x),
     lambda lab, x: F.cross_entropy(x, lab.long(), reduction="none"),
     [labels((4,), 6), normal((4, 6))], [0, 1], False),
    ("softmax_ce", lambda p, x: flow.nn.softmax_cross_entropy_with_logits(p, x),
     lambda p, x: -(p * torch.log_softmax(x, -1)).sum(-1),
     [lambda rng: rng.dirichlet(np.ones(5), 3), normal((3, 5))], [0, 1], True),
    ("bias_add", flow.nn.bias_add, lambda x, b: x + b.reshape(1, -1, 1, 1),
     [normal((2, 3, 4, 4)), normal((3,))], [1, 1], True),
    ("conv_same", lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"), lambda x, w: F.conv2d(x, w, padding=2),
     [normal((2, 3, 8, 8)), normal((4, 3, 5, 5))], [1, 1], False),
    ("conv_stride2_pad1", lambda x, w: flow.nn.conv2d(x, w, 2, [[0, 0], [0, 0], [1, 1], [1, 1]]),
     lambda x, w: F.conv2d(x, w, stride=2, padding=1), [normal((2, 3, 9, 9)), normal((4, 3, 3, 3))], [1, 1], False),
    ("conv_dilated", lambda x, w: flow.nn.conv2d(x, w, 1, "VALID", dilations=2),
     lambda x, w: F.conv2d(x, w, dilation=2), [normal((1, 2, 9, 9)), normal((3, 2, 3, 3))], [1, 1], False),
    ("max_pool_2x2", lambda x: flow.nn.max_pool2d(x, 2, 2, "VALID"), lambda x: F.max_pool2d(x, 2, 2),
     [sep((2, 3, 6, 6))], [1], False),
    ("max_pool_overlap", lambda x: flow.nn.max_pool2d(x, 3, 2, "VALID"), lambda x: F.max_pool2d(x, 3, 2),
     [sep((2, 2, 7, 7))], [1], False),
    ("avg_pool_2x2", lambda x: flow.nn.avg_pool2d(x, 2, 2, "VALID"), lambda x: F.avg_pool2d(x, 2, 2),
     [normal((2, 3, 6, 6))], [1], False),
    ("avg_pool_global", lambda x: flow.nn.avg_pool2d(x, 5, 1, "VALID"),
     lambda x: F.avg_pool2d(x, 5, 1), [normal((2, 3, 5, 5))], [1], False),
    ("avg_pool_padded", lambda x: flow.nn.avg_pool2d(x, 3, 1, [[0, 0], [0, 0], [1, 1], [1, 1]]),
     lambda x: F.avg_pool2d(x, 3, 1, padding=1, count_include_pad=False), [normal((1, 2, 5, 5))], [1], False),
    ("cumsum_primitive", lambda a: op("CumSum", a, flow.constant(1, dtype=flow.int64, shape=())),
     lambda a: torch.cumsum(a, 1), [normal((3, 5))], [1], True),
    ("cumsum_primitive_reverse_exclusive",
     lambda a: op("CumSum", a, flow.constant(0, dtype=flow.int64, shape=()), exclusive=1, reverse=1),
     lambda a: torch.flip(torch.cumsum(torch.flip(a, [0]), 0), [0]) - a, [normal((4, 2))], [1], True),
    ("batch_norm_train", lambda x: flow.layers.batch_normalization(x, axis=1, name="bn"),
     lambda x: F.batch_norm(x, None, None, training=True, eps=0.001), [normal((4, 3, 2, 2))], [1], True),
]


test_against_finite_differences, test_against_pytorch = gradient_tests(CASES)


def test_dropout_gradient_uses_the_mask():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 40)).astype(np.float32) + 5.0
    run, shape = vjp(lambda a: flow.nn.dropout(a, rate=0.5), [x], [1])
    ct = rng.standard_normal(shape).astype(np.float32)
    y, (g,) = run([x], ct)
    kept = y != 0
    assert 0.35 < kept.mean() < 0.65, "dropout must really drop about half in train graphs"
    np.testing.assert_allclose(y[kept], x[kept] * 2, rtol=1e-6)
    np.testing.assert_allclose(g, np.where(kept, ct * 2, 0), rtol=1e-6)


def test_missing_gradient_rule_names_op_and_line(monkeypatch):
    from onnxjob.errors import MissingGradientError
    from onnxjob.graph import registry
    # a primitive registered without a gradient rule, for this test only
    no_grad = registry.Primitive("NoGradient", registry.same_as_input(), None, True)
    monkeypatch.setitem(registry._TABLE, "NoGradient", no_grad)
    with pytest.raises(MissingGradientError, match="NoGradient") as e:
        vjp(lambda a: op("NoGradient", a), [np.ones((2, 3), np.float32)], [1])
    assert "test_gradients.py" in str(e.value)


CONV_CASES = [c for c in CASES if c[0].startswith("conv")] + [
    ("conv_stride2_dilated_asymmetric",
     lambda x, w: flow.nn.conv2d(x, w, 2, [[0, 0], [0, 0], [1, 2], [0, 1]], dilations=2),
     lambda x, w: F.conv2d(F.pad(x, (0, 1, 1, 2)), w, stride=2, dilation=2),
     [normal((2, 3, 11, 10)), normal((4, 3, 3, 2))], [1, 1], False),
    # 1x1 kernels: the per-image MatMul (small M*C), the batch-last Gemm (large M*C), strided
    ("conv_pointwise_per_image", lambda x, w: flow.nn.conv2d(x, w, 1, "VALID"),
     lambda x, w: F.conv2d(x, w), [normal((2, 3, 8, 8)), normal((4, 3, 1, 1))], [1, 1], False),
    ("conv_pointwise_batch_last", lambda x, w: flow.nn.conv2d(x, w, 1, "VALID"),
     lambda x, w: F.conv2d(x, w), [normal((2, 16, 2, 2)), normal((16, 16, 1, 1))], [1, 1],
     False),
    ("conv_pointwise_stride2", lambda x, w: flow.nn.conv2d(x, w, 2, "VALID"),
     lambda x, w: F.conv2d(x, w, stride=2), [normal((2, 3, 9, 7)), normal((5, 3, 1, 1))],
     [1, 1], False),
    ("conv1d_pointwise_stride3", lambda x, w: flow.nn.conv1d(x, w, 3, "VALID"),
     lambda x, w: F.conv1d(x, w, stride=3), [normal((2, 4, 10)), normal((6, 4, 1))], [1, 1],
     False),
]


@pytest.mark.parametrize("formulation", ["gather", "im2col", "conv", "batch-last"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_weight_gradient_formulations(case, formulation, monkeypatch):
    """Each selectable weight-gradient formulation (ONNXJOB_CONV_WGRAD) against PyTorch."""
    monkeypatch.setenv("ONNXJOB_CONV_WGRAD", formulation)
    check_case_against_pytorch(case)


def test_unknown_conv_weight_gradient_formulation_is_refused(monkeypatch):
    monkeypatch.setenv("ONNXJOB_CONV_WGRAD", "fft")
    x, w = np.ones((1, 1, 4, 4), np.float32), np.ones((1, 1, 3, 3), np.float32)
    with pytest.raises(SettingsError, match="ONNXJOB_CONV_WGRAD='fft': expected one of "
                                            "gather, im2col, conv, batch-last"):
        vjp(lambda a, b: flow.nn.conv2d(a, b, 1, "VALID"), [x, w], [1, 1])
