"""The fast path of a synchronous job call (a predict job serving requests, a train step).

A call whose arguments are C-contiguous ndarrays of exactly each Numpy placeholder's
shape and dtype, made while nothing is queued, runs here: the arguments are checked
against a precomputed (name, shape, dtype) per placeholder, fed as they are (no copy:
the run has finished when the call returns), and run in the caller's thread
(`Executor.try_inline`). Any other call, or one that meets queued work, an error to
re-raise or another thread's inline run, gets NOT_INLINE back before anything ran and takes the full path of `JobFunction.__call__`, which checks, orders and
reports exactly as before. bench/bench_serving.py measures the difference.
"""
import numpy as np

from onnxjob import typing as tp
from onnxjob.compat.zero_d_results import host_result
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


class OneInputFastCall(FastCall):
    """FastCall of a job with one placeholder (most served models): the same checks
    without the loop (~1 us less a call on the loaded 2-core machine)."""

    __slots__ = ("_name", "_shape", "_dtype")

    def __init__(self, executor, params, runtime, build):
        super().__init__(executor, params, runtime, build)
        (self._name, self._shape, self._dtype), = params

    def __call__(self, args):
        if len(args) != 1:
            return NOT_INLINE
        arg = args[0]
        if type(arg) is not np.ndarray or arg.dtype is not self._dtype or \
                arg.shape != self._shape or not arg.flags.c_contiguous:
            return NOT_INLINE
        outs = self._try_inline(self._run, {self._name: arg})
        if outs is NOT_INLINE:
            return NOT_INLINE
        return self._build(outs)


def make_fast_call(session, params, runtime, wrap=None):
    """The FastCall of a job whose placeholders are `params` ((name, shape, dtype), Numpy
    placeholders only) running as `runtime` in `session`, or None where every call must
    take the full path: a job with watch handlers (user code inside the run). `wrap(value)`:
    the caller's value (a Future for jobs without a return annotation)."""
    compiled = runtime.compiled
    if compiled.watch_outputs:
        return None
    build = output_builder(compiled.output_tree)
    if wrap is not None:
        inner = build

        def build(outs):
            return wrap(inner(outs))
    exact = [(name, tuple(shape), np.dtype(dtype)) for name, shape, dtype in params]
    kind = OneInputFastCall if len(exact) == 1 else FastCall
    return kind(session.executor, exact, runtime, build)


def output_builder(tree):
    """outputs (one array per graph output, one device) -> the caller's value, as
    results.build makes it; a single tp.Numpy result that is not 0-d is its array (a
    VectorOfOne view where it has one element, as results.build gives it)."""
    if isinstance(tree, results.Leaf) and tree.kind is tp.Numpy and not tree.zero_d:
        index = tree.index
        return lambda outs: host_result(outs[index])

    def build(outs):
        return results.build(tree, [[value] for value in outs])
    return build
