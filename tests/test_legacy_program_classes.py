"""Legal OneFlow calls that real legacy programs make, one class per section, pinned to
OneFlow's documented behaviour: blob truthiness and protocols, distribution hints and
properties, None meaning a default, reductions keeping one axis, host values feeding graph
ops (checkpoint folders without markers: test_checkpoint.py; the image reader's labels:
test_data_legacy.py)."""
import os
import warnings
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import ConcreteBlobError, UnsupportedAPIError
from onnxjob.graph.tracer import current_builder
from onnxjob.io import images as image_io
from onnxjob.io import ofrecord

THIS_FILE = os.path.basename(__file__)
X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 10


def _run(body, x=X):
    flow.clear_default_session()

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        return body(a)
    return job(x)


# -- truthiness and Python protocols -----------------------------------------------------

def test_a_blob_is_true_as_onefow_lazy_blobs_are():
    def body(x):
        bias = flow.constant(1.0, shape=[4])
        out = x
        if bias:                            # LSTM code: a test for "given"
            out = flow.nn.bias_add(out, bias, data_format="NHC")
        return out if x is not None and bias else x

    with warnings.catch_warnings():
        warnings.simplefilter("error")      # a float blob's truth is no trap: no warning
        np.testing.assert_allclose(_run(body), X + 1)


def test_a_comparison_in_an_if_is_true_and_warns_once_per_line():
    def body(x):
        for _ in range(3):
            if x > 100:                     # int8 blob: always true, as in OneFlow
                x = x + 1
        return x

    with pytest.warns(UserWarning, match=THIS_FILE) as caught:
        np.testing.assert_allclose(_run(body), X + 3)
    assert len([w for w in caught if THIS_FILE in str(w.message)]) == 1


@pytest.mark.parametrize("use", [len, iter, float, int, lambda b: [0, 1][b],
                                 lambda b: 1 in b], ids=["len", "iter", "float", "int",
                                                         "index", "in"])
def test_protocols_oneflow_blobs_lack_raise_type_error_naming_the_line(use):
    with pytest.raises(ConcreteBlobError, match=THIS_FILE) as e:
        _run(lambda x: use(x) and x)
    assert isinstance(e.value, TypeError)   # what Python raises for OneFlow's blobs


# -- distribution hints -------------------------------------------------------------------

def test_distribute_hints_keep_values_and_gradients():
    grads = {}

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> Tuple[tp.Numpy, tp.Numpy]:
        w = flow.get_variable("w", (3, 2), initializer=flow.ones_initializer(),
                              distribute=flow.distribute.split(1))
        h = flow.matmul(x.with_distribute(flow.distribute.split(0)),
                        w.with_distribute(flow.distribute.broadcast()))
        h = h.with_split_distribute(1).with_broadcast_distribute()
        h = h.with_gradient_distribute(flow.distribute.split(0))
        h = flow.parallel_cast(h, distribute=flow.distribute.broadcast(),
                               gradient_distribute=flow.distribute.split(0))
        assert h.distribute == flow.distribute.auto()
        assert x.with_split_distribute(1).distribute == flow.distribute.split(1)
        loss = flow.math.reduce_sum(h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        flow.watch_diff(w, lambda g: grads.setdefault("w", g))
        return h, loss

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    h, loss = train(x)
    np.testing.assert_allclose(h, x @ np.ones((3, 2)))
    np.testing.assert_allclose(grads["w"], np.repeat(x.sum(0)[:, None], 2, 1))
    with pytest.raises(AssertionError, match="distribute"):
        _run(lambda a: a.with_distribute("split"))


def test_split_axis_and_parallel_size_on_one_device():
    seen = {}

    def body(x):
        seen["split"] = (x.split_axis, flow.math.reduce_sum(x).split_axis)
        seen["size"] = x.parallel_size
        with flow.scope.placement("cpu", "0:0-3"):
            seen["placed"] = flow.identity(x).parallel_size
        seen["batch"] = (x.batch_axis, flow.transpose(x, [1, 0, 2]).batch_axis,
                         flow.math.reduce_sum(x, axis=[0]).batch_axis)
        return x

    _run(body)
    # OneFlow 0.5 makes every blob broadcast on one device: INVALID_SPLIT_AXIS
    assert seen["split"] == (flow.INVALID_SPLIT_AXIS, -22)
    assert seen["size"] == 1 and seen["placed"] == 4
    assert seen["batch"] == (0, 1, None)


def test_split_axis_on_data_parallel_ranks_follows_the_rows():
    seen = {}

    def body(x):
        builder = current_builder()
        builder.data_parallel_ranks = 2     # as a 2-rank train step traces
        try:
            w = flow.get_variable("w", (4, 5), initializer=flow.ones_initializer())
            y = flow.matmul(flow.slice(flow.reshape(x, (2, 12)), [None, 0], [None, 4]), w)
            seen["axes"] = (x.split_axis, y.split_axis, w.split_axis,
                            flow.math.reduce_mean(y, axis=[0]).split_axis,
                            flow.transpose(y, [1, 0]).split_axis)
            seen["size"] = x.parallel_size
        finally:
            builder.data_parallel_ranks = None
        return x

    _run(body)
    assert seen["axes"] == (0, 0, -22, -22, 1) and seen["size"] == 2


# -- None meaning a default ----------------------------------------------------------------

def test_pool_ksize_and_strides_none_read_as_one():
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 5)).astype(np.float32)
    same = _run(lambda a: flow.nn.avg_pool2d(a, ksize=[2, 2], strides=None, padding="VALID"),
                x)
    windows = np.lib.stride_tricks.sliding_window_view(x, (2, 2), axis=(2, 3))
    np.testing.assert_allclose(same, windows.mean(axis=(-2, -1)), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        _run(lambda a: flow.nn.max_pool2d(a, ksize=None, strides=None, padding="SAME"), x), x)
    assert _run(lambda a: flow.nn.avg_pool2d(a, ksize=[4, 5], strides=None, padding="SAME"),
                x).shape == x.shape


