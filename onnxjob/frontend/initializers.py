"""Variable initializers (spec §5.8). Each returns a config object that draws values
with NumPy when the session starts."""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.source_info import user_location


class Initializer:
    """An initializer: `sample(shape, np_dtype, rng) -> ndarray`."""

    def __init__(self, kind, **params):
        self.kind = kind
        self.params = params

    def __repr__(self):
        return f"{self.kind}({', '.join(f'{k}={v}' for k, v in self.params.items())})"

    def sample(self, shape, np_dtype, rng, model_io=False):
        """Values of `shape` and `np_dtype` drawn from `rng`. `model_io`: a variable's
        initial value, which OneFlow draws in Python (check_point_v2: an integer uniform
        excludes maxval); otherwise as its C++ kernels draw (decode_random: includes it)."""
        if self.kind == "constant":
            return _constant(shape, np_dtype, self.params["value"])
        if self.kind == "random_uniform" and self.params["integer"]:
            low, high = int(self.params["minval"]), int(self.params["maxval"])
            high = max(high, low + 1) if model_io else high + 1
            return rng.integers(low, high, size=shape).astype(np_dtype, copy=False)
        values = _SAMPLERS[self.kind](shape, rng, _draw_dtype(np_dtype), **self.params)
        return np.asarray(values).astype(np_dtype, copy=False)


def _draw_dtype(np_dtype):
    """The dtype random floats are drawn in: float32 unless the variable is float64
    (NumPy draws float32 directly, about 3x faster than float64 plus a cast; ResNet50's
    25M weights took 0.5 s the other way)."""
    return np.float64 if np.dtype(np_dtype) == np.float64 else np.float32


def _normal(rng, mean, stddev, shape, draw):
    out = rng.standard_normal(size=shape, dtype=draw)
    out *= draw(stddev)
    out += draw(mean)
    return out


def _uniform_real(rng, low, high, shape, draw):
    out = rng.random(size=shape, dtype=draw)
    out *= draw(high - low)
    out += draw(low)
    return out


def _truncated(shape, rng, draw, mean, stddev):
    """Normal(mean, stddev) resampled until |x - mean| < 2 stddev."""
    out = rng.standard_normal(size=shape, dtype=draw)
    bad = np.flatnonzero(np.abs(out) >= 2.0)
    while bad.size:
        flat = out.reshape(-1)
        flat[bad] = rng.standard_normal(size=bad.size, dtype=draw)
        bad = bad[np.abs(flat[bad]) >= 2.0]
    out *= draw(stddev)
    out += draw(mean)
    return out


def _fans(shape, channels_first):
    """(fan_in, fan_out) of a weight of `shape` as OneFlow counts them: fan_in the product
    of every axis but the first; fan_out the first axis times the kernel's spatial axes,
    those after the channels where `channels_first`, else those before the last."""
    if not shape:
        return 1, 1
    if len(shape) < 2:      # (OneFlow's GenInitialFan: prod(shape[1:]) is 1 for a vector)
        return 1, shape[0]
    if len(shape) == 2:
        return shape[1], shape[0]
    spatial = shape[2:] if channels_first else shape[1:-1]
    return int(np.prod(shape[1:])), shape[0] * int(np.prod(spatial))


def _variance_scaling_fans(shape, data_format):
    """The fans OneFlow 0.4/0.5's variables drawn with a variance-scaling initializer get
    (check_point_v2 through initializer_util.GenInitialFan): it tests data_format ==
    "channel_first", which the conf's "channels_first" never equals, so every layout,
    flow.layers' NCHW convolutions' default xavier included, counts channels-last fans."""
    return _fans(shape, data_format == "channel_first")


def _variance_scaling(shape, rng, draw, scale, mode, distribution, data_format):
    fan_in, fan_out = _variance_scaling_fans(shape, data_format)
    fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
    s = scale / max(1.0, fan)
    if distribution == "truncated_normal":
        return _truncated(shape, rng, draw, 0.0, math.sqrt(s) / 0.87962566103423978)
    if distribution == "random_normal":
        return _normal(rng, 0.0, math.sqrt(s), shape, draw)
    limit = math.sqrt(3.0 * s)
    return _uniform_real(rng, -limit, limit, shape, draw)


