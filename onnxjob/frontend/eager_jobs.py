"""Job functions defined while the session runs, as OneFlow's eager mode (0.2-0.4) allows.

An eager program may define its job function inside the function its training loop calls
(OneFlow's own eager MNIST sample does), so the same job is defined again at every step.
onnxjob runs jobs lazily (frontend/helpers.py `enable_eager_execution`): a definition
equal to the running job of its name (the same code, config, annotations, default values
and closure values) is that job, compiled once; any other definition is compiled into the
running session, keeping the variables it shares with the other jobs. Without eager mode
a definition after the session started is refused, as OneFlow refuses it.

OneFlow's eager mode also ran the body at every call, so a body reading a Python value
that the program changes between calls (a global learning rate, an epoch counter) saw
the new value each time. onnxjob notes the plain values (numbers, strings and tuples of
them) the body's code reads from its globals and closure when it is traced
(`plain_inputs`), and a call where one of them changed traces the body again
(`inputs_changed`; Session.runtime_with_values)."""
import argparse
import numbers
import types

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


def plain_inputs(func):
    """{("global" | "cell", name): its value} of the plain values (_PLAIN, and tuples of
    them) that `func`'s code reads from its globals and closure, nested functions' code
    included."""
    found = {}
    names = set()
    stack = [func.__code__]
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    holders = {}
    for name in names:
        if name in func.__globals__:
            holders[("global", name)] = func.__globals__[name]
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or ()):
        try:
            holders[("cell", name)] = cell.cell_contents
        except ValueError:          # (a cell not yet filled)
            continue
    for key, value in holders.items():
        if _is_plain(value):
            found[key] = value
        elif isinstance(value, _NAMESPACES):
            # the program's options (`args.lr` of an argparse.Namespace, a config module's
            # names): the plain attributes of the names the code reads
            attributes = vars(value)
            for attribute in names & attributes.keys():
                if _is_plain(attributes[attribute]):
                    found[key + (attribute,)] = attributes[attribute]
    return found


# objects whose plain attributes a body's options are read from
_NAMESPACES = (argparse.Namespace, types.SimpleNamespace, types.ModuleType)


def inputs_changed(func, noted):
    """Whether a value `plain_inputs(func)` noted as `noted` is another now."""
    cells = dict(zip(func.__code__.co_freevars, func.__closure__ or ()))
    for (kind, name, *attribute), value in noted.items():
        try:
            now = func.__globals__[name] if kind == "global" else cells[name].cell_contents
            if attribute:
                now = vars(now)[attribute[0]]
        except (KeyError, ValueError, TypeError):
            return True
        if not _same(value, now):
            return True
    return False


def _is_plain(value):
    # (not lists or dicts: a body appending to a list it logs into would change it at
    # every call)
    if isinstance(value, tuple):
        return all(_is_plain(v) for v in value)
    return isinstance(value, _PLAIN)
