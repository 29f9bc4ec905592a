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
