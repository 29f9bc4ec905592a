"""The fast path of a synchronous job call (a predict job serving requests, a train step).

A call whose arguments are C-contiguous ndarrays of exactly each Numpy placeholder's
shape and dtype, made while nothing is queued, runs here: the arguments are checked
against a precomputed (name, shape, dtype) per placeholder, fed as they are (no copy:
the run has finished when the call returns), and run in the caller's thread
(`Executor.try_inline`). Any other call, or one that meets queued work, an error to
re-raise or another thread's inline run, gets NOT_INLINE back before anything ran and takes the full path of `JobFunction.__call__`, which checks, orders and
reports exactly as before. bench/bench_serving.py measures the difference.
"""
import operator

import numpy as np

from onnxjob import typing as tp
from onnxjob.frontend import results
from onnxjob.runtime.executor import NOT_INLINE


class FastCall:
    """`fast_call(args)`: one job's synchronous call in one session, or NOT_INLINE.
    Sessions keep their jobs' FastCalls (`Session.fast_calls`), so none outlives its
    session."""

    __slots__ = ("_count", "_params", "_try_inline", "_run", "_build")

    def __init__(self, executor, params, runtime, build):
        self._count = len(params)
        self._params = tuple(params)
        self._try_inline = executor.try_inline
        self._run = runtime.run
        self._build = build

    def __call__(self, args):
        if len(args) != self._count:
            return NOT_INLINE
        feeds = {}
        for arg, (name, shape, dtype) in zip(args, self._params):
            # NOTE: `is` on the dtype: NumPy's builtin dtypes are singletons; an equal
            # dtype that is another object takes the full path, which accepts it
            if type(arg) is not np.ndarray or arg.dtype is not dtype or \
                    arg.shape != shape or not arg.flags.c_contiguous:
                return NOT_INLINE
            feeds[name] = arg
        outs = self._try_inline(self._run, feeds)
        if outs is NOT_INLINE:
            return NOT_INLINE
        return self._build(outs)


def make_fast_call(session, params, runtime, wrap=None):
    """The FastCall of a job whose placeholders are `params` ((name, shape, dtype), Numpy
    placeholders only) running as `runtime` in `session`, or None where a call must take
    the full path every time: watch handlers (user code inside the run) or a result tree
    that is not single-device. `wrap(value)`: the caller's value (e.g. a Future)."""
    compiled = runtime.compiled
    if compiled.watch_outputs:
        return None
    build = output_builder(compiled.output_tree)
    if wrap is not None:
        inner = build

        def build(outs):
            return wrap(inner(outs))
    dtypes = [np.dtype(dtype) for _, _, dtype in params]
    return FastCall(session.executor, [(name, tuple(shape), dtype)
                              for (name, shape, _), dtype in zip(params, dtypes)],
                    runtime, build)


def output_builder(tree):
    """outputs (one array per graph output, one device) -> the caller's value, as
    results.build makes it; a single tp.Numpy result is just its array."""
    if isinstance(tree, results.Leaf) and tree.kind is tp.Numpy:
        return operator.itemgetter(tree.index)

    def build(outs):
        return results.build(tree, [[value] for value in outs])
    return build
