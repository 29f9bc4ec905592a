"""Legal OneFlow calls that real legacy programs make, one class per section, pinned to
OneFlow's documented behaviour: blob truthiness and protocols, distribution hints and
properties, None meaning a default, 0-d results fed where OneFlow 0.4 had (1,), host values feeding graph
ops (checkpoint folders without markers: test_checkpoint.py; the image reader's labels:
test_data_legacy.py)."""
import os
import warnings
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import ConcreteBlobError, TraceError, UnsupportedAPIError
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


# -- 0-d results where OneFlow <= 0.4 had (1,) ----------------------------------------------
# OneFlow 0.5's shapes come out (a reduction over every axis, argmax of a vector, element
# counts and shapeless constants are 0-d); the ops OneFlow 0.4 programs feed them to take
# them as the one-element vectors they were there (onnxjob/compat/zero_d_inputs.py)

FULL_REDUCTIONS = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max,
                   "reduce_min": np.min, "reduce_prod": np.prod, "reduce_variance": np.var,
                   "reduce_std": np.std, "reduce_any": np.any, "reduce_all": np.all,
                   "reduce_logsumexp": lambda v: np.log(np.exp(v).sum()),
                   "reduce_euclidean_norm": lambda v: np.sqrt((v ** 2).sum())}


@pytest.mark.parametrize("reduce", sorted(FULL_REDUCTIONS))
def test_full_reductions_are_0d_and_a_04_program_concatenates_them(reduce):
    fn, whole = getattr(flow.math, reduce), FULL_REDUCTIONS[reduce]
    shapes = {}

    def body(x):
        parts = [fn(x), fn(x, axis=[0, 1, 2]), fn(x * 2)]
        shapes["parts"] = [p.shape for p in parts]
        return flow.concat(parts, axis=0)

    out = _run(body)
    assert shapes["parts"] == [(), (), ()]          # OneFlow 0.5: Shape::RemoveOnes
    assert out.shape == (3,)
    np.testing.assert_allclose(out, [whole(X), whole(X), whole(X * 2)], rtol=1e-5)
    assert _run(lambda x: fn(x)).shape == ()
    assert _run(lambda x: fn(x, axis=[0, 1, 2], keepdims=True)).shape == (1, 1, 1)
    assert _run(lambda x: fn(x, axis=[1])).shape == (2, 4)


def test_other_0d_results_concatenate_with_vectors():
    def body(x):
        v = flow.reshape(x, [24])
        parts = [flow.cast(flow.math.argmax(v), flow.float),
                 flow.squeeze(flow.math.reduce_sum(x, keepdims=True)),
                 flow.cast(flow.math.reduced_shape_elem_cnt(x), flow.float),
                 flow.cast(flow.elem_cnt(x), flow.float), flow.constant(7.0)]
        assert all(p.shape == () for p in parts)    # as OneFlow 0.5 gives them
        return flow.concat(parts + [flow.constant(8.0, shape=[2])], axis=-1)
    np.testing.assert_allclose(_run(body), [23, X.sum(), 24, 24, 7, 8, 8], rtol=1e-6)


def _total(x):
    return flow.math.reduce_sum(x * x)              # 0-d here, (1,) in OneFlow <= 0.4


