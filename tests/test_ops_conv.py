"""Convolutions and pooling of every rank, transposed convolutions, resizing and pixel
shuffles: forward values and gradients against PyTorch and finite differences, the float64
lowerings, shape rules, dtypes and errors."""
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.frontend.variables import VariableSpec
from onnxjob.graph import autodiff
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, as_blob, op, tracing
from onnxjob.ops.conv import upsample
from gradcheck import (check_case_against_pytorch, check_case_finite_differences, gradient_tests, normal,
                       sep, vjp)

torch = pytest.importorskip("torch", reason="PyTorch is the reference for gradients")
F = torch.nn.functional


def _last(x):
    """channels-first -> channels-last (torch)."""
    return x.permute(0, *range(2, x.dim()), 1)


def _first(x):
    """channels-last -> channels-first (torch)."""
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))


def _avg_excluding_pad(pool, pads, k, s):
    """PyTorch average pool over zero padding `pads` (F.pad order), padding not counted."""
    def fn(x):
        return pool(F.pad(x, pads), k, s) / pool(F.pad(torch.ones_like(x), pads), k, s)
    return fn


def _resize(x, sizes, mode, transform, nearest_mode=None):
    sizes = as_blob(np.asarray(sizes, np.int64), like=x, dtype=np.int64)
    return op("Resize", x, None, None, sizes, mode=mode, nearest_mode=nearest_mode,
              coordinate_transformation_mode=transform)


