"""Legal OneFlow calls that real legacy programs make, one class per section, pinned to
OneFlow's documented behaviour: blob truthiness and protocols, distribution hints and
properties, None meaning a default, 0-d results fed where OneFlow 0.4 had (1,), host values
feeding graph ops (checkpoint folders without markers: test_checkpoint.py; the image
reader's labels: test_data_legacy.py), session calls before any job (a reader's (N, 1)
labels for the face-recognition ops: test_ops_legacy.py; every kind of the old API's
learning_rate_decay: test_optimizers.py), a job body's scope being its own, not its
caller's, and eager mode's switch (job functions run lazily)."""
import argparse
import json
import os
import warnings
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import ConcreteBlobError, JobArgumentError, TraceError, UnsupportedAPIError
from onnxjob.graph.tracer import current_builder
from onnxjob.io import images as image_io
from onnxjob.io import ofrecord
from ofrecord_datasets import load_digits, write_digits

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


def test_parallel_size_without_a_placement_is_the_configured_device_count():
    """OneFlow's default placement names flow.config.gpu_device_num's devices: a placeholder
    of a program configured for 4 GPUs reports 4, as a blob placed on "0:0-3" does."""
    import warnings
    seen = {}

    def body(x):
        seen["size"] = x.parallel_size
        with flow.scope.placement("gpu", "0:0-3"):
            seen["placed"] = flow.identity(x).parallel_size
        seen["scope"] = flow.current_scope().device_parallel_desc_symbol.parallel_num
        return x

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # gpu_device_num(4) on one device says so
        flow.config.gpu_device_num(4)
    _run(body)
    assert seen == {"size": 4, "placed": 4, "scope": 4}


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


@pytest.mark.parametrize("loss", ["sparse_softmax_cross_entropy_with_logits",
                                  "sparse_cross_entropy"])
def test_a_label_squeezed_to_0d_is_a_batch_of_one_s_label(loss):
    """OneFlow <= 0.4's squeeze of a (1,) label left (1,) (its squeeze shape rule), so a
    program reading one example at a time squeezes its labels and feeds them to a loss;
    onnxjob's squeeze gives 0.5's 0-d blob, which the losses take as that (1,) label."""
    flow.clear_default_session()
    fn = getattr(flow.nn, loss)
    logits = np.array([[0.5, -1.0, 2.0, 0.0]], np.float32)
    if loss == "sparse_cross_entropy":
        logits = np.exp(logits) / np.exp(logits).sum()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((1, 4)),
            y: tp.Numpy.Placeholder((1, 1), dtype=flow.int32)) -> Tuple[tp.Numpy, tp.Numpy]:
        squeezed = flow.squeeze(flow.reshape(y, [-1]))
        return fn(labels=squeezed, logits=x) if "softmax" in loss else \
            fn(labels=squeezed, prediction=x), fn(flow.reshape(y, [-1]), x)

    squeezed, vector = job(logits, np.array([[2]], np.int32))
    assert squeezed.shape == (1,)
    np.testing.assert_array_equal(squeezed, vector)


def test_in_top_k_takes_a_squeezed_target_of_a_batch_of_one():
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((1, 4)),
            y: tp.Numpy.Placeholder((1,), dtype=flow.int32)) -> tp.Numpy:
        return flow.math.in_top_k(flow.squeeze(y), x, 1)

    x = np.array([[0, 1, 3, 2]], np.float32)
    assert job(x, np.array([2], np.int32)).tolist() == [1]
    assert job(x, np.array([3], np.int32)).tolist() == [0]


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


def _reductions_job():
    """Jobs returning a full reduction, an argmax of a vector and a vector, in each way a
    result reaches the host (annotated, unannotated LocalBlob, watched, one tp.Numpy)."""
    flow.clear_default_session()
    watched = {}

    @flow.global_function()
    def annotated(x: tp.Numpy.Placeholder((5,))) -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        total = flow.math.reduce_sum(x)
        flow.watch(total, lambda v: watched.setdefault("numpy", v))
        flow.watch(total, lambda v: watched.setdefault("local", v.numpy()))
        return total, flow.math.argmax(x), x

    @flow.global_function()
    def unannotated(x: tp.Numpy.Placeholder((5,))):
        return flow.math.reduce_max(x)

    @flow.global_function()
    def single(x: tp.Numpy.Placeholder((5,))) -> tp.Numpy:
        return flow.math.reduce_mean(x)

    return annotated, unannotated, single, watched


def test_a_04_program_indexes_a_returned_0d_result_as_its_one_element_vector():
    annotated, unannotated, single, watched = _reductions_job()
    x = np.array([3, -1, 7, 2, 0.5], np.float32)
    for _ in range(3):                   # the first call and the fast path of later ones
        assert single(x)[0] == pytest.approx(2.3) and single(x).shape == ()
        total, index, vector = annotated(x)
        loss = total[0]                  # OneFlow <= 0.4 returned shape (1,)
        assert isinstance(loss, np.float32) and loss == pytest.approx(11.5)
        assert total[-1] == loss and index[0] == 2 and index[-1] == 2
        np.testing.assert_array_equal(total[:1], [11.5])
        assert total[0:1].shape == (1,) and total[(0,)] == loss
        assert len(total) == 1 and list(total) == [loss] and [i for i in index] == [2]
        # ... and OneFlow 0.5's 0-d reads are unchanged
        assert total.shape == () and total.ndim == 0 and float(total) == 11.5
        assert f"{total:.2f}" == "11.50" and total[()] == loss and total.item() == 11.5
        assert total + 1 == 12.5 and repr(total) == repr(np.array(11.5, np.float32))
        assert vector[0] == 3 and len(vector) == 5 and isinstance(vector, np.ndarray)
    with pytest.raises(IndexError):
        total[1]                         # as the (1,) vector refuses it
    assert watched["numpy"][0] == watched["local"][0] == pytest.approx(11.5)
    blob = unannotated(x).get()
    assert blob[0] == 7 and blob.numpy()[0] == 7 and len(blob) == 1
    assert f"{blob.numpy():.1f}" == "7.0"


