"""Batch normalization's moving averages updated together (onnxjob/graph/moving_averages.py):
the values one update per layer gives, in one concatenated update."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph import moving_averages

X = np.random.default_rng(0).standard_normal((4, 3, 5, 5)).astype(np.float32)


def _moving_statistics(together, monkeypatch, momentum_b=0.9):
    """The variables after 3 train steps of a net with three batch norms (two of one
    momentum, one of another; channels 3, 6, 6), updated together or one by one."""
    if not together:
        monkeypatch.setattr(moving_averages, "flush", lambda builder: None)
    flow.clear_default_session()
    flow.config.seed(1)

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
    # the four moving statistics (and the four small variables: train/flat_groups.py)
    assert sorted(len(n.outputs) for n in splits) == [4, 4]
