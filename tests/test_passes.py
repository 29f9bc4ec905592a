"""Each pass, three ways: the structure before, the `modified` flag and the structure
after, and equal numbers from onnxruntime before and after on random inputs."""
import collections
import types

import numpy as np
import pytest
import onnx_ir as ir
import onnxruntime as ort
import onnx_ir.passes as ir_passes
from onnx_ir.passes import common

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, as_blob, op, tracing
from onnxjob.graph import memory_plan
from onnxjob.passes import (AlignBroadcastRanks, BatchNormRowStatistics, BatchNormStatistics,
                    FoldReshapes, FoldTransposeIntoGemm, HalfColumnSums, KeepOnCuda,
                    MaskBeforeMaxUnpool, PadBeforeTranspose,
                    SumSquareReductions, RecomputeCheapValues, ReluMaskAsMul,
                    ScatterAddIntoSum, SeparableAveragePools,
                    ShareBatchNormCentering, ShareCastsThroughViews, SoftmaxCrossEntropyRows,
                    SplitChannelReductions,
                    op_counts)


def build(fn, *shapes):
    builder = GraphBuilder("g")
    with tracing(builder):
        xs = [builder.add_input(f"x{i}", s, np.float32) for i, s in enumerate(shapes)]
        y = fn(*xs)
        y = op("Identity", y)
        y.value.name = "y"
        builder.graph.outputs.append(y.value)
    return ir.Model(builder.graph, ir_version=IR_VERSION)


def run(model, inputs):
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {f"x{i}": x for i, x in enumerate(inputs)})[0]


def check(pass_, fn, shapes, before_ops, after_ops):
    model = build(fn, *shapes)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = run(model, inputs)
    assert {k: v for k, v in op_counts(model).items() if k in before_ops} == before_ops
    result = pass_(model)
    assert result.modified
    counts = op_counts(result.model)
    assert {k: counts.get(k, 0) for k in after_ops} == after_ops
    np.testing.assert_allclose(run(result.model, inputs), expected, rtol=1e-5, atol=1e-6)
    assert not pass_(result.model).modified, "a second run must find nothing left to do"


def test_fold_reshapes_identity_reshape():
    check(FoldReshapes(),
          lambda x: op("Relu", op("Reshape", x, x.builder.constant(np.array([3, 4], np.int64)))),
          [(3, 4)], {"Reshape": 1}, {"Reshape": 0, "Relu": 1})


def test_fold_reshapes_chain():
    check(FoldReshapes(), lambda x: op("Relu", flow.reshape(flow.reshape(x, [12]), [2, 6])),
          [(3, 4)], {"Reshape": 2}, {"Reshape": 1})


def test_fold_reshapes_reduce_sum_keepdims():
    check(FoldReshapes(),
          lambda x: op("Relu", flow.reshape(flow.math.reduce_sum(x, axis=0, keepdims=True), [4])),
          [(3, 4)], {"Reshape": 1, "ReduceSum": 1}, {"Reshape": 0, "ReduceSum": 1})


def test_fold_transpose_into_gemm():
    check(FoldTransposeIntoGemm(), lambda a, b: op("Gemm", flow.transpose(a), b),
          [(4, 3), (4, 5)], {"Transpose": 1, "Gemm": 1}, {"Transpose": 0, "Gemm": 1})


def test_fold_transpose_into_matmul_becomes_gemm():
    check(FoldTransposeIntoGemm(), lambda a, b: flow.matmul(a, b, transpose_b=True),
          [(3, 4), (5, 4)], {"Transpose": 1, "MatMul": 1}, {"Transpose": 0, "MatMul": 0, "Gemm": 1})


def test_transpose_with_other_uses_is_kept():
    def two_uses(a, b):
        t = flow.transpose(a)
        return op("Add", op("Gemm", t, b), op("Relu", op("Gemm", op("Relu", t), b)))
    model = build(two_uses, (4, 3), (4, 4))
    assert not FoldTransposeIntoGemm()(model).modified


def test_transpose_read_by_several_products_folds_into_each():
    """A tied weight read transposed by a forward product and a backward one (BERT's word
    embeddings): no transposed copy is left."""
    def two_products(a, b, w):
        t = flow.transpose(w)
        return op("Add", flow.matmul(a, t), op("Gemm", b, t))
    check(FoldTransposeIntoGemm(), two_products, [(2, 4), (2, 4), (3, 4)],
          {"Transpose": 1, "MatMul": 1, "Gemm": 1}, {"Transpose": 0, "MatMul": 0, "Gemm": 2})


@pytest.mark.parametrize("product, transposes", [
    (lambda a, b: op("Gemm", a, b, transA=1, alpha=0.5), 1),
    (lambda a, b: flow.matmul(flow.transpose(a), b), 2),
])
def test_transpose_of_a_product_is_the_product_swapped(product, transposes):
    """Case 4: (A' B')^T = B'^T A'^T, written in the transposed layout at once (a weight
    gradient computed for the transposed weight)."""
    check(FoldTransposeIntoGemm(), lambda a, b: op("Relu", flow.transpose(product(a, b))),
          [(4, 3), (4, 5)], {"Transpose": transposes},
          {"Transpose": 0, "MatMul": 0, "Gemm": 1})


def _relu_pool_gradient(x, g, pool_input=None):
    """The gradient graph of MaxPool(Relu(x)) for the cotangent g, as the autodiff emits it."""
    r = op("Relu", x)
    _, idx = op("MaxPool", r if pool_input is None else pool_input(r), num_outputs=2,
                kernel_shape=[2, 2], strides=[2, 2])
    zero = x.builder.constant(np.zeros((), np.float32))
    unpooled = op("MaxUnpool", g, idx, x.builder.constant(np.array(x.shape, np.int64)),
                  kernel_shape=[2, 2], strides=[2, 2])
    return op("Where", op("Greater", r, zero), unpooled, zero)


def test_mask_before_max_unpool():
    check(MaskBeforeMaxUnpool(), _relu_pool_gradient, [(2, 3, 6, 6), (2, 3, 3, 3)],
          {"Where": 1, "Greater": 1, "MaxUnpool": 1}, {"Where": 1, "Greater": 1, "MaxUnpool": 1})
    model = build(_relu_pool_gradient, (2, 3, 6, 6), (2, 3, 3, 3))
    MaskBeforeMaxUnpool()(model)
    where = next(n for n in model.graph if n.op_type == "Where")
    assert tuple(where.outputs[0].shape) == (2, 3, 3, 3), "the mask must act on the pooled side"


def test_mask_before_max_unpool_ties_and_zeros():
    """Constant windows (all four equal: zero or positive) route the gradient to one place."""
    model = build(_relu_pool_gradient, (1, 2, 4, 4), (1, 2, 2, 2))
    x = np.array([0.0, 0.5, -1.0, 0.5], np.float32).repeat(8).reshape(1, 2, 4, 4)
    g = np.arange(1, 9, dtype=np.float32).reshape(1, 2, 2, 2)
    expected = run(model, [x, g])
    assert MaskBeforeMaxUnpool()(model).modified
    np.testing.assert_array_equal(run(model, [x, g]), expected)
    assert np.count_nonzero(expected) == 4      # one position in each window whose max is > 0


def test_mask_before_max_unpool_needs_the_same_tensor():
    """A MaxPool over something else than the masked tensor is left alone."""
    model = build(lambda x, g: _relu_pool_gradient(x, g, lambda r: op("Neg", r)),
                  (2, 3, 6, 6), (2, 3, 3, 3))
    assert not MaskBeforeMaxUnpool()(model).modified


