"""OneFlow's remaining legacy ops (onnxjob/ops/legacy.py, flow.summary): forward values
against NumPy / PyTorch, gradients by finite differences and against PyTorch, OneFlow's
own test expectations, and trace-time errors that name the user's line."""
import os
import warnings
from typing import Tuple

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest
from gradcheck import check_finite_differences, vjp

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing

torch = pytest.importorskip("torch", reason="PyTorch is the reference")
THIS_FILE = os.path.basename(__file__)
RNG = np.random.default_rng(0)


def forward(fn, *arrays, train=False):
    """Trace `fn` (one Blob or a list) on inputs shaped like `arrays`, run it once."""
    builder = GraphBuilder("forward", is_train=train)
    with tracing(builder):
        blobs = [builder.add_input(f"x{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
        ys = fn(*blobs)
        single = not isinstance(ys, (list, tuple))
        for y in [ys] if single else ys:
            if y.producer is None or y.value in builder.graph.outputs:
                y = op("Identity", y)
            builder.graph.outputs.append(y.value)
    model = ir.to_proto(ir.Model(builder.graph, ir_version=IR_VERSION))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    out = session.run(None, {f"x{i}": a for i, a in enumerate(arrays)})
    return out[0] if single else out


def vjp_against_torch(fn, torch_fn, xs, diff, rtol=1e-5, atol=1e-5):
    run, yshape = vjp(fn, xs, diff)
    ct = RNG.standard_normal(yshape).astype(np.float32)
    y, grads = run(xs, ct)
    txs = [torch.tensor(x, requires_grad=bool(d)) for x, d in zip(xs, diff)]
    ty = torch_fn(*txs)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=rtol, atol=atol)
    ty.backward(torch.tensor(ct))
    gi = iter(grads)
    for x, d in zip(txs, diff):
        if d:
            np.testing.assert_allclose(next(gi), x.grad.numpy(), rtol=rtol, atol=atol)


# -- count_not_finite ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_count_not_finite_as_oneflow_test(dtype):
    x = RNG.standard_normal((10, 30)).astype(dtype)
    x[0] = np.nan
    x[5][4] = np.inf
    x[7][1] = -np.inf
    for fn in (flow.count_not_finite, flow.math.count_not_finite):
        y = forward(fn, x)
        assert y.dtype == np.int64 and y.shape == (1,)
        assert y[0] == x.size - np.isfinite(x).sum() == 32
    x2 = RNG.standard_normal((10, 20)).astype(dtype)
    x2[2] = np.inf
    x2[6, 5] = np.nan
    y = forward(lambda a, b: flow.multi_count_not_finite([a] * 3 + [b] * 2), x, x2)
    assert y[0] == 3 * 32 + 2 * 21


def test_count_not_finite_rejects_integers():
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(flow.count_not_finite, np.zeros(3, np.int32))
    with pytest.raises(TraceError, match="one dtype"):
        forward(lambda a, b: flow.multi_count_not_finite([a, b]), np.zeros(3, np.float32),
                np.zeros(3, np.float64))


# -- indexed_slices_reduce_sum ---------------------------------------------------------------

@pytest.mark.parametrize("idx_dtype", [np.int32, np.int64])
def test_indexed_slices_reduce_sum_as_oneflow_test(idx_dtype):
    indices = RNG.integers(0, 32, 256).astype(idx_dtype)
    values = RNG.random((256, 8)).astype(np.float32)
    for fn in (flow.experimental.indexed_slices_reduce_sum, flow.indexed_slices_reduce_sum):
        y_idx, y_val, num = forward(fn, indices, values)
        assert num.dtype == np.int64 and num.shape == (1,) and y_idx.dtype == idx_dtype
        ref = np.unique(indices)
        k = int(num[0])
        assert k == len(ref) and y_val.shape == (256, 8)
        order = np.argsort(y_idx[:k])
        np.testing.assert_array_equal(y_idx[:k][order], ref)
        want = np.stack([values[indices == i].sum(0) for i in ref])
        np.testing.assert_allclose(y_val[:k][order], want, rtol=1e-5)
        assert not y_val[k:].any()


def test_indexed_slices_reduce_sum_multi_axis_indices():
    indices = np.array([[3, 1], [3, 0]], np.int64)
    values = np.arange(2 * 2 * 2 * 3, dtype=np.float64).reshape(2, 2, 2, 3)
    y_idx, y_val, num = forward(flow.indexed_slices_reduce_sum, indices, values)
    assert num[0] == 3 and y_val.shape == (4, 6)
    np.testing.assert_array_equal(y_idx[:3], [3, 1, 0])  # order of first appearance
    flat = values.reshape(4, 6)
    np.testing.assert_allclose(y_val[:3], [flat[0] + flat[2], flat[1], flat[3]])
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(flow.indexed_slices_reduce_sum, indices, np.zeros((2, 3, 4), np.float32))


# -- fused self attention --------------------------------------------------------------------

def _torch_qkv(h, heads, head_size, alpha):
    s, b, _ = h.shape
    x = h.reshape(s, b, heads, 3, head_size)
    q, k, v = (x[:, :, :, i].permute(1, 2, 0, 3) for i in range(3))
    return alpha * q @ k.transpose(-1, -2), v


@pytest.mark.parametrize("seq,batch,heads,head_size,alpha", [(4, 2, 3, 5, 1.0),
                                                             (6, 1, 1, 4, 0.125)])
def test_fused_self_attention_forward_and_gradients(seq, batch, heads, head_size, alpha):
    h = RNG.standard_normal((seq, batch, heads * 3 * head_size)).astype(np.float32)
    fused = flow.nn.fused_self_attention_query_mul_key_and_value
    qmk, v = forward(lambda x: list(fused(x, head_size, alpha)), h)
    tq, tv = _torch_qkv(torch.tensor(h), heads, head_size, alpha)
    np.testing.assert_allclose(qmk, tq.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(v, tv.numpy())
    # the gradient of both outputs together, as OneFlow's test (qmk @ v)
    both = lambda x: op("MatMul", *fused(x, head_size, alpha))
    check_finite_differences(both, [h.astype(np.float64)], [True], np.random.default_rng(1))
    vjp_against_torch(both, lambda x: torch.matmul(*_torch_qkv(x, heads, head_size, alpha)),
                      [h], [True], rtol=1e-4, atol=1e-4)


def test_fused_self_attention_bad_shapes():
    fused = flow.nn.fused_self_attention_query_mul_key_and_value
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(lambda x: fused(x, 4, 1.0)[0], np.zeros((2, 2, 20), np.float32))
    with pytest.raises(TraceError, match="head_size"):
        forward(lambda x: fused(x, 0)[0], np.zeros((2, 2, 12), np.float32))


# -- fused_scale_tril_softmax_dropout --------------------------------------------------------

def _torch_tril_softmax(x, diagonal, fill, scale):
    rows, cols = x.shape[-2:]
    keep = torch.tensor(np.arange(cols)[None, :] - np.arange(rows)[:, None] <= diagonal)
    return torch.softmax(torch.where(keep, x * scale, torch.tensor(fill, dtype=x.dtype)), -1)


@pytest.mark.parametrize("diagonal,fill,scale", [(0, -1e4, 0.5), (1, 0.0, 2.0), (-1, -3.0, 1)])
def test_fused_scale_tril_softmax_without_dropout(diagonal, fill, scale):
    x = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    fn = lambda v: flow.math.fused_scale_tril_softmax_dropout(v, diagonal, fill, scale)
    y = forward(fn, x)
    np.testing.assert_allclose(y, _torch_tril_softmax(torch.tensor(x), diagonal, fill,
                                                      scale).numpy(), rtol=1e-5, atol=1e-6)
    check_finite_differences(fn, [x.astype(np.float64)], [True], np.random.default_rng(1))
    vjp_against_torch(fn, lambda v: _torch_tril_softmax(v, diagonal, fill, scale), [x], [True])


def test_fused_scale_tril_softmax_dropout_masks_and_rescales():
    x = RNG.standard_normal((8, 64, 64)).astype(np.float32)
    fn = lambda v: [flow.nn.fused_scale_tril_softmax_dropout(v, 0, -1e4, 1.0, rate=0.25),
                    flow.math.fused_scale_tril_softmax_dropout(v, 0, -1e4, 1.0)]
    y, ref = forward(fn, x)  # the mask is drawn in predict jobs too, as in OneFlow
    kept = y != 0
    visible = ref > 1e-30
    np.testing.assert_allclose(y[kept], ref[kept] / 0.75, rtol=1e-5)
    assert abs(kept[visible].mean() - 0.75) < 0.01
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(lambda v: flow.nn.fused_scale_tril_softmax_dropout(v, rate=1.0), x)


# -- combined_margin_loss --------------------------------------------------------------------

def _np_margin(x, label, m1, m2, m3):
    y = x.copy()
    for i, c in enumerate(label):
        if 0 <= c < x.shape[1]:
            y[i, c] = np.cos(m1 * np.arccos(x[i, c]) + m2) - m3
    return y


def _torch_margin(x, label, m1, m2, m3):
    onehot = torch.nn.functional.one_hot(torch.tensor(label, dtype=torch.long), x.shape[1]).bool()
    return torch.where(onehot, torch.cos(m1 * torch.acos(x) + m2) - m3, x)


@pytest.mark.parametrize("m1,m2,m3", [(1.0, 0.5, 0.0), (1.0, 0.0, 0.35), (1.35, 0.2, 0.1)])
@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_combined_margin_loss(m1, m2, m3, label_dtype):
    x = RNG.uniform(-0.9, 0.9, (6, 7)).astype(np.float32)
    label = RNG.integers(0, 7, 6).astype(label_dtype)
    fn = lambda a, b: flow.combined_margin_loss(a, b, m1, m2, m3)
    np.testing.assert_allclose(forward(fn, x, label), _np_margin(x, label, m1, m2, m3),
                               rtol=1e-5, atol=1e-6)
    check_finite_differences(fn, [x.astype(np.float64), label], [True, False],
                             np.random.default_rng(1))
    vjp_against_torch(fn, lambda a, b: _torch_margin(a, label, m1, m2, m3), [x, label],
                      [True, False])


def test_combined_margin_loss_out_of_range_labels_pass_through():
    x = RNG.uniform(-0.9, 0.9, (3, 4)).astype(np.float32)
    label = np.array([1, -1, 4], np.int32)
    y = forward(lambda a, b: flow.combined_margin_loss(a, b, 1.0, 0.5, 0.0), x, label)
    np.testing.assert_allclose(y, _np_margin(x, label, 1.0, 0.5, 0.0), rtol=1e-6)
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(lambda a, b: flow.combined_margin_loss(a, b), x, np.zeros(2, np.int32))


def test_combined_margin_loss_takes_a_readers_n_by_1_labels():
    # OneFlow checks only label.shape[0] == x.shape[0]; a raw decoder's shape=(1,) labels
    # are (N, 1) and read one class per row, as (N,)
    x = RNG.uniform(-0.9, 0.9, (4, 5)).astype(np.float32)
    label = np.array([3, 0, 4, 1], np.int32)
    fn = lambda a, b: flow.combined_margin_loss(a, b, 1.0, 0.5, 0.0)
    np.testing.assert_allclose(forward(fn, x, label[:, None]), forward(fn, x, label))
    np.testing.assert_allclose(forward(fn, x, label[:, None]),
                               _np_margin(x, label, 1.0, 0.5, 0.0), rtol=1e-5, atol=1e-6)
    check_finite_differences(fn, [x.astype(np.float64), label[:, None]], [True, False],
                             np.random.default_rng(2))
    for bad in (np.zeros((4, 2), np.int32), np.zeros((3, 1), np.int32)):
        with pytest.raises(TraceError, match=THIS_FILE + ".*one class per row"):
            forward(fn, x, bad)


# -- distributed_partial_fc_sample -----------------------------------------------------------

def test_distributed_partial_fc_sample():
    classes, dim, num_sample = 20, 3, 8
    weight = RNG.standard_normal((classes, dim)).astype(np.float32)
    label = np.array([7, 2, 7, 15, 2], np.int32)
    for _ in range(3):
        mapped, sampled, sw = forward(
            lambda w, l: list(flow.distributed_partial_fc_sample(w, l, num_sample)), weight, label)
        assert sampled.shape == (num_sample,) and sampled.dtype == np.int32
        np.testing.assert_array_equal(sampled[:3], [2, 7, 15])  # the positives, ascending
        assert len(set(sampled.tolist())) == num_sample
        np.testing.assert_array_equal(sampled[mapped], label)
        np.testing.assert_array_equal(sw, weight[sampled])
    # the gradient reaches exactly the sampled rows of weight (one run: one sample)
    run, yshape = vjp(lambda w, l: flow.distributed_partial_fc_sample(w, l, num_sample)[2],
                      [weight, label], [True, False])
    ct = RNG.standard_normal(yshape).astype(np.float32)
    _, (gw,) = run([weight, label], ct)
    touched = np.flatnonzero(np.abs(gw).sum(1))
    assert len(touched) == num_sample and {2, 7, 15} <= set(touched.tolist())
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(lambda w, l: flow.distributed_partial_fc_sample(w, l, 21)[0], weight, label)


def test_distributed_partial_fc_sample_keeps_the_label_shape_as_oneflow():
    # OneFlow's shape rule: mapped_label has label's shape, sampled_label label's shape with
    # num_sample rows; an (N, 1) label samples as its (N,) values
    weight = RNG.standard_normal((10, 3)).astype(np.float32)
    label = np.array([[4], [9], [4]], np.int64)
    mapped, sampled, sw = forward(
        lambda w, l: list(flow.distributed_partial_fc_sample(w, l, 5)), weight, label)
    assert mapped.shape == (3, 1) and sampled.shape == (5, 1) and sw.shape == (5, 3)
    assert mapped.dtype == sampled.dtype == np.int64
    np.testing.assert_array_equal(sampled[:2, 0], [4, 9])
    np.testing.assert_array_equal(sampled[mapped[:, 0], 0], label[:, 0])
    np.testing.assert_array_equal(sw, weight[sampled[:, 0]])
    with pytest.raises(TraceError, match=THIS_FILE + ".*one class per row"):
        forward(lambda w, l: flow.distributed_partial_fc_sample(w, l, 5)[0], weight,
                np.zeros((3, 2), np.int64))


# -- repeat / acc, unpack / pack -------------------------------------------------------------

def test_repeat_acc_as_oneflow_test():
    x = RNG.random((4, 3)).astype(np.float32)
    y = forward(lambda a: flow.acc(flow.repeat(a, 5), 5), x)
    np.testing.assert_allclose(y, x * 5, rtol=1e-6)
    y = forward(lambda a: flow.acc(flow.math.square(flow.repeat(a, 3)) + 1.0, 3), x)
    np.testing.assert_allclose(y, 3 * (x * x + 1), rtol=1e-6)
    # random ops between the two ends draw anew at each time step
    x = np.ones((2000,), np.float32)
    y = forward(lambda a: flow.acc(flow.nn.dropout(flow.repeat(a, 4), 0.5), 4), x, train=True)
    assert set(np.unique(y)) <= {0, 2, 4, 6, 8} and len(np.unique(y)) == 5


def test_unpack_pack():
    x = RNG.random((6, 4)).astype(np.float32)
    np.testing.assert_array_equal(forward(lambda a: flow.pack(flow.unpack(a, 3), 3), x), x)
    # the ops between run on each micro-batch: a reduction sums per micro-batch
    y = forward(lambda a: flow.pack(flow.math.reduce_sum(flow.unpack(a, 3)), 3), x)
    np.testing.assert_allclose(y, x.reshape(3, 8).sum(1), rtol=1e-6)
    y = forward(lambda a: flow.pack(flow.math.reduce_sum(flow.unpack(a, 2), axis=0,
                                                         keepdims=True), 2), x)
    np.testing.assert_allclose(y, x.reshape(2, 3, 4).sum(1), rtol=1e-6)
    # gradients flow through every time step's copy
    fn = lambda a: flow.pack(flow.math.reduce_mean(flow.math.square(flow.unpack(a, 3)),
                                                   axis=0), 3)
    check_finite_differences(fn, [x.astype(np.float64)], [True], np.random.default_rng(1))


def test_several_unpacks_and_repeats_of_one_count_step_together():
    """OneFlow runs an op over inputs of one time shape once per time step, however many
    unpacks made them (test/models/alexnet_with_unpack.py unpacks its images and labels)."""
    x = RNG.random((6, 4)).astype(np.float32)
    y = RNG.random((6, 4)).astype(np.float32)
    both = lambda a, b: flow.pack(flow.math.reduce_sum(flow.unpack(a, 3) * flow.unpack(b, 3),
                                                       axis=1), 3)
    np.testing.assert_allclose(forward(both, x, y), (x * y).sum(1), rtol=1e-6)
    check_finite_differences(both, [x.astype(np.float64), y.astype(np.float64)], [True, True],
                             np.random.default_rng(2))
    summed = forward(lambda a, b: flow.acc(flow.repeat(a, 2) * flow.repeat(b, 2), 2), x, y)
    np.testing.assert_allclose(summed, 2 * x * y, rtol=1e-6)
    z = RNG.random((4, 4)).astype(np.float32)      # 2 micro-batches of 2 rows, as x's 3
    with pytest.raises(TraceError, match="pack_num 3 differs from the unpack_num 2, 3"):
        forward(lambda a, c: flow.pack(flow.unpack(a, 3) + flow.unpack(c, 2), 3), x, z)


def test_time_shape_errors_name_the_line():
    x = np.zeros((6, 4), np.float32)
    with pytest.raises(TraceError, match=THIS_FILE):
        forward(lambda a: flow.acc(a, 2), x)
    with pytest.raises(TraceError, match="differs"):
        forward(lambda a: flow.acc(flow.repeat(a, 2), 3), x)
    with pytest.raises(TraceError, match="multiple"):
        forward(lambda a: flow.pack(flow.unpack(a, 4), 4), x)
    with pytest.raises(TraceError, match="differs"):
        forward(lambda a: flow.pack(flow.unpack(a, 3), 2), x)


# -- categorical_ordinal_encode, summary -----------------------------------------------------

def _oneflow_cpu_ordinals(batches):
    """OneFlow's CPU kernel's numbering: 0 -> 0, other values 1, 2, ... by first sight."""
    table, out = {0: 0}, []
    for batch in batches:
        out.append(np.array([table.setdefault(v, len(table)) for v in batch.ravel()],
                            batch.dtype).reshape(batch.shape))
    return out


def _encoder_job(shape, dtype, capacity):
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(shape, dtype=dtype)) -> Tuple[tp.Numpy, tp.Numpy]:
        y = flow.layers.categorical_ordinal_encoder(x, capacity=capacity)
        z = flow.layers.categorical_ordinal_encoder(x, capacity=capacity, name="encode1")
        return y, z
    return job


def test_categorical_ordinal_encode_numbers_values_as_onefows_cpu_kernel_across_runs():
    rng = np.random.default_rng(0)
    tokens = rng.integers(-2**62, 2**62, 300)
    tokens[:5] = 0
    batches = [tokens[rng.integers(0, 300, (8, 25))] for _ in range(6)]
    job = _encoder_job((8, 25), flow.int64, capacity=400)
    for batch, expected in zip(batches, _oneflow_cpu_ordinals(batches)):
        y, z = job(batch)
        np.testing.assert_array_equal(y, expected)
        np.testing.assert_array_equal(z, expected)   # each encoder has its own table


def test_categorical_ordinal_encode_does_not_need_a_stable_sort(monkeypatch):
    """The CUDA EP's TopK orders equal keys arbitrarily (the spec says stable): with a
    TopK that puts equal keys in reverse order the numbering is the same."""
    from onnxjob.graph.tracer import int64_constant
    from onnxjob.ops import legacy
    stable_op = legacy.op

    def reversing_ties(op_type, *inputs, **attrs):
        if op_type != "TopK":
            return stable_op(op_type, *inputs, **attrs)
        keys, k = inputs
        n = keys.shape[0]
        backwards = stable_op("Slice", keys, *(int64_constant(keys, [v]) for v in
                                                (n - 1, -n - 1, 0, -1)))
        values, places = stable_op("TopK", backwards, k, **attrs)
        return values, stable_op("Sub", int64_constant(keys, [n - 1]), places)
    monkeypatch.setattr(legacy, "op", reversing_ties)
    test_categorical_ordinal_encode_numbers_values_as_onefows_cpu_kernel_across_runs()


def test_categorical_ordinal_encode_docstring_example_int32():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3, 3), dtype=flow.int32)) -> tp.Numpy:
        with flow.scope.namespace("categorical_ordinal_encode"):
            table, size = (flow.get_variable(
                name=n, shape=s, dtype=flow.int32, trainable=False,
                initializer=flow.constant_initializer(0, dtype=flow.int32))
                for n, s in (("Table", (16,)), ("Size", (1,))))
            return flow.categorical_ordinal_encode(table=table, size=size, input_tensor=x)

    x = np.array([[7, 0, 2], [1, 7, 2], [0, 1, 7]], np.int32)
    np.testing.assert_array_equal(job(x), [[1, 0, 2], [3, 1, 2], [0, 3, 1]])
    size = flow.get_all_variables()["categorical_ordinal_encode-Size"]
    np.testing.assert_array_equal(size.numpy(), [3])


