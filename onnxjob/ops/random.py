"""`flow.random`: random ops evaluated inside the graph, fresh on every run.

Each op draws from onnxruntime's RandomUniform, which is never constant-folded or
merged with another draw; with a `seed` the sequence of runs is reproducible from the
session's start, without one each op gets a random seed when the job is traced.
CoinFlip is OneFlow's data op: drawn on the host before each run (ops/host.py), so the
image ops can read it as well as the graph.
"""
import random
import sys

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError, missing_api
from onnxjob.graph.tracer import as_blob, current_builder, in_job, int64_constant, op
from onnxjob.ops.host import to_blob
from onnxjob.ops.indexing import gather

__all__ = ["CoinFlip", "bernoulli", "coin_flip", "gen_seed",
           "generate_random_batch_permutation_indices", "random_mask_like", "shuffle"]

_SEED_RANGE = 2 ** 24  # ONNX seeds are float32 attributes: exact below 2**24


def gen_seed(seed=None):
    """(seed, has_seed): `seed`, or a new one from the job's seed stream when None (from
    Python's `random` module, as OneFlow's random.randint; reproducible under
    flow.config.seed), and True."""
    if seed is None:
        stream = current_builder().random if in_job() else random
        seed = stream.randint(-sys.maxsize, sys.maxsize)
    return seed, True


def op_seed(seed=None):
    """The seed attribute of one random node: `seed`, or a fresh random one when None.

    NOTE: onnxruntime seeds every unseeded random op of a process alike (fresh sessions
    would repeat their draws) and two unseeded random nodes with equal inputs are merged
    by common-subexpression elimination, so every random node gets its own seed, random
    when None as in OneFlow. ONNX seeds are float32 attributes: seeds are folded into
    their exact integer range.
    """
    seed, _ = gen_seed(seed)
    return int(seed) % _SEED_RANGE


def _uniform(shape, np_dtype=np.float32, seed=None, api="flow.random"):
    """U[0, 1) samples of `shape`, drawn anew on every run."""
    current_builder(api)
    return op("RandomUniform", shape=[int(d) for d in shape], seed=float(op_seed(seed)),
              dtype=dtypes.from_numpy(np_dtype).ir_dtype.value)


def _cast(x, np_dtype, name=None):
    return op("Cast", x, to=dtypes.from_numpy(np_dtype).ir_dtype.value, name=name)


def bernoulli(x, seed=None, dtype=None, name="Bernoulli"):
    """1 with probability x (elementwise, x in [0, 1]), else 0, as `dtype` (default x's)."""
    if not dtypes.is_floating(x.np_dtype):
        raise TraceError(f"bernoulli takes float32 or float64 probabilities, got {x.np_dtype}")
    np_dtype = x.np_dtype if dtype is None else dtypes.to_numpy(dtype)
    draw = _uniform(x.shape, x.np_dtype, seed, "flow.random.bernoulli")
    return _cast(op("Less", draw, x), np_dtype, name=name)


def coin_flip(batch_size=1, seed=None, probability=0.5, name="CoinFlip"):
    """int8 flags of shape (batch_size,): 1 with `probability`, fresh on every run; a
    graph input drawn on the host (CropMirrorNormalize's `mirror_blob`), reproducible
    from the session's start with a `seed` or under flow.config.seed."""
    if not 0.0 <= probability <= 1.0:
        raise TraceError(f"coin_flip: probability must be in [0, 1], got {probability}")
    api = "flow.random.coin_flip"
    current_builder(api)
    rng = np.random.default_rng(int(gen_seed(seed)[0]) % 2 ** 63)
    batch_size = int(batch_size)

    def flip():
        return (rng.random(batch_size) < probability).astype(np.int8)

    return to_blob(name or "CoinFlip", flip, [], (batch_size,), np.int8, api)


CoinFlip = coin_flip


def generate_random_batch_permutation_indices(value, seed=None, name=None):
    """A random permutation of 0..value.shape[0]-1 (int32), fresh on every run."""
    n = value.shape[0]
    draw = _uniform([n], np.float32, seed, "flow.random.generate_random_batch_permutation_indices")
    # NOTE: sorting i.i.d. uniform keys gives every permutation the same probability
    _, order = op("TopK", draw, int64_constant(draw, [n]), axis=0, num_outputs=2)
    return _cast(order, np.int32, name=name)


def shuffle(value, seed=None, name=None):
    """`value` with its first axis randomly permuted."""
    return gather(value, generate_random_batch_permutation_indices(value, seed), name=name)


def random_mask_like(like, rate, seed=None, noise_shape=None, name=None):
    """int8 mask of like's shape: 1 (keep) with probability 1 - rate, 0 (drop) with rate.

    The building block of flow.nn.random_mask_like.
    """
    if not 0.0 <= rate < 1.0:
        raise TraceError(f"random_mask_like: rate must be in [0, 1), got {rate}")
    if noise_shape is not None:
        raise TraceError("random_mask_like: noise_shape is not supported (as in OneFlow)")
    draw = _uniform(like.shape, np.float32, seed, "flow.nn.random_mask_like")
    keep = op("Greater", draw, as_blob(np.float32(rate), like=draw))
    return _cast(keep, np.int8, name=name)


__getattr__ = missing_api("flow.random")