def _dcr(x, b):
    n, c, h, w = x.shape
    return x.reshape(n, b, b, c // b ** 2, h, w).permute(0, 3, 4, 1, 5, 2).reshape(
        n, c // b ** 2, h * b, w * b)


def _space_to_depth(x, b):
    n, c, h, w = x.shape
    return x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4).reshape(
        n, c * b * b, h // b, w // b)


def _shuffle_v2(x, hf, wf):
    n, c, h, w = x.shape
    return x.reshape(n, c // (hf * wf), hf, wf, h, w).permute(0, 1, 4, 2, 5, 3).reshape(
        n, c // (hf * wf), h * hf, w * wf)


# name, onnxjob fn, torch fn, input makers, differentiated inputs, float64 kernels exist.
# Conv, ConvTranspose, AveragePool, GlobalAveragePool and Resize have float32 kernels only
# (float64 is lowered, see test_float64_lowerings_against_pytorch), so their rows check
# the gradient rules by finite differences in float32.
CASES = [
    ("conv1d_stride2", lambda x, w: flow.nn.conv1d(x, w, 2, "VALID"),
     lambda x, w: F.conv1d(x, w, stride=2), [normal((2, 3, 9)), normal((4, 3, 3))], [1, 1], False),
    ("conv1d_nwc_same_dilated",
     lambda x, w: flow.nn.conv1d(x, w, 1, "SAME", data_format="NWC", dilations=2),
     lambda x, w: _last(F.conv1d(F.pad(_first(x), (2, 2)), _first(w), dilation=2)),
     [normal((2, 9, 3)), normal((4, 3, 3))], [1, 1], False),
    ("conv3d_strided_asymmetric_pad",
     lambda x, w: flow.nn.conv3d(x, w, [1, 2, 1], [[0, 0], [0, 0], [1, 1], [0, 1], [1, 0]]),
     lambda x, w: F.conv3d(F.pad(x, (1, 0, 0, 1, 1, 1)), w, stride=(1, 2, 1)),
     [normal((2, 3, 4, 5, 5)), normal((2, 3, 2, 3, 2))], [1, 1], False),
    ("conv3d_ndhwc_grouped",
     lambda x, w: flow.nn.conv3d(x, w, 1, "VALID", data_format="NDHWC", groups=2),
     lambda x, w: _last(F.conv3d(_first(x), _first(w), groups=2)),
     [normal((1, 4, 4, 4, 4)), normal((4, 2, 2, 2, 2))], [1, 1], False),
    ("conv2d_grouped", lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=2),
     lambda x, w: F.conv2d(x, w, padding=1, groups=2),
     [normal((2, 4, 6, 6)), normal((6, 2, 3, 3))], [1, 1], False),
    ("conv2d_grouped_stride2_bias",
     lambda x, w, b: flow.nn.conv2d(x, w, 2, [[0, 0], [0, 0], [1, 1], [1, 1]], b, groups=3),
     lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=3),
     [normal((2, 6, 7, 7)), normal((9, 2, 3, 3)), normal((9,))], [1, 1, 1], False),
    ("depthwise_stride1", lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=4),
     lambda x, w: F.conv2d(x, w, padding=1, groups=4),
     [normal((2, 4, 6, 6)), normal((4, 1, 3, 3))], [1, 1], False),
    ("depthwise_stride2", lambda x, w: flow.nn.conv2d(x, w, 2, "SAME", groups=4),
     lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=4),
     [normal((2, 4, 7, 7)), normal((4, 1, 3, 3))], [1, 1], False),
    ("depthwise_multiplier2", lambda x, w: flow.nn.conv2d(x, w, 1, "VALID", groups=3),
     lambda x, w: F.conv2d(x, w, groups=3), [normal((2, 3, 5, 5)), normal((6, 1, 3, 3))],
     [1, 1], False),
    ("conv2d_transpose_stride2_output_padding",
     lambda x, w: flow.nn.conv2d_transpose(x, w, output_shape=(2, 3, 12, 12), strides=2),
     lambda x, w: F.conv_transpose2d(x, w, stride=2, output_padding=1),
     [normal((2, 4, 5, 5)), normal((4, 3, 3, 3))], [1, 1], False),
    ("conv2d_transpose_same",
     lambda x, w: flow.nn.conv2d_transpose(x, w, output_shape=(2, 3, 10, 10), strides=2,
                                           padding="SAME"),
     lambda x, w: F.conv_transpose2d(x, w, stride=2)[..., :10, :10],
     [normal((2, 4, 5, 5)), normal((4, 3, 3, 3))], [1, 1], False),
    ("conv2d_transpose_nhwc_keywords",
     lambda x, w: flow.nn.conv2d_transpose(input=x, filters=w, output_shape=(2, 10, 9, 3),
                                           strides=[2, 2], padding="SAME", data_format="NHWC"),
     lambda x, w: _last(F.conv_transpose2d(_first(x), _first(w), stride=2)[..., 0:10, 1:10]),
     [normal((2, 5, 5, 4)), normal((4, 3, 3, 3))], [1, 1], False),
    ("torch_conv2d_transpose",
     lambda x, w: flow.nn.torch_conv2d_transpose(x, w, output_padding=(1, 0), strides=2,
                                                 padding_needed=(2, 2), dilations=2),
     lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=(1, 0),
                                     dilation=2),
     [normal((2, 4, 4, 5)), normal((4, 3, 3, 2))], [1, 1], False),
    ("conv_transpose1d_grouped_dilated",
     lambda x, w: op("ConvTranspose", x, w, strides=[2], dilations=[2], pads=[1, 0], group=2,
                     output_padding=[1]),
     lambda x, w: F.conv_transpose1d(x, w, stride=2, dilation=2, groups=2,
                                     output_padding=1)[..., 1:],
     [normal((2, 4, 5)), normal((4, 3, 3))], [1, 1], False),
    ("conv_transpose3d_bias",
     lambda x, w, b: op("ConvTranspose", x, w, b, strides=[1, 2, 1], pads=[0, 1, 0, 0, 1, 1]),
     lambda x, w, b: F.conv_transpose3d(x, w, b, stride=(1, 2, 1))[:, :, :, 1:-1, :-1],
     [normal((1, 2, 3, 3, 4)), normal((2, 3, 2, 3, 2)), normal((3,))], [1, 1, 1], False),
    ("compat_conv2d_same_stride2", lambda x, w: flow.nn.compat_conv2d(x, w, 2, "SAME"),
     lambda x, w: F.conv2d(F.pad(x, (0, 1, 0, 1)), w, stride=2),
     [normal((2, 3, 8, 8)), normal((4, 3, 3, 3))], [1, 1], False),
    ("max_pool1d_nwc_default_overlapping", lambda x: flow.nn.max_pool1d(x, 3, 2, "SAME"),
     lambda x: _last(F.max_pool1d(_first(x), 3, 2, padding=1)), [sep((2, 9, 3))], [1], True),
    ("avg_pool1d", lambda x: flow.nn.avg_pool1d(x, 2, 2, "VALID"),
     lambda x: F.avg_pool1d(x, 2, 2), [normal((2, 3, 8))], [1], False),
    ("avg_pool1d_overlapping_padded",
     lambda x: flow.nn.avg_pool1d(x, 3, 1, [[0, 0], [0, 0], [1, 1]]),
     lambda x: F.avg_pool1d(x, 3, 1, padding=1, count_include_pad=False),
     [normal((2, 3, 7))], [1], False),
    ("max_pool2d_nchw_vect_c_is_channels_first",
     lambda x: flow.nn.max_pool2d(x, 2, 1, "VALID", data_format="NCHW_VECT_C"),
     lambda x: F.max_pool2d(x, 2, 1), [sep((1, 3, 4, 5))], [1], True),
    ("max_pool3d", lambda x: flow.nn.max_pool3d(x, 2, 2, "VALID"),
     lambda x: F.max_pool3d(x, 2, 2), [sep((2, 2, 4, 4, 4))], [1], True),
    ("max_pool3d_overlapping_padded",
     lambda x: flow.nn.max_pool3d(x, 3, 2, [[0, 0], [0, 0], [1, 1], [1, 1], [1, 1]]),
     lambda x: F.max_pool3d(x, 3, 2, padding=1), [sep((1, 2, 5, 5, 5))], [1], True),
    ("max_pool3d_ndhwc", lambda x: flow.nn.max_pool3d(x, 2, 1, "VALID", data_format="NDHWC"),
     lambda x: _last(F.max_pool3d(_first(x), 2, 1)), [sep((1, 3, 3, 4, 2))], [1], True),
    ("avg_pool3d_overlapping_same", lambda x: flow.nn.avg_pool3d(x, 3, 2, "SAME"),
     _avg_excluding_pad(F.avg_pool3d, (1, 1, 1, 0, 1, 1), 3, 2),
     [normal((1, 2, 5, 6, 5))], [1], False),
    # ceil_mode counts with explicit pads only, as OneFlow's GetWindowedOutputSize ("VALID"
    # and "SAME" keep their own sizes)
    ("avg_pool2d_ceil_mode",
     lambda x: flow.nn.avg_pool2d(x, 3, 2, [[0, 0], [0, 0], [0, 0], [0, 0]], ceil_mode=True),
     lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), [normal((1, 2, 6, 6))], [1], False),
    ("max_pool2d_ceil_mode",
     lambda x: flow.nn.max_pool2d(x, 3, 2, [[0, 0], [0, 0], [0, 0], [0, 0]], ceil_mode=True),
     lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), [sep((1, 2, 6, 6))], [1], True),
    ("max_pool2d_valid_ceil_mode_is_valid",
     lambda x: flow.nn.max_pool2d(x, 3, 2, "VALID", ceil_mode=True),
     lambda x: F.max_pool2d(x, 3, 2), [sep((1, 2, 6, 6))], [1], True),
    ("avg_pool2d_same_ceil_mode_is_same",
     lambda x: flow.nn.avg_pool2d(x, 2, 2, "SAME", ceil_mode=True),
     lambda x: F.avg_pool2d(x, 2, 2), [normal((1, 2, 6, 6))], [1], False),
    ("avg_pool2d_ceil_mode_padded_last_window_dropped",
     lambda x: flow.nn.avg_pool2d(x, 2, 2, [[0, 0], [0, 0], [1, 1], [0, 1]], ceil_mode=True),
     _avg_excluding_pad(F.avg_pool2d, (0, 1, 1, 1), 2, 2), [normal((1, 2, 5, 4))], [1],
     False),
    ("max_pool2d_ceil_mode_padded_last_window_dropped",
     lambda x: flow.nn.max_pool2d(x, 2, 2, [[0, 0], [0, 0], [0, 1], [0, 1]], ceil_mode=True),
     lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), [sep((1, 2, 4, 4))], [1], True),
    ("average_pool_op_ceil_mode",
     lambda x: op("AveragePool", x, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 0, 0],
                  ceil_mode=1),
     _avg_excluding_pad(lambda x, k, s: F.avg_pool2d(x, k, s, ceil_mode=True), (0, 0, 1, 0),
                        (3, 2), 2), [normal((1, 2, 6, 5))], [1], False),
    # a stride-1 pool's gradient as window sums (pooling._window_sums): MobileNetV3's
    # squeeze-excite writes its global pool as a whole-window "SAME" pool, strides None
    ("avg_pool2d_whole_window_same_strides_none",
     lambda x: flow.nn.avg_pool2d(x, [4, 6], None, "SAME"),
     _avg_excluding_pad(F.avg_pool2d, (3, 2, 2, 1), (4, 6), 1), [normal((1, 2, 4, 6))], [1],
     False),
    ("average_pool_op_stride_1_padding_counted",
     lambda x: op("AveragePool", x, kernel_shape=[3, 2], pads=[1, 0, 2, 1],
                  count_include_pad=1),
     lambda x: F.avg_pool2d(F.pad(x, (0, 1, 1, 2)), (3, 2), 1), [normal((2, 3, 5, 4))], [1],
     False),
    ("global_avg_pool3d", lambda x: op("GlobalAveragePool", x),
     lambda x: x.mean((2, 3, 4), keepdim=True), [normal((2, 3, 2, 3, 4))], [1], False),
    ("upsample_nearest", lambda x: upsample(x, 2),
     lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), [normal((2, 3, 4, 5))], [1],
     False),
    ("upsample_nearest_3x2", lambda x: upsample(x, (3, 2)),
     lambda x: F.interpolate(x, scale_factor=(3, 2), mode="nearest"), [normal((1, 2, 3, 4))],
     [1], False),
    ("upsample_bilinear", lambda x: upsample(x, 2, interpolation="bilinear"),
     lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), [normal((2, 3, 4, 5))], [1],
     False),
    ("upsample_bilinear_align_corners",
     lambda x: upsample(x, (2, 3), align_corners=True, interpolation="bilinear"),
     lambda x: F.interpolate(x, scale_factor=(2, 3), mode="bilinear", align_corners=True),
     [normal((1, 2, 4, 3))], [1], False),
    ("upsample_bilinear_nhwc",
     lambda x: upsample(x, 2, data_format="NHWC", interpolation="bilinear"),
     lambda x: _last(F.interpolate(_first(x), scale_factor=2, mode="bilinear")),
     [normal((1, 3, 4, 2))], [1], False),
    ("resize_linear_downscale_sizes", lambda x: _resize(x, [2, 3, 5], "linear", "half_pixel"),
     lambda x: F.interpolate(x, size=5, mode="linear"), [normal((2, 3, 8))], [1], False),
    ("resize_nearest_3d_sizes",
     lambda x: _resize(x, [1, 2, 3, 5, 7], "nearest", "asymmetric", "floor"),
     lambda x: F.interpolate(x, size=(3, 5, 7), mode="nearest"), [normal((1, 2, 2, 4, 3))],
     [1], False),
    ("pixel_shuffle", lambda x: flow.nn.PixelShuffle(x, 2), lambda x: F.pixel_shuffle(x, 2),
     [normal((2, 8, 3, 3))], [1], True),
    ("pixel_shufflev2", lambda x: flow.nn.PixelShufflev2(x, 2, 3),
     lambda x: _shuffle_v2(x, 2, 3), [normal((2, 12, 3, 2))], [1], True),
    ("depth_to_space_dcr", lambda x: op("DepthToSpace", x, blocksize=2, mode="DCR"),
     lambda x: _dcr(x, 2), [normal((2, 8, 2, 3))], [1], True),
    ("space_to_depth", lambda x: op("SpaceToDepth", x, blocksize=2),
     lambda x: _space_to_depth(x, 2), [normal((2, 3, 4, 6))], [1], True),
]


