"""Batch normalization's moving averages updated together (onnxjob/graph/moving_averages.py):
the values one update per layer gives, in one concatenated update."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph import moving_averages

X = np.random.default_rng(0).standard_normal((4, 3, 5, 5)).astype(np.float32)


def _fresh_session(together, monkeypatch, seed):
    """A new default session whose moving averages are updated together or, with
    `together` false, one by one (moving_averages.flush does nothing)."""
    if not together:
        monkeypatch.setattr(moving_averages, "flush", lambda builder: None)
    flow.clear_default_session()
    flow.config.seed(seed)


def _moving_statistics(together, monkeypatch, momentum_b=0.9):
    """The variables after 3 train steps of a net with three batch norms (two of one
    momentum, one of another; channels 3, 6, 6), updated together or one by one."""
    _fresh_session(together, monkeypatch, seed=1)

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 5, 5))) -> tp.Numpy:
        h = flow.layers.batch_normalization(x, axis=1, momentum=0.9, name="bn0")
        h = flow.layers.conv2d(h, 6, 3, padding="SAME", name="c")
        h = flow.layers.batch_normalization(h, axis=1, momentum=momentum_b, name="bn1")
        h = flow.layers.batch_normalization(flow.nn.relu(h), axis=1, momentum=0.99,
                                            name="bn2")
        loss = flow.math.reduce_mean(h * h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss

    for step in range(3):
        job(X * (step + 1))
    return {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}


@pytest.mark.parametrize("momentum_b", [0.9, 0.5])
def test_moving_averages_updated_together_are_those_of_one_update_per_layer(momentum_b,
                                                                            monkeypatch):
    together = _moving_statistics(True, monkeypatch, momentum_b)
    one_by_one = _moving_statistics(False, monkeypatch, momentum_b)
    assert "bn1-moving_mean" in together and set(together) == set(one_by_one)
    for name, value in one_by_one.items():
        np.testing.assert_array_equal(together[name], value, err_msg=name)
    assert not np.allclose(together["bn1-moving_variance"], 1.0), "the averages moved"


def test_one_concatenated_update_for_the_layers_of_a_momentum():
    from onnxjob.graph.compiler import compile_job
    from onnxjob.runtime.session import default_session
    flow.clear_default_session()

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 5, 5))) -> tp.Numpy:
        h = flow.layers.batch_normalization(x, axis=1, name="bn0")
        h = flow.layers.batch_normalization(h, axis=1, name="bn1")
        loss = flow.math.reduce_mean(h * h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    session = default_session()
    graph = compile_job(session.jobs["job"], session, 0).model.graph
    splits = [n for n in graph if n.op_type == "Split"]
    # the four moving statistics (and the four small variables: train/flat_groups.py),
    # and the backward's four per-channel coefficients of the two layers
    # (graph/batch_norm_coefficients.py)
    assert sorted(len(n.outputs) for n in splits) == [2, 2, 2, 2, 4, 4]


def _wide_statistics(together, monkeypatch):
    """The variables after 2 train steps of a net whose batch norms have 64, 128 and 3
    channels (one momentum), updated together or one by one, and the compiled graph."""
    from onnxjob.graph.compiler import compile_job
    from onnxjob.runtime.session import default_session
    _fresh_session(together, monkeypatch, seed=2)

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 5, 5))) -> tp.Numpy:
        h = flow.layers.batch_normalization(x, axis=1, name="bn0")
        h = flow.layers.conv2d(h, 64, 3, padding="SAME", name="c0")
        h = flow.layers.batch_normalization(h, axis=1, name="bn1")
        h = flow.layers.conv2d(flow.nn.relu(h), 128, 1, name="c1")
        h = flow.layers.batch_normalization(h, axis=1, name="bn2")
        loss = flow.math.reduce_mean(h * h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss

    for step in range(2):
        job(X * (step + 1))
    session = default_session()
    graph = compile_job(session.jobs["job"], session, 0).model.graph
    return {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}, graph


def test_wide_layers_are_concatenated_as_rows_and_odd_ones_apart(monkeypatch):
    """Statistics of 64 and 128 channels are concatenated as rows of 64 (onnxruntime's CUDA
    Concat and Split copy a table of every index along the axis: shape_ops.concat_flat);
    the 3-channel layer's stay apart, so the rows stay 64 wide. The values are those of
    one update per layer."""
    together, graph = _wide_statistics(True, monkeypatch)
    one_by_one, _ = _wide_statistics(False, monkeypatch)
    for name, value in one_by_one.items():
        np.testing.assert_array_equal(together[name], value, err_msg=name)
    from onnxjob.graph.traffic import origin
    rows = [n for n in graph if n.op_type == "Split" and len(n.inputs[0].shape) == 2]
    assert rows and all(n.inputs[0].shape[1] == 64 for n in rows)
    # (bn1's and bn2's four backward coefficients, graph/batch_norm_coefficients.py)
    coefficients = [n for n in rows if origin(n)[0] == "backward"]
    assert [n.inputs[0].shape[0] for n in coefficients] == [(64 + 128) // 64] * 4
    splits = [n for n in rows if n not in coefficients]
    statistics = 2 * (64 + 128)                 # bn1's and bn2's means and variances
    small_variables = statistics + 64 * 27 + 64 + 128 * 64 + 128    # + c0's, c1's
    assert sorted(n.inputs[0].shape[0] for n in splits) == [statistics // 64] + \
        [small_variables // 64] * (len(splits) - 1)
