"""Host-side data sources: graph inputs that a job fills itself before every run.

A source has `next_batch() -> ndarray` of the shape and dtype it was declared with; the
tracer records it as a graph input (GraphBuilder.add_source) and the job's runtime calls
it before each run, so jobs that make or read their own data need no placeholder.
"""
import numpy as np


class RandomSource:
    """`flow.data.decode_random`: a fresh batch drawn from an initializer every run."""

    def __init__(self, shape, np_dtype, initializer, seed=None):
        self.shape = tuple(int(d) for d in shape)
        self.np_dtype = np.dtype(np_dtype)
        self.initializer = initializer
        self._rng = np.random.default_rng(seed)

    def next_batch(self):
        batch = self.initializer.sample(self.shape, self.np_dtype, self._rng)
        return np.ascontiguousarray(batch, dtype=self.np_dtype)