def _relu_gradient(x, g):
    """The gradient of Relu(x) for the cotangent g, as the autodiff emits it."""
    zero = x.builder.constant(np.zeros((), np.float32))
    return op("Where", op("Greater", op("Relu", x), zero), g, zero)


def test_relu_mask_as_mul():
    check(ReluMaskAsMul(), _relu_gradient, [(2, 3, 4, 4), (2, 3, 4, 4)],
          {"Where": 1, "Greater": 1}, {"Where": 0, "Greater": 1, "Cast": 1, "Mul": 1})


def test_relu_mask_as_mul_after_mask_before_max_unpool():
    """The pooled-side mask MaskBeforeMaxUnpool leaves is a ReLU mask too; zeros and ties
    (constant windows) come out the same."""
    model = build(_relu_pool_gradient, (1, 2, 4, 4), (1, 2, 2, 2))
    x = np.array([0.0, 0.5, -1.0, 0.5], np.float32).repeat(8).reshape(1, 2, 4, 4)
    g = np.arange(1, 9, dtype=np.float32).reshape(1, 2, 2, 2)
    expected = run(model, [x, g])
    assert MaskBeforeMaxUnpool()(model).modified
    assert ReluMaskAsMul()(model).modified
    assert op_counts(model).get("Where", 0) == 0
    np.testing.assert_array_equal(run(model, [x, g]), expected)


def test_relu_mask_as_mul_leaves_other_masks_alone():
    """A Where over a mask of something else than a ReLU output (a guard that may hide
    inf or NaN) is kept."""
    def guarded(x, g):
        zero = x.builder.constant(np.zeros((), np.float32))
        return op("Where", op("Greater", x, zero), op("Log", g), zero)
    model = build(guarded, (2, 3), (2, 3))
    assert not ReluMaskAsMul()(model).modified


def test_relu_mask_as_mul_runs_only_for_cpu_jobs():
    from onnxjob.passes import default_passes
    assert any(isinstance(p, ReluMaskAsMul) for p in default_passes("cpu"))
    assert not any(isinstance(p, ReluMaskAsMul) for p in default_passes("cuda"))


def _batch_norm_train_model(shape, dtype=np.float32, constant_scale_and_bias=False):
    """onnxjob.BatchNormTrain's forward as the tracer expands it: outputs y, mean + var."""
    builder = GraphBuilder("g")
    channels = shape[1]
    with tracing(builder):
        x = builder.add_input("x0", shape, dtype)
        if constant_scale_and_bias:
            gamma = builder.constant(np.full(channels, 1.5, dtype))
            beta = builder.constant(np.full(channels, -0.5, dtype))
        else:
            gamma = builder.add_input("x1", (channels,), dtype)
            beta = builder.add_input("x2", (channels,), dtype)
        y, mean, var = op("onnxjob.BatchNormTrain", x, gamma, beta, axis=1, epsilon=1e-3,
                          num_outputs=3)
        # (the sum: the statistics' only reader, as in a train graph's moving averages)
        for name, blob in (("y", y), ("sum", op("Add", mean, var))):
            blob = op("Identity", blob)
            blob.value.name = name
            builder.graph.outputs.append(blob.value)
    return ir.Model(builder.graph, ir_version=IR_VERSION)


def _run_all(model, feeds):
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.parametrize("shape,dtype", [((4, 8, 5, 5), np.float32), ((3, 4, 6), np.float64),
                                         ((2, 16, 3, 4, 2), np.float32)])
