"""Initializer distributions (spec §5.8) and the layers' default initializers (§5.2, §5.3)."""
import math

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp

RNG = np.random.default_rng(0)
SHAPE = (256, 128)


def sample(init, shape=SHAPE, dtype=np.float32):
    return init.sample(shape, np.dtype(dtype), RNG)


def test_truncated_normal_is_cut_at_two_sigma():
    x = sample(flow.truncated_normal(0.1))
    assert np.abs(x).max() < 0.2
    assert x.std() == pytest.approx(0.1 * 0.8796, rel=0.02)


def test_normal_uniform_constant():
    assert sample(flow.random_normal_initializer(1.0, 2.0)).std() == pytest.approx(2.0, rel=0.02)
    u = sample(flow.random_uniform_initializer(-0.5, 0.25))
    assert u.min() >= -0.5 and u.max() <= 0.25 and u.mean() == pytest.approx(-0.125, abs=0.01)
    assert np.all(sample(flow.constant_initializer(3.5)) == 3.5)
    assert np.all(sample(flow.ones_initializer()) == 1) and np.all(sample(flow.zeros_initializer()) == 0)
    # a variable's initial value excludes maxval (OneFlow's model IO v2, the default since
    # 0.3.2: rng.integers(min, max)); its C++ kernels (decode_random) include it
    uniform_int = flow.random_uniform_initializer(0, 3, dtype=flow.int32)
    ints = uniform_int.sample(SHAPE, np.dtype(np.int32), RNG, model_io=True)
    assert set(np.unique(ints)) == {0, 1, 2}
    assert set(np.unique(sample(uniform_int, dtype=np.int32))) == {0, 1, 2, 3}


def test_constant_initializer_is_made_in_the_variables_dtype():
    """An integer constant given with an integer dtype stays exact (OneFlow's
    ConstantIntInitializerConf); with the default float dtype it is OneFlow's float32
    field's value (2**40 + 1 becomes 2**40, also in an int64 variable; 0.1 a float32 0.1
    in a float64 one); ints fill ints, floats floats, with no cast pass after."""
    big = sample(flow.constant_initializer(2 ** 40 + 1, dtype=flow.int64), shape=(3,),
                 dtype=np.int64)
    assert big.dtype == np.int64 and np.all(big == 2 ** 40 + 1)
    rounded = sample(flow.constant_initializer(2 ** 40 + 1), shape=(3,), dtype=np.int64)
    assert np.all(rounded == 2 ** 40)
    tenth = sample(flow.constant_initializer(0.1), shape=(2,), dtype=np.float64)
    assert np.all(tenth == np.float64(np.float32(0.1)))
    assert np.all(sample(flow.constant_initializer(2.5, dtype=flow.int32), shape=(2,)) == 2.0)
    zeros = sample(flow.zeros_initializer(), dtype=np.float64)
    assert zeros.dtype == np.float64 and zeros.shape == SHAPE and not zeros.any()


def test_variance_scaling_fans_of_a_vector_are_oneflow_s():
    """OneFlow's GenInitialFan on a (n,) variable: fan_in = prod(shape[1:]) = 1, fan_out =
    n; fan_in uniform is U(-sqrt(3), sqrt(3)), glorot's U(+-sqrt(3 / ((1 + n) / 2)))."""
    fan_in = sample(flow.variance_scaling_initializer(1.0, "fan_in", "random_uniform"),
                    shape=(400,))
    assert 0.95 * math.sqrt(3.0) < np.abs(fan_in).max() <= math.sqrt(3.0)
    glorot = sample(flow.glorot_uniform_initializer(), shape=(400,))
    limit = math.sqrt(3.0 / ((1 + 400) / 2))
    assert 0.95 * limit < np.abs(glorot).max() <= limit


def test_xavier_and_kaiming_scales():
    fan_in, fan_out = 128, 256
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    x = sample(flow.xavier_uniform_initializer())
    assert np.abs(x).max() <= limit and np.abs(x).max() > 0.95 * limit
    k = sample(flow.kaiming_initializer(SHAPE, nonlinearity="relu"))
    assert k.std() == pytest.approx(math.sqrt(2.0 / fan_in), rel=0.03)
    conv = sample(flow.variance_scaling_initializer(2.0, "fan_in", "random_normal"), shape=(64, 32, 5, 5))
    assert conv.std() == pytest.approx(math.sqrt(2.0 / (32 * 25)), rel=0.03)


