"""flow.advanced.distribute_* (OneFlow's per-device split / clone / concat / add / map,
with the numbers of the current placement's device count), flow.experimental's
square_sum, logical_slice(_assign), ssp_variable_proxy and interface blob values."""
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError


def test_distribute_split_is_balanced_and_concat_inverts_it():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((7, 2))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        with flow.scope.placement("cpu", "0:0-2"):
            parts = flow.advanced.distribute_split(x, axis=0)
            assert len(parts) == 3
            joined = flow.advanced.distribute_concat(list(parts), axis=0)
            total = flow.advanced.distribute_add([flow.slice(p, [0, 0], [2, 2])
                                                  for p in parts])
            return parts[0], parts[2], joined, total

    x = np.arange(14, dtype=np.float32).reshape(7, 2)
    first, last, joined, total = job(x)
    np.testing.assert_array_equal(first, x[:3])    # 7 rows on 3 devices: 3, 2, 2
    np.testing.assert_array_equal(last, x[5:])
    np.testing.assert_array_equal(joined, x)
    np.testing.assert_array_equal(total, x[0:2] + x[3:5] + x[5:7])


def test_distribute_on_one_device_and_clone():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> Tuple[tp.Numpy, tp.Numpy]:
        (part,) = flow.advanced.distribute_split(x, axis=1)
        with flow.scope.placement("cpu", "0:0-1"):
            a, b = flow.advanced.distribute_clone(x)
            summed = flow.advanced.distribute_add([a, b])
        return part, summed

    x = np.random.rand(4, 3).astype(np.float32)
    part, summed = job(x)
    np.testing.assert_array_equal(part, x)
    np.testing.assert_allclose(summed, 2 * x)


def test_distribute_map_applies_per_part():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3)), y: tp.Numpy.Placeholder((4, 3))
            ) -> Tuple[tp.Numpy, tp.Numpy]:
        with flow.scope.placement("cpu", "0:0-1"):
            one = flow.advanced.distribute_map(x, lambda p: p * 2)
            two = flow.advanced.distribute_map([x, y], lambda p, q: (p + q, p - q))
        return one, two[1]

    x, y = np.random.rand(2, 4, 3).astype(np.float32)
    one, diff = job(x, y)
    np.testing.assert_allclose(one, 2 * x)
    np.testing.assert_allclose(diff, x - y)


def test_distribute_map_runs_f_on_one_device():
    """OneFlow runs `f` under a placement of one device ("@0:0", _UnderSingleDevicePlacementScope):
    inside it the device count is 1, and a batch norm normalizes each part by its own rows
    (under the two-device placement it would split the part again)."""
    seen = []

    def f(part):
        seen.append(flow.current_scope().device_parallel_desc_symbol.parallel_num)
        return flow.layers.batch_normalization(part, axis=1, name=f"bn{len(seen)}")

    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 1))) -> tp.Numpy:
        with flow.scope.placement("gpu", "0:0-1"):
            y = flow.advanced.distribute_map(x, f)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(flow.math.reduce_sum(y))
        return y

    x = np.array([[0.0], [1.0], [2.0], [3.0]], np.float32)
    y = job(x)
    assert seen == [1, 1]
    halves = x.reshape(2, 2)
    expected = (halves - halves.mean(1, keepdims=True)) / np.sqrt(
        halves.var(1, keepdims=True) + 1e-3)      # (the layer's default epsilon)
    np.testing.assert_allclose(y.ravel(), expected.ravel(), rtol=1e-5)


def test_a_placement_may_name_a_rank():
    """"@0:0", OneFlow's machine written as a rank (parallel_conf_util.cpp), is machine 0."""
    from onnxjob.frontend.scope import device_count, machine_device_lists
    assert machine_device_lists("@0:0-1") == {0: [0, 1]}
    assert device_count(["@0:0", "@1:0-2"]) == 4


def test_distribute_concat_needs_one_blob_per_device():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0-1"):
            return flow.advanced.distribute_concat([x])

    with pytest.raises(TraceError, match="one blob per device"):
        job(np.zeros((4, 3), np.float32))