def test_batch_norm_statistics(shape, dtype):
    """One training-mode BatchNormalization gives y and the batch's mean and biased
    variance as the ReduceMean/Sub/Mul/ReduceMean parts did (x far from zero mean), also
    where onnxruntime writes the statistics over the zero inputs (they must be two)."""
    model = _batch_norm_train_model(shape, dtype)
    rng = np.random.default_rng(0)
    feeds = {"x0": (rng.standard_normal(shape) * 3 + 20).astype(dtype),
             "x1": rng.uniform(0.5, 2, shape[1]).astype(dtype),
             "x2": rng.standard_normal(shape[1]).astype(dtype)}
    expected = _run_all(model, feeds)
    assert op_counts(model)["ReduceMean"] == 2
    assert BatchNormStatistics()(model).modified
    common.RemoveUnusedNodesPass()(model)
    assert op_counts(model).get("ReduceMean", 0) == 0
    (bn,) = [n for n in model.graph if n.op_type == "BatchNormalization"]
    assert bn.attributes["training_mode"].value == 1 and len(bn.outputs) == 3
    # y = (x - mean) / std with x near 20 and std near 3: each path's rounding of x - mean
    # is a few float32 ulps of 20 (1.9e-6 each), over 3 (onnxruntime's kernels sum in
    # another order with more threads: up to 2.9e-6 apart on 16 cores)
    atol = 1e-5 if dtype == np.float32 else 1e-6
    for got, want in zip(_run_all(model, feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=atol)
    assert not BatchNormStatistics()(model).modified


def test_batch_norm_statistics_needs_run_time_scale_or_bias():
    """With gamma and beta both constants there is no run-time vector to make the zero
    statistics inputs from (a constant would be folded into one shared initializer), so
    the parts stay."""
    model = _batch_norm_train_model((2, 4, 3, 3), constant_scale_and_bias=True)
    assert not BatchNormStatistics()(model).modified


def test_batch_norm_statistics_runs_only_for_cpu_jobs():
    from onnxjob.passes import default_passes
    assert any(isinstance(p, BatchNormStatistics) for p in default_passes("cpu"))
    assert not any(isinstance(p, BatchNormStatistics) for p in default_passes("cuda"))


def _batch_norm_backward_parts(x, dy, b):
    """The parts of a CUDA-form batch norm's forward statistics and backward, as
    graph/primitives/batch_norm.py emits them: the forward's x - mean, the backward's x -
    mean made again from the (C,) mean reshaped back, and b * (x - mean) as an inference
    BatchNormalization of x."""
    builder, channels = x.builder, x.shape[1]
    bshape = builder.constant(np.array([1, channels, 1, 1], np.int64))
    mean = op("ReduceMean", x, axes=[0, 2, 3], keepdims=1)
    centered = op("Sub", x, mean)
    var = op("ReduceMean", op("Mul", centered, centered), axes=[0, 2, 3], keepdims=1)
    mean_c = op("Reshape", mean, builder.constant(np.array([channels], np.int64)))
    again = op("Sub", x, op("Reshape", mean_c, bshape))
    d_gamma = op("ReduceSum", op("Mul", dy, again), builder.constant(
        np.array([0, 2, 3], np.int64)), keepdims=1)
    zeros = builder.constant(np.zeros(channels, np.float32))
    unit = builder.constant(np.full(channels, 1 - 1e-5, np.float32))
    spread = op("BatchNormalization", x, b, zeros, mean_c, unit, epsilon=1e-5)
    return op("Add", op("Add", spread, d_gamma), var)


def test_share_batch_norm_centering():
    """The backward's x - mean is the forward's, and b * (x - mean) reads it: x is read by
    forward nodes only, and the numbers are the same."""
    shapes = [(4, 3, 5, 5), (4, 3, 5, 5), (3,)]
    check(ShareBatchNormCentering(), _batch_norm_backward_parts, shapes,
          {"Sub": 2, "BatchNormalization": 1}, {"Sub": 1, "BatchNormalization": 1})
    model = build(_batch_norm_backward_parts, *shapes)
    ShareBatchNormCentering()(model)
    x = model.graph.inputs[0]
    assert sorted(u.node.op_type for u in x.uses()) == ["ReduceMean", "Sub"]
    (bn,) = [n for n in model.graph if n.op_type == "BatchNormalization"]
    assert bn.inputs[0].producer().op_type == "Sub" and bn.inputs[3] is bn.inputs[2]


def test_share_batch_norm_centering_needs_the_forward_s_centering():
    """Without a forward x - mean (a CPU job's statistics come from one training-mode
    node), nothing changes."""
    def backward_only(x, dy, b):
        channels = x.shape[1]
        mean_c = op("ReduceMean", x, axes=[0, 2, 3], keepdims=0)
        again = op("Sub", x, op("Reshape", mean_c, x.builder.constant(
            np.array([1, channels, 1, 1], np.int64))))
        zeros = x.builder.constant(np.zeros(channels, np.float32))
        unit = x.builder.constant(np.full(channels, 1 - 1e-5, np.float32))
        return op("Add", op("Mul", dy, again), op("BatchNormalization", x, b, zeros, mean_c,
                                                   unit, epsilon=1e-5))
    assert not ShareBatchNormCentering()(build(backward_only, (2, 3, 4, 4), (2, 3, 4, 4),
                                               (3,))).modified


def test_share_batch_norm_centering_runs_for_cuda_float32_jobs_only():
    from onnxjob.passes import default_passes

    def has(device, amp):
        return any(isinstance(p, ShareBatchNormCentering) for p in default_passes(device, amp))
    assert has("cuda", False) and not has("cuda", True) and not has("cpu", False)


def test_align_broadcast_ranks_computed_scalar():
    """A computed scalar against a (M, C, 1, 1) weight gets a Reshape to rank 4."""
    check(AlignBroadcastRanks(),
          lambda w, s: op("Sub", w, op("Mul", op("ReduceMean", s, keepdims=0), w)),
          [(6, 4, 1, 1), (3,)], {"Mul": 1, "Sub": 1}, {"Reshape": 1, "Mul": 1, "Sub": 1})
    model = build(lambda w, s: op("Mul", op("ReduceMean", s, keepdims=0), w), (6, 4, 1, 1), (3,))
    AlignBroadcastRanks()(model)
    mul = next(n for n in model.graph if n.op_type == "Mul")
    assert [tuple(v.shape) for v in mul.inputs] == [(1, 1, 1, 1), (6, 4, 1, 1)]


def test_align_broadcast_ranks_constant_and_where():
    """Constants are reshaped in place of a node; every lower-rank input of Where aligns."""
    def fn(w):
        zero = w.builder.constant(np.zeros((), np.float32))
        half = w.builder.constant(np.full((1,), 0.5, np.float32))
        return op("Where", op("Greater", w, zero), op("Mul", w, half), zero)
    check(AlignBroadcastRanks(), fn, [(5, 3, 1)], {"Where": 1}, {"Reshape": 0, "Where": 1})
    model = build(fn, (5, 3, 1))
    AlignBroadcastRanks()(model)
    for node in model.graph:
        if node.op_type in ("Where", "Greater", "Mul"):
            assert all(len(v.shape) == 3 for v in node.inputs), node


def test_align_broadcast_ranks_leaves_other_shapes_alone():
    """Only outputs that end in a unit axis are rewritten (a bias add (N, C) + (C,) is fast)."""
    model = build(lambda x, b: op("Add", x, b), (4, 3), (3,))
    assert not AlignBroadcastRanks()(model).modified


def test_switch_off_and_user_pass(monkeypatch):
    seen = []

    class CountingPass(ir.passes.InPlacePass):
        def call(self, model):
            seen.append(collections.Counter(n.op_type for n in model.graph))
            return ir.passes.PassResult(model, False)

    config = flow.function_config()
    config.passes([CountingPass()])

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return flow.math.relu(flow.reshape(flow.reshape(x, [12]), [3, 4]))

    x = np.ones((3, 4), np.float32)
    assert np.array_equal(job(x), x)
    assert seen and seen[-1]["Reshape"] == 0

    flow.clear_default_session()
    monkeypatch.setenv("ONNXJOB_DISABLE_PASSES", "1")
    config = flow.function_config()
    config.passes([CountingPass()])

    @flow.global_function(function_config=config)
    def job2(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return flow.math.relu(flow.reshape(flow.reshape(x, [12]), [3, 4]))

    seen.clear()
    job2(x)
    assert seen == []
    from onnxjob.runtime.session import default_session
    assert op_counts(default_session().runtimes["job2"].compiled.model)["Reshape"] == 2


def test_dump_passes_writes_before_and_after(tmp_path, capsys):
    config = flow.function_config()
    config.dump_passes(str(tmp_path))

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        return flow.reshape(flow.reshape(x, [12]), [3, 4])

    job(np.ones((3, 4), np.float32))
    assert (tmp_path / "job.before.onnx").is_file() and (tmp_path / "job.after.onnx").is_file()
    assert "Reshape" in capsys.readouterr().out


def test_keep_on_cuda_max_unpool_becomes_scatter_elements():
    def unpool(x, g):
        _, idx = op("MaxPool", x, num_outputs=2, kernel_shape=[2, 2], strides=[2, 2])
        return op("MaxUnpool", g, idx, x.builder.constant(np.array(x.shape, np.int64)),
                  kernel_shape=[2, 2], strides=[2, 2])
    check(KeepOnCuda(), unpool, [(2, 3, 6, 6), (2, 3, 3, 3)], {"MaxUnpool": 1},
          {"MaxUnpool": 0, "ScatterElements": 1, "ConstantOfShape": 0})


def test_keep_on_cuda_overlapping_max_pool_gradient_makes_its_zeros_each_run():
    """The overlapping pool's gradient scatters into zeros made by a MaxUnpool of a few
    zeros (primitives/pooling.py); on CUDA they come from the pooled input, not from a
    ConstantOfShape that onnxruntime would fold into an initializer of the input's size,
    and are those zeros alone: one scatter (the gradient's), none copying zeros."""
    from onnxjob.graph.primitives.pooling import _max_pool_grad

    def grad(x, g):
        y, idx = op("MaxPool", x, num_outputs=2, kernel_shape=[3, 3], strides=[2, 2],
                    pads=[1, 1, 1, 1])
        pool = types.SimpleNamespace(inputs=[x], outputs=[y, idx], attrs={
            a: v.value for a, v in y.value.producer().attributes.items()})
        return _max_pool_grad(pool, [g], [True])[0]
    check(KeepOnCuda(), grad, [(2, 3, 8, 8), (2, 3, 4, 4)], {"MaxUnpool": 1},
          {"MaxUnpool": 0, "ConstantOfShape": 0, "Less": 1, "ScatterElements": 1})


def test_keep_on_cuda_asymmetric_conv_transpose_becomes_symmetric_and_sliced():
    def input_grad(gy, w):     # a stride-2 SAME conv's input gradient: pads (0, 0, 1, 1)
        return op("ConvTranspose", gy, w, strides=[2, 2], pads=[0, 0, 1, 1],
                  output_padding=[1, 1])
    check(KeepOnCuda(), input_grad, [(2, 4, 4, 4), (4, 3, 3, 3)], {"ConvTranspose": 1},
          {"ConvTranspose": 1, "Slice": 1})
    model = build(input_grad, (2, 4, 4, 4), (4, 3, 3, 3))
    KeepOnCuda()(model)
    conv = next(n for n in model.graph if n.op_type == "ConvTranspose")
    pads = conv.attributes["pads"].value
    assert pads[:2] == pads[2:], pads


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64, np.int8])
@pytest.mark.parametrize("reduction", ["none", "add"])
def test_keep_on_cuda_scatter_nd_of_other_types(dtype, reduction):
    builder = GraphBuilder("g")
    with tracing(builder):
        data = builder.add_input("x0", (4, 3, 2), dtype)
        updates = builder.add_input("x1", (2, 2), dtype)
        indices = builder.constant(np.array([[1, 2], [3, 0]], np.int64))
        y = op("Identity", op("ScatterND", data, indices, updates, reduction=reduction))
        y.value.name = "y"
        builder.graph.outputs.append(y.value)
    model = ir.Model(builder.graph, ir_version=IR_VERSION)
    rng = np.random.default_rng(0)
    inputs = [(rng.standard_normal(s) * 50).astype(dtype) for s in [(4, 3, 2), (2, 2)]]
    expected = run(model, inputs)
    # a scatter-add is traced as ScatterElements already (primitives/shape_ops.py)
    assert KeepOnCuda()(model).modified == (reduction == "none")
    assert op_counts(model).get("ScatterND", 0) == 0
    np.testing.assert_array_equal(run(model, inputs), expected)