test_against_finite_differences, test_against_pytorch = gradient_tests(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_pytorch_traced_for_cuda(case):
    """Every case's VJP as a job compiled for CUDA traces it (its own weight-gradient
    columns: whole, or per image), run on the CPU EP, against PyTorch."""
    check_case_against_pytorch(case, "cuda")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float64_lowerings_against_pytorch(case):
    """float64 (lowered where onnxruntime lacks the kernel): value and VJP at 1e-10."""
    name, fn, torch_fn, makers, diff, _ = case
    rng = np.random.default_rng(4)
    xs = [np.asarray(m(rng), np.float64) for m in makers]
    run, yshape = vjp(fn, xs, diff)
    ct = rng.standard_normal(yshape)
    y, grads = run(xs, ct)
    assert y.dtype == np.float64
    txs = [torch.tensor(x, requires_grad=bool(d)) for x, d in zip(xs, diff)]
    ty = torch_fn(*txs)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-10)
    ty.backward(torch.tensor(ct))
    for g, x in zip(grads, [t for t, d in zip(txs, diff) if d]):
        np.testing.assert_allclose(g, x.grad.numpy(), rtol=1e-10, atol=1e-10)


FORMULATION_CASES = [c for c in CASES if c[0] in (
    "conv1d_stride2", "conv1d_nwc_same_dilated", "conv3d_strided_asymmetric_pad",
    "conv2d_transpose_stride2_output_padding", "torch_conv2d_transpose",
    "conv_transpose3d_bias")]