def test_categorical_ordinal_encode_past_its_capacity_keeps_the_first_values():
    job = _encoder_job((6,), flow.int32, capacity=4)
    first, = _oneflow_cpu_ordinals([np.arange(1, 7, dtype=np.int32)])
    y, _ = job(np.arange(1, 7, dtype=np.int32))
    np.testing.assert_array_equal(y, first)          # 6 values numbered 1..6
    y, _ = job(np.array([4, 3, 2, 1, 5, 6], np.int32))
    np.testing.assert_array_equal(y[:4], [4, 3, 2, 1])   # remembered (capacity 4)
    assert set(y[4:]) == {7, 8}                        # not remembered: numbered on


def test_categorical_ordinal_encode_checks_its_arguments():
    with pytest.raises(TraceError, match=f"{THIS_FILE}.*int32 or int64"):
        forward(lambda a: flow.layers.categorical_ordinal_encoder(a, 16),
                np.zeros((3,), np.float32))
    with pytest.raises(TraceError, match="capacity must be a positive int"):
        forward(lambda a: flow.layers.categorical_ordinal_encoder(a, 0),
                np.zeros((3,), np.int32))


def test_summary_is_accepted_with_one_warning(monkeypatch):
    from onnxjob.ops import summary
    monkeypatch.setattr(summary, "_warned", False)
    x = np.ones((3,), np.float32)

    def body(a):
        flow.summary.scalar(flow.math.reduce_sum(a), 1, "loss")
        flow.summary.histogram(a, 1, "a")
        flow.summary.Graph("logdir").write_structure_graph()
        return a * 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = forward(body, x)
    np.testing.assert_array_equal(y, 2 * x)
    assert [w.category.__name__ for w in caught] == ["SummaryIgnoredWarning"]
    assert "TensorBoard" in str(caught[0].message)
    assert caught[0].filename == __file__          # the program's line, not onnxjob's