def test_keep_on_cuda_wide_concat_becomes_concats_of_at_most_32():
    check(KeepOnCuda(), lambda x: op("Concat", *[op("Neg", x) for _ in range(70)], axis=1),
          [(2, 3)], {"Concat": 1}, {"Concat": 4})
    check(KeepOnCuda(), lambda x: op("Concat", *[op("Neg", x) for _ in range(33)], axis=-1),
          [(2, 3)], {"Concat": 1}, {"Concat": 2})


def test_keep_on_cuda_runs_only_for_cuda_jobs():
    from onnxjob.passes import default_passes
    assert not any(isinstance(p, KeepOnCuda) for p in default_passes("cpu"))
    assert any(isinstance(p, KeepOnCuda) for p in default_passes("cuda"))


@pytest.mark.parametrize("reduce_op,keepdims", [("ReduceMean", 1), ("ReduceSum", 0),
                                                ("ReduceSum", 1)])
def test_split_channel_reductions(reduce_op, keepdims):
    def per_channel(x):     # opset 17: ReduceMean takes axes as an attribute
        if reduce_op == "ReduceMean":
            return op(reduce_op, x, axes=[0, 2, 3], keepdims=keepdims)
        return op(reduce_op, x, x.builder.constant(np.array([0, 2, 3], np.int64)),
                  keepdims=keepdims)
    check(SplitChannelReductions(), per_channel, [(4, 3, 5, 6)], {reduce_op: 1},
          {reduce_op: 2, "Reshape": 2})


@pytest.mark.parametrize("reduce_op", ["ReduceSum", "ReduceMean"])
def test_split_channel_reductions_of_one_value_per_row_reduce_over_the_batch_only(reduce_op):
    """Per-row statistics (N, C, 1, 1), as BatchNormRowStatistics reduces them: one
    reduction over N, no first step that copies each value."""
    def per_channel(x):
        if reduce_op == "ReduceMean":
            return op(reduce_op, x, axes=[0, 2, 3], keepdims=0)
        return op(reduce_op, x, x.builder.constant(np.array([0, 2, 3], np.int64)), keepdims=0)
    check(SplitChannelReductions(), per_channel, [(4, 3, 1, 1)], {reduce_op: 1},
          {reduce_op: 1, "Reshape": 2})


def test_split_channel_reductions_of_squares_of_one_value_per_row():
    """A sum of squares over (N, C, 1, 1) stays a sum of squares, over N alone."""
    both = ir_passes.PassManager([SumSquareReductions(), SplitChannelReductions()], steps=1)
    check(both, _centered_variance, [(4, 3, 1, 1)], {"Mul": 1, "ReduceMean": 2},
          {"ReduceSumSquare": 1, "ReduceSum": 0, "ReduceMean": 1})


def test_split_channel_reductions_leaves_other_axes_alone():
    def spatial(x):
        return op("ReduceSum", x, x.builder.constant(np.array([2, 3], np.int64)), keepdims=1)
    assert not SplitChannelReductions()(build(spatial, (4, 3, 5, 6))).modified


def _wide_peak_between_reads(source):
    """A graph whose Cast (of `source(x)`, to float64) is read before and after a wide
    temporary (4 copies of x) that makes the planned peak."""
    def fn(x):
        h = source(x)
        c = op("Cast", h, to=ir.DataType.DOUBLE.value)
        early = op("ReduceSum", c, keepdims=0)
        wide = op("ReduceSum", op("Concat", x, x, x, x, axis=0), keepdims=0)
        late = op("Cast", op("Mul", c, op("Cast", wide, to=ir.DataType.DOUBLE.value)),
                  to=ir.DataType.FLOAT.value)
        return op("Add", op("Add", late, op("Cast", early, to=ir.DataType.FLOAT.value)), h)
    return fn


def _peak(model):
    return memory_plan.plan(model.graph).peak_bytes


def test_recompute_cheap_values_casts_again_after_the_peak():
    model = build(_wide_peak_between_reads(lambda x: op("Relu", x)), (128, 128))
    before = _peak(model)
    check(RecomputeCheapValues(), _wide_peak_between_reads(lambda x: op("Relu", x)),
          [(128, 128)], {"Cast": 4}, {"Cast": 5})
    after = RecomputeCheapValues()(build(_wide_peak_between_reads(lambda x: op("Relu", x)),
                                         (128, 128))).model
    # the float64 copy (128 KiB) is no longer live at the peak beside the wide temporary
    # (a few scalars are, now)
    assert before - _peak(after) >= 128 * 128 * 8 - 64


def test_recompute_cheap_values_leaves_small_values_alone():
    """A value under MIN_BYTES live at the peak stays: its bytes are nothing there, and its
    copy would be one more kernel launch (ResNet50's per-channel vectors)."""
    from onnxjob.passes.recompute_cheap_values import MIN_BYTES
    assert 64 * 64 * 8 < MIN_BYTES <= 128 * 128 * 8
    model = build(_wide_peak_between_reads(lambda x: op("Relu", x)), (64, 64))
    assert not RecomputeCheapValues()(model).modified


def test_recompute_cheap_values_keeps_a_cast_whose_input_would_live_longer():
    """The Cast's input (not itself cheap to make again) is read by nothing after the peak:
    casting again later would keep it alive across the peak, so the pass leaves the graph
    alone."""
    def fn(x):
        h = op("Softmax", x)
        c = op("Cast", h, to=ir.DataType.DOUBLE.value)
        early = op("ReduceSum", c, keepdims=0)
        wide = op("ReduceSum", op("Concat", x, x, x, x, axis=0), keepdims=0)
        late = op("Mul", op("ReduceSum", c, keepdims=0), early)
        return op("Mul", op("Cast", late, to=ir.DataType.FLOAT.value), wide)
    model = build(fn, (128, 128))
    assert not RecomputeCheapValues()(model).modified


def test_recompute_cheap_values_leaves_a_variable_s_cast_made_once():
    """A variable's half copy (of a graph input the optimizer's update reads) is made once
    a step (AutoMixedPrecision's rule 5), even when it is live across the peak; so is any
    input's in a graph without an update (a predict job's weights are not told from its
    data); a copy of fed data (an input nothing of a train step's update reads) is made
    again after the peak."""
    def updating(read_x):
        def source(x):
            with x.builder.origin("update"):
                op("Mul", x if read_x else as_blob(np.float32(2)), as_blob(np.float32(0.5)))
            return x
        return source
    for fn in (updating(True), lambda x: x):
        assert not RecomputeCheapValues()(build(_wide_peak_between_reads(fn), (128, 128))).modified
    fed = build(_wide_peak_between_reads(updating(False)), (128, 128))
    before = _peak(fed)
    assert RecomputeCheapValues()(fed).modified and _peak(fed) < before


