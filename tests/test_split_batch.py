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