def test_what_numpy_computes_from_a_0d_result_is_numpy_1_s_value():
    """NumPy's own value, promoted as NumPy 1.x (OneFlow's) promoted 0-d operands: a
    Python number counts as a 64-bit value (NumPy 2 keeps float32 for `* 2`, and an
    accumulated `total += loss` would be a float32 json refuses)."""
    annotated, _, _, _ = _reductions_job()
    total, _, vector = annotated(np.array([3, -1, 7, 2, 0.5], np.float32))
    plain = np.array(11.5, np.float32)
    for compute, numpy_1 in ((lambda v: v * 2, np.float64), (lambda v: v + 1, np.float64),
                             (lambda v: 0.0 + v, np.float64), (lambda v: v / 3, np.float64),
                             (lambda v: v.mean(), np.float32), (np.sqrt, np.float32),
                             (lambda v: v == 11.5, np.bool_), (lambda v: -v, np.float32),
                             (lambda v: v + np.float32(1), np.float32)):
        value = compute(total)
        expected = compute(plain.astype(np.float64) if numpy_1 is np.float64 else plain)
        assert type(value) is numpy_1 and value == expected, (value, expected)
    accumulated = 0.0
    accumulated += total
    assert json.dumps({"loss": accumulated / 2}) == '{"loss": 5.75}'
    assert type(total + vector) is np.ndarray and (total + vector).shape == (5,)
    assert (total + vector).dtype == np.float32      # (an array keeps its dtype in 1.x too)
    # pickled as plain arrays: loadable without onnxjob
    import pickle
    for result in (total, vector, vector[:1]):
        assert type(pickle.loads(pickle.dumps(result))) is np.ndarray


def test_callbacks_and_async_get_read_a_0d_result_as_its_one_element_vector():
    flow.clear_default_session()
    seen = []

    @flow.global_function()
    def called_back(x: tp.Numpy.Placeholder((5,))) -> tp.Callback[tp.Numpy]:
        return flow.math.reduce_sum(x)

    @flow.global_function()
    def unannotated(x: tp.Numpy.Placeholder((5,))):
        return {"loss": flow.math.reduce_max(x)}

    x = np.array([3, -1, 7, 2, 0.5], np.float32)
    called_back(x)(lambda v: seen.append(v[0]))
    # a Re-ID training loop: losses.update(loss.numpy_list()[0][0], batch_size)
    unannotated(x).async_get(lambda d: seen.append(d["loss"].numpy_list()[0][0]))
    flow.sync_default_session()
    assert seen == [pytest.approx(11.5), 7]


def test_fetched_blobs_carry_oneflows_local_blob_attributes():
    flow.clear_default_session()

    @flow.global_function()
    def job(a: tp.Numpy.Placeholder((2, 3))):
        return a * 2

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    blob = job(x).get()
    # Re-ID's eval reads feature.ndarray_list_[0] inside a bare try/except whose fallback
    # silently takes other rows: the attribute must be there
    np.testing.assert_array_equal(blob.ndarray_list_[0], x * 2)     # LocalMirroredTensor's
    assert len(blob.ndarray_list_) == 1
    np.testing.assert_array_equal(blob.ndarray_, x * 2)             # LocalBlob's
    assert blob.is_dynamic_ is False


def test_a_0d_result_feeds_a_one_element_placeholder_as_oneflow_04s_vector_did():
    flow.clear_default_session()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)

    @flow.global_function()
    def total(a: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.math.reduce_sum(a)

    @flow.global_function()
    def scale(a: tp.Numpy.Placeholder((2, 3)), s: tp.Numpy.Placeholder((1,))) -> tp.Numpy:
        return a * s

    @flow.global_function()
    def scale_list(s: tp.ListNumpy.Placeholder((4,))) -> tp.ListNumpy:
        return s * 2

    @flow.global_function()
    def pair(s: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return s

    t = total(x)
    np.testing.assert_allclose(scale(x, t), x * 15)
    np.testing.assert_allclose(scale(x, np.array(2, np.float32)), x * 2)
    out, = scale_list([t])
    np.testing.assert_allclose(out, [30])
    with pytest.raises(JobArgumentError,
                       match=r"argument 's' has shape \(\), expected exactly \(2,\)"):
        pair(t)


# -- OneFlow's internal modules that programs copy code from -----------------------------

@pytest.fixture
def oneflow_alias():
    """`import oneflow...` resolving to onnxjob in this process, removed afterwards."""
    import importlib
    from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias
    install_oneflow_alias()
    try:
        yield importlib.import_module
    finally:
        uninstall_oneflow_alias()


@pytest.mark.parametrize("framework", ["oneflow.python.framework",
                                       "oneflow.compatible.single_client.framework"])
@pytest.mark.parametrize("extension", ["oneflow_api", "oneflow._oneflow_internal"])
def test_get_variables_for_current_job_splits_the_optimizers(oneflow_alias, framework,
                                                               extension):
    session_ctx = oneflow_alias(f"{framework}.session_context")
    c_api_util = oneflow_alias(f"{framework}.c_api_util")
    oneflow_api = oneflow_alias(extension)
    flow.clear_default_session()
    seen = {}

    def variables_for_current_job():     # OneFlow's optimizer.GetVariablesForCurrentJob
        sess = session_ctx.GetDefaultSession()
        job_name = oneflow_api.JobBuildAndInferCtx_GetCurrentJobName()
        assert c_api_util.JobBuildAndInferCtx_GetCurrentJobName() == job_name
        seen["job"] = job_name
        return list(sess.job_name2var_name2var_blob_[job_name].keys())

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        scale = flow.get_variable("scale", (1,), initializer=flow.ones_initializer())
        loss = flow.math.reduce_sum(x * w * scale)
        rest = [v for v in variables_for_current_job() if v != "scale"]
        sgd = flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                                 variables=rest)
        sgd_scale = flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                                       variables=["scale"])
        flow.optimizer.CombinedOptimizer([sgd, sgd_scale]).minimize(loss)
        return loss

    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    train(x)
    assert seen["job"] == "train"
    variables = flow.get_all_variables()
    np.testing.assert_allclose(variables["w"].numpy(), 1 - 0.1 * x.sum(0))
    np.testing.assert_allclose(variables["scale"].numpy(), [1 - 0.01 * x.sum()])
    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}:.*inside a job function"):
        session_ctx.GetDefaultSession().job_name2var_name2var_blob_  # noqa: B018
    with pytest.raises(TraceError, match=f"{THIS_FILE}:.*only be used inside a job"):
        oneflow_api.JobBuildAndInferCtx_GetCurrentJobName()