def test_recompute_cheap_values_makes_a_short_elementwise_chain_again():
    """1 + erf(h * c) (GELU's factor, which CSE shares between the forward and the
    backward) is made again from h, live across the peak anyway: three nodes copied."""
    def fn(x):
        h = op("Softmax", x)
        v = op("Add", as_const(1.0), op("Erf", op("Mul", h, as_const(0.70710678))))
        early = op("ReduceSum", v, keepdims=0)
        wide = op("ReduceSum", op("Concat", x, x, x, x, axis=0), keepdims=0)
        return op("Add", op("Mul", op("Mul", v, early), wide), h)

    def as_const(value):
        return flow.constant(value, dtype=flow.float, shape=[])
    check(RecomputeCheapValues(), fn, [(128, 128)], {"Erf": 1, "Softmax": 1},
          {"Erf": 2, "Softmax": 1})


def _centered_variance(x):
    c = op("Sub", x, flow.math.reduce_mean(x, axis=[0, 2, 3], keepdims=True))
    return flow.math.reduce_mean(op("Mul", c, c), axis=[0, 2, 3], keepdims=True)


def test_sum_square_reductions_of_a_mean():
    check(SumSquareReductions(), _centered_variance, [(4, 3, 5, 5)],
          {"Mul": 1, "ReduceMean": 2}, {"ReduceSumSquare": 1, "ReduceMean": 1})


def test_sum_square_reductions_leave_a_square_read_elsewhere():
    def fn(x):
        square = op("Mul", x, x)
        return op("Add", flow.math.reduce_mean(square, axis=[1], keepdims=True), square)
    model = build(fn, (4, 3))
    assert not SumSquareReductions()(model).modified


def test_split_channel_reductions_of_a_sum_of_squares():
    """The variance as SumSquareReductions leaves it, split: the second step sums the
    first's sums of squares (a ReduceSum)."""
    both = ir_passes.PassManager([SumSquareReductions(), SplitChannelReductions()], steps=1)
    check(both, _centered_variance, [(4, 3, 5, 5)], {"Mul": 1, "ReduceMean": 2},
          {"ReduceSumSquare": 1, "ReduceSum": 1, "ReduceMean": 2})


def _half_cast_twice(x):
    """A half value cast back to float32 once as it is and once through a Reshape (as
    mixed precision leaves a batch norm's input for its mean and its centering)."""
    half = op("Cast", op("Relu", x), to=ir.DataType.FLOAT16.value)
    whole = op("Cast", half, to=ir.DataType.FLOAT.value)
    seen = op("Cast", flow.reshape(half, [4, 3, 25]), to=ir.DataType.FLOAT.value)
    return op("Add", flow.reshape(flow.math.reduce_sum(seen, axis=[2]), [4, 3, 1, 1]), whole)


def test_share_casts_through_views():
    check(ShareCastsThroughViews(), _half_cast_twice, [(4, 3, 5, 5)],
          {"Cast": 3, "Reshape": 2}, {"Cast": 2, "Reshape": 2})


def test_share_casts_through_views_needs_a_cast_to_share():
    def fn(x):
        half = op("Cast", op("Relu", x), to=ir.DataType.FLOAT16.value)
        return op("Cast", flow.reshape(half, [4, 75]), to=ir.DataType.FLOAT.value)
    assert not ShareCastsThroughViews()(build(fn, (4, 3, 5, 5))).modified


def test_sum_square_reductions_count_a_repeated_axis_once():
    check(SumSquareReductions(),
          lambda x: flow.math.reduce_mean(op("Mul", x, x), axis=[0, -2], keepdims=False),
          [(3, 4)], {"Mul": 1, "ReduceMean": 1}, {"ReduceSumSquare": 1, "ReduceMean": 0})


def test_sum_square_reductions_of_a_sum():
    """An optimizer's norm: the sum of a tensor's square over every axis and over one."""
    def fn(x):
        r = op("Relu", x)
        return op("Add", flow.math.reduce_sum(op("Mul", x, x)),
                  flow.math.reduce_sum(flow.math.reduce_sum(op("Mul", r, r), axis=[1])))
    check(SumSquareReductions(), fn, [(3, 4)], {"Mul": 2, "ReduceSum": 3},
          {"ReduceSumSquare": 2, "ReduceSum": 1, "Mul": 0})


def _batch_norm_step_model(shape, epsilon=1e-3, **attrs):
    """A train batch norm's forward and backward as the tracer and the gradient pass emit
    them (the CUDA form: statistics and sums as parts): outputs y, mean + var, and the
    gradients of sum(y * ct) for x, gamma and beta."""
    from onnxjob.frontend.variables import VariableSpec
    from onnxjob.graph import autodiff
    builder, channels = GraphBuilder("g", is_train=True), shape[1]
    with tracing(builder):
        inputs = {}
        for name, s in (("x", shape), ("gamma", (channels,)), ("beta", (channels,))):
            inputs[name] = b = builder.add_input(name, s, np.float32)
            builder.variables[name] = b
            builder.variable_specs[name] = VariableSpec(name, s, np.float32, None)
        y, mean, var = op("onnxjob.BatchNormTrain", inputs["x"], inputs["gamma"],
                          inputs["beta"], axis=1, epsilon=epsilon, num_outputs=3, **attrs)
        ct = builder.add_input("ct", shape, np.float32)
        loss = op("ReduceSum", op("Mul", y, ct),
                  builder.constant(np.arange(len(shape), dtype=np.int64)), keepdims=0)
        grads = autodiff.backward(builder, [loss])
        outs = [y, op("Add", mean, var)] + [grads[n] for n in ("x", "gamma", "beta")]
        for i, blob in enumerate(outs):
            blob = op("Identity", blob)
            blob.value.name = f"out{i}"
            builder.graph.outputs.append(blob.value)
    return ir.Model(builder.graph, ir_version=IR_VERSION)


def _batch_norm_step_reference(feeds, epsilon):
    """The same outputs in float64 NumPy (the closed forms cuDNN computes)."""
    x, gamma, beta, ct = (feeds[n].astype(np.float64) for n in ("x", "gamma", "beta", "ct"))
    axes = (0,) + tuple(range(2, x.ndim))
    bshape = [1, x.shape[1]] + [1] * (x.ndim - 2)
    mean, var = x.mean(axes), x.var(axes)
    xhat = (x - mean.reshape(bshape)) / np.sqrt(var + epsilon).reshape(bshape)
    y = xhat * gamma.reshape(bshape) + beta.reshape(bshape)
    d_beta, d_gamma = ct.sum(axes), (ct * xhat).sum(axes)
    count = x.size // x.shape[1]
    dx = (gamma / np.sqrt(var + epsilon)).reshape(bshape) * (
        ct - (d_beta / count).reshape(bshape) - xhat * (d_gamma / count).reshape(bshape))
    return [y, mean + var, dx, d_gamma, d_beta]


@pytest.mark.parametrize("shape", [(4, 8, 5, 5), (3, 4, 6), (2, 16, 3, 4, 2)])
def test_batch_norm_row_statistics(shape):
    """The batch's statistics and the backward's sums from per-row LayerNormalization
    statistics give what the parts give (x far from zero mean, a constant row whose
    1 / std is infinite), both within float32 rounding of float64: nothing reads x but
    the row statistics, the normalizations and the gradients' x-hat."""
    epsilon = 1e-3
    model = _batch_norm_step_model(shape, epsilon)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * 3 + 20
    x[1, 2] = 7.0                           # one row's variance is 0
    feeds = {"x": x.astype(np.float32), "ct": rng.standard_normal(shape).astype(np.float32),
             "gamma": rng.uniform(0.5, 2, shape[1]).astype(np.float32),
             "beta": rng.standard_normal(shape[1]).astype(np.float32)}
    expected = _run_all(model, feeds)
    reference = _batch_norm_step_reference(feeds, epsilon)
    result = BatchNormRowStatistics()(model)
    assert result.modified
    common.RemoveUnusedNodesPass()(model)
    assert op_counts(model)["LayerNormalization"] == 3      # x, dy and dy * x-hat
    x_value = model.graph.inputs[0]
    assert {u.node.op_type for u in x_value.uses()} == {"LayerNormalization",
                                                       "BatchNormalization"}
    got = _run_all(model, feeds)
    for name, g, e, r in zip(["y", "mean + var", "dx", "d_gamma", "d_beta"],
                             got, expected, reference):
        scale = np.abs(r).max()
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5 * scale, err_msg=name)
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=2e-5 * scale, err_msg=name)
    assert not BatchNormRowStatistics()(model).modified