def test_kaiming_takes_its_std_from_the_shape_given_and_the_data_format():
    """As OneFlow's kaiming_initializer (initializer_util.py: _CalcFan, CalcGain): the fan
    of the `shape` argument (its docstring passes an input's shape, (1, 256, 32, 32), for a
    conv weight), fan-out counted channels first for NCHW, channels last for NHWC."""
    weight = (64, 4, 3, 3)
    given = sample(flow.kaiming_initializer((1, 256, 32, 32)), shape=weight)
    assert given.std() == pytest.approx(math.sqrt(2.0 / (256 * 32 * 32)), rel=0.05)
    fan_out = sample(flow.kaiming_initializer(weight, mode="fan_out", nonlinearity="relu"),
                     shape=weight)
    assert fan_out.std() == pytest.approx(math.sqrt(2.0 / (64 * 3 * 3)), rel=0.05)
    last = sample(flow.kaiming_initializer((64, 3, 3, 4), mode="fan_out", data_format="NHWC",
                                           distribution="random_uniform"), shape=weight)
    limit = math.sqrt(3.0) * math.sqrt(2.0 / (64 * 3 * 3))
    assert np.abs(last).max() <= limit and np.abs(last).max() > 0.95 * limit
    # without a shape (OneFlow requires one), the variable's
    own = sample(flow.kaiming_initializer(mode="fan_out", nonlinearity="relu"), shape=weight)
    assert own.std() == pytest.approx(math.sqrt(2.0 / (64 * 3 * 3)), rel=0.05)


def test_layer_defaults_dense_zero_conv_xavier():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 3, 8, 8))) -> tp.Numpy:
        y = flow.layers.conv2d(x, 4, 3, name="c")
        return flow.layers.dense(flow.reshape(y, [2, -1]), 5, name="d")

    job(np.ones((2, 3, 8, 8), np.float32))
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    assert np.all(values["d-weight"] == 0) and values["d-weight"].shape == (5, 144)
    assert np.all(values["c-bias"] == 0) and np.abs(values["c-weight"]).max() > 0
    assert values["c-weight"].shape == (4, 3, 3, 3)


def test_missing_initializer_is_a_clear_error():
    from onnxjob.errors import TraceError

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2,))) -> tp.Numpy:
        return x * flow.get_variable("w", (2,))

    with pytest.raises(TraceError, match="no initializer"):
        job(np.zeros(2, np.float32))


def _random_job_outputs(seed):
    """Initial variable, dropout mask and decode_random batch of a fresh session."""
    from onnxjob.frontend.config import process_config
    flow.clear_default_session()
    process_config.random_seed = seed  # what flow.config.seed(seed) sets

    @flow.global_function(type="train")
    def job() -> tp.Numpy:
        x = flow.data.decode_random((50,), flow.float, batch_size=2)
        w = flow.get_variable("w", (2, 50), initializer=flow.random_normal_initializer())
        y = flow.nn.dropout(x * w, rate=0.5)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0]),
                           momentum=0).minimize(flow.math.reduce_sum(y))
        return flow.concat([x, w, y], axis=0)

    return job()


def test_config_seed_makes_every_random_draw_reproducible():
    first, again = _random_job_outputs(7), _random_job_outputs(7)
    np.testing.assert_array_equal(first, again)
    assert (first[4:] == 0).any()  # the dropout really dropped
    assert not np.array_equal(first, _random_job_outputs(8))
    assert not np.array_equal(_random_job_outputs(None), _random_job_outputs(None))


def test_pythons_random_seed_repeats_the_random_ops_draws():
    """OneFlow's random ops take their seeds from Python's `random` module when traced
    (random.randint in nn_ops / random_util): a program's random.seed(n) repeats its
    dropout masks and shuffles from run to run, without flow.config.seed."""
    import random

    def masks():
        flow.clear_default_session()

        @flow.global_function(type="predict")
        def job(x: tp.Numpy.Placeholder((64,))) -> tp.Numpy:
            keep = flow.random.bernoulli(x)
            order = flow.random.generate_random_batch_permutation_indices(x)
            return flow.concat([keep, flow.cast(order, flow.float)], axis=0)
        return job(np.full(64, 0.5, np.float32))

    random.seed(11)
    first = masks()
    random.seed(11)
    np.testing.assert_array_equal(masks(), first)
    assert not np.array_equal(masks(), first)       # the module's stream went on


def _initial_value_of_w(other_variables):
    """The seeded initial value of variable "w" in a session that also defines
    `other_variables` variables before it."""
    flow.clear_default_session()
    flow.config.seed(3)

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
        for i in range(other_variables):
            x = x + flow.get_variable(f"other_{i}", (4,),
                                      initializer=flow.random_normal_initializer())
        return flow.get_variable("w", (4,), initializer=flow.random_normal_initializer()) + x * 0

    return job(np.zeros(4, np.float32))


