"""Scatter-adds with repeated indices (gradients of gather and gather_nd, segment sums,
tensor_scatter_nd_add) are exact: onnxruntime's CPU ScatterND adds on several threads
without ordering the updates, so they are emitted as ScatterElements."""
import numpy as np

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph.tracer import GraphBuilder, op, tracing

from gradcheck import vjp


def test_segment_sum_of_many_repeated_ids_is_exact():
    rng = np.random.default_rng(0)
    data = rng.uniform(-1, 1, (64, 96, 5, 6, 7)).astype(np.float32)
    ids = rng.integers(0, 4, (64, 96)).astype(np.int32)

    @flow.global_function()
    def job(d: tp.Numpy.Placeholder(data.shape),
            s: tp.Numpy.Placeholder(ids.shape, dtype=flow.int32)) -> tp.Numpy:
        return flow.math.unsorted_segment_sum(d, s, 4, axis=0)

    expected = np.zeros((4, 5, 6, 7))
    np.add.at(expected, ids, data.astype(np.float64))
    for _ in range(4):      # the threaded ScatterND lost updates in about 1 run of 4
        np.testing.assert_allclose(job(data, ids), expected, atol=1e-3)


def test_no_scatter_nd_add_is_emitted():
    builder = GraphBuilder("scatter")
    with tracing(builder):
        data = builder.add_input("data", (5, 3), np.float32)
        idx = builder.add_input("idx", (4, 1), np.int64)
        upd = builder.add_input("upd", (4, 3), np.float32)
        op("ScatterND", data, idx, upd, reduction="add")
    kinds = [(n.op_type, n.attributes.get("reduction")) for n in builder.graph]
    assert not any(kind == "ScatterND" for kind, _ in kinds), kinds
    assert any(kind == "ScatterElements" for kind, _ in kinds)


def test_scatter_nd_add_values_and_gradients():
    """Negative and repeated indices; both gradients against NumPy."""
    data = np.arange(24, dtype=np.float64).reshape(4, 3, 2)
    idx = np.array([[1, -1], [1, 2], [0, 0], [-4, 0]], np.int64)
    upd = np.random.default_rng(1).random((4, 2))
    run, _ = vjp(lambda d, u: op("ScatterND", d, d.builder.constant(idx), u,
                                 reduction="add"), [data, upd], [True, True])
    ct = np.random.default_rng(2).random(data.shape)
    y, (g_data, g_upd) = run([data, upd], ct)
    expected = data.copy()
    for (i, j), u in zip(idx, upd):
        expected[i, j] += u
    np.testing.assert_allclose(y, expected)
    np.testing.assert_allclose(g_data, ct)
    np.testing.assert_allclose(g_upd, ct[idx[:, 0], idx[:, 1]])


def test_no_scatter_nd_add_is_emitted_for_run_time_row_counts():
    """Indices and updates whose row count is known at run time (a mirrored job's
    ListNumpy placeholders), and data whose dims are, whichever number of axes the index
    picks."""
    for data_dynamic, k in ((False, 1), (True, 1), (True, 2)):
        builder = GraphBuilder("scatter")
        with tracing(builder):
            data = builder.add_input("data", (5, 3, 2), np.float32, dynamic=data_dynamic)
            idx = builder.add_input("idx", (4, k), np.int64, dynamic=True)
            upd = builder.add_input("upd", (4,) + (3, 2)[k - 1:], np.float32, dynamic=True)
            op("ScatterND", data, idx, upd, reduction="add")
        kinds = [n.op_type for n in builder.graph]
        assert "ScatterND" not in kinds and "ScatterElements" in kinds, kinds


def test_a_mirrored_tensor_scatter_nd_add_of_repeated_indices_is_exact():
    """OneFlow's test_tensor_scatter_nd_add case 2 in a mirrored view: indices of three
    axes into data known at run time, many repeated; the plain ScatterND lost an update in
    about 1 run of 5 (an error of ~1 against NumPy)."""
    rng = np.random.default_rng(0)
    shape, index_shape, update_shape = (2, 7, 19, 41, 33), (20, 9, 3), (20, 9, 41, 33)
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(function_config=config)
    def job(p: tp.ListNumpy.Placeholder(shape),
            i: tp.ListNumpy.Placeholder(index_shape, dtype=flow.int32),
            u: tp.ListNumpy.Placeholder(update_shape)) -> tp.ListNumpy:
        return flow.tensor_scatter_nd_add(p, i, u)

    for _ in range(12):
        params = rng.random(shape, dtype=np.float32)
        updates = rng.random(update_shape, dtype=np.float32)
        idx = np.stack([rng.integers(0, n, index_shape[:2]) for n in shape[:3]], -1)
        expected = params.astype(np.float64)
        np.add.at(expected, tuple(idx.reshape(-1, 3).T), updates.reshape(-1, 41, 33))
        got = job([params], [idx.astype(np.int32)], [updates])[0]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    flow.clear_default_session()


def test_a_mirrored_gather_gradient_counts_every_repeated_index():
    """OneFlow's test_gather case: many repeated indices along axis 1, a mirrored view;
    the gradient of a sum of the gathered rows is each row's count, exactly."""
    rng = np.random.default_rng(0)
    shape, index_shape = (6, 150, 20), (20, 15, 45)
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    for _ in range(3):
        flow.clear_default_session()
        seen = {}

        @flow.global_function(type="train", function_config=config)
        def job(p: tp.ListNumpy.Placeholder(shape),
                i: tp.ListNumpy.Placeholder(index_shape, dtype=flow.int32)):
            x = flow.get_variable("params", shape=shape,
                                  initializer=flow.constant_initializer(0)) + p
            y = flow.gather(x, i, axis=1)
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.001]),
                               momentum=0).minimize(y)
            flow.watch_diff(x, lambda g: seen.setdefault("g", g.numpy_list()[0].copy()))
            return y

        idx = rng.integers(0, shape[1], index_shape).astype(np.int32)
        job([rng.random(shape, dtype=np.float32)], [idx]).get()
        counts = np.bincount(idx.ravel(), minlength=shape[1]).astype(np.float32)
        np.testing.assert_array_equal(seen["g"], np.broadcast_to(counts[None, :, None], shape))
    flow.clear_default_session()


def test_gather_nd_gradient_of_data_smaller_than_its_placeholder():
    """A mirrored ListNumpy x fed smaller than its placeholder in every axis (OneFlow's
    dynamic blob): gather_nd's gradient adds each picked row into x's own run-time shape."""
    rng = np.random.default_rng(1)
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    seen = {}

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.ListNumpy.Placeholder((16, 16)),
            i: tp.ListNumpy.Placeholder((20, 1), dtype=flow.int32)) -> tp.ListNumpy:
        w = flow.get_variable("w", shape=(1,), initializer=flow.constant_initializer(1))
        x = x * w
        flow.watch_diff(x, lambda g: seen.setdefault("g", g.numpy_list()[0].copy()))
        y = flow.gather_nd(x, i)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(y)
        return y

    x = rng.random((12, 15), dtype=np.float32)
    idx = rng.integers(0, 12, (20, 1)).astype(np.int32)
    y = job([x], [idx])[0]
    np.testing.assert_array_equal(y, x[idx[:, 0]])
    expected = np.zeros_like(x)
    np.add.at(expected, idx[:, 0], 1.0)
    np.testing.assert_array_equal(seen["g"], expected)
    flow.clear_default_session()