@pytest.mark.parametrize("formulation", ["im2col", "conv"])
@pytest.mark.parametrize("case", FORMULATION_CASES, ids=[c[0] for c in FORMULATION_CASES])
def test_weight_gradient_formulations_of_other_ranks(case, formulation, monkeypatch):
    """ONNXJOB_CONV_WGRAD's group-1 formulations work for 1-D, 3-D and transposed convs."""
    monkeypatch.setenv("ONNXJOB_CONV_WGRAD", formulation)
    check_case_against_pytorch(case)


def _backward_ops(fn, xs, device=None):
    """The op types autodiff emits for the gradients of sum(fn(*xs)) w.r.t. all xs (traced
    for `device`, as compile_job traces a job)."""
    builder = GraphBuilder("g", is_train=True)
    builder.device = device
    with tracing(builder):
        blobs = [builder.add_input(f"x{i}", x.shape, x.dtype) for i, x in enumerate(xs)]
        for b, x in zip(blobs, xs):
            builder.variables[b.name] = b
            builder.variable_specs[b.name] = VariableSpec(b.name, x.shape, x.dtype, None)
        y = fn(*blobs)
        first = len(builder.nodes)
        autodiff.backward(builder, [op("ReduceSum", y, keepdims=0)])
    return [n.op_type for n in builder.nodes[first:]]


@pytest.mark.parametrize("batch,columns_op", [(2, "Slice"), (8, "Gather")])
def test_grouped_weight_gradient_is_one_batched_matmul(batch, columns_op):
    """32 groups: one batched MatMul over im2col columns (per-offset Slices when an output
    row is longer than the batch, else one batch-last Gather), no per-group loop. (The
    other MatMul flips the kernels for the input gradient.)"""
    ops = _backward_ops(lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=32),
                        [np.zeros((batch, 64, 4, 4), np.float32),
                         np.zeros((64, 2, 3, 3), np.float32)])
    assert ops.count("MatMul") == 2 and columns_op in ops
    assert "Split" not in ops and "Gemm" not in ops
    assert ops.count("Conv") == 1  # the input gradient (stride 1: a flipped-kernel Conv)


CHUNKED_CASES = [
    ("grouped_per_image_chunks", lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=2),
     lambda x, w: F.conv2d(x, w, padding=1, groups=2),
     [normal((4, 4, 6, 6)), normal((6, 2, 3, 3))], [1, 1], False),
    ("depthwise_group_chunks", lambda x, w: flow.nn.conv2d(x, w, 2, "SAME", groups=4),
     lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=4),
     [normal((4, 4, 7, 7)), normal((8, 1, 3, 3))], [1, 1], False),
]


@pytest.mark.parametrize("case", CHUNKED_CASES, ids=[c[0] for c in CHUNKED_CASES])
def test_grouped_weight_gradient_in_chunks(case, monkeypatch):
    """Columns larger than CHUNK_BYTES are built and multiplied chunk by chunk: by images
    (partial sums added) or by groups (results concatenated)."""
    from onnxjob.graph.primitives import conv_weight_grad as rules
    monkeypatch.setattr(rules, "CHUNK_BYTES", 1000)
    ops = _backward_ops(case[1], [np.zeros(m(np.random.default_rng(0)).shape, np.float32)
                                  for m in case[3]])
    assert "Split" in ops and ops.count("MatMul") + ops.count("Gemm") > 1
    check_case_against_pytorch(case)
    check_case_finite_differences(case)


COLUMN_CHUNK_CASES = [
    ("same_3x3", lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"),
     lambda x, w: F.conv2d(x, w, padding=1),
     [normal((3, 4, 6, 6)), normal((5, 4, 3, 3))], [1, 1], False),
    ("strided_5x5", lambda x, w: flow.nn.conv2d(x, w, 2, "SAME"),
     lambda x, w: F.conv2d(x, w, stride=2, padding=2),
     [normal((2, 3, 9, 9)), normal((4, 3, 5, 5))], [1, 1], False),
]


