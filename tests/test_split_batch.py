"""graph/split_batch.py's layout rule: where a Reshape puts the rank's rows."""
from onnxjob.graph.split_batch import Split
from onnxjob.graph.split_rules import reshaped_split


def test_rows_merged_with_the_axes_after_them_stay_one_block():
    # (8, 4) -> (32,): rank r's rows are elements [r * 16, (r + 1) * 16)
    assert reshaped_split((8, 4), Split(0), (32,), 8) == Split(0, inner=4)
    assert reshaped_split((8, 4, 5), Split(0), (8, 20), 8) == Split(0)


def test_the_batch_as_the_last_of_merged_axes():
    # the convolution's weight gradient: (C, H, W, N) -> (C, H * W * N)
    assert reshaped_split((3, 5, 5, 8), Split(3), (3, 200), 8) == Split(1, inner=1)
    # and back out of it: (C, H * W * N) -> (C, H * W, N)
    assert reshaped_split((3, 200), Split(1), (3, 25, 8), 8) == Split(2)


def test_an_axis_holding_the_batch_within_others():
    # (4, 8, 6) split on axis 1 -> (32, 6) -> the rows are inside axis 0 (4 x 8 x 1)
    assert reshaped_split((4, 8, 6), Split(1), (32, 6), 8) == Split(0, inner=1)
    # -> (4, 48): the batch merged with the 6 after it
    assert reshaped_split((4, 8, 6), Split(1), (4, 48), 8) == Split(1, inner=6)


def test_a_reshape_that_spreads_the_rows_is_refused():
    # (8, 3) -> (3, 8) is not a transpose: row 0 lands in output rows 0 and 1
    assert reshaped_split((8, 3), Split(0), (3, 8), 8) is None
    # (8, 6) -> (4, 12): two rows per output row, the batch spread over two axes
    assert reshaped_split((8, 6), Split(0), (4, 12), 8) is None


def test_a_row_cut_in_two_is_still_one_block():
    # (8, 6) -> (16, 3): each row becomes 2 output rows, a rank's rows one block of them
    assert reshaped_split((8, 6), Split(0), (16, 3), 8) == Split(0, inner=2)


def test_scatter_elements_with_whole_updates_takes_the_ranks_rows_of_them():
    """The CUDA form of a max pool's gradient (passes/keep_on_cuda.py) scatters a whole
    constant, shaped like the logical batch's indices, at MaxPool's flat indices along
    axis 0: each rank scatters its rows of it at its own indices."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxjob.graph.split_batch import split_batch
    batch, ranks = 4, 2
    updates = np.arange(1, batch * 2 + 1, dtype=np.float32)
    nodes = [helper.make_node("MaxPool", ["x"], ["y", "idx"], kernel_shape=[2], strides=[2]),
             helper.make_node("Reshape", ["idx", "flat"], ["flat_idx"]),
             helper.make_node("ScatterElements", ["zeros", "flat_idx", "updates"], ["s"], axis=0),
             helper.make_node("Reshape", ["s", "shape"], ["out"])]
    constants = [numpy_helper.from_array(np.zeros(batch * 4, np.float32), "zeros"),
                 numpy_helper.from_array(updates, "updates"),
                 numpy_helper.from_array(np.array([-1], np.int64), "flat"),
                 numpy_helper.from_array(np.array([batch, 1, 4], np.int64), "shape")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 1, 4])], constants,
        value_info=[helper.make_tensor_value_info("flat_idx", TensorProto.INT64, [batch * 2]),
                    helper.make_tensor_value_info("idx", TensorProto.INT64, [batch, 1, 2]),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 1, 2]),
                    helper.make_tensor_value_info("s", TensorProto.FLOAT, [batch * 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.random.default_rng(0).standard_normal((batch, 1, 4)).astype(np.float32)

    def run(proto, feed):
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"x": feed})[0]

    whole = run(model, x)
    rows = batch // ranks
    for rank in range(ranks):
        part = onnx.load_from_string(model.SerializeToString())
        kinds = split_batch(part, ["x"], rank, ranks, "job")
        assert kinds["out"] == Split(0)
        np.testing.assert_array_equal(run(part, x[rank * rows:(rank + 1) * rows]),
                                      whole[rank * rows:(rank + 1) * rows])


def test_a_whole_operand_contracted_with_the_rows_takes_the_ranks_columns_of_them():
    """MatMul(w, x) with x split along its rows (the contracted axis) and w whole, the
    batch along w's last axis (HalfColumnSums' row of ones): each rank multiplies its
    columns of w by its rows, a partial sum, and the ranks' sums add up to the whole."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    from onnxjob.graph.split_batch import SUM, split_batch
    batch, ranks = 4, 2
    weights = np.arange(1, batch + 1, dtype=np.float32).reshape(1, batch)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["w", "x"], ["out"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.random.default_rng(0).standard_normal((batch, 3)).astype(np.float32)
    rows, total = batch // ranks, 0
    for rank in range(ranks):
        part = onnx.load_from_string(model.SerializeToString())
        assert split_batch(part, ["x"], rank, ranks, "job")["out"] == SUM
        session = ort.InferenceSession(part.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        total = total + session.run(None, {"x": x[rank * rows:(rank + 1) * rows]})[0]
    np.testing.assert_allclose(total, weights @ x, rtol=1e-6)