def test_square_sum_and_its_gradient():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((8, 5))) -> tp.Numpy:
        return flow.experimental.square_sum(x)

    x = np.random.uniform(-1, 1, (8, 5)).astype(np.float32)
    out = job(x)
    assert out.shape == (1,)
    np.testing.assert_allclose(out, [np.sum(x ** 2)], rtol=1e-5)
    flow.clear_default_session()
    grads = {}

    @flow.global_function(type="train")
    def train() -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.constant_initializer(2.0))
        flow.watch_diff(w, lambda g: grads.setdefault("w", g))
        loss = flow.experimental.square_sum(w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        return loss

    np.testing.assert_allclose(train(), [12.0])
    np.testing.assert_allclose(grads["w"], [4.0, 4.0, 4.0])


def test_logical_slice_and_slice_assign_on_a_variable():
    @flow.global_function()
    def write(value: tp.Numpy.Placeholder((2, 2))):
        var = flow.get_variable("var", (4, 6), initializer=flow.constant_initializer(0.0),
                                distribute=flow.distribute.split(0))
        flow.experimental.logical_slice_assign(var, value, [(1, 4, 2), (0, 6, 3)])

    @flow.global_function()
    def read() -> tp.Numpy:
        var = flow.get_variable("var", (4, 6), initializer=flow.constant_initializer(0.0),
                                distribute=flow.distribute.split(0))
        return flow.experimental.logical_slice(var, [(None, None, None), (1, 6, 2)])

    value = np.array([[1, 2], [3, 4]], np.float32)
    write(value)
    expected = np.zeros((4, 6), np.float32)
    expected[1:4:2, 0:6:3] = value
    np.testing.assert_array_equal(read(), expected[:, 1:6:2])
    np.testing.assert_array_equal(flow.experimental.get_interface_blob_value("var"), expected)


def test_ssp_variable_proxy_without_staleness():
    @flow.global_function()
    def step() -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.constant_initializer(0.0))
        ref, value = flow.experimental.ssp_variable_proxy(w, buffer_size=1)
        flow.assign(ref, value + flow.constant_like(w, 1.0))
        return value

    for i in range(3):
        np.testing.assert_array_equal(step(), np.full(3, i))


@pytest.mark.parametrize("buffer_size", [2, 4])
def test_ssp_variable_proxy_reads_stale_values(buffer_size):
    """value at run t is the variable's value at run t - (buffer_size - 1), its first value
    before that (OneFlow's test_ssp_variable_proxy, both update rules)."""
    @flow.global_function()
    def from_value() -> tp.Numpy:
        w = flow.get_variable("w", (2,), initializer=flow.constant_initializer(0.0))
        ref, value = flow.experimental.ssp_variable_proxy(w, buffer_size=buffer_size)
        flow.assign(ref, value + flow.constant_like(w, 1.0))
        return value

    @flow.global_function()
    def from_ref() -> tp.Numpy:
        w = flow.get_variable("v", (2,), initializer=flow.constant_initializer(5.0))
        ref, value = flow.experimental.ssp_variable_proxy(w, buffer_size=buffer_size)
        flow.assign(ref, ref + flow.constant_like(w, 1.0))
        return value

    lag = buffer_size - 1
    w, history = 0.0, []
    for _ in range(3 * buffer_size):
        history.append(w)
        value = history[max(0, len(history) - 1 - lag)]
        np.testing.assert_array_equal(from_value(), [value, value])
        w = value + 1
    for t in range(3 * buffer_size):
        np.testing.assert_array_equal(from_ref(), np.full(2, 5.0 + max(0, t - lag)))
    flow.clear_default_session()

    @flow.global_function()
    def bad() -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.constant_initializer(0.0))
        return flow.experimental.ssp_variable_proxy(w + 1, buffer_size=2)[1]

    with pytest.raises(TraceError, match="takes a variable"):
        bad()


def test_interface_blob_values_read_and_write_variables():
    @flow.global_function()
    def add() -> tp.Numpy:
        x = flow.get_variable("x", (2, 3), initializer=flow.random_uniform_initializer())
        y = flow.get_variable("y", (2, 3), initializer=flow.random_uniform_initializer())
        return flow.math.add_n([x, y])

    x_value, y_value = np.random.rand(2, 2, 3).astype(np.float32)
    flow.experimental.set_interface_blob_value("x", x_value)
    flow.experimental.set_interface_blob_value("y", y_value)
    np.testing.assert_array_equal(flow.experimental.get_interface_blob_value("x"), x_value)
    np.testing.assert_allclose(add(), x_value + y_value)
    with pytest.raises(KeyError, match="not a variable"):
        flow.experimental.get_interface_blob_value("z")
    with pytest.raises(AssertionError):
        flow.experimental.set_interface_blob_value("x", np.zeros((3, 2), np.float32))


def _ssp_job(loss_of, stages=4, stage=0, config_scope=True):
    flow.clear_default_session()
    fc = flow.FunctionConfig()
    fc.enable_ssp(True)

    @flow.global_function(type="train", function_config=fc)
    def job() -> tp.Numpy:
        attrs = dict(ssp_num_stages=stages, ssp_stage_id=stage) if config_scope else {}
        with flow.experimental.scope.config(**attrs):
            w = flow.get_variable("w", shape=(3,), dtype=flow.float,
                                  initializer=flow.constant_initializer(1.0))
        loss = loss_of(w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return w + flow.constant_like(w, 0.0)
    return job


def test_enable_ssp_reads_trainable_variables_stale_and_updates_them_by_that_gradient():
    """As OneFlow's AddSspVariableProxy pass: ops outside the optimizer read w as it was
    ssp_num_stages - ssp_stage_id - 1 runs ago; the optimizer updates w itself with the
    gradient taken at that stale value (here of sum(w^2) / 3: 2 w_stale / 3)."""
    job = _ssp_job(lambda w: flow.math.reduce_mean(flow.math.square(w)), stages=3, stage=0)
    history, seen = [np.ones(3, np.float32)], []
    for step in range(6):
        seen.append(job()[0])
        stale = history[max(step - 2, 0)]
        history.append(history[-1] - np.float32(0.1) * 2 * stale / 3)
        np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), history[-1],
                                   rtol=1e-6)
    np.testing.assert_allclose(seen, [history[max(t - 2, 0)][0] for t in range(6)], rtol=1e-6)


