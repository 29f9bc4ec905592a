"""A variable's initial value when `flow.get_variable(..., random_seed=n)` names its seed:
drawn as OneFlow 0.5's model IO draws it, so that the same seed gives OneFlow's values.

OneFlow (check_point_v2.init_by_initializer_conf, initializer_util's *InitializerImpl)
makes one `np.random.default_rng(random_seed)` per variable, reads the initializer's
parameters back from its InitializerConf (float fields: float32 values), draws float64 (or
int64) values slice by slice (_ForEachSlice: runs of at most 32 MiB of the variable's
dtype, the same generator throughout) and casts them to the variable's dtype. Without a
seed OneFlow draws a fresh one per variable; onnxjob then draws from the session's seed
(runtime/session.py)."""
import math

import numpy as np

from onnxjob.frontend.initializers import _variance_scaling_fans

SLICE_BYTES = 32 * 1024 * 1024      # check_point_v2._ForEachSlice


def seeded_values(initializer, shape, np_dtype, seed):
    """The initial value OneFlow draws for a variable of `shape` and `np_dtype` with
    `initializer` and random_seed `seed`, or None for an initializer that draws nothing
    at random (constants, ranges: made as without a seed)."""
    rng = np.random.default_rng(seed)
    draw = _drawer(initializer, tuple(shape), rng)
    if draw is None:
        return None
    np_dtype = np.dtype(np_dtype)
    parts = [np.asarray(draw(n)) for n in slice_lengths(tuple(shape), np_dtype.itemsize)]
    flat = np.concatenate(parts) if parts else np.empty(0)
    return flat.astype(np_dtype).reshape(shape)


def slice_lengths(shape, itemsize):
    """The element counts of the slices OneFlow's _ForEachSlice cuts a variable into, in
    order: along the outermost axis whose trailing block exceeds the limit, runs of as many
    of its rows as fit, never across an index of the axes before it."""
    if not shape:
        return [1]
    limit = SLICE_BYTES // itemsize
    count = 1
    for axis in reversed(range(len(shape))):
        count *= shape[axis]
        if count > limit:
            break
    unit = int(np.prod(shape[axis + 1:]))
    most = limit // unit
    rows = []
    left = shape[axis]
    while left > 0:
        rows.append(min(most, left))
        left -= rows[-1]
    outer = int(np.prod(shape[:axis]))
    return [r * unit for r in rows] * outer if unit else []


def _f32(value):
    """A float as OneFlow's InitializerConf float field holds it."""
    return float(np.float32(value))


def _drawer(initializer, shape, rng):
    kind, p = initializer.kind, initializer.params
    if kind == "random_normal":
        mean, std = _f32(p["mean"]), _f32(p["stddev"])
        return lambda n: rng.normal(loc=mean, scale=std, size=n)
    if kind == "random_uniform" and p.get("integer"):
        low, high = int(p["minval"]), int(p["maxval"])
        return lambda n: rng.integers(low=low, high=max(high, low + 1), size=n)
    if kind == "random_uniform":
        low, high = _f32(p["minval"]), np.nextafter(_f32(p["maxval"]), float("inf"))
        return lambda n: rng.uniform(low=low, high=high, size=n)
    if kind == "truncated_normal":
        mean, std = _f32(p["mean"]), _f32(p["stddev"])
        return lambda n: truncated_normal(mean, std, n, rng)
    if kind == "variance_scaling":
        return _variance_scaling(shape, rng, _f32(p["scale"]), p["mode"], p["distribution"])
    if kind == "kaiming":     # (made without a shape: OneFlow's random_normal / uniform conf)
        from onnxjob.frontend.initializers import _kaiming_std
        std = _f32(_kaiming_std(shape, p["mode"], p["nonlinearity"], p["negative_slope"],
                                p["data_format"]))
        if p["distribution"] == "random_normal":
            return lambda n: rng.normal(loc=0.0, scale=std, size=n)
        bound = _f32(math.sqrt(3.0) * std)
        return lambda n: rng.uniform(low=-bound, high=np.nextafter(bound, float("inf")),
                                     size=n)
    return None


def truncated_normal(mean, std, length, rng):
    """OneFlow's RngTruncatedNormal: normal draws 1.2x the remainder at a time, kept where
    within 2 std of the mean."""
    data = np.empty(length)
    generated = 0
    while generated < length:
        remaining = length - generated
        norm = rng.normal(mean, std, size=int(remaining * 1.2))
        kept = norm[np.abs(norm - mean) < 2 * std][:remaining]
        data[generated:generated + len(kept)] = kept
        generated += len(kept)
    return data


def _variance_scaling(shape, rng, scale, mode, distribution):
    """OneFlow's VarianceScalingInitializerImpl with GenInitialFan (whose channels-first
    branch its data_format string never reaches: initializers._variance_scaling_fans)."""
    fan_in, fan_out = _variance_scaling_fans(shape, "")
    fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[mode]
    s = scale / fan
    if distribution == "truncated_normal":
        std = math.sqrt(s) / 0.8796256610342398
        return lambda n: truncated_normal(0, std, n, rng)
    if distribution == "random_normal":
        std = math.sqrt(s)
        return lambda n: rng.normal(0, std, size=n)
    limit = math.sqrt(3.0 * s)
    return lambda n: rng.uniform(low=-limit, high=limit, size=n)