@pytest.mark.parametrize("local_statistics", [0, 1])
def test_batch_norm_row_statistics_of_a_data_parallel_step(local_statistics):
    """In a data-parallel step's graph (before it is split per rank) the rank-local
    markers and the collectives read the new statistics and sums: each rank's come from
    its own rows, as before (tests/test_distributed.py splits such a step)."""
    model = _batch_norm_step_model((8, 4, 3, 3), ranks=2, local_statistics=local_statistics)
    assert BatchNormRowStatistics()(model).modified
    common.RemoveUnusedNodesPass()(model)
    x = model.graph.inputs[0]
    assert {u.node.op_type for u in x.uses()} == {"LayerNormalization", "BatchNormalization"}
    marked = [n.inputs[0].producer() for n in model.graph if n.op_type == "RankLocal"]
    # the mean and variance (and with local statistics the two sums), and the mean the
    # rows' spread is taken around (the rank's own, as the parts' x - mean was)
    assert len(marked) == (5 if local_statistics else 3)
    assert all("/rows_" in p.name for p in marked), [p.name for p in marked]
    assert not BatchNormRowStatistics()(model).modified


def test_batch_norm_row_statistics_needs_rows_of_two_or_more():
    """A batch norm over (N, C, 1, 1) has rows of one element (onnxruntime's
    LayerNormalization refuses them): the parts stay."""
    assert not BatchNormRowStatistics()(_batch_norm_step_model((8, 4, 1, 1))).modified


def test_batch_norm_row_statistics_runs_for_cuda_mixed_precision_jobs_only():
    from onnxjob.passes import default_passes

    def has(device, amp):
        return any(isinstance(p, BatchNormRowStatistics) for p in default_passes(device, amp))
    assert has("cuda", True) and not has("cuda", False) and not has("cpu", True)


def _half_column_sums_model(shape, axes):
    """float32 x -> half (x * 2) -> float32 copy -> ReduceSum over `axes` (keepdims 0): the
    form AutoMixedPrecision gives a bias gradient of a half gradient."""
    def fn(x):
        half = op("Mul", op("Cast", x, to=ir.DataType.FLOAT16.value),
                  as_blob(np.float16(2)))
        return op("ReduceSum", op("Cast", half, to=ir.DataType.FLOAT.value),
                  x.builder.constant(np.array(axes, np.int64)), keepdims=0)
    return build(fn, shape)


@pytest.mark.parametrize("shape,axes", [((1024, 48), [0]), ((8, 64, 3, 5), [0, 1])])
def test_half_column_sums(shape, axes):
    """A float32 sum over a half tensor's leading axes becomes one half MatMul by a row of
    ones: the same sums to half precision (against float64), the half tensor read once;
    a sum past float16's range is infinite, as the half weight gradient beside it would
    be (a dynamic loss scale skips that step)."""
    model = _half_column_sums_model(shape, axes)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)
    expected = run(model, [x])
    reference = (2 * x.astype(np.float16).astype(np.float64)).sum(tuple(axes))
    np.testing.assert_allclose(expected, reference, rtol=1e-5)
    assert HalfColumnSums()(model).modified
    common.RemoveUnusedNodesPass()(model)
    counts = op_counts(model)
    assert counts["MatMul"] == 1 and counts.get("ReduceSum", 0) == 0
    (matmul,) = [n for n in model.graph if n.op_type == "MatMul"]
    assert matmul.inputs[1].type.dtype == ir.DataType.FLOAT16
    np.testing.assert_allclose(run(model, [x]), reference, rtol=1e-3)
    assert np.isinf(run(model, [x * 100])).all()       # sums of ~1e6
    assert not HalfColumnSums()(model).modified


def test_half_column_sums_leaves_other_sums_alone():
    """Few rows, a trailing axis, or a float32 copy read by something else: nothing
    changes."""
    assert not HalfColumnSums()(_half_column_sums_model((64, 48), [0])).modified
    assert not HalfColumnSums()(_half_column_sums_model((1024, 48), [1])).modified

    def shared(x):
        copy = op("Cast", op("Cast", x, to=ir.DataType.FLOAT16.value),
                  to=ir.DataType.FLOAT.value)
        total = op("ReduceSum", copy, x.builder.constant(np.array([0], np.int64)),
                   keepdims=0)
        return op("Add", total, op("ReduceMax", copy, axes=[0], keepdims=0))
    assert not HalfColumnSums()(build(shared, (1024, 48))).modified


def test_half_column_sums_runs_for_cuda_mixed_precision_jobs_only():
    from onnxjob.passes.default_pipeline import final_passes

    def has(device, amp):
        return any(isinstance(p, HalfColumnSums) for p in final_passes(device, amp))
    assert has("cuda", True) and not has("cuda", False) and not has("cpu", True)


def test_separable_average_pools_of_a_whole_image_same_pool():
    """MobileNetV3's squeeze-excite pool: the image's size, strides None (1), "SAME"
    (padding not counted): one pool per axis, the same means."""
    check(SeparableAveragePools(), lambda x: flow.nn.avg_pool2d(x, [6, 8], None, "SAME"),
          [(2, 3, 6, 8)], {"AveragePool": 1}, {"AveragePool": 2})


def test_separable_average_pools_strided_with_the_padding_counted():
    check(SeparableAveragePools(),
          lambda x: op("AveragePool", x, kernel_shape=[5, 7], strides=[2, 3],
                       pads=[1, 3, 2, 0], count_include_pad=1),
          [(1, 2, 11, 13)], {"AveragePool": 1}, {"AveragePool": 2})


def test_separable_average_pools_in_3d():
    check(SeparableAveragePools(),
          lambda x: op("AveragePool", x, kernel_shape=[4, 1, 9], pads=[1, 0, 4, 2, 0, 4]),
          [(1, 2, 5, 3, 9)], {"AveragePool": 1}, {"AveragePool": 2})


@pytest.mark.parametrize("pool", [
    lambda x: flow.nn.avg_pool2d(x, 3, 1, "SAME"),               # a small window
    lambda x: flow.nn.avg_pool2d(x, [6, 8], 1, "VALID"),         # one output: a reduction
    lambda x: op("AveragePool", x, kernel_shape=[6, 6], ceil_mode=1, strides=[4, 4])])
def test_separable_average_pools_leave_small_global_and_ceil_mode_pools(pool):
    assert not SeparableAveragePools()(build(pool, (2, 3, 6, 8))).modified


def test_a_program_logging_at_info_does_not_get_the_passes_bookkeeping(caplog, monkeypatch):
    """onnx_ir's passes log "Removed 4 unused nodes" at INFO; a program that sets its own
    logging to INFO saw those lines among its own (OneFlow printed none)."""
    import logging
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", "off")      # (a cached job runs no pass)
    caplog.set_level(logging.INFO)
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    assert float(job(np.ones((2, 3), np.float32))) == 6.0
    assert not [r for r in caplog.records if r.name.startswith("onnx_ir")
                and r.levelno < logging.WARNING]
    flow.clear_default_session()


