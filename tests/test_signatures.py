"""The parameter / return signature matrix of OneFlow's test_global_function_signature."""
import os
import socket
from typing import Dict, List, Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp

DATA = np.arange(10, dtype=np.float32)


def mirrored():
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    return config


def test_return_none_returns_immediately_and_runs():
    seen = []

    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))) -> None:
        flow.watch(x, lambda v: seen.append(v))

    assert foo(DATA) is None
    flow.sync_default_session()
    assert np.array_equal(seen[0], DATA)


@pytest.mark.parametrize("leaf,placeholder,arg,unwrap", [
    (tp.Numpy, tp.Numpy.Placeholder((10,)), DATA, lambda r: r),
    (tp.ListNumpy, tp.ListNumpy.Placeholder((10,)), [DATA], lambda r: r[0]),
    (tp.ListListNumpy, tp.ListListNumpy.Placeholder((10,)), [[DATA]], lambda r: r[0][0]),
])
def test_leaf_identity(leaf, placeholder, arg, unwrap):
    config = mirrored() if leaf is not tp.Numpy else None

    @flow.global_function(function_config=config)
    def foo(x: placeholder) -> leaf:
        return x

    assert np.array_equal(unwrap(foo(arg)), DATA)


def test_numpy_leaf_computes():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))) -> tp.Numpy:
        return flow.math.relu(x - 4.5) * 2

    assert np.allclose(foo(DATA), np.maximum(DATA - 4.5, 0) * 2)


def test_list_numpy_accepts_smaller_inputs_dynamic_shape():
    @flow.global_function(function_config=mirrored())
    def foo(x: tp.ListNumpy.Placeholder((10, 3))) -> tp.ListNumpy:
        return flow.math.relu(x)

    small = np.random.randn(4, 3).astype(np.float32)
    out = foo([small])
    assert out[0].shape == (4, 3)
    assert np.allclose(out[0], np.maximum(small, 0))


def test_list_list_numpy_several_tensors():
    @flow.global_function(function_config=mirrored())
    def foo(x: tp.ListListNumpy.Placeholder((10,))) -> tp.ListListNumpy:
        return x

    a, b = np.ones(3, np.float32), np.zeros(5, np.float32)
    out = foo([[a, b]])
    assert len(out) == 1 and len(out[0]) == 2
    assert np.array_equal(out[0][0], a) and np.array_equal(out[0][1], b)


@pytest.mark.parametrize("ann,make,get", [
    (Dict[str, tp.Numpy], lambda x: {"x": x}, lambda r: r["x"]),
    (Dict[str, Dict[str, tp.Numpy]], lambda x: {"x": {"x": x}}, lambda r: r["x"]["x"]),
    (Tuple[tp.Numpy], lambda x: (x,), lambda r: r[0]),
    (Tuple[tp.Numpy, tp.Numpy], lambda x: (x, x), lambda r: r[1]),
    (List[tp.Numpy], lambda x: [x, x, x], lambda r: r[2]),
    (Tuple[List[tp.Numpy], Dict[str, tp.Numpy]], lambda x: ([x], {"a": x}), lambda r: r[1]["a"]),
    (tp.Bundle[tp.Numpy], lambda x: x, lambda r: r),
    (tp.Bundle[tp.Numpy], lambda x: [x], lambda r: r[0]),
    (tp.Bundle[tp.Numpy], lambda x: {"x": x}, lambda r: r["x"]),
    (tp.Bundle[tp.Numpy], lambda x: (x, (x,), [x, x, x], {"x": {256: x}}), lambda r: r[3]["x"][256]),
])
def test_container_returns(ann, make, get):
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))) -> ann:
        return make(x)

    assert np.array_equal(get(foo(DATA)), DATA)


@pytest.mark.parametrize("leaf,placeholder,arg,unwrap", [
    (tp.ListNumpy, tp.ListNumpy.Placeholder((10,)), [DATA], lambda r: r[0][0]),
    (tp.ListListNumpy, tp.ListListNumpy.Placeholder((10,)), [[DATA]], lambda r: r[0][0][0]),
])
def test_bundle_and_tuple_of_mirrored(leaf, placeholder, arg, unwrap):
    @flow.global_function(function_config=mirrored())
    def foo(x: placeholder) -> Tuple[leaf]:
        return (x,)

    assert np.array_equal(unwrap(foo(arg)), DATA)


def test_tuple_parameter():
    @flow.global_function()
    def foo(x: Tuple[tp.Numpy.Placeholder((10,)), tp.Numpy.Placeholder((10,))]) -> tp.Numpy:
        return x[0] + x[1]

    assert np.array_equal(foo((DATA, DATA)), DATA * 2)


@pytest.mark.parametrize("ann,make,get", [
    (tp.Callback[tp.Numpy], lambda x: x, lambda r: r),
    (tp.Callback[Tuple[tp.Numpy]], lambda x: (x,), lambda r: r[0]),
    (tp.Callback[Dict[str, tp.Numpy]], lambda x: {"k": x}, lambda r: r["k"]),
])
def test_callback_returns(ann, make, get):
    got = []

    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))) -> ann:
        return make(x)

    foo(DATA)(lambda r: got.append(get(r)))
    flow.sync_default_session()
    assert len(got) == 1 and np.array_equal(got[0], DATA)


def test_no_annotation_returns_future():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))):
        return x * 2

    result = foo(DATA).get()
    assert np.array_equal(result.numpy(), DATA * 2)
    assert result.mean() == pytest.approx(DATA.mean() * 2)