@pytest.mark.parametrize("case", COLUMN_CHUNK_CASES, ids=[c[0] for c in COLUMN_CHUNK_CASES])
def test_weight_gradient_columns_in_chunks(case, monkeypatch):
    """Group-1 columns beyond 2 * COLUMN_CHUNK_BYTES are gathered and multiplied by chunks
    of output positions, each Gemm adding the last one's result; below, one Gemm."""
    from onnxjob.graph.primitives import conv_weight_grad as rules
    zeros = [np.zeros(m(np.random.default_rng(0)).shape, np.float32) for m in case[3]]
    assert _backward_ops(case[1], zeros).count("Gemm") == 1
    monkeypatch.setattr(rules, "COLUMN_CHUNK_BYTES", 600)
    ops = _backward_ops(case[1], zeros)
    assert "Split" in ops and ops.count("Gemm") > 2 and ops.count("Gather") == ops.count("Gemm")
    check_case_against_pytorch(case)
    check_case_finite_differences(case)


def test_weight_gradient_columns_go_whole_on_cuda(monkeypatch):
    """Traced for CUDA, columns the CPU's limit would chunk are gathered whole (one Gather,
    one Gemm) up to 2 * CUDA_COLUMN_CHUNK_BYTES, and by chunks beyond."""
    from onnxjob.graph.primitives import conv_weight_grad as rules
    # (more channels than positions: the batch-last columns, not per-image ones)
    conv = lambda x, w: flow.nn.conv2d(x, w, 1, "SAME")    # noqa: E731
    zeros = [np.zeros((3, 8, 6, 6), np.float32), np.zeros((16, 8, 3, 3), np.float32)]
    monkeypatch.setattr(rules, "COLUMN_CHUNK_BYTES", 600)
    assert _backward_ops(conv, zeros).count("Gemm") > 2
    ops = _backward_ops(conv, zeros, "cuda")
    assert ops.count("Gemm") == 1 and ops.count("Gather") == 1 and "Split" not in ops
    monkeypatch.setattr(rules, "CUDA_COLUMN_CHUNK_BYTES", 600)
    assert _backward_ops(conv, zeros, "cuda").count("Gemm") > 2


# convolutions whose per-image weight-gradient results (M*C*K a image) are smaller than
# x and gy (Q*(M+C)): large images, few channels
PER_IMAGE_CASES = [
    ("same_3x3", lambda x, w: flow.nn.conv2d(x, w, 1, "SAME"),
     lambda x, w: F.conv2d(x, w, padding=1), [normal((2, 2, 8, 8)), normal((3, 2, 3, 3))],
     [1, 1], False),
    ("stride2_dilated_asymmetric",
     lambda x, w: flow.nn.conv2d(x, w, 2, [[0, 0], [0, 0], [1, 2], [0, 1]], dilations=2),
     lambda x, w: F.conv2d(F.pad(x, (0, 1, 1, 2)), w, stride=2, dilation=2),
     [normal((2, 2, 12, 11)), normal((3, 2, 3, 2))], [1, 1], False),
    ("conv1d_stride2", lambda x, w: flow.nn.conv1d(x, w, 2, "VALID"),
     lambda x, w: F.conv1d(x, w, stride=2), [normal((2, 2, 20)), normal((3, 2, 3))], [1, 1],
     False),
    ("conv3d_strided_asymmetric_pad",
     lambda x, w: flow.nn.conv3d(x, w, [1, 2, 1], [[0, 0], [0, 0], [1, 1], [0, 1], [1, 0]]),
     lambda x, w: F.conv3d(F.pad(x, (1, 0, 0, 1, 1, 1)), w, stride=(1, 2, 1)),
     [normal((1, 2, 5, 6, 6)), normal((2, 2, 2, 3, 2))], [1, 1], False),
]


@pytest.mark.parametrize("case", PER_IMAGE_CASES, ids=[c[0] for c in PER_IMAGE_CASES])
def test_weight_gradient_columns_per_image_on_cuda(case):
    """Traced for CUDA, a group-1 weight gradient whose per-image results are smaller than
    x and gy made batch-last gathers its columns per image from x as it is, (N, C*K, Q),
    and sums per-image products: no activation is transposed (the one Transpose is the
    MatMul's transB operand, which onnxruntime fuses). Against PyTorch and finite
    differences, as the CPU's batch-last form."""
    zeros = [np.zeros(m(np.random.default_rng(0)).shape, np.float32) for m in case[3]]
    ops = _backward_ops(case[1], zeros, "cuda")
    assert ops.count("Gather") == 1 and ops.count("MatMul") >= 1 and "Gemm" not in ops, ops
    assert ops.count("Transpose") == 1, ops
    check_case_against_pytorch(case, "cuda")
    check_case_finite_differences(case, "cuda")


def test_batch_last_columns_on_cuda_when_asked(monkeypatch):
    """ONNXJOB_CONV_WGRAD=batch-last keeps a CUDA job's early layers on the batch-last
    columns and one Gemm (to compare the two on a GPU: bench_variants.py)."""
    case = PER_IMAGE_CASES[0]
    zeros = [np.zeros(m(np.random.default_rng(0)).shape, np.float32) for m in case[3]]
    monkeypatch.setenv("ONNXJOB_CONV_WGRAD", "batch-last")
    ops = _backward_ops(case[1], zeros, "cuda")
    assert ops.count("Gemm") == 1 and ops.count("Transpose") >= 2, ops
    check_case_against_pytorch(case, "cuda")


# -- shape rules ------------------------------------------------------------------------------

def _run_forward(fn, xs):
    """(traced shape, onnxruntime's value) of fn(*xs) in a predict graph."""
    builder = GraphBuilder("fwd")
    with tracing(builder):
        blobs = [builder.add_input(f"x{i}", x.shape, x.dtype) for i, x in enumerate(xs)]
        y = op("Identity", fn(*blobs))
        y.value.name = "y"
        builder.graph.outputs.append(y.value)
    model = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION)).SerializeToString()
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return y.shape, sess.run(None, {f"x{i}": x for i, x in enumerate(xs)})[0]