def _padded_transpose(perm, begin, end, lead, trail):
    from onnxjob.graph.primitives.windows import pad_spatial
    return lambda x: op("Relu", pad_spatial(op("Transpose", x, perm=perm), begin, end, lead,
                                            trail))


@pytest.mark.parametrize("perm, begin, end, lead, trail", [
    ([1, 2, 3, 0], [1, 1], [1, 1], 1, 1),       # a weight gradient's (C, H, W, N) windows
    ([1, 2, 3, 0], [0, 2], [3, 0], 1, 1),
])
def test_pad_before_transpose(perm, begin, end, lead, trail):
    """The Pad moves before the Transpose, onto the last two axes of its input; the same
    values (three ways, `check`)."""
    shape = (2, 3, 5, 4)[:len(perm)]
    fn = _padded_transpose(perm, begin, end, lead, trail)
    check(PadBeforeTranspose(), fn, [shape], {"Pad": 1, "Transpose": 1},
          {"Pad": 1, "Transpose": 1})
    model = PadBeforeTranspose()(build(fn, shape)).model
    pad = next(n for n in model.graph if n.op_type == "Pad")
    assert pad.inputs[0].name == "x0"       # the input, padded along its last axes
    assert next(n for n in model.graph if n.op_type == "Transpose").inputs[0] is \
        pad.outputs[0]


@pytest.mark.parametrize("perm, begin, end, lead, trail", [
    ([1, 2, 3, 0], [1, 1], [1, 1], 2, 0),      # would pad x's N axis: no fast kernel there
    ([0, 1, 2, 3], [1, 1], [1, 1], 2, 0),      # already along the last two axes
    ([1, 2, 0], [1], [2], 1, 1),                # (C, L, N): already the fast kernel's
])
def test_pad_before_transpose_leaves_other_pads_alone(perm, begin, end, lead, trail):
    model = build(_padded_transpose(perm, begin, end, lead, trail), (2, 3, 5, 4)[:len(perm)])
    assert not PadBeforeTranspose()(model).modified


def _affine_pair_model(shape, dtype=ir.DataType.FLOAT16, read_twice=False, centred_bias=0.0):
    """x, w (float32) -> half a * x + c + b * (w - m) -> float32: batch norm's input gradient
    after mixed precision, its per-channel affines as channel_affine makes them (inference
    BatchNormalizations whose variance + epsilon is 1), built node by node."""
    channels, eps = shape[1], 1e-5
    np_type = np.float16 if dtype == ir.DataType.FLOAT16 else np.float32
    rng = np.random.default_rng(1)

    def vector(name, array):
        return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape([channels]),
                        const_value=ir.tensor(array.astype(np_type), name=name))
    a, b, c, m = (vector(n, rng.uniform(0.5, 2, channels)) for n in "abcm")
    zeros, shift = vector("zeros", np.zeros(channels)), vector("shift", np.full(channels,
                                                                              centred_bias))
    unit = vector("unit", np.ones(channels, np_type) - np_type(eps))
    x, w = (ir.Value(name=f"x{i}", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape))
            for i in range(2))
    xh = ir.node("Cast", [x], attributes={"to": dtype.value})
    wh = ir.node("Cast", [w], attributes={"to": dtype.value})
    plain = ir.node("BatchNormalization", [xh.outputs[0], a, c, zeros, unit],
                    attributes={"epsilon": eps})
    centred = ir.node("BatchNormalization", [wh.outputs[0], b, shift, m, unit],
                      attributes={"epsilon": eps})
    total = ir.node("Add", [plain.outputs[0], centred.outputs[0]])
    nodes = [xh, wh, plain, centred, total]
    last = total
    if read_twice:
        last = ir.node("Add", [total.outputs[0], plain.outputs[0]])
        nodes.append(last)
    out = ir.node("Cast", [last.outputs[0]], attributes={"to": ir.DataType.FLOAT.value})
    nodes.append(out)
    for node in nodes[:-1]:
        node.outputs[0].type, node.outputs[0].shape = ir.TensorType(dtype), ir.Shape(shape)
    out.outputs[0].name = "y"
    graph = ir.Graph([x, w], [out.outputs[0]], nodes=nodes, opset_imports={"": 17})
    for value in (a, b, c, m, zeros, shift, unit):
        graph.register_initializer(value)
    return ir.Model(graph, ir_version=IR_VERSION)


@pytest.mark.parametrize("shape", [(4, 8, 5, 5), (3, 16, 7)])
def test_half_affine_pairs(shape):
    """Two half per-channel affines added: the one with no centre becomes a Mul by its
    scale, its shift goes to the other's bias; the same sums to half precision."""
    from onnxjob.passes import HalfAffinePairs
    model = _affine_pair_model(shape)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(np.float32) * 3 + 1 for _ in range(2)]
    expected = run(model, inputs)
    assert op_counts(model)["BatchNormalization"] == 2
    assert HalfAffinePairs()(model).modified
    common.RemoveUnusedNodesPass()(model)
    counts = op_counts(model)
    assert counts["BatchNormalization"] == 1 and counts["Mul"] == 1
    (mul,) = [n for n in model.graph if n.op_type == "Mul"]
    assert mul.outputs[0].type.dtype == ir.DataType.FLOAT16
    np.testing.assert_allclose(run(model, inputs), expected, rtol=2e-3, atol=2e-3)
    assert not HalfAffinePairs()(model).modified


def test_half_affine_pairs_leaves_other_sums_alone():
    """float32 affines (one launch each on CUDA), an affine read twice, and two centred
    affines with a shift of their own: nothing changes."""
    from onnxjob.passes import HalfAffinePairs
    for model in (_affine_pair_model((2, 4, 3), ir.DataType.FLOAT),
                  _affine_pair_model((2, 4, 3), read_twice=True),
                  _affine_pair_model((2, 4, 3), centred_bias=0.5)):
        assert not HalfAffinePairs()(model).modified


def test_half_affine_pairs_runs_for_cuda_mixed_precision_jobs_only():
    from onnxjob.passes import HalfAffinePairs
    from onnxjob.passes.default_pipeline import final_passes

    def has(device, amp):
        return any(isinstance(p, HalfAffinePairs) for p in final_passes(device, amp))
    assert has("cuda", True) and not has("cuda", False) and not has("cpu", True)


@pytest.mark.parametrize("device,amp", [("cpu", False), ("cuda", False), ("cuda", True)])
def test_one_round_of_the_default_pipeline_leaves_nothing_for_another(tmp_path, device, amp):
    """The compile runs the pipeline round after round until a round changes nothing
    (passes.build_pipeline): a first round that leaves work behind costs two more whole
    rounds. On a train step with convolutions, batch norms, a residual add, pooling and a
    dense layer (compiled for `device` without running it), a second round finds nothing."""
    from onnxjob.graph.compiler import compile_job
    from onnxjob.passes import default_passes
    from onnxjob.runtime.session import default_session
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.dump_passes(str(tmp_path))
    config.enable_auto_mixed_precision(amp)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((4, 3, 8, 8)),
            labels: tp.Numpy.Placeholder((4,), dtype=flow.int32)) -> tp.Numpy:
        def conv_bn(h, name):
            h = flow.layers.conv2d(h, 8, 3, padding="SAME", name=f"{name}-conv")
            return flow.layers.batch_normalization(h, axis=1, name=f"{name}-bn")
        h = flow.nn.relu(conv_bn(x, "a"))
        h = flow.nn.relu(h + conv_bn(flow.nn.relu(conv_bn(h, "b")), "c"))
        h = flow.layers.conv2d(h, 16, 1, name="d-conv")      # (a pointwise weight gradient)
        h = flow.nn.max_pool2d(h, 2, 2, "VALID")
        logits = flow.layers.dense(flow.reshape(h, [4, -1]), 10, name="fc")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss

    session = default_session()
    session.device = device
    compile_job(session.jobs["job"], session, 0)
    flow.clear_default_session()
    model = ir.load(str(tmp_path / "job.before.onnx"))
    assert ir_passes.Sequential(*default_passes(device, amp))(model).modified
    assert [type(p).__name__ for p in default_passes(device, amp) if p(model).modified] == []