def _uniform(shape, rng, draw, minval, maxval, integer):
    # (integers: Initializer.sample, whose range depends on who draws)
    return _uniform_real(rng, minval, maxval, shape, draw)


def _kaiming(shape, rng, draw, distribution, mode, nonlinearity, negative_slope, data_format):
    std = _kaiming_std(shape, mode, nonlinearity, negative_slope, data_format)
    if distribution == "random_normal":
        return _normal(rng, 0.0, std, shape, draw)
    return _uniform_real(rng, -math.sqrt(3.0) * std, math.sqrt(3.0) * std, shape, draw)


def _kaiming_std(shape, mode, nonlinearity, negative_slope, data_format):
    """OneFlow's kaiming_initializer standard deviation (initializer_util.py, _CalcFan and
    CalcGain): the fan from `shape` as `data_format` lays it out (channels first: fan-out
    is out x the kernel's spatial sizes; channels last: out x the axes before the last)."""
    fan_in, fan_out = _fans(shape, str(data_format).startswith("NC"))
    fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[mode]
    gain = {None: 1.0, "linear": 1.0, "sigmoid": 1.0, "tanh": 5.0 / 3, "relu": math.sqrt(2.0),
            "leaky_relu": math.sqrt(2.0 / (1 + negative_slope ** 2))}[nonlinearity]
    return gain / math.sqrt(fan)


def _constant(shape, np_dtype, value):
    """`value` everywhere, made in the variable's dtype (no cast pass after); zeros come
    from np.zeros, whose large arrays the OS maps lazily: optimizer slots that the first
    step replaces are never written."""
    if np.ndim(value) == 0 and value == 0:
        return np.zeros(shape, np_dtype)
    return np.full(shape, value, np_dtype)


def _range(shape, rng, draw, start, stride, axis):
    """start + j * stride at index j of `axis`, the same across the other axes (OneFlow's
    RangeInitializer of range_conf / int_range_conf)."""
    if not shape or not -len(shape) <= axis < len(shape):
        raise ValueError(f"InitializerConf.range_conf: axis {axis} is not an axis of the "
                         f"variable's shape {tuple(shape)}")
    axis %= len(shape)
    line = start + np.arange(shape[axis]) * stride
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(line.reshape(view), shape)


_SAMPLERS = {
    "range": _range,
    "truncated_normal": _truncated,
    "random_normal": lambda shape, rng, draw, mean, stddev: _normal(rng, mean, stddev, shape, draw),
    "random_uniform": _uniform,
    "variance_scaling": _variance_scaling,
    "kaiming": _kaiming,
}


def constant_initializer(value=0, dtype=dtypes.float):
    """`value` everywhere, stored as OneFlow's InitializerConf stores it: int(value) for an
    integer `dtype` (ConstantIntInitializerConf), else a float32 (its float field)."""
    if np.ndim(value) == 0 and not isinstance(value, bool):
        integer = not dtypes.is_floating(dtypes.to_numpy(dtype))
        value = int(value) if integer else float(np.float32(value))
    return Initializer("constant", value=value)


def zeros_initializer(dtype=dtypes.float):
    return Initializer("constant", value=0)


def ones_initializer(dtype=dtypes.float):
    return Initializer("constant", value=1)


def truncated_normal_initializer(mean=0.0, stddev=1.0):
    return Initializer("truncated_normal", mean=mean, stddev=stddev)


def truncated_normal(stddev=1.0):
    """Deprecated spelling used by the docs: truncated normal around 0."""
    return truncated_normal_initializer(0.0, stddev)


def random_normal_initializer(mean=0.0, stddev=1.0, seed=None, dtype=None):
    assert seed is None, "random_normal_initializer: seed is not supported"
    assert dtype is None, "random_normal_initializer: dtype is not supported"
    return Initializer("random_normal", mean=mean, stddev=stddev)


def random_uniform_initializer(minval=0, maxval=1, dtype=dtypes.float):
    assert minval <= maxval, f"minval {minval} > maxval {maxval}"
    integer = not dtypes.is_floating(dtypes.to_numpy(dtype))
    return Initializer("random_uniform", minval=minval, maxval=maxval, integer=integer)