@pytest.mark.parametrize("attrs,crop", [   # the full output is 11 x 9; crop: t, b, l, r
    (dict(output_shape=[8, 6]), (2, 1, 2, 1)),             # NOTSET: the larger half first
    (dict(output_shape=[8, 6], auto_pad="SAME_UPPER"), (1, 2, 1, 2)),
    (dict(auto_pad="SAME_UPPER"), (0, 1, 0, 1)),           # output = input * stride
    (dict(auto_pad="SAME_LOWER"), (1, 0, 1, 0)),
    (dict(auto_pad="VALID"), (0, 0, 0, 0)),
])
def test_conv_transpose_shape_rule_for_output_shape_and_auto_pad(attrs, crop):
    """The ConvTranspose shape rule (and its gradient) for output_shape / auto_pad agree
    with onnxruntime and with PyTorch's full transposed convolution, cropped."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)

    def fn(a, b):
        return op("ConvTranspose", a, b, strides=[2, 2], **attrs)
    shape, y = _run_forward(fn, [x, w])
    assert y.shape == shape
    full = F.conv_transpose2d(torch.tensor(x), torch.tensor(w), stride=2)
    top, bottom, left, right = crop
    expected = full[..., top:full.shape[2] - bottom, left:full.shape[3] - right]
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-5)
    case = ("t", fn, lambda a, b: F.conv_transpose2d(a, b, stride=2)[
        ..., top:full.shape[2] - bottom, left:full.shape[3] - right],
        [normal(x.shape), normal(w.shape)], [1, 1], False)
    check_case_against_pytorch(case)


def test_conv_transpose_output_padding_must_be_less_than_the_stride():
    """onnxruntime refuses output_padding >= stride (even below the dilation) at run time,
    so the shape rule refuses it while tracing."""
    for attrs in (dict(strides=[2], output_padding=[2]), dict(dilations=[2], output_padding=[1])):
        with pytest.raises(TraceError, match="output_padding"):
            _run_forward(lambda x, w: op("ConvTranspose", x, w, **attrs),
                         [np.zeros((1, 2, 4), np.float32), np.zeros((2, 2, 3), np.float32)])


# -- dtypes ----------------------------------------------------------------------------------

def _conv_like(api):
    ops = {
        "conv1d": (lambda x, w: flow.nn.conv1d(x, w, 1, "SAME"), (2, 3, 6), (4, 3, 3)),
        "conv2d": (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=3), (2, 3, 5, 5),
                   (3, 1, 3, 3)),
        "conv3d": (lambda x, w: flow.nn.conv3d(x, w, 2, "VALID"), (1, 2, 4, 5, 4),
                   (3, 2, 2, 2, 2)),
        "compat_conv2d": (lambda x, w: flow.nn.compat_conv2d(x, w, 2, "SAME"), (1, 2, 6, 6),
                          (3, 2, 3, 3)),
        "conv2d_transpose": (lambda x, w: flow.nn.conv2d_transpose(
            x, w, output_shape=(1, 3, 8, 8), strides=2, padding="SAME"), (1, 2, 4, 4),
            (2, 3, 3, 3)),
        "torch_conv2d_transpose": (lambda x, w: flow.nn.torch_conv2d_transpose(
            x, w, strides=2, padding_needed=[2, 0]), (1, 2, 4, 4), (2, 3, 3, 3)),
    }
    return ops[api]


TORCH_FORWARD = {
    "conv1d": lambda x, w: F.conv1d(x, w, padding=1),
    "conv2d": lambda x, w: F.conv2d(x, w, padding=1, groups=3),
    "conv3d": lambda x, w: F.conv3d(x, w, stride=2),
    "compat_conv2d": lambda x, w: F.conv2d(F.pad(x, (0, 1, 0, 1)), w, stride=2),
    "conv2d_transpose": lambda x, w: F.conv_transpose2d(x, w, stride=2)[..., :8, :8],
    "torch_conv2d_transpose": lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=(1, 0)),
    "max_pool1d": lambda x: _last(F.max_pool1d(_first(x), 2, 2)),
    "avg_pool1d": lambda x: F.avg_pool1d(x, 2, 2),
    "max_pool2d": lambda x: F.max_pool2d(x, 3, 2, padding=1),
    "avg_pool2d": lambda x: F.avg_pool2d(x, 2, 1),
    "max_pool3d": lambda x: F.max_pool3d(x, 2, 2),
    "avg_pool3d": lambda x: F.avg_pool3d(x, 2, 2),
    "upsample_nearest": lambda x: F.interpolate(x, scale_factor=2, mode="nearest"),
    "upsample_bilinear": lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
}
UNARY = {
    "max_pool1d": (lambda x: flow.nn.max_pool1d(x, 2, 2, "VALID"), (2, 6, 3)),
    "avg_pool1d": (lambda x: flow.nn.avg_pool1d(x, 2, 2, "VALID"), (2, 3, 6)),
    "max_pool2d": (lambda x: flow.nn.max_pool2d(x, 3, 2, "SAME"), (2, 3, 5, 5)),
    "avg_pool2d": (lambda x: flow.nn.avg_pool2d(x, 2, 1, "VALID"), (2, 3, 5, 5)),
    "max_pool3d": (lambda x: flow.nn.max_pool3d(x, 2, 2, "VALID"), (1, 2, 4, 4, 4)),
    "avg_pool3d": (lambda x: flow.nn.avg_pool3d(x, 2, 2, "VALID"), (1, 2, 4, 4, 4)),
    "upsample_nearest": (lambda x: upsample(x, 2), (1, 2, 3, 4)),
    "upsample_bilinear": (lambda x: upsample(x, 2, interpolation="bilinear"), (1, 2, 3, 4)),
}
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("api", list(TORCH_FORWARD))
def test_dtypes_run_correctly_or_raise(api, dtype):
    """OneFlow's CPU kernels take float32 and float64: those run (float64 exactly, through
    the lowerings), integers raise TraceError before onnxruntime sees the graph (float16,
    which the GPU kernels of some of these take, is in test_op_properties.py)."""
    rng = np.random.default_rng(5)
    if api in UNARY:
        fn, shapes = UNARY[api][0], [UNARY[api][1]]
    else:
        fn, *shapes = _conv_like(api)
    xs = [(rng.standard_normal(s) * 3).astype(dtype) for s in shapes]
    if np.dtype(dtype).kind != "f":
        with pytest.raises(TraceError, match=r"takes (float16, )?float32 or float64 input"):
            _run_forward(fn, xs)
        return
    _, y = _run_forward(fn, xs)
    assert y.dtype == dtype
    expected = TORCH_FORWARD[api](*(torch.tensor(x) for x in xs)).numpy()
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(y, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES + [np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_pixel_shuffle_takes_every_dtype(dtype):
    """PixelShuffle is a rearrangement (Reshape + Transpose in OneFlow): every dtype runs,
    DepthToSpace where onnxruntime has the kernel, Reshape + Transpose otherwise."""
    x = (np.arange(2 * 8 * 2 * 3) % 7).reshape(2, 8, 2, 3).astype(dtype)
    expected = F.pixel_shuffle(torch.tensor(x.astype(np.float64)), 2).numpy().astype(dtype)
    _, y = _run_forward(lambda a: flow.nn.PixelShuffle(a, 2), [x])
    np.testing.assert_array_equal(y, expected)
    _, y = _run_forward(lambda a: op("SpaceToDepth", a, blocksize=2), [x[:, :, :2, :2]])
    np.testing.assert_array_equal(
        y, _space_to_depth(torch.tensor(x[:, :, :2, :2].astype(np.float64)), 2).numpy()
        .astype(dtype))


# -- errors ----------------------------------------------------------------------------------

X4, W4 = (2, 4, 4, 4), (4, 4, 3, 3)


@pytest.mark.parametrize("call,shapes,message", [
    (lambda x, w: flow.nn.conv1d(x, w, 1, "VALID", data_format="NCHW"), [(2, 4, 6), (4, 4, 3)],
     "data_format must be one of NCW, NWC"),
    (lambda x, w: flow.nn.conv1d(x, w, 1, "VALID", data_format="NWC", groups=2),
     [(2, 6, 4), (4, 3, 2)], "NWC does not support groups"),
    (lambda x, w: flow.nn.conv3d(x, w, 1, "VALID"), [X4, W4], "3-D convolution needs a 5-D"),
    (lambda x, w: flow.nn.conv2d(x, w, 1, "SAME", groups=3), [X4, W4], "with group 3 expects"),
    (lambda x, w: flow.nn.conv2d_transpose(x, w, output_shape=(2, 4, 11, 11), strides=2),
     [X4, W4], "output size 11 does not fit input size 4"),
    (lambda x, w: flow.nn.conv2d_transpose(x, w, output_shape=(3, 5, 8, 8), strides=2,
                                           padding="SAME"), [X4, W4], "the input's batch 2"),
    (lambda x, w: flow.nn.conv2d_transpose(x, w, strides=2), [X4, W4], "output_shape must be"),
    (lambda x, w: flow.nn.conv2d_transpose(x, w, output_shape=(2, 4, 8, 8), strides=2,
                                           input=x), [X4, W4], "one of `value` and `input`"),
    (lambda x, w: flow.nn.torch_conv2d_transpose(x, w, strides=2, padding_needed=[1, 1]),
     [X4, W4], "padding_needed must be 2 even ints"),
    (lambda x, w: upsample(x, 2, align_corners=True), [X4, W4], "does not support align_corn"),
    (lambda x, w: upsample(x, 2, interpolation="bicubic"), [X4, W4], "interpolation must be"),
    (lambda x, w: flow.nn.PixelShuffle(x, 3), [X4, W4], "divisible by 9"),
    (lambda x, w: flow.nn.max_pool3d(x, 2, 2, "VALID"), [X4, W4], "3-D pool needs a 5-D input"),
    (lambda x, w: flow.nn.avg_pool1d(x, 2, 2, "FULL"), [(2, 4, 6), W4], "padding must be VALID"),
])
def test_bad_arguments_raise_trace_error(call, shapes, message):
    with pytest.raises(TraceError, match=message) as e:
        _run_forward(call, [np.zeros(s, np.float32) for s in shapes])
    assert "test_ops_conv.py" in str(e.value)


# -- a train job ----------------------------------------------------------------------------

def test_train_job_with_grouped_conv_deconv_pool_and_upsample_matches_pytorch():
    """One SGD step of a small encoder-decoder (depthwise + grouped conv, max pool,
    transposed conv, bilinear upsample) gives PyTorch's updated weights."""
    rng = np.random.default_rng(6)
    shapes = {"dw": (4, 1, 3, 3), "g": (8, 2, 3, 3), "up": (8, 4, 2, 2)}  # g: 2 groups
    init = {k: rng.standard_normal(s).astype(np.float32) * 0.5 for k, s in shapes.items()}
    images = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)

    def variable(name):
        return flow.get_variable(name, shape=shapes[name], dtype=flow.float,
                                 initializer=flow.constant_initializer(0.0))

    @flow.global_function(type="train")
    def step(x: tp.Numpy.Placeholder((2, 4, 8, 8))) -> tp.Numpy:
        h = flow.nn.conv2d(x, variable("dw"), 1, "SAME", groups=4)
        h = flow.nn.conv2d(h, variable("g"), 1, "SAME", groups=2)
        h = flow.nn.max_pool2d(h, 2, 2, "VALID")
        h = flow.nn.conv2d_transpose(h, variable("up"), output_shape=(2, 4, 8, 8), strides=2)
        h = upsample(h, 2, interpolation="bilinear")
        loss = flow.math.reduce_mean(flow.math.square(h))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    flow.load_variables(init)
    loss = step(images)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    h = F.conv2d(torch.tensor(images), t["dw"], padding=1, groups=4)
    h = F.max_pool2d(F.conv2d(h, t["g"], padding=1, groups=2), 2, 2)
    h = F.interpolate(F.conv_transpose2d(h, t["up"], stride=2), scale_factor=2,
                      mode="bilinear")
    expected = (h ** 2).mean()
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5)
    values = flow.get_all_variables()
    for k in init:
        np.testing.assert_allclose(values[k].numpy(), (t[k] - 0.1 * t[k].grad).detach().numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_conv2d_transpose_takes_its_output_channels_from_the_weight():
    """Generative/layers.py passes the input's channel count in output_shape; OneFlow only
    uses the batch and spatial entries of output_shape, so that runs."""
    x = np.ones((2, 8, 4, 4), np.float32)
    w = np.ones((8, 3, 5, 5), np.float32)

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder(x.shape), k: tp.Numpy.Placeholder(w.shape)) -> tp.Numpy:
        return flow.nn.conv2d_transpose(a, k, output_shape=(2, 8, 8, 8), strides=2,
                                        padding="SAME")

    assert job(x, w).shape == (2, 3, 8, 8)