def test_op_code_copied_from_oneflow_reads_its_blob_classes_and_names(oneflow_alias):
    remote_blob_util = oneflow_alias("oneflow.python.framework.remote_blob")
    id_util = oneflow_alias("oneflow.compatible.single_client.framework.id_util")
    distribute_util = oneflow_alias("oneflow.python.framework.distribute")
    internal = oneflow_alias("oneflow._oneflow_internal")

    def scaled(x: internal.BlobDesc, name: str = None) -> remote_blob_util.BlobDef:
        name = name or id_util.UniqueStr("Scaled_")
        assert isinstance(x, (remote_blob_util.ConsistentBlob, internal.LazyMirroredBlob))
        return flow.math.multiply(x, 2.0, name=name)

    names = {id_util.UniqueStr("Scaled_") for _ in range(3)} | {
        internal.UniqueStr("Scaled_") for _ in range(3)}    # (oneflow_convert's handlers)
    assert len(names) == 6 and all(n.startswith("Scaled_") for n in names)
    assert distribute_util.split(0).axis == 0
    np.testing.assert_allclose(_run(lambda x: scaled(scaled(x))), 4 * X)


def test_checkpoint_tools_write_meta_files_with_oneflow_s_variable_meta_info(oneflow_alias,
                                                                            tmp_path):
    """A converter writes `<name>/out` and a `meta` text proto with VariableMetaInfo (the
    MXNet-to-OneFlow tool of OneFlow-Benchmark); flow.checkpoint.get reads it, and reading
    a meta of onnxjob's back gives its shape and DataType."""
    from google.protobuf import text_format
    meta_pb = oneflow_alias("oneflow.core.framework.variable_meta_info_pb2")
    internal = oneflow_alias("oneflow._oneflow_internal")
    value = np.arange(6, dtype=np.float32).reshape(2, 3)
    (tmp_path / "w").mkdir()
    value.tofile(tmp_path / "w" / "out")
    info = meta_pb.VariableMetaInfo()
    info.shape.dim[:] = value.shape
    info.data_type = internal.deprecated.GetProtoDtype4OfDtype(flow.float32)
    (tmp_path / "w" / "meta").write_bytes(text_format.MessageToBytes(info))
    np.testing.assert_array_equal(flow.checkpoint.get(str(tmp_path))["w"].numpy(), value)
    flow.checkpoint.save(str(tmp_path / "again"), {"v": value.astype(np.float64)})
    read = text_format.Parse((tmp_path / "again" / "v" / "meta").read_text(),
                             meta_pb.VariableMetaInfo())
    assert list(read.shape.dim) == [2, 3] and read.data_type == meta_pb.kDouble == 3


def test_oneflow_s_version_is_the_api_release_onnxjob_reproduces(oneflow_alias):
    """OneFlow's documentation samples branch on `flow.__version__ < "0.3.0"` (the old
    CheckPoint API); onnxjob's own version number took them there."""
    assert oneflow_alias("oneflow").__version__ == "0.5.0"
    assert flow.__version__ != "0.5.0"      # (import onnxjob: onnxjob's own)


def test_model_code_s_other_internal_imports(oneflow_alias):
    """Imports at the top of real model files: YOLOv3's ops (logical_blob_id_pb2), Mask
    R-CNN's test helpers (local_blob.LocalBlob, what .get() returns), OneFlow 0.2/0.3's
    documentation samples (python_gen.compatibility.with_cuda)."""
    lbi = oneflow_alias("oneflow.core.register.logical_blob_id_pb2")
    blob_id = lbi.LogicalBlobId(op_name="conv", blob_name="out")
    assert lbi.LogicalBlobId.FromString(blob_id.SerializeToString()) == blob_id
    local_blob = oneflow_alias("oneflow.python.framework.local_blob")

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))):
        return flow.math.relu(x)

    out = job(np.array([-1.0, 2.0], np.float32)).get()
    assert isinstance(out, local_blob.LocalBlob) and out.numpy().tolist() == [0.0, 2.0]
    compatibility = oneflow_alias("oneflow.python_gen.compatibility")
    assert compatibility.with_cuda is flow.sysconfig.with_cuda()


def test_oneflow_0_4_s_export_decorators_return_what_they_tag(oneflow_alias):
    """`from oneflow.python.oneflow_export import oneflow_export` (oneflow_convert's older
    flow2onnx and onnx2flow): the decorators only tag (OneFlow's build reads the tags)."""
    export = oneflow_alias("oneflow.python.oneflow_export")

    @export.oneflow_export("my_scaled")
    @export.stable_api
    def scaled(x):
        return flow.math.multiply(x, 2.0)

    assert scaled._ONEFLOW_API == ["my_scaled"]
    assert export.experimental_api(scaled) is export.oneflow_deprecate("old")(scaled) is scaled
    np.testing.assert_allclose(_run(scaled), 2 * X)