# each: a consumer of a full reduction as OneFlow 0.4 programs call it
CONSUMERS = {
    "concat_with_vector": lambda v: flow.concat([v, flow.constant(1.0, shape=[2])], axis=0),
    "stack_with_vector": lambda v: flow.stack([v, flow.constant(1.0, shape=[1])], axis=0),
    "stack_on_axis_1": lambda v: flow.stack([v, v * 2], axis=1),
    "add_n_with_vector": lambda v: flow.math.add_n([v, flow.constant(1.0, shape=[1])]),
    "slice": lambda v: flow.slice(v, [0], [1]),
    "slice_v2": lambda v: flow.slice_v2(v, [(0, 1, 1)]),
    "slice_update": lambda v: flow.slice_update(flow.constant(5.0, shape=[3]), v, [(1, 2, 1)]),
    "gather": lambda v: flow.gather(v, flow.constant(0, dtype=flow.int32, shape=[2])),
    "gather_nd": lambda v: flow.gather_nd(v, flow.constant(0, dtype=flow.int32, shape=[1, 1])),
    "dim_gather": lambda v: flow.dim_gather(v, 0, flow.constant(0, dtype=flow.int32, shape=[1])),
    "expand_dims_1": lambda v: flow.expand_dims(v, 1),
    "pad": lambda v: flow.pad(v, [[1, 2]], constant_value=3.0),
    "transpose": lambda v: flow.transpose(v, [0]),
    "squeeze_axis_0": lambda v: flow.squeeze(v, axis=[0]),
    "reduce_over_axis_0": lambda v: flow.math.reduce_mean(v, axis=0),
    "reverse": lambda v: flow.reverse(v, axis=0),
}


@pytest.mark.parametrize("use", sorted(CONSUMERS))
def test_ops_take_a_0d_value_as_oneflow_04_took_its_one_element_vector(use):
    consume = CONSUMERS[use]
    as_04 = _run(lambda x: consume(flow.reshape(_total(x), [1])))   # 0.4's (1,) form
    as_05 = _run(lambda x: consume(_total(x)))
    assert as_05.shape == as_04.shape and as_05.dtype == as_04.dtype
    np.testing.assert_array_equal(as_05, as_04)
    total = (X * X).sum() + (1 if use == "add_n_with_vector" else 0)
    assert np.isclose(np.ravel(as_05), total, rtol=1e-6).any()   # the value is used


def test_a_04_variable_of_one_element_takes_a_full_reduction():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder(X.shape)) -> tp.Numpy:
        total = flow.get_variable("total", (1,), initializer=flow.zeros_initializer())
        flow.assign(total, total + _total(x))         # total + 0-d: (1,)
        best = flow.get_variable("best", (1,), initializer=flow.zeros_initializer())
        flow.assign(best, flow.math.reduce_max(x))   # a 0-d value for a (1,) variable
        return total

    job(X)
    np.testing.assert_allclose(job(X), [(X * X).sum()], rtol=1e-6)
    np.testing.assert_allclose(flow.get_all_variables()["best"].numpy(), [X.max()])


def test_the_forms_oneflow_05_takes_keep_their_results():
    def body(x):
        v = _total(x)
        shapes = {"concat_of_one": flow.concat([v]).shape,
                  "stack": flow.stack([v, v]).shape,
                  "add_n": flow.math.add_n([v, v]).shape,
                  "expand_dims_0": flow.expand_dims(v, 0).shape,
                  "slice_nothing": flow.slice_v2(v, []).shape,
                  "reduce_all_axes": flow.math.reduce_sum(v).shape,
                  "squeeze": flow.squeeze(v).shape,
                  "gather_by_0d": flow.gather(flow.reshape(x, [24]), flow.math.argmax(
                      flow.reshape(x, [24]))).shape}
        assert shapes == {"concat_of_one": (), "stack": (2,), "add_n": (),
                          "expand_dims_0": (1,), "slice_nothing": (), "reduce_all_axes": (),
                          "squeeze": (), "gather_by_0d": ()}
        return x
    _run(body)


def test_a_04_triplet_loss_of_concatenated_row_maxima_trains():
    # re-identification code: per-row hardest distances as full reductions, concatenated
    flow.clear_default_session()
    grads = {}

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        w = flow.get_variable("w", (4,), initializer=flow.ones_initializer())
        d = x * w
        rows = [flow.slice_v2(d, [(i, i + 1, 1)]) for i in range(3)]
        hardest = flow.concat([flow.math.reduce_max(r) for r in rows], 0)
        easiest = flow.concat([flow.math.reduce_min(r) for r in rows], 0)
        loss = flow.math.reduce_mean(flow.nn.relu(hardest - easiest + 0.5))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        flow.watch_diff(w, lambda g: grads.setdefault("w", g))
        return loss

    x = np.float32([[1, 5, 2, 0], [3, 1, 4, 2], [0, 2, 6, 1]])
    loss = train(x)
    assert loss.shape == ()
    np.testing.assert_allclose(loss, np.mean(x.max(1) - x.min(1) + 0.5), rtol=1e-6)
    want = np.zeros(4, np.float32)
    for row in x:
        want[row.argmax()] += row.max() / 3
        want[row.argmin()] -= row.min() / 3
    np.testing.assert_allclose(grads["w"], want, rtol=1e-6)