def test_overlapping_max_pool_gradient_leaves_no_input_sized_constant(tmp_path):
    """The zeros the gradient scatters into are made at run time: onnxruntime would fold a
    ConstantOfShape into an initializer of the input's size, kept for the session's life."""
    shape = (4, 8, 32, 32)

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder(shape)) -> tp.Numpy:
        w = flow.get_variable("w", (1, 8, 1, 1), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(flow.nn.max_pool2d(x * w, 3, 2, "SAME"))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    job(np.random.default_rng(0).random(shape, dtype=np.float32))
    flow.export(job, str(tmp_path / "step.onnx"))
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "step.onnx"), opts, providers=["CPUExecutionProvider"])
    optimized = onnx.load(str(tmp_path / "optimized.onnx"))
    sizes = [int(np.prod(t.dims)) for t in optimized.graph.initializer]
    assert max(sizes) < np.prod(shape), sorted(sizes)[-3:]


def _ndhwc_layer(groups=1, padding="SAME", kernel=(1, 3, 3)):
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((1, 4, 6, 6, 4))) -> tp.Numpy:
        return flow.layers.conv3d(x, 4, kernel_size=kernel, padding=padding, groups=groups,
                                  data_format="NDHWC", name="c")
    return job


def test_conv3d_layer_ndhwc_is_oneflow_s_ncdhw_between_transposes():
    """OneFlow's conv3d layer transposes an NDHWC input to NCDHW first: its weight is
    (filters, in/groups, kd, kh, kw) and groups are taken (layers.py of v0.4/v0.5)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 6, 6, 4)).astype(np.float32)
    torch = pytest.importorskip("torch")
    for groups in (1, 2):
        job = _ndhwc_layer(groups)
        job(x)
        weight = rng.standard_normal((4, 4 // groups, 1, 3, 3)).astype(np.float32)
        flow.load_variables({"c-weight": weight, "c-bias": np.zeros(4, np.float32)})
        expected = torch.nn.functional.conv3d(
            torch.from_numpy(x).permute(0, 4, 1, 2, 3), torch.from_numpy(weight),
            padding=(0, 1, 1), groups=groups).permute(0, 2, 3, 4, 1).numpy()
        np.testing.assert_allclose(job(x), expected, rtol=1e-5, atol=1e-5)


def test_conv3d_ndhwc_explicit_pads_are_read_as_oneflow_reads_them():
    """OneFlow swaps only the pads of axes 1 and 4 when it transposes NDHWC to NCDHW: the
    depth, height and width take those written for height, width and depth (said once)."""
    pads = [[0, 0], [0, 0], [1, 1], [1, 1], [0, 0]]   # written: H and W padded by 1

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((1, 4, 6, 6, 2)),
            w: tp.Numpy.Placeholder((3, 1, 3, 3, 2))) -> tp.Numpy:
        return flow.nn.conv3d(x, w, 1, pads, data_format="NDHWC")

    with pytest.warns(UserWarning, match="depth, height and width take the pads"):
        out = job(np.ones((1, 4, 6, 6, 2), np.float32), np.ones((3, 1, 3, 3, 2), np.float32))
    assert out.shape == (1, 6, 6, 4, 3)     # D and H padded, W not
    with pytest.warns(UserWarning, match="depth, height and width take the pads"):
        assert _ndhwc_layer(padding=pads, kernel=(1, 3, 3))(
            np.ones((1, 4, 6, 6, 4), np.float32)).shape == (1, 6, 6, 4, 4)