@pytest.mark.parametrize("module, name", [
    ("oneflow.python.framework.session_context", "TryCloseDefaultSession"),
    ("oneflow_api", "GetDefaultSessionId"),
    ("oneflow.python.framework.remote_blob", "EagerLogicalBlob"),
])
def test_internal_names_onnxjob_lacks_raise_naming_the_line(oneflow_alias, module, name):
    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}:.*{module}.{name} is not"):
        getattr(oneflow_alias(module), name)
    session = oneflow_alias("oneflow.python.framework.session_context").GetDefaultSession()
    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}:.*session.LaunchJob"):
        session.LaunchJob  # noqa: B018
    with pytest.raises(ModuleNotFoundError, match="oneflow.python.framework.hob"):
        oneflow_alias("oneflow.python.framework.hob")


# -- function_config's nested option namespaces -----------------------------------------

def test_tensorrt_options_turn_tensorrt_on_and_say_what_int8_does(monkeypatch):
    from onnxjob.frontend import config as config_module
    from onnxjob.runtime import backend, session_cache
    monkeypatch.setattr(session_cache, "cache_dir", lambda: None)
    monkeypatch.setattr(config_module, "_warned_flags", set())
    fp16 = flow.function_config()
    fp16.tensorrt.use_fp16()                       # OneFlow: also use_tensorrt(True)
    assert fp16.function_desc.use_tensorrt is True
    assert backend.tensorrt_provider_options(fp16) == {"trt_fp16_enable": "1"}
    int8 = flow.function_config()
    with pytest.raises(AssertionError, match="tensorrt.use_int8"):
        int8.tensorrt.int8_calibration("./int8_calibration")   # OneFlow asserts it too
    with pytest.warns(UserWarning, match="calibration table") as caught:
        int8.tensorrt.use_int8()
        int8.tensorrt.use_int8()                   # said once
    assert len(caught) == 1 and caught[0].filename == __file__
    int8.tensorrt.int8_calibration("./int8_calibration")
    assert int8.function_desc.use_tensorrt is True
    assert backend.tensorrt_provider_options(int8) == {}       # no int8 option
    with pytest.raises(UnsupportedAPIError, match="tensorrt.use_int9"):
        int8.tensorrt.use_int9()

    flow.clear_default_session()

    @flow.global_function(type="predict", function_config=int8)
    def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.math.tanh(x)

    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    with pytest.warns(UserWarning, match="does nothing") as caught:
        for _ in range(10):                    # an online int8 program's calibration loop
            flow.tensorrt.cache_int8_calibration()
    assert len(caught) == 1 and caught[0].filename == __file__
    np.testing.assert_allclose(predict(x), np.tanh(x), rtol=1e-6)


def test_write_int8_calibration_writes_nothing_and_says_so(tmp_path, monkeypatch):
    from onnxjob.frontend import config as config_module
    monkeypatch.setattr(config_module, "_warned_flags", set())
    with pytest.warns(UserWarning, match="writes nothing") as caught:
        flow.tensorrt.write_int8_calibration(str(tmp_path / "int8_calibration"))
    assert caught[0].filename == __file__ and not os.listdir(tmp_path)


def test_static_memory_policy_white_list_reads_back_as_oneflows():
    config = flow.function_config()
    policies = config.static_mem_alloc_policy_white_list
    assert config.static_mem_alloc_algo_white_list.show() == [
        "use_mem_size_first_algo", "use_mutual_exclusion_first_algo", "use_time_line_algo"]
    assert policies.has(policies.policy_mem_size_first())
    assert not policies.has(policies.policy_time_line())
    policies.add(policies.policy_time_line())
    policies.remove(policies.policy_mutual_exclusion_first())
    assert policies.has("use_time_line_algo")
    assert not policies.has("use_mutual_exclusion_first_algo")
    clone = config.clone()
    clone.static_mem_alloc_policy_white_list.remove("use_time_line_algo")
    assert policies.has("use_time_line_algo")  # a clone's list is its own
    with pytest.raises(ValueError, match="use_time_line_algo"):
        policies.add("use_fastest_algo")


# -- OneFlow <= 0.3's flow.onnx.export ----------------------------------------------------

def _onnx_run(path_or_proto, x):
    import onnxruntime as ort
    model = path_or_proto if isinstance(path_or_proto, str) else \
        path_or_proto.SerializeToString()
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_onnx_export_writes_the_job_with_the_saved_weights(tmp_path):
    import onnx
    flow.clear_default_session()

    @flow.global_function(type="predict")
    def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3, 4), initializer=flow.random_normal_initializer())
        return flow.math.tanh(flow.matmul(x, w))

    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    saved_w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    flow.load_variables({"w": saved_w})
    flow.checkpoint.save(str(tmp_path / "model"))
    flow.load_variables({"w": np.zeros((3, 4), np.float32)})   # not what is exported
    want = np.tanh(x @ saved_w)
    path = str(tmp_path / "model.onnx")
    assert flow.onnx.export(predict, str(tmp_path / "model"), path) is None      # OneFlow 0.3
    np.testing.assert_allclose(_onnx_run(path, x), want, rtol=1e-6)
    np.testing.assert_allclose(predict(x), np.zeros((2, 4)))   # the session keeps its values
    proto = flow.onnx.export(predict, str(tmp_path / "model"), False)  # earlier: a ModelProto
    np.testing.assert_allclose(_onnx_run(proto, x), want, rtol=1e-6)
    converted = str(tmp_path / "opset18.onnx")
    flow.onnx.export(predict, str(tmp_path / "model"), converted, opset=18, external_data=True)
    assert [o.version for o in onnx.load(converted).opset_import if o.domain == ""] == [18]
    assert os.path.isfile(converted + ".data")                # the weights beside the file
    np.testing.assert_allclose(_onnx_run(converted, x), want, rtol=1e-6)
    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}:.*shape_override"):
        flow.onnx.export(predict, str(tmp_path / "model"), path, shape_override={"x": [1, 3]})


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


# -- session calls before any job ------------------------------------------------------------