def test_generation_keywords_and_none_names():
    def body(x):
        flow.get_variable("v", (3,), initializer=flow.zeros_initializer(),
                          parallel_distribution=["B"])
        y = flow.hierarchical_parallel_cast(x, parallel_distribution=["B"],
                                            grad_parallel_distribution=["B"])
        with flow.scope.placement("cpu", "0:0-3", hierarchy=[2, 2]):
            y = flow.identity(y)
        coin = flow.cast(flow.random.coin_flip(2, name=None), flow.float)
        steps = flow.cast(flow.range(4, name=None), flow.float)           # 0, 1, 2, 3
        zeros = flow.random.bernoulli(x * 0, name=None)                  # probability 0
        return y + zeros + flow.reshape(coin, (2, 1, 1)) * 0 + steps * 0
    np.testing.assert_allclose(_run(body), X)


# -- reductions keep one axis ---------------------------------------------------------------

@pytest.mark.parametrize("reduce", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min",
                                    "reduce_prod", "reduce_logsumexp", "reduce_variance",
                                    "reduce_std", "reduce_euclidean_norm", "reduce_any",
                                    "reduce_all"])
def test_a_reduction_over_every_axis_keeps_one_axis_and_concatenates(reduce):
    fn = getattr(flow.math, reduce)
    out = _run(lambda x: flow.concat([fn(x), fn(x, axis=[0, 1, 2]), fn(x * 2)], axis=0))
    whole = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max,
             "reduce_min": np.min, "reduce_prod": np.prod, "reduce_variance": np.var,
             "reduce_std": np.std, "reduce_any": np.any, "reduce_all": np.all,
             "reduce_logsumexp": lambda v: np.log(np.exp(v).sum()),
             "reduce_euclidean_norm": lambda v: np.sqrt((v ** 2).sum())}[reduce]
    assert out.shape == (3,)
    np.testing.assert_allclose(out, [whole(X), whole(X), whole(X * 2)], rtol=1e-5)
    assert _run(lambda x: fn(x, axis=[0, 1, 2], keepdims=True)).shape == (1, 1, 1)
    assert _run(lambda x: fn(x, axis=[1])).shape == (2, 4)


def test_other_ops_without_an_axis_left_give_one_axis():
    def body(x):
        v = flow.reshape(x, [24])
        parts = [flow.cast(flow.math.argmax(v), flow.float),
                 flow.reshape(flow.squeeze(flow.math.reduce_sum(x, keepdims=True)), [1]),
                 flow.cast(flow.math.reduced_shape_elem_cnt(x), flow.float),
                 flow.cast(flow.elem_cnt(x), flow.float), flow.constant(7.0)]
        assert all(p.shape == (1,) for p in parts)
        return flow.concat(parts, axis=0)
    np.testing.assert_allclose(_run(body), [23, X.sum(), 24, 24, 7], rtol=1e-6)


def test_a_full_reduction_loss_trains_as_before():
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_mean(flow.math.square(x * w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    loss = train(x)
    assert loss.shape == (1,)
    np.testing.assert_allclose(loss[0], np.mean(x ** 2), rtol=1e-6)
    w = flow.get_all_variables()["w"].numpy()
    np.testing.assert_allclose(w, 1 - 0.1 * (2 * x ** 2).sum(0) / x.size, rtol=1e-5)


# -- host values and graph values --------------------------------------------------------

def test_crop_mirror_normalize_takes_a_uint8_batch_computed_in_the_graph():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, (3, 6, 7, 3)).astype(np.float32)
    flags = np.array([1, 0, 1], np.int8)
    mean, std = np.float32([10, 20, 30]), np.float32([2, 4, 8])

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((3, 6, 7, 3)),
            m: tp.Numpy.Placeholder((3,), dtype=flow.int8)) -> Tuple[tp.Numpy, tp.Numpy]:
        batch = flow.cast(a, flow.uint8)
        nchw = flow.image.CropMirrorNormalize(batch, m, crop_h=4, crop_w=5, crop_pos_y=0.3,
                                              crop_pos_x=0.8, mean=list(mean), std=list(std))
        nhwc = flow.image.CropMirrorNormalize(batch, output_layout="NHWC")
        return nchw, nhwc

    nchw, nhwc = job(x, flags)
    ref = np.stack([image_io.crop_mirror_normalize(x[i].astype(np.uint8), 4, 5, 0.3, 0.8,
                                                   flags[i], mean, 1 / std, True)
                    for i in range(3)])
    np.testing.assert_allclose(nchw, ref, rtol=1e-6)
    np.testing.assert_array_equal(nhwc, x)


def test_a_record_blob_fed_to_a_graph_op_says_how_to_convert_it(tmp_path):
    ofrecord.write_dataset(str(tmp_path), [{"x": np.float32([1, 2])}] * 2,
                           part_name_suffix_length=-1)

    @flow.global_function()
    def job() -> tp.Numpy:
        records = flow.data.ofrecord_reader(str(tmp_path), batch_size=2)
        return flow.math.relu(records)

    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}.*tensor_buffer_to_tensor"):
        job()