def variance_scaling_initializer(scale=1.0, mode="fan_in", distribution="truncated_normal",
                                 data_format=""):
    # as OneFlow's _get_variance_norm / _get_random_distribution: any case
    mode, distribution = str(mode).lower(), str(distribution).lower()
    if mode not in ("fan_in", "fan_out", "fan_avg"):
        raise ValueError(f"{user_location()}: Invalid variance_norm: mode {mode!r} is none of "
                         "'fan_in', 'fan_out', 'fan_avg'")
    if distribution not in ("truncated_normal", "random_normal", "random_uniform"):
        raise ValueError(f"{user_location()}: Invalid random_distribution: {distribution!r} "
                         "is none of 'truncated_normal', 'random_normal', 'random_uniform'")
    return Initializer("variance_scaling", scale=scale, mode=mode, distribution=distribution,
                       data_format=data_format)


def glorot_uniform_initializer(data_format=""):
    return variance_scaling_initializer(1.0, "fan_avg", "random_uniform", data_format)


def glorot_normal_initializer(data_format=""):
    return variance_scaling_initializer(1.0, "fan_avg", "random_normal", data_format)


xavier_uniform_initializer = glorot_uniform_initializer
xavier_normal_initializer = glorot_normal_initializer


def kaiming_initializer(shape=None, distribution="random_normal", mode="fan_in",
                        nonlinearity="leaky_relu", negative_slope=0.0, data_format="NCHW"):
    """He et al.'s normal or uniform initializer. As OneFlow's, the standard deviation
    comes from `shape` (the shape given here, which OneFlow requires, not the variable's:
    its own docstring passes an input's shape) and `data_format`; without `shape`, from the
    variable's shape."""
    if shape is not None:
        std = _kaiming_std(tuple(shape), mode, nonlinearity, negative_slope, data_format)
        if distribution == "random_normal":
            return random_normal_initializer(0.0, std)
        bound = math.sqrt(3.0) * std
        return random_uniform_initializer(-bound, bound)
    return Initializer("kaiming", distribution=distribution, mode=mode,
                       nonlinearity=nonlinearity, negative_slope=negative_slope,
                       data_format=data_format)


_VARIANCE_NORMS = {0: "fan_in", 1: "fan_out", 2: "fan_avg"}
_DISTRIBUTIONS = {0: "random_uniform", 1: "random_normal", 2: "truncated_normal"}


def from_initializer_conf(conf):
    """The initializer that OneFlow's `InitializerConf` message `conf` describes (the
    protobuf of oneflow/core/job/initializer_conf.proto, which OneFlow <= 0.4's
    initializer functions returned and flow.get_variable accepted)."""
    kind = conf.WhichOneof("type") if hasattr(conf, "WhichOneof") else None
    if kind is None:
        raise TypeError(f"{user_location()}: a variable's initializer must be a "
                        f"flow.*_initializer() or an InitializerConf with one conf set, got "
                        f"{conf!r}")
    c = getattr(conf, kind)
    if kind in ("constant_conf", "constant_int_conf"):
        return Initializer("constant", value=c.value)
    if kind in ("random_uniform_conf", "random_uniform_int_conf"):
        return Initializer("random_uniform", minval=c.min, maxval=c.max,
                           integer=kind == "random_uniform_int_conf")
    if kind == "random_normal_conf":
        return Initializer("random_normal", mean=c.mean, stddev=c.std)
    if kind == "truncated_normal_conf":
        return Initializer("truncated_normal", mean=c.mean, stddev=c.std)
    if kind == "xavier_conf":  # OneFlow: uniform in +-sqrt(3 / n)
        return variance_scaling_initializer(1.0, _VARIANCE_NORMS[c.variance_norm],
                                            "random_uniform", c.data_format)
    if kind == "msra_conf":  # OneFlow: normal with std sqrt(2 / n)
        return variance_scaling_initializer(2.0, _VARIANCE_NORMS[c.variance_norm],
                                            "random_normal", c.data_format)
    if kind == "variance_scaling_conf":
        return variance_scaling_initializer(c.scale, _VARIANCE_NORMS[c.variance_norm],
                                            _DISTRIBUTIONS[c.distribution], c.data_format)
    if kind in ("range_conf", "int_range_conf"):
        return Initializer("range", start=c.start, stride=c.stride, axis=int(c.axis))
    # empty_conf: OneFlow leaves the memory as allocated; onnxjob's allocations are zeroed
    return Initializer("constant", value=0)