def test_old_style_fixed_tensor_def_defaults():
    @flow.global_function()
    def foo(x=flow.FixedTensorDef((10,))):
        return x + 1

    assert np.array_equal(foo(DATA).get().numpy(), DATA + 1)


def test_watch_numpy_and_list_numpy():
    seen = {}

    def watch_numpy(x: tp.Numpy):
        seen["numpy"] = x

    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))) -> tp.Numpy:
        flow.watch(x * 3, watch_numpy)
        return x

    foo(DATA)
    assert np.array_equal(seen["numpy"], DATA * 3)


def test_mirrored_predict_over_two_devices_returns_per_device_results():
    flow.config.gpu_device_num(2)
    watched = []

    def watch_both(x: tp.ListNumpy):
        watched.append(x)

    @flow.global_function(function_config=mirrored())
    def foo(x: tp.ListNumpy.Placeholder((4, 3))) -> tp.ListNumpy:
        y = flow.math.relu(x) * 2
        flow.watch(y, watch_both)
        return y

    a = np.random.randn(4, 3).astype(np.float32)
    b = np.random.randn(2, 3).astype(np.float32)
    out = foo([a, b])
    assert len(out) == 2 and out[1].shape == (2, 3)
    np.testing.assert_allclose(out[0], np.maximum(a, 0) * 2)
    np.testing.assert_allclose(out[1], np.maximum(b, 0) * 2)
    assert len(watched[0]) == 2 and watched[0][1].shape == (2, 3)

    got = []
    flow.clear_default_session()
    flow.config.gpu_device_num(2)

    @flow.global_function(function_config=mirrored())
    def bar(x: tp.ListNumpy.Placeholder((4, 3))) -> tp.Callback[tp.ListNumpy]:
        return x + 1

    bar([a, b])(got.append)
    flow.sync_default_session()
    np.testing.assert_allclose(got[0][1], b + 1)


def test_mirrored_train_over_two_devices_runs_each_and_updates_once():
    flow.config.gpu_device_num(2)

    @flow.global_function(type="train", function_config=mirrored())
    def train(x: tp.ListNumpy.Placeholder((4, 3))) -> tp.ListNumpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        loss = x * w
        flow.optimizer.SGD(0.1, momentum=0).minimize(loss)
        return loss

    x = np.ones((4, 3), np.float32)
    first, second = train([x, 2 * x])
    np.testing.assert_array_equal(first, x)
    np.testing.assert_array_equal(second, 2 * x)
    # d sum(x * w) / dw summed over both devices' rows (4 + 8), over the 8 loss rows (a
    # dynamic loss's count, as OneFlow's: its rows along axis 0, summed over the devices)
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), 1 - 0.1 * 12 / 8,
                               rtol=1e-6)


def test_user_node_names_never_collide_with_generated_ones():
    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        a = flow.math.relu(x)                  # generated name: Relu_0
        b = flow.math.relu(a, name="Relu_0")   # a user name equal to it
        return flow.math.relu(b, name="Relu_0") + flow.math.relu(b)

    x = np.array([-1.0, 0.5, 2.0], np.float32)  # onnxruntime rejects duplicate node names
    np.testing.assert_allclose(foo(x), np.maximum(x, 0) * 2)


def test_env_machine_and_ctrl_port_give_the_rendezvous(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "unset")          # (restored after the test)
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setenv("MASTER_PORT", "29400")          # set by a launcher: kept
    flow.env.machine([{"addr": "10.0.0.7"}, {"addr": "10.0.0.8"}])
    flow.env.ctrl_port(9988)
    assert os.environ["MASTER_ADDR"] == "10.0.0.7" and os.environ["MASTER_PORT"] == "29400"


def test_env_log_dir_is_created_when_the_session_starts(tmp_path):
    # OneFlow's environment creates <log_dir>/<hostname> as it starts; programs then write
    # their own files under the log_dir they named
    log_dir = tmp_path / "output"
    with pytest.raises(TypeError, match=r"test_signatures\.py:\d+: flow\.env\.log_dir takes a str"):
        flow.env.log_dir(7)
    flow.env.log_dir(str(log_dir))

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x + 1

    assert not log_dir.exists()
    np.testing.assert_allclose(job(np.zeros(2, np.float32)), [1, 1])
    assert (log_dir / socket.gethostname()).is_dir()
    os.mkdir(log_dir / "save_model")


def test_consistent_train_job_over_two_devices_gives_the_single_device_result():
    def losses(devices):
        flow.clear_default_session()
        flow.config.gpu_device_num(devices)
        flow.config.seed(1)

        @flow.global_function(type="train")
        def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
            w = flow.get_variable("w", (3, 2), initializer=flow.random_normal_initializer())
            loss = flow.math.reduce_mean(flow.math.square(flow.matmul(x, w)))
            flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                               momentum=0.9).minimize(loss)
            return loss

        x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
        return [float(train(x)) for _ in range(3)]

    one = losses(1)
    assert losses(2) == one and one[-1] < one[0]


def test_no_annotation_and_no_return_value_returns_none():
    """OneFlow's LazyRun returns None for a job whose body returns nothing (no future),
    on the first call and on later (fast) calls alike."""
    seen = []

    @flow.global_function()
    def foo(x: tp.Numpy.Placeholder((10,))):
        flow.watch(x * 2, lambda b: seen.append(b.numpy()))

    assert foo(DATA) is None
    assert foo(DATA) is None
    flow.sync_default_session()
    assert len(seen) == 2 and np.array_equal(seen[1], DATA * 2)