def _backward_casts_model():
    """Two forward vectors (a max and a min of x) cast to half for backward products, and
    a third vector made from a backward product, cast likewise: values exact in half."""
    from onnxjob.graph.tracer import ORIGIN
    f32, f16 = ir.DataType.FLOAT, ir.DataType.FLOAT16
    nodes = []

    def node(op_type, inputs, shape, dtype, phase="forward", **attributes):
        n = ir.node(op_type, inputs, attributes=attributes, name=f"{op_type}_{len(nodes)}",
                    metadata_props={ORIGIN: phase})
        n.outputs[0].type, n.outputs[0].shape = ir.TensorType(dtype), ir.Shape(shape)
        n.outputs[0].name = n.name
        nodes.append(n)
        return n.outputs[0]

    x = ir.Value(name="x", type=ir.TensorType(f32), shape=ir.Shape([4, 6]))
    h = ir.Value(name="h", type=ir.TensorType(f16), shape=ir.Shape([4, 6]))
    top = node("ReduceMax", [x], [6], f32, axes=[0], keepdims=0)
    first = node("Mul", [h, node("Cast", [top], [6], f16, to=f16.value)], [4, 6], f16,
                 "backward")
    # (made after the first reader: moved ahead of the concatenation)
    bottom = node("ReduceMin", [x], [6], f32, axes=[0], keepdims=0)
    second = node("Mul", [h, node("Cast", [bottom], [6], f16, to=f16.value)], [4, 6], f16,
                  "backward")
    later = node("Add", [node("Cast", [node("ReduceMax", [first], [6], f16, "backward",
                                            axes=[0], keepdims=0)], [6], f32, "backward",
                              to=f32.value), top], [6], f32, "backward")
    third = node("Mul", [h, node("Cast", [later], [6], f16, "backward", to=f16.value)],
                 [4, 6], f16, "backward")
    y = node("Add", [node("Add", [first, second], [4, 6], f16, "backward"), third],
             [4, 6], f16, "backward")
    y.name = "y"
    graph = ir.Graph([x, h], [y], nodes=nodes, opset_imports={"": 17})
    return ir.Model(graph, ir_version=IR_VERSION)


def test_batch_backward_casts():
    """The two forward vectors' casts become one Cast of their concatenation, placed before
    the first reader with the vector made after it moved ahead; the third, made from what a
    reader of the first computes, keeps its own (batching it would make a cycle); the
    graph stays in topological order, the numbers are the same (values exact in half) and
    a second run finds nothing."""
    from onnxjob.passes import BatchBackwardCasts
    model = _backward_casts_model()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.integers(-8, 8, (4, 6)).astype(np.float32) / 4,
             "h": rng.integers(-8, 8, (4, 6)).astype(np.float16) / 2}

    def run_model(m):
        sess = ort.InferenceSession(ir.to_proto(m).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)[0]
    expected = run_model(model)
    assert op_counts(model)["Cast"] == 4
    assert BatchBackwardCasts()(model).modified
    counts = op_counts(model)
    assert (counts["Cast"], counts["Concat"], counts["Split"]) == (3, 1, 1)
    batched = [n for n in model.graph if n.op_type == "Cast" and n.inputs[0].producer() is not None
               and n.inputs[0].producer().op_type == "Concat"]
    assert len(batched) == 1
    made = {v.name for v in model.graph.inputs}
    for n in model.graph:       # still in topological order
        assert all(v is None or v.name in made or v.const_value is not None
                   for v in n.inputs), n.name
        made.update(v.name for v in n.outputs)
    np.testing.assert_array_equal(run_model(model), expected)
    assert not BatchBackwardCasts()(model).modified


def test_batch_backward_casts_runs_for_cuda_mixed_precision_jobs_only():
    from onnxjob.passes import BatchBackwardCasts
    from onnxjob.passes.default_pipeline import final_passes

    def has(device, amp):
        return any(isinstance(p, BatchBackwardCasts) for p in final_passes(device, amp))
    assert has("cuda", True) and not has("cuda", False) and not has("cpu", True)


def _cross_entropy(reduction="none", labels=np.array([2, 0, 4], np.int64)):
    """The loss plus each row's summed log-probabilities of a SoftmaxCrossEntropyLoss."""
    def fn(x):
        loss, log_prob = op("SoftmaxCrossEntropyLoss", x, x.builder.constant(labels),
                            reduction=reduction, num_outputs=2)
        axis = x.builder.constant(np.array([1], np.int64))
        return op("Add", loss, op("ReduceSum", log_prob, axis, keepdims=0))
    return fn


def test_softmax_cross_entropy_rows():
    check(SoftmaxCrossEntropyRows(), _cross_entropy(), [(3, 5)],
          {"SoftmaxCrossEntropyLoss": 1},
          {"SoftmaxCrossEntropyLoss": 0, "LogSoftmax": 1, "GatherElements": 1})


@pytest.mark.parametrize("case", ["mean", "rank 3"])
def test_softmax_cross_entropy_rows_leaves_other_forms(case):
    """A reduced loss and logits with more axes than (N, C) stay as they are."""
    fn = _cross_entropy("mean") if case == "mean" else \
        _cross_entropy(labels=np.zeros((3, 2), np.int64))
    shape = (3, 5) if case == "mean" else (3, 5, 2)
    model = build(fn, shape)
    assert not SoftmaxCrossEntropyRows()(model).modified


def _scatter_add(data, updates, indices=np.array([[1, 1], [3, 0], [1, 2]], np.int64)):
    return op("ScatterElements", data, data.builder.constant(indices), updates, axis=0,
              reduction="add")


@pytest.mark.parametrize("zeros", ["ConstantOfShape", "initializer"])
def test_scatter_add_into_sum(zeros):
    """A table's gradient from its lookups (a scatter-add into zeros) plus its gradient as
    a whole (BERT's tied word embeddings) scatters into the latter."""
    def fn(table_grad, updates):
        if zeros == "ConstantOfShape":
            zero = op("ConstantOfShape", table_grad.builder.constant(np.array([4, 2], np.int64)))
        else:
            zero = table_grad.builder.constant(np.zeros((4, 2), np.float32))
        return op("Add", table_grad, _scatter_add(zero, updates))
    check(ScatterAddIntoSum(), fn, [(4, 2), (3, 2)], {"ScatterElements": 1, "Add": 1},
          {"ScatterElements": 1, "Add": 0})


def test_scatter_add_into_sum_leaves_other_forms():
    """Into data that is not zeros, or a sum that broadcasts: nothing to do."""
    def into_data(table_grad, updates, data):
        return op("Add", table_grad, _scatter_add(data, updates))

    def broadcast(row, updates):
        zero = op("ConstantOfShape", row.builder.constant(np.array([4, 2], np.int64)))
        return op("Add", row, _scatter_add(zero, updates))
    assert not ScatterAddIntoSum()(build(into_data, (4, 2), (3, 2), (4, 2))).modified
    assert not ScatterAddIntoSum()(build(broadcast, (1, 2), (3, 2))).modified
