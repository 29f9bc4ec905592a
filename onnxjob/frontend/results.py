"""Mapping a job body's return value to graph outputs and back (spec §2.3, §2.5)."""
import typing

import numpy as np

from onnxjob import typing as tp
from onnxjob.compat.zero_d_results import host_results
from onnxjob.graph.tracer import Blob


class Leaf:
    """One graph output, converted on the way back per its leaf annotation; `zero_d`:
    whether the output is 0-d (the caller gets it as a ZeroDResult, or as OneFlow <= 0.4's
    (1,) vector where `as_vector`: compat/zero_d_results.py)."""

    __slots__ = ("kind", "index", "is_dynamic", "zero_d", "as_vector")

    def __init__(self, kind, index, is_dynamic=False, zero_d=False):
        self.kind = kind
        self.index = index
        self.is_dynamic = is_dynamic
        self.zero_d = zero_d
        self.as_vector = False


def zero_d_as_vectors(tree):
    """Mark each 0-d leaf of `tree` to come back as a (1,) vector (a job defined by code
    written for OneFlow <= 0.4, compat/generations.written_for_0_4)."""
    if isinstance(tree, Leaf):
        tree.as_vector = tree.zero_d
    elif isinstance(tree, (tuple, list)):
        for t in tree:
            zero_d_as_vectors(t)
    elif isinstance(tree, dict):
        for t in tree.values():
            zero_d_as_vectors(t)


def _mismatch(ret, annotation, job_name, extra=""):
    return AssertionError(f"{ret} does not matched return annotation {annotation} of "
                          f"global_function {job_name}.{extra}")


def flatten(ret, annotation, job_name, blobs):
    """Check `ret` against `annotation`; append its Blobs to `blobs`; return the tree."""
    if annotation is None:
        if ret is not None:
            raise _mismatch(ret, annotation, job_name)
        return None
    if tp.is_callback(annotation):
        return flatten(ret, tp.callback_inner(annotation), job_name, blobs)
    if annotation in tp.LEAVES:
        if not isinstance(ret, Blob):
            raise AssertionError(f"type(ret): {type(ret)} (global_function {job_name} is "
                                 f"annotated to return {annotation.__name__})")
        if annotation is tp.Numpy and ret.is_dynamic:
            raise AssertionError(
                "only fixed shaped blob compatible to oneflow.typing.Numpy. you can change "
                "annotation to oneflow.typing.ListNumpy or oneflow.typing.ListListNumpy")
        blobs.append(ret)
        return Leaf(annotation, len(blobs) - 1, ret.is_dynamic, ret.shape == ())
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is tp.Bundle:
        return _flatten_bundle(ret, args[0], job_name, blobs)
    if origin is tuple:
        if type(ret) is not tuple:
            raise _mismatch(ret, annotation, job_name)
        if len(ret) != len(args):
            raise _mismatch(ret, annotation, job_name,
                            f" length compare: {len(ret)} v.s. {len(args)}")
        return tuple(flatten(r, a, job_name, blobs) for r, a in zip(ret, args))
    if origin is list:
        if type(ret) is not list:
            raise _mismatch(ret, annotation, job_name)
        return [flatten(r, args[0], job_name, blobs) for r in ret]
    if origin is dict:
        if not isinstance(ret, dict):
            raise _mismatch(ret, annotation, job_name)
        out = {}
        for k, v in ret.items():
            if type(k) is not args[0]:
                raise AssertionError(f"type of k:{type(k)} and v:{type(v)} do not matched "
                                     f"return annotation {args} of global_function {job_name}.")
            out[k] = flatten(v, args[1], job_name, blobs)
        return out
    raise NotImplementedError("invalid return annotation %s found" % (annotation,))


def _flatten_bundle(ret, leaf, job_name, blobs):
    if isinstance(ret, Blob):
        return flatten(ret, leaf, job_name, blobs)
    if isinstance(ret, (tuple, list)):
        return type(ret)(_flatten_bundle(r, leaf, job_name, blobs) for r in ret)
    if isinstance(ret, dict):
        return {k: _flatten_bundle(v, leaf, job_name, blobs) for k, v in ret.items()}
    raise AssertionError(f"{ret} does not matched return annotation Bundle of global_function "
                         f"{job_name}.")