def test_a_variables_initial_value_depends_on_the_seed_and_its_name_only():
    alone = _initial_value_of_w(0)
    np.testing.assert_array_equal(alone, _initial_value_of_w(3))
    assert np.std(alone) > 0.1      # drawn, not a constant


def test_initial_values_keep_their_shape_and_are_not_shared():
    """Initial values are stored without a copy: a 0-d variable stays 0-d, and two
    variables with the same constant initializer are two arrays."""
    flow.clear_default_session()

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3,))) -> tp.Numpy:
        scale = flow.get_variable("scale", (), initializer=flow.constant_initializer(2.0))
        zeros_a = flow.get_variable("zeros_a", (3,), initializer=flow.zeros_initializer())
        zeros_b = flow.get_variable("zeros_b", (3,), initializer=flow.zeros_initializer())
        return x * scale + zeros_a + zeros_b

    np.testing.assert_array_equal(job(np.ones(3, np.float32)), [2, 2, 2])
    values = flow.get_all_variables()
    assert values["scale"].numpy().shape == ()
    a, b = (flow.get_all_variables()[n].numpy() for n in ("zeros_a", "zeros_b"))
    assert not np.shares_memory(a, b)


def test_a_variable_s_random_seed_gives_oneflow_s_values():
    """get_variable(random_seed=n): OneFlow draws np.random.default_rng(n) per variable
    with the InitializerConf's (float32) parameters, in float64, then casts: the same
    values here, and two variables with one seed are equal."""
    from typing import Tuple

    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        normal = flow.random_normal_initializer(0.5, 0.1)
        a = flow.get_variable("a", shape=(4, 3), initializer=normal, random_seed=1)
        b = flow.get_variable("b", shape=(4, 3), initializer=normal, random_seed=1)
        u = flow.get_variable("u", shape=(6,), random_seed=2,
                              initializer=flow.random_uniform_initializer(-1.0, 1.0))
        i = flow.get_variable("i", shape=(6,), dtype=flow.int32, random_seed=3,
                              initializer=flow.random_uniform_initializer(0, 5, flow.int32))
        t = flow.get_variable("t", shape=(50,), random_seed=4,
                              initializer=flow.truncated_normal(0.1))
        return a, b, u, i, t

    flow.clear_default_session()
    a, b, u, i, t = flow.global_function()(job)()
    expected = np.random.default_rng(1).normal(float(np.float32(0.5)), float(np.float32(0.1)),
                                               size=12).astype(np.float32).reshape(4, 3)
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(u, np.random.default_rng(2).uniform(
        -1.0, np.nextafter(1.0, np.inf), size=6).astype(np.float32))
    np.testing.assert_array_equal(i, np.random.default_rng(3).integers(0, 5, size=6))
    assert np.abs(t).max() < 0.2 and t.std() > 0.05
    flow.clear_default_session()     # a new session: the same seeded values again
    again = flow.global_function()(job)()
    np.testing.assert_array_equal(again[0], a)
    np.testing.assert_array_equal(again[4], t)


def test_oneflow_s_initial_value_slices():
    """OneFlow draws a variable in slices of at most 32 MiB along its outermost axis whose
    trailing block is larger, never across an index of the axes before it."""
    from onnxjob.frontend.seeded_values import slice_lengths
    assert slice_lengths((3, 10, 1000000), 4) == [8000000, 2000000] * 3
    assert slice_lengths((4, 3), 4) == [12]
    assert slice_lengths((20000000,), 4) == [8388608, 8388608, 3222784]


def test_fans_follow_oneflow_s_draws_of_each_initializer():
    """A variance-scaling initializer's variables take channels-last fans whatever the
    layout (OneFlow 0.4/0.5's GenInitialFan tests data_format == "channel_first", which
    its conf's "channels_first" never equals: flow.layers.conv2d's default xavier on NCHW
    too); kaiming_initializer's own _CalcFan reads the layout."""
    from onnxjob.frontend.initializers import _kaiming_std, _variance_scaling_fans
    shape = (64, 32, 3, 3)
    assert _variance_scaling_fans(shape, "channels_first") == (288, 64 * 32 * 3)
    assert _variance_scaling_fans(shape, "NCHW") == (288, 64 * 32 * 3)
    assert _kaiming_std(shape, "fan_out", "relu", 0.0, "NCHW") == \
        pytest.approx(math.sqrt(2.0) / math.sqrt(64 * 9))
    assert _kaiming_std(shape, "fan_out", "relu", 0.0, "NHWC") == \
        pytest.approx(math.sqrt(2.0) / math.sqrt(64 * 32 * 3))
