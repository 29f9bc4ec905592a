"""A non-Blob passed where an op takes a Blob: onnxjob's error naming the user's line.

A program's own slip (a settings object or a NumPy array passed to an op, an op called
outside any job, as TensorFlow code does) fails in OneFlow too; in onnxjob it would fail as
an AttributeError or TypeError about `.shape` from deep inside the op. `guard` wraps each
public op of a `flow.*` namespace so that such an error, when it is about one of the
call's arguments that no op takes (a NumPy array, an object of a class of the program's
own), comes out as a TraceError naming the op, the argument and the user's line. Other
errors pass unchanged.
"""
import functools
import inspect
import re

import numpy as np

from onnxjob.errors import OnnxJobError, TraceError
from onnxjob.graph.tracer import in_job

# the modules OneFlow's API is implemented in (their functions are the ops to guard)
API_MODULES = ("onnxjob.ops", "onnxjob.frontend", "onnxjob.io", "onnxjob.train")
# the kinds of values ops take besides Blobs: Python's own, numbers, onnxjob's objects
# (dtypes, initializers, readers' outputs), protobuf messages (InitializerConf, ...)
_OWN_MODULES = ("builtins", "onnxjob", "google.protobuf", "numpy")


def _foreign(value):
    """Whether `value` is of a kind no op takes for a Blob: a NumPy array, or an object
    of a class from outside Python, NumPy's scalars, onnxjob and protobuf."""
    if isinstance(value, np.ndarray):
        return True
    if callable(value):             # activations, initializer factories, classes
        return False
    return not (type(value).__module__ or "").startswith(_OWN_MODULES)


def _arguments(fn, args, kwargs):
    """{parameter name: value} of a call."""
    try:
        return dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return {f"argument {i}": a for i, a in enumerate(args)} | kwargs


def _foreign_arguments(fn, args, kwargs):
    """[(parameter name, value)] of the call's foreign arguments (in lists: the items)."""
    found = []
    for name, value in _arguments(fn, args, kwargs).items():
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend((name, v) for v in items if _foreign(v))
    return found


def _about(error, value):
    """Whether the raw `error` speaks of `value` (its type, or an array's truth value)."""
    text = str(error)
    return type(value).__name__ in text or (isinstance(value, np.ndarray) and "array" in text)


_BLOB_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(shape|np_dtype|dtype|builder|"
                             r"is_dynamic|value|producer|is_tensor_list)'")


def _read_as_blob(error, fn, args, kwargs):
    """(parameter, value) of the argument that the op read a Blob's attribute of, when
    `error` is such an AttributeError (a list or a number where a Blob belongs), or None."""
    match = isinstance(error, AttributeError) and _BLOB_ATTRIBUTE.search(str(error))
    if not match:
        return None
    for name, value in _arguments(fn, args, kwargs).items():
        if type(value).__name__ == match.group(1):
            return name, value
    return None


def _refusal(api, name, value):
    kind = type(value).__name__
    if not in_job():
        return (f"{api}: {name!r} is a {kind}, not a Blob: ops run inside a job function "
                "body (a function decorated with @flow.global_function) on its Blobs")
    return (f"{api}: {name!r} is a {kind}, not a Blob (an op takes the job's placeholders, "
            "variables and the results of other ops)")


def _eager_tensors_in(args, kwargs):
    """Whether the call's arguments (in lists and tuples too) hold an eager tensor."""
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else (value,)
        if any(getattr(type(v), "_eager_tensor", False) for v in items):
            return True
    return False


def _guarded(fn, api):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not in_job() and _eager_tensors_in(args, kwargs):
            return _on_eager_tensors(fn, api, args, kwargs)
        try:
            return fn(*args, **kwargs)
        except OnnxJobError:
            raise
        except (AttributeError, TypeError, ValueError, KeyError, IndexError) as e:
            for name, value in _foreign_arguments(fn, args, kwargs):
                if _about(e, value):
                    raise TraceError(_refusal(api, name, value)) from e
            read = _read_as_blob(e, fn, args, kwargs)
            if read is not None:
                raise TraceError(_refusal(api, *read)) from e
            raise
    return call


def _on_eager_tensors(fn, api, args, kwargs):
    """An op called on eager tensors, run at once (onnxjob/eager/tensor.py); an API that
    is no op (flow.global_function, flow.save, ...) given a tensor says so at the line."""
    from onnxjob.eager.tensor import apply
    try:
        return apply(fn, args, kwargs)
    except OnnxJobError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as e:
        raise TraceError(f"{api} cannot take eager tensors (flow.Tensor) as given "
                         f"({type(e).__name__}: {e})") from e


# one wrapper per function: an alias stays the same object (flow.clip is flow.clamp)
_WRAPPED = {}


def guard(namespace, prefix):
    """Wrap, in place, the public ops of `namespace` (a module or an ApiNamespace) that
    are OneFlow API functions; `prefix` is how users spell it ("flow.math")."""
    for name, fn in list(vars(namespace).items()):
        if name.startswith("_") or not inspect.isfunction(fn) or \
                not fn.__module__.startswith(API_MODULES) or fn in _WRAPPED.values():
            continue
        if fn not in _WRAPPED:
            _WRAPPED[fn] = _guarded(fn, f"{prefix}.{name}")
        setattr(namespace, name, _WRAPPED[fn])
