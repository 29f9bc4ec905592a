"""Job functions defined while the session runs, as OneFlow's eager mode (0.2-0.4) allows.

An eager program may define its job function inside the function its training loop calls
(OneFlow's own eager MNIST sample does), so the same job is defined again at every step.
onnxjob runs jobs lazily (frontend/helpers.py `enable_eager_execution`): a definition
equal to the running job of its name (the same code, config, annotations, default values
and closure values) is that job, compiled once; any other definition is compiled into the
running session, keeping the variables it shares with the other jobs. Without eager mode
a definition after the session started is refused, as OneFlow refuses it."""
import numbers

import numpy as np

from onnxjob import typing as tp
from onnxjob.graph import tracer

_PLAIN = (numbers.Number, str, bytes, bool, type(None), np.generic)


def allowed():
    """Whether a job may be defined while the session runs: flow.enable_eager_execution(True)."""
    return tracer.eager_requested_at is not None


def running_job_for(session, job):
    """The job the running `session` should call for the new definition `job`: the running
    job of its name when the definitions are equal, else `job` compiled into the session."""
    earlier = session.jobs.get(job.name)
    if earlier is not None and same_definition(earlier, job):
        return earlier
    session.add_job_while_running(job)
    return job


def same_definition(a, b):
    """Whether two definitions of a job trace to the same graph, as far as Python can tell
    without tracing: values are compared by identity, plain values (numbers, strings,
    NumPy scalars, tuples of them) and placeholder annotations by value."""
    fa, fb = a.func, b.func
    if fa.__code__ is not fb.__code__ or a.job_type != b.job_type:
        return False
    if not _same_config(a.config, b.config):
        return False
    cells_a = [c.cell_contents for c in fa.__closure__ or ()]
    cells_b = [c.cell_contents for c in fb.__closure__ or ()]
    return (_same(cells_a, cells_b) and _same(fa.__defaults__, fb.__defaults__)
            and _same(fa.__kwdefaults__, fb.__kwdefaults__)
            and _same(list(a.param_annotations), list(b.param_annotations))
            and _same(a.return_annotation, b.return_annotation))


def _same_config(a, b):
    return a.job_type == b.job_type and _same(a.flags, b.flags) and _same(a.train_conf,
                                                                          b.train_conf)


def _same(a, b):
    if a is b:
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if _is_placeholder(a) and _is_placeholder(b):
        return (a.__mro__[1] is b.__mro__[1] and a.shape == b.shape
                and _same(a.dtype, b.dtype))
    if isinstance(a, _PLAIN) and isinstance(b, _PLAIN):
        return type(a) is type(b) and bool(a == b)
    return False


def _is_placeholder(value):
    return isinstance(value, type) and issubclass(value, tp.PlaceholderDef)