def test_a_returned_full_reduction_loss_is_0d_and_reads_as_a_number():
    flow.clear_default_session()

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_mean(flow.math.square(x * w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    loss = train(x)
    assert isinstance(loss, np.ndarray) and loss.shape == ()
    with warnings.catch_warnings():
        warnings.simplefilter("error")       # NumPy 2 deprecates float() of a (1,) array
        assert float(loss) == pytest.approx(np.mean(x ** 2), rel=1e-6)
        assert f"{loss:.3f}" == f"{np.mean(x ** 2):.3f}"
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


# -- values computed from dynamic blobs ----------------------------------------------------
# OneFlow's triplet losses pick each row's positives with argwhere (`flow.where(mask)`), a
# dynamic blob, and reduce what gather_nd takes to one number; that number has one shape
# whatever the rows picked, so the loss is static: returned as tp.Numpy, minimized with a
# constant seed (OneFlow gives gather_nd's output its first input's static flag)

def _hard_mining_numpy(x, w, labels, margin):
    f = x * w
    d = -f @ f.T
    same = labels[:, None] == labels[None, :]
    hardest = np.array([d[i][same[i]].max() for i in range(len(x))])
    easiest = np.array([d[i][~same[i]].min() for i in range(len(x))])
    return np.maximum(hardest - easiest + margin, 0).mean(), hardest


def test_a_full_reduction_of_argwhere_rows_is_static_and_trains():
    flow.clear_default_session()
    flags, grads = {}, {}
    x = np.float32([[1, 2, 0], [0, 1, 2], [2, 0, 1], [1, 1, 1]]) / 2
    labels = np.float32([0, 0, 1, 1])

    @flow.global_function(type="train")
    def train(a: tp.Numpy.Placeholder((4, 3)),
              pids: tp.Numpy.Placeholder((4,))) -> Tuple[tp.Numpy, tp.Numpy]:
        w = flow.get_variable("w", (3,), initializer=flow.constant_initializer(1.5))
        f = a * w
        dist = flow.math.negative(flow.matmul(f, flow.transpose(f, perm=(1, 0))))
        grid = flow.constant(0.0, shape=(4, 4))
        rows = flow.broadcast_like(flow.reshape(pids, (4, 1)), grid, broadcast_axes=[1])
        same = flow.math.equal(rows, flow.transpose(rows, perm=(1, 0)))
        other = flow.math.not_equal(rows, flow.transpose(rows, perm=(1, 0)))
        hardest, easiest = [], []
        for i in range(4):
            row = flow.slice_v2(dist, [(i, i + 1, 1)])
            picked = flow.gather_nd(row, flow.where(flow.slice_v2(same, [(i, i + 1, 1)])))
            top = flow.math.reduce_max(picked)
            flags.setdefault("picked", picked.is_dynamic)
            flags.setdefault("top", (top.is_dynamic, top.shape))
            hardest.append(flow.expand_dims(top, 0))
            easiest.append(flow.expand_dims(flow.math.reduce_min(
                flow.gather_nd(row, flow.where(flow.slice_v2(other, [(i, i + 1, 1)])))), 0))
        hardest = flow.concat(hardest, 0)
        loss = flow.math.reduce_mean(flow.clip(hardest - flow.concat(easiest, 0) + 0.3,
                                               min_value=0))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(loss)
        flow.watch_diff(w, lambda g: grads.setdefault("w", g))
        return loss, hardest

    loss, hardest = train(x, labels)
    assert flags == {"picked": True, "top": (False, ())}
    want_loss, want_hardest = _hard_mining_numpy(x.astype(np.float64), 1.5, labels, 0.3)
    np.testing.assert_allclose(hardest, want_hardest, rtol=1e-6)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
    eps, numeric = 1e-6, np.zeros(3)
    for k in range(3):
        step = np.full(3, 1.5)
        step[k] += eps
        up = _hard_mining_numpy(x.astype(np.float64), step, labels, 0.3)[0]
        step[k] -= 2 * eps
        numeric[k] = (up - _hard_mining_numpy(x.astype(np.float64), step, labels, 0.3)[0]) / (2 * eps)
    np.testing.assert_allclose(grads["w"], numeric, rtol=1e-4, atol=1e-6)


def test_a_value_whose_rows_vary_stays_dynamic():
    flow.clear_default_session()
    x = np.float32([[3, -1], [-2, 5]])

    @flow.global_function()
    def rows(a: tp.Numpy.Placeholder((2, 2))) -> tp.ListNumpy:
        picked = flow.gather_nd(a, flow.where(a > 0))
        assert flow.math.reduce_sum(picked, axis=[0], keepdims=True).is_dynamic
        return picked

    np.testing.assert_array_equal(rows(x)[0], [3, 5])
    flow.clear_default_session()

    @flow.global_function()
    def as_numpy(a: tp.Numpy.Placeholder((2, 2))) -> tp.Numpy:
        return flow.gather_nd(a, flow.where(a > 0)) * 2

    with pytest.raises(AssertionError, match="only fixed shaped blob"):
        as_numpy(x)


# -- a non-Blob where an op takes a Blob ------------------------------------------------------
# a program's slip (its model called with its settings object, or outside any job, as
# TensorFlow code is): onnxjob's error names the op, the argument and the line; every
# public op is swept in test_public_call_forms.py

class _Settings:
    IMAGE_HEIGHT = 8


def _stem(images):
    return flow.layers.conv2d(images, 4, 3, padding="SAME", name="stem")


def test_a_model_called_outside_a_job_names_its_line():
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: flow.layers.conv2d: 'inputs' "
                                         "is a _Settings, not a Blob: ops run inside a job"):
        _stem(_Settings())
    with pytest.raises(TraceError, match=r"flow.reshape: 'x' is a ndarray, not a Blob"):
        flow.reshape(np.zeros((2, 3), np.float32), (3, 2))


def test_a_non_blob_inside_a_job_names_the_argument():
    with pytest.raises(TraceError, match=rf"{THIS_FILE}:\d+: flow.nn.max_pool2d: 'input' is "
                                         "a list, not a Blob .an op takes the job's"):
        _run(lambda x: flow.nn.max_pool2d([[1.0, 2.0]], 2, 2, "SAME"))
    with pytest.raises(TraceError, match="flow.matmul: 'b' is a _Settings"):
        _run(lambda x: flow.matmul(x, _Settings()))


# -- fetched results -----------------------------------------------------------------------

def test_a_fetched_blob_has_oneflows_data_attributes():
    # OneFlow 0.2-0.4 programs read LocalMirroredTensor's `ndarray_list_` directly
    flow.clear_default_session()

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((2, 3)), n: tp.Numpy.Placeholder((1,), dtype=flow.int32)):
        return a * 2, flow.sync_dynamic_resize(a, n)

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    static, dynamic = job(x, np.int32([1])).get()
    assert isinstance(static.ndarray_list_, list) and len(static.ndarray_list_) == 1
    np.testing.assert_array_equal(static.ndarray_list_[0], x * 2)
    np.testing.assert_array_equal(static.ndarray_, x * 2)
    np.testing.assert_array_equal(dynamic.ndarray_list_[0], x[:1])
    assert (static.is_dynamic_, dynamic.is_dynamic_) == (False, True)