def test_enable_ssp_needs_the_stages_in_the_variables_scope():
    job = _ssp_job(lambda w: flow.math.reduce_sum(w), config_scope=False)
    with pytest.raises(TraceError, match="ssp_num_stages"):
        job()


def test_a_blobs_parallel_conf_is_the_placement_it_was_made_under():
    """OneFlow's Blob.parallel_conf: the innermost placement scope, else the job's
    default_placement_scope, else the device the session runs on."""
    seen = {}
    config = flow.function_config()
    config.default_placement_scope(flow.scope.placement("cpu", "0:0"))

    @flow.global_function(function_config=config)
    def job(x: tp.Numpy.Placeholder((2, 5))) -> tp.Numpy:
        y = flow.math.relu(x)
        with flow.scope.placement("gpu", "0:0-1"):
            z = y + 1
        seen["y"] = (y.parallel_conf.device_tag(), y.parallel_conf.device_name())
        seen["z"] = (z.parallel_conf.device_tag(), z.parallel_conf.device_name())
        # OneFlow <= 0.4's protobuf fields (its test_cpu_only_user_op: "cpu" in device_tag)
        seen["fields"] = (y.parallel_conf.device_tag, list(z.parallel_conf.device_name))
        return z

    @flow.global_function()
    def plain(x: tp.Numpy.Placeholder((2, 5))) -> tp.Numpy:
        seen["plain"] = x.parallel_conf.device_tag()
        return x

    job(np.ones((2, 5), np.float32))
    plain(np.ones((2, 5), np.float32))
    assert seen["y"] == ("cpu", ["0:0"]) and seen["z"] == ("gpu", ["0:0-1"])
    assert seen["fields"] == ("cpu", ["0:0-1"]) and "cpu" in seen["fields"][0]
    from onnxjob.runtime.session import default_session
    assert seen["plain"] == ("gpu" if default_session().device == "cuda" else "cpu")


def test_flow_placement_and_flow_device_in_each_generation_s_sense():
    """OneFlow 0.2's flow.placement.current_scope() (model code such as two_stage_reduce
    reads its default_device_tag and machine_id2device_id_list inside a job) and
    flow.device("gpu:0") as a placement scope; OneFlow 0.5's flow.placement(tag, {machine:
    [devices]}) and flow.device("cuda:0") as values with their fields."""
    seen = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((6, 2))) -> tp.Numpy:
        with flow.scope.placement("cpu", "0:0-2"):
            here = flow.placement.current_scope()
            seen["scope"] = (here.default_device_tag, here.machine_id2device_id_list,
                             here.parallel_size)
            parts = flow.advanced.distribute_split(x, axis=0)
            total = flow.advanced.distribute_add(
                [flow.math.reduce_sum(p, axis=0, keepdims=True) for p in parts])
        with flow.device("gpu:1"):
            y = total * 2
            seen["device"] = (y.parallel_conf.device_tag(), y.parallel_conf.device_name())
        return y

    config = flow.function_config()
    config.default_placement_scope(flow.scope.placement("gpu", "0:1"))   # (advisory)

    @flow.global_function(function_config=config)
    def default_scope() -> tp.Numpy:     # as OneFlow 0.2's test_function_config
        here = flow.placement.current_scope()
        seen["default"] = (here.default_device_tag, here.machine_id2device_id_list)
        return flow.get_variable("w", (3,), initializer=flow.constant_initializer(1))

    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    np.testing.assert_allclose(job(x), 2 * x.sum(0, keepdims=True))
    np.testing.assert_allclose(default_scope(), np.ones(3))
    assert seen["scope"] == ("cpu", {0: [0, 1, 2]}, 3) and seen["default"] == ("gpu", {0: [1]})
    assert seen["device"] == ("gpu", ["0:1"])
    place = flow.placement("gpu", {0: [0, 1], 1: [2]})
    assert (place.device_tag, place.parallel_num, place.hierarchy) == ("gpu", 3, [3])
    assert place == flow.placement("gpu", ["0:0-1", "1:2"])
    cuda = flow.device("cuda:2")
    assert (cuda.type, cuda.index, str(cuda)) == ("cuda", 2, "cuda:2")
    assert flow.device("cuda", 2) == cuda and flow.device("cpu").index == 0
    assert repr(cuda) == "device(type='cuda', index=2)"
    with pytest.raises(ValueError, match="flow.device takes"):
        flow.device("tpu:0")
    flow.deprecated.delete_worker_by_bootstrap()     # one machine: no worker to stop