def flatten_unannotated(ret, blobs, where="the job", path=""):
    """Old-style job without a return annotation: any nesting of Blobs. `where` names
    the job in the error (its name and the line that defines it), `path` the position
    in its return value."""
    if ret is None:
        return None
    if isinstance(ret, Blob):
        blobs.append(ret)
        return Leaf(None, len(blobs) - 1, ret.is_dynamic, ret.shape == ())
    if isinstance(ret, (tuple, list)):
        return type(ret)(flatten_unannotated(r, blobs, where, f"{path}[{i}]")
                         for i, r in enumerate(ret))
    if isinstance(ret, dict):
        return {k: flatten_unannotated(v, blobs, where, f"{path}[{k!r}]")
                for k, v in ret.items()}
    # OneFlow's global_function refuses it too (NotImplementedError, "returns RemoteBlob
    # or list/tuple/dict nested RemoteBlob only")
    raise NotImplementedError(
        f"{where} returns Blobs or list/tuple/dict nested Blobs only (as OneFlow's "
        f"global_function); got {type(ret).__name__} {ret!r} at return value{path}")


def convert_leaf(kind, values, is_dynamic=False, as_vector=False):
    """The caller's value of one output; `values` holds one array per device."""
    values = host_results(values, as_vector)
    if kind is tp.Numpy:
        return values[0]
    if kind is tp.ListNumpy:
        return list(values)
    if kind is tp.ListListNumpy:
        return [list(v) for v in values]
    return LocalBlob(values, is_dynamic)


def build(tree, values):
    """The caller's value: `tree` with each Leaf replaced by its converted output."""
    if tree is None:
        return None
    if isinstance(tree, Leaf):
        return convert_leaf(tree.kind, values[tree.index], tree.is_dynamic, tree.as_vector)
    if isinstance(tree, tuple):
        return tuple(build(t, values) for t in tree)
    if isinstance(tree, list):
        return [build(t, values) for t in tree]
    return {k: build(t, values) for k, t in tree.items()}


class LocalBlob:
    """A fetched value of an unannotated job (or of flow.watch's handler without an
    annotation): `.numpy()`, `.numpy_list()`, `.is_dynamic`, `.parallel_num()`, the
    deprecated `.ndarray()` / `.ndarray_list()`, the data attributes `.ndarray_list_`,
    `.ndarray_`, `.is_dynamic_`, and the ndarray's methods, as OneFlow's."""

    def __init__(self, per_device, is_dynamic=False):
        self._per_device = per_device
        self._array = per_device[0]
        self._is_dynamic = bool(is_dynamic)

    @property
    def is_dynamic(self):
        """Whether the blob was dynamic (its numpy_list() entries hold the actual rows)."""
        return self._is_dynamic

    def parallel_num(self):
        return len(self._per_device)

    def numpy(self, parallel_id=None):
        """The value (of device `parallel_id`, as OneFlow's `blob.numpy(0)`)."""
        array = self._array if parallel_id is None else self._per_device[parallel_id]
        if isinstance(array, list):
            raise AssertionError("this blob is a tensor list: use numpy_lists()")
        return array

    def numpy_list(self):
        return list(self._per_device)

    # OneFlow's deprecated spellings of numpy() / numpy_list()
    ndarray = numpy
    ndarray_list = numpy_list

    def numpy_lists(self):
        return [list(v) for v in self._per_device]

    ndarray_lists = numpy_lists     # OneFlow <= 0.2's spelling (local_blob.py)

    # The instance attributes of OneFlow's LocalBlob (0.5) and LocalMirroredTensor
    # (<= 0.4), which programs read directly
    @property
    def ndarray_list_(self):
        return self.numpy_list()

    @property
    def ndarray_(self):
        return self._array

    @property
    def is_dynamic_(self):
        return self._is_dynamic

    def __getattr__(self, name):
        return getattr(self._array, name)

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._array, dtype=dtype)

    def __repr__(self):
        return f"LocalBlob({self._array!r})"


def _forward_to_array(method):
    def forwarded(self, *args):
        args = [a.numpy() if isinstance(a, LocalBlob) else a for a in args]
        return getattr(self.numpy(), method)(*args)
    forwarded.__name__ = method
    return forwarded


# As OneFlow's LocalBlob: the ndarray's operators and protocols work on the blob itself
# (`blob[i, 0]`, `blob * 2`, `len(blob)`, comparisons, ...).
_NOT_FORWARDED = {"__class__", "__new__", "__init__", "__getattribute__", "__setattr__",
                  "__delattr__", "__dir__", "__init_subclass__", "__subclasshook__",
                  "__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__sizeof__",
                  "__class_getitem__", "__hash__", "__buffer__", "__release_buffer__"}
for _method in dir(np.ndarray):
    if (_method.startswith("__") and not _method.startswith("__array")
            and _method not in vars(LocalBlob) and _method not in _NOT_FORWARDED):
        setattr(LocalBlob, _method, _forward_to_array(_method))