def test_session_calls_before_any_job_start_an_empty_session_as_oneflow(tmp_path):
    # OneFlow's checkpoint functions and CheckPoint.init start the default session even with
    # no job defined (a validator that calls init() first); it has no variables, and a job
    # defined afterwards is refused as OneFlow's AddJob refuses it
    flow.clear_default_session()
    assert flow.get_all_variables() == {}
    flow.train.CheckPoint().init()
    flow.checkpoint.save(str(tmp_path / "empty"))
    assert os.listdir(tmp_path / "empty") == ["snapshot_done"]
    flow.load_variables(flow.checkpoint.get(str(tmp_path / "empty")))
    with pytest.raises(NotImplementedError, match="clear_default_session"):
        @flow.global_function()
        def job(a: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return a + 1
    flow.clear_default_session()
    np.testing.assert_allclose(_run(lambda a: a + 1), X + 1)


# -- refusals name the user's line ------------------------------------------------------------

def test_calls_onnxjob_cannot_run_raise_unsupported_api_error_naming_the_line():
    # OneFlow's op-list serving: UnsupportedAPIError with this file's line
    with pytest.raises(UnsupportedAPIError, match=f"{THIS_FILE}:\\d+: .*InferenceSession"):
        flow.serving.InferenceSession().open("job")


def test_generators_hold_the_process_seed_as_oneflows_default_generator(monkeypatch):
    """flow.default_generator().manual_seed(s) is flow.manual_seed(s): the same initial
    variables; initial_seed()/seed() report and set the seed in force; flow.Generator()
    makes its own generator, whose seed no lazy op reads."""
    from onnxjob.frontend.config import process_config
    monkeypatch.setattr(process_config, "random_seed", None)

    def initial_weights(seed_call):
        flow.clear_default_session()
        seed_call()

        @flow.global_function()
        def predict(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
            return flow.layers.dense(x, 4, name="generated",
                                     kernel_initializer=flow.random_normal_initializer())
        predict(np.ones((2, 3), np.float32))
        return flow.get_all_variables()["generated-weight"].numpy()

    by_generator = initial_weights(lambda: flow.default_generator().manual_seed(7))
    assert flow.default_generator("cuda:0").initial_seed() == 7
    assert np.array_equal(initial_weights(lambda: flow.manual_seed(7)), by_generator)
    assert not np.array_equal(initial_weights(lambda: flow.manual_seed(8)), by_generator)
    fresh = flow.default_generator().seed()
    assert flow.default_generator().initial_seed() == fresh == process_config.random_seed
    own = flow.Generator("cpu").manual_seed(3)
    assert own.initial_seed() == 3 and process_config.random_seed == fresh
    with pytest.raises(ValueError, match="device"):
        flow.Generator("tpu")
    flow.clear_default_session()


def test_delete_worker_of_multi_process_removes_the_run_folder_as_oneflow(tmp_path, capsys,
                                                                         monkeypatch):
    run_dir = tmp_path / "run"
    (run_dir / "log").mkdir(parents=True)
    monkeypatch.setenv("ONEFLOW_WORKER_KEEP_LOG", "1")
    flow.deprecated.delete_worker_of_multi_process(str(run_dir))
    assert run_dir.exists() and "worker log kept" in capsys.readouterr().out
    monkeypatch.delenv("ONEFLOW_WORKER_KEEP_LOG")
    flow.deprecated.delete_worker_of_multi_process(str(run_dir))
    assert not run_dir.exists() and "temp run dir removed" in capsys.readouterr().out
    flow.deprecated.delete_worker_of_multi_process(str(run_dir))
    assert "No such file" in capsys.readouterr().err
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
        down = _hard_mining_numpy(x.astype(np.float64), step, labels, 0.3)[0]
        numeric[k] = (up - down) / (2 * eps)
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


# -- a job body's scope is its own, not its caller's ---------------------------------------
# OneFlow compiles each job from MakeInitialScope(job config): the name space, placement and
# scope attributes open where the job is first called do not apply inside it, and the body
# sees the config's logical view (compiler.py InterpretScope).

def _var_job(config=None):
    flow.clear_default_session()

    @flow.global_function("predict", config or flow.FunctionConfig())
    def job(x: tp.Numpy.Placeholder((2, 3))) -> Tuple[tp.Numpy, tp.Numpy]:
        with flow.scope.namespace("net"):
            w = flow.get_variable("w", (3, 2), initializer=flow.ones_initializer())
        view = flow.constant(float(flow.scope.mirrored_view_enabled()), shape=(1,))
        return flow.matmul(x, w), view
    return job


def test_a_job_first_called_inside_a_caller_namespace_names_variables_as_anywhere():
    job = _var_job()
    with flow.scope.namespace("caller"), flow.scope.placement("cpu", "0:0"):
        out, view = job(np.ones((2, 3), np.float32))
        assert flow.scope.namespace_prefix() == "caller-"   # the caller's block is intact
    np.testing.assert_allclose(out, np.full((2, 2), 3.0))
    assert sorted(flow.get_all_variables()) == ["net-w"]
    assert view[0] == 0.0


def test_a_job_first_called_from_a_thread_with_a_namespace_open_names_variables_as_anywhere():
    import threading
    job = _var_job()
    seen = {}

    def worker():
        with flow.scope.namespace("worker"):
            job(np.ones((2, 3), np.float32))
            with flow.scope.namespace("inner"):   # the caller's stack is intact after
                seen["prefix"] = flow.scope.namespace_prefix()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert sorted(flow.get_all_variables()) == ["net-w"]
    assert seen["prefix"] == "worker-inner-"


@pytest.mark.parametrize("caller_view", ["mirrored_view", "consistent_view"])
@pytest.mark.parametrize("config_view", ["mirrored_view", "consistent_view"])
def test_the_body_sees_its_configs_logical_view_whatever_the_caller_has_open(caller_view,
                                                                            config_view):
    config = flow.FunctionConfig()
    config.default_logical_view(getattr(flow.scope, config_view)())
    job = _var_job(config)
    with getattr(flow.scope, caller_view)():
        _, view = job(np.ones((2, 3), np.float32))
        assert flow.scope.mirrored_view_enabled() == (caller_view == "mirrored_view")
    assert view[0] == float(config_view == "mirrored_view")


# -- the op-identifying attributes of a blob ------------------------------------------------

def test_op_name_is_the_ops_name_and_blob_name_the_outputs_as_in_oneflows_lbi():
    # OneFlow's lazy blob: op_name and blob_name are its lbi's two parts, the logical blob
    # name joins them with "/"; a variable's op is the variable itself
    seen = {}

    def body(x):
        with flow.scope.namespace("s1"):
            w = flow.get_variable("w", shape=(4, 5), initializer=flow.ones_initializer())
            fc = flow.matmul(flow.reshape(x, (6, 4)), w, name="fc")
            act = flow.math.relu(fc)
            values, indices = flow.math.top_k(act, k=2), flow.math.argmax(act)
        for key, blob in dict(w=w, fc=fc, act=act, values=values, indices=indices).items():
            seen[key] = (blob.op_name, blob.blob_name, blob.logical_blob_name,
                         (blob.lbi.op_name, blob.lbi.blob_name))
        return act

    _run(body)
    assert seen["w"][0] == "s1-w"
    assert seen["fc"][:2] == ("s1-fc", "out")
    for key, (op_name, blob_name, lbn, lbi) in seen.items():
        assert "/" not in op_name, key
        assert lbi == (op_name, blob_name), key
        if key != "w":
            assert lbn == f"{op_name}/{blob_name}", key


def test_a_blob_s_view_warnings_are_empty_on_one_device():
    """OneFlow's lazy blobs say (as text) when a mirrored blob's shape is read in a consistent
    view or the reverse; one device's views agree: no warning, and the blob is itself."""
    seen = {}

    def body(x):
        seen["warnings"] = (x.get_lazy_shape_log_warning(), x.get_mirror_shape_log_warning())
        seen["identical"] = (x.IdenticalTo(x), x.IdenticalTo(flow.identity(x)))
        return x

    _run(body)
    assert seen == {"warnings": ("", ""), "identical": (True, False)}


def test_op_names_of_a_namespaced_conv_and_gather_are_oneflows():
    seen = {}

    def body(x):
        image = flow.reshape(x, (1, 2, 3, 4))
        with flow.scope.namespace("job1_scope1"):
            kernel = flow.get_variable("conv_weight", shape=(5, 2, 3, 3),
                                       initializer=flow.random_uniform_initializer())
            conv = flow.nn.conv2d(image, kernel, 1, "SAME", "NCHW", name="conv")
            picked = flow.gather(x, flow.constant(1, shape=(2,), dtype=flow.int32), axis=1,
                                 name="pick")
        seen.update(conv=conv.op_name, gather=picked.op_name)
        return conv

    _run(body)
    assert seen == {"conv": "job1_scope1-conv", "gather": "job1_scope1-pick"}


def test_flow_variable_scope_points_at_the_names_released_oneflow_exports():
    with pytest.raises(UnsupportedAPIError, match=rf"{THIS_FILE}:\d+: flow.variable_scope .*"
                                                  r"flow.deprecated.variable_scope"):
        flow.variable_scope("scope")
    assert flow.deprecated.variable_scope is flow.scope.namespace


# -- eager mode: job functions run lazily -------------------------------------------------

@pytest.fixture
def eager_requested(monkeypatch):
    """flow.enable_eager_execution(True) called in this test only (its warning and the
    place it was called are the process's)."""
    from onnxjob.graph import tracer
    monkeypatch.setattr(tracer, "eager_requested_at", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flow.enable_eager_execution(True)
        flow.enable_eager_execution()               # (once per process)
    return caught


def _train_twice(seed):
    """Two SGD steps of a dense layer on a fixed batch: the losses and the weight."""
    flow.clear_default_session()
    flow.config.seed(seed)

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        y = flow.layers.dense(x, 2, name="fc",
                              kernel_initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss

    @flow.global_function()
    def weight() -> tp.Numpy:
        return flow.get_variable("fc-weight", shape=(2, 3))
    batch = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    return [train(batch) for _ in range(2)] + [weight()]


def test_eager_job_functions_run_lazily_with_the_same_results_and_a_warning(eager_requested):
    """OneFlow 0.2-0.4's flow.enable_eager_execution(True) before job functions (MinGPT's
    attention test): accepted, one warning naming its line and what differs, the jobs
    compute what lazy ones do; eager_execution_enabled() stays False (the lazy branch of
    code that tests it)."""
    assert len(eager_requested) == 1 and "as graphs" in str(eager_requested[0].message)
    assert os.path.basename(eager_requested[0].filename) == THIS_FILE
    assert flow.eager_execution_enabled() is False
    eager = _train_twice(seed=5)
    from onnxjob.graph import tracer
    tracer.eager_requested_at = None                     # the same jobs, no eager call
    lazy = _train_twice(seed=5)
    assert eager[0] > eager[1]                           # it trains
    for a, b in zip(eager, lazy):
        np.testing.assert_array_equal(a, b)


def test_a_blobs_value_inside_a_lazy_job_names_the_line_and_eager_mode():
    def body(x):
        y = flow.math.relu(x)
        print(y.numpy())                                 # eager debugging, in a lazy job
        return y
    with pytest.raises(UnsupportedAPIError) as raised:
        _run(body)
    message = str(raised.value)
    assert f"{THIS_FILE}:" in message and "blob.numpy" in message
    assert "flow.enable_eager_execution(True)" in message


def _mlp_steps(read_values, steps=4):
    """SGD steps of a two-layer MLP on a fixed batch; with `read_values` its eager body
    reads the hidden layer's value at each call (as OneFlow's eager mode let a body print
    or branch on it). The losses and the hidden means the body read."""
    flow.clear_default_session()
    flow.config.seed(3)
    seen = []

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((8, 5)),
              labels: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        hidden = flow.layers.dense(x, 6, activation=flow.nn.relu, name="h",
                                   kernel_initializer=flow.random_normal_initializer())
        if read_values:
            seen.append(hidden.numpy().mean(axis=1))
        logits = flow.layers.dense(hidden, 3, name="out",
                                   kernel_initializer=flow.random_normal_initializer())
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                           momentum=0).minimize(loss)
        return loss

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 5)).astype(np.float32)
    labels = rng.integers(0, 3, 8).astype(np.int32)
    return [train(x, labels).mean() for _ in range(steps)], seen, x


def test_an_eager_body_reads_its_blobs_values_at_every_call(eager_requested):
    """OneFlow's eager blobs have numpy(): the body runs at each call and reads the value
    the graph computes there from the call's arguments and the variables before the step.
    The steps train as the same job without the reads."""
    eager, seen, x = _mlp_steps(read_values=True)
    lazy, _, _ = _mlp_steps(read_values=False)
    np.testing.assert_allclose(eager, lazy, rtol=1e-6)
    assert eager[0] > eager[-1]
    assert len(seen) == 4                       # one read per call, none of zeros
    assert not np.allclose(seen[0], seen[1])    # each after the previous step's update
    flow.clear_default_session()
    flow.config.seed(3)

    @flow.global_function()
    def hidden_only(x: tp.Numpy.Placeholder((8, 5))) -> tp.Numpy:
        return flow.math.reduce_mean(
            flow.layers.dense(x, 6, activation=flow.nn.relu, name="h",
                              kernel_initializer=flow.random_normal_initializer()), axis=1)
    np.testing.assert_allclose(seen[0], hidden_only(x), rtol=1e-6)   # the first call's


def test_an_eager_body_branches_on_a_value_and_each_path_runs(eager_requested):
    """Python control flow on a value: each call takes the path its value picks (a graph
    per path, compiled once); numpy_list() gives the value in a list."""
    flow.clear_default_session()
    paths = []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        total = flow.math.reduce_sum(x)
        if total.numpy_list()[0] > 0:
            paths.append("double")
            return x * 2
        paths.append("negate")
        return -x

    up, down = np.ones(3, np.float32), -np.ones(3, np.float32)
    results = [job(v) for v in (up, down, up, down)]
    assert paths == ["double", "negate", "double", "negate"]
    for got, v in zip(results, (up, down, up, down)):
        np.testing.assert_array_equal(got, v * 2 if v.sum() > 0 else -v)
    from onnxjob.runtime.session import default_session
    assert len(default_session().eager_cut_sessions) == 1    # one cut graph for all calls


def test_an_eager_body_read_after_a_checkpoint_load_reads_the_loaded_variables(
        eager_requested, tmp_path, capsys):
    """A session started by CheckPoint before any call declares every variable of a
    body that reads values (traced once on zeros, its prints held back), so a load
    reaches them all; the calls then read and compute with the loaded values."""
    flow.clear_default_session()
    printed = []

    def define():
        @flow.global_function()
        def job(x: tp.Numpy.Placeholder((2, 4))) -> tp.Numpy:
            a = flow.layers.dense(x, 3, name="a",
                                  kernel_initializer=flow.random_normal_initializer())
            printed.append(a.numpy().copy())
            print("hidden", a.numpy())
            return flow.layers.dense(a, 2, name="b",
                                     kernel_initializer=flow.random_normal_initializer())
        return job

    job = define()
    checkpoint = flow.train.CheckPoint()
    checkpoint.init()
    x = np.ones((2, 4), np.float32)
    expected = job(x)
    checkpoint.save(str(tmp_path / "model"))
    first = printed[-1]
    assert first.any()
    capsys.readouterr()

    flow.clear_default_session()
    printed.clear()
    job = define()
    checkpoint = flow.train.CheckPoint()
    checkpoint.load(str(tmp_path / "model"))    # starts the session: the zeros trace
    assert printed and not printed[0].any()     # (its values were zeros)
    assert "hidden" not in capsys.readouterr().out   # and what it printed is held back
    printed.clear()
    np.testing.assert_allclose(job(x), expected, rtol=1e-6)
    np.testing.assert_allclose(printed[0], first, rtol=1e-6)
    assert capsys.readouterr().out.count("hidden") == 1


def test_an_eager_body_reads_what_host_ops_make_from_its_arguments(eager_requested):
    """OneFlow 0.3's eager tensor-list test: the pieces flow.tensor_list_split makes on
    the host from a tp.ListListNumpy argument are read in the body."""
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    pieces = [np.random.rand(1, 5, 4).astype(np.float32),
              np.random.rand(1, 4, 4).astype(np.float32)]
    read = []

    @flow.global_function(function_config=config)
    def job(parts: tp.ListListNumpy.Placeholder((2, 5, 4))):
        first, second = flow.tensor_list_split(parts)
        read.extend([first.numpy(), second.numpy()])

    job([pieces])
    np.testing.assert_array_equal(read[0], pieces[0].squeeze())
    np.testing.assert_array_equal(read[1], pieces[1].squeeze())


def test_an_eager_value_made_by_a_data_reader_is_refused_naming_the_line(
        eager_requested, tmp_path, mnist_path):
    """Reading a reader's batch in the body would take the reader's next samples: refused
    with the line, where the job returning the blob reads it."""
    digits, labels = load_digits(mnist_path, 8)
    write_digits(tmp_path, digits, labels, "raw")
    flow.clear_default_session()

    @flow.global_function()
    def job() -> tp.Numpy:
        records = flow.data.ofrecord_reader(str(tmp_path), batch_size=4, data_part_num=1,
                                            part_name_suffix_length=5)
        label = flow.data.OFRecordRawDecoder(records, "labels", shape=(), dtype=flow.int32)
        print(label.numpy())
        return label

    with pytest.raises(UnsupportedAPIError) as raised:
        job()
    assert f"{THIS_FILE}:" in str(raised.value) and "data reader" in str(raised.value)


_SCALE = 1.0        # a global an eager body reads (the test below changes it)


def _scaled_job(traced):
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        traced.append(_SCALE)
        return x * _SCALE
    return job


def test_an_eager_body_sees_the_python_values_the_program_changes_between_calls(
        eager_requested):
    """OneFlow's eager mode ran the body at each call, so a global the program changes
    (a learning rate, an epoch) is read anew: a call that finds a plain value the body
    reads changed traces it again; calls that find none changed do not."""
    global _SCALE
    flow.clear_default_session()
    traced = []
    job = _scaled_job(traced)
    x = np.ones(2, np.float32)
    _SCALE = 1.0
    first = [job(x), job(x)]
    _SCALE = 3.0
    later = [job(x), job(x)]
    assert traced == [1.0, 3.0]
    np.testing.assert_array_equal(first, [[1, 1], [1, 1]])
    np.testing.assert_array_equal(later, [[3, 3], [3, 3]])


def test_a_lazy_body_keeps_the_python_values_of_its_trace():
    """In lazy mode (OneFlow's default) the body runs once: a later change is not seen."""
    global _SCALE
    flow.clear_default_session()
    traced = []
    job = _scaled_job(traced)
    _SCALE = 1.0
    job(np.ones(2, np.float32))
    _SCALE = 3.0
    try:
        np.testing.assert_array_equal(job(np.ones(2, np.float32)), [1, 1])
    finally:
        _SCALE = 1.0
    assert traced == [1.0]


def _eager_step(batch, traced, scale=1.0):
    """OneFlow's eager MNIST sample's shape: the train job is defined inside the function
    each step calls, so it is defined again at every step while the session runs."""
    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        traced.append(scale)
        y = flow.layers.dense(x, 2, name="fc",
                              kernel_initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_mean(y * y) * scale
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss
    return train(batch)


def test_an_eager_job_defined_at_every_step_is_compiled_once_and_trains(eager_requested):
    """In eager mode a job may be defined while the session runs (OneFlow's
    eager_mlp_mnist.py defines its train job inside main(), after CheckPoint().init()):
    an equal definition is the running job (traced once), and it trains as a job
    defined once does."""
    flow.clear_default_session()
    flow.config.seed(5)
    flow.train.CheckPoint().init()                  # the session runs before any job
    batch = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    traced = []
    eager = [_eager_step(batch, traced) for _ in range(3)]
    assert traced == [1.0]                          # one trace for three definitions
    assert eager[0] > eager[1] > eager[2]
    lazy = _train_twice(seed=5)                     # the same job defined once
    np.testing.assert_array_equal(eager[:2], lazy[:2])


def test_an_eager_redefinition_with_other_values_is_traced_again_and_keeps_the_variables(
        eager_requested):
    """A definition whose closure reads another value is another graph: it is traced
    into the running session and replaces the job of its name; the variables it shares
    keep their trained values (as the eager variables of OneFlow's session)."""
    flow.clear_default_session()
    flow.config.seed(5)
    batch = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    traced = []
    first = _eager_step(batch, traced, scale=1.0)
    second = _eager_step(batch, traced, scale=1.0)
    doubled = _eager_step(batch, traced, scale=2.0)
    assert traced == [1.0, 2.0]
    assert first > second
    # the doubled loss at the weights the two steps left, not at the initial ones
    after_two = _eager_step(batch, [], scale=1.0)   # traced again: scale 1 replaces 2
    assert 0 < doubled < 2 * second
    assert after_two < doubled / 2


def test_a_job_defined_after_the_session_started_is_refused_without_eager_mode():
    """OneFlow's lazy session refuses a job defined after it started."""
    flow.clear_default_session()
    flow.train.CheckPoint().init()
    with pytest.raises(NotImplementedError, match="clear_default_session"):
        @flow.global_function()
        def late(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
            return x


def test_an_eager_body_reads_a_variables_and_a_constants_value(eager_requested):
    """OneFlow's eager variables and constants are eager blobs with numpy(): a body prints
    its weight (the value before the call's step) and a constant."""
    flow.clear_default_session()
    seen = []

    @flow.global_function(type="train")
    def train(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        w = flow.get_variable("w", shape=(3, 1), initializer=flow.constant_initializer(0.5))
        seen.append((w.numpy().ravel().copy(), flow.constant(3.0, shape=(2,)).numpy()))
        loss = flow.math.reduce_sum(flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(loss)
        return loss
    x = np.ones((2, 3), np.float32)
    train(x)
    train(x)
    np.testing.assert_allclose(seen[-2][0], [0.5, 0.5, 0.5])
    np.testing.assert_allclose(seen[-1][0], [0.3, 0.3, 0.3], rtol=1e-6)   # 0.5 - 0.1 * 2
    np.testing.assert_array_equal(seen[-1][1], [3.0, 3.0])


_ARGS = argparse.Namespace(scale=1.0, name="run")   # a program's options, read by a body


def test_an_eager_body_sees_the_options_the_program_changes_between_calls(eager_requested):
    """`args.lr` changed by the training loop (an argparse.Namespace's attribute) is read
    anew, as OneFlow's eager mode ran the body at each call."""
    flow.clear_default_session()
    traced = []

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        traced.append(_ARGS.scale)
        return x * _ARGS.scale
    x = np.ones(2, np.float32)
    try:
        first = [job(x), job(x)]
        _ARGS.scale = 3.0
        later = [job(x), job(x)]
    finally:
        _ARGS.scale = 1.0
    assert traced == [1.0, 3.0]
    np.testing.assert_array_equal(first + later, [[1, 1], [1, 1], [3, 3], [3, 3]])
