"""`oneflow.typing`: placeholders for job parameters and annotations for job results.

    import onnxjob.typing as tp
    def job(x: tp.Numpy.Placeholder((100, 784))) -> tp.Callback[tp.Numpy]: ...
"""
import inspect
import typing
from typing import Generic, TypeVar

import numpy as np

from onnxjob import dtypes
from onnxjob.compat.zero_d_results import as_fed
from onnxjob.errors import JobArgumentError, missing_api
from onnxjob.source_info import warn_at_user_line

T = TypeVar("T")


class PyStructCompatibleToBlob:
    """Base of the leaf annotations Numpy, ListNumpy, ListListNumpy."""


class Numpy(PyStructCompatibleToBlob):
    """A static-shape blob; the caller passes / receives one np.ndarray."""

    @staticmethod
    def Placeholder(shape, dtype=dtypes.float, batch_axis=0):
        return _make_placeholder(NumpyDef, shape, dtype, batch_axis)


class ListNumpy(PyStructCompatibleToBlob):
    """A mirrored (dynamic) blob; a list of ndarrays, one per device."""

    @staticmethod
    def Placeholder(shape, dtype=dtypes.float, batch_axis=0):
        return _make_placeholder(ListNumpyDef, shape, dtype, batch_axis)


class ListListNumpy(PyStructCompatibleToBlob):
    """A mirrored tensor list; per device a list of ndarrays."""

    @staticmethod
    def Placeholder(shape, dtype=dtypes.float, batch_axis=0):
        return _make_placeholder(ListListNumpyDef, shape, dtype, batch_axis)


class Callback(Generic[T]):
    """`-> tp.Callback[T]`: the call returns at once; `job(...)(cb)` gets the T value."""


class Bundle(Generic[T]):
    """`-> tp.Bundle[L]`: any nesting of tuple/list/dict of blobs, leaves converted per L."""


LEAVES = (Numpy, ListNumpy, ListListNumpy)


class PlaceholderDef:
    """Base of the classes `X.Placeholder(...)` returns: one job parameter."""

    shape = ()
    dtype = dtypes.float
    leaf = None

    @classmethod
    def np_dtype(cls):
        return dtypes.to_numpy(cls.dtype)


class NumpyDef(PlaceholderDef):
    leaf = Numpy


class ListNumpyDef(PlaceholderDef):
    leaf = ListNumpy


class ListListNumpyDef(PlaceholderDef):
    leaf = ListListNumpy


def _make_placeholder(base, shape, dtype, batch_axis=0):
    assert isinstance(shape, tuple), "shape should be a tuple. %s found" % (shape,)
    for d in shape:
        assert isinstance(d, int) and d > 0, (
            f"every dimension of a placeholder shape must be a positive int, got {shape}")
    dtypes.to_numpy(dtype)
    if isinstance(batch_axis, int) and -len(shape) <= batch_axis < 0:
        batch_axis += len(shape)     # (OneFlow <= 0.3's input_blob_def normalizes it)
    # OneFlow <= 0.3's Blob.batch_axis of the placeholder (None: it has none)
    return type(f"{base.leaf.__name__}Placeholder", (base,),
                {"shape": shape, "dtype": dtype, "batch_axis": batch_axis})


def is_placeholder(annotation):
    return isinstance(annotation, type) and issubclass(annotation, PlaceholderDef)


# -- decoration-time checks ---------------------------------------------------------------

def check_parameter_annotation(annotation):
    if is_placeholder(annotation):
        return
    if typing.get_origin(annotation) is tuple:
        args = typing.get_args(annotation)
        assert args, "T in typing.Tuple[T, ...] cannot be omitted"
        for a in args:
            check_parameter_annotation(a)
        return
    if annotation is typing.Tuple:
        raise AssertionError("T in typing.Tuple[T, ...] cannot be omitted")
    raise NotImplementedError("invalid parameter annotation %s found" % (annotation,))


def check_return_annotation(annotation, inside_callback=False):
    """Validate a return annotation (spec §2.5); None means `-> None`."""
    if annotation is None or annotation is inspect.Signature.empty:
        if inside_callback and annotation is None:
            raise NotImplementedError("invalid return annotation %s found" % (annotation,))
        return
    if annotation in LEAVES:
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Callback or (origin is None and annotation is Callback):
        raise AssertionError("T in oneflow.typing.Callback[T] cannot be omitted")
    if annotation is Bundle:
        raise AssertionError("T in oneflow.typing.Bundle[T] must be one of "
                             "(oneflow.typing.Numpy, oneflow.typing.ListNumpy, "
                             "oneflow.typing.ListListNumpy)")
    if annotation in (typing.Tuple, tuple):
        raise AssertionError("T in typing.Tuple[T, ...] cannot be omitted")
    if annotation in (typing.List, list):
        raise AssertionError("T in typing.List[T] cannot be omitted")
    if annotation in (typing.Dict, dict):
        raise AssertionError("(K, V) in typing.Dict[K,V] cannot be omitted")
    if origin is Callback:
        if inside_callback:
            raise NotImplementedError("invalid return annotation %s found" % (annotation,))
        check_return_annotation(args[0], inside_callback=True)
        return
    if origin is Bundle:
        assert args[0] in LEAVES, (
            "T in oneflow.typing.Bundle[T] must be one of (oneflow.typing.Numpy, "
            "oneflow.typing.ListNumpy, oneflow.typing.ListListNumpy)")
        return
    if origin is tuple:
        assert args, "T in typing.Tuple[T, ...] cannot be omitted"
        for a in args:
            check_return_annotation(a, inside_callback)
        return
    if origin is list:
        assert args, "T in typing.List[T] cannot be omitted"
        check_return_annotation(args[0], inside_callback)
        return
    if origin is dict:
        assert len(args) == 2, "(K, V) in typing.Dict[K,V] cannot be omitted"
        check_return_annotation(args[1], inside_callback)
        return
    raise NotImplementedError("invalid return annotation %s found" % (annotation,))


def is_callback(annotation):
    return typing.get_origin(annotation) is Callback


def callback_inner(annotation):
    return typing.get_args(annotation)[0]


# -- call-time argument checks --------------------------------------------------------------

def _cast_argument(arr, ph, where):
    return as_fed_dtype(arr, ph.np_dtype(), where,
                        f"placeholder dtype flow.{ph.dtype.__name__}")


# (where, from dtype, to dtype) of the truncating casts already warned about
_WARNED_CASTS = set()


def as_fed_dtype(arr, want, where, what):
    """A C-ordered copy of `arr` in dtype `want`, converted as OneFlow's copy into a
    placeholder converts it (pybind11's force-cast, NumPy's unsafe cast: float64 ->
    float32, int64 -> int32, integers -> floats, booleans -> numbers, floats -> integers);
    floats cast to integers lose their fractions, as there, with a one-time warning
    naming the argument. Arrays of objects or strings convert where their elements do,
    as there (a mixed table's `DataFrame.values` sliced to its numeric columns, numbers
    read from a CSV as text); others are refused; `where` and `what` (the placeholder's
    dtype) name them in the messages."""
    want = np.dtype(want)
    if arr.dtype == want:
        return np.array(arr, order="C", copy=True)
    refused = JobArgumentError(
        f"{where}: expected dtype {want} ({what}), got an array of dtype {arr.dtype}, "
        "which does not convert to it: feed an array of numbers")
    if want.kind not in "biuf" or arr.dtype.kind not in "biufcOUS":
        raise refused
    if arr.dtype.kind in "cOUS":
        try:
            return np.asarray(arr.astype(want), order="C")
        except (TypeError, ValueError, OverflowError) as e:
            raise refused from e
    if arr.dtype.kind == "f" and want.kind in "iu":
        key = (where, arr.dtype.str, want.str)
        if key not in _WARNED_CASTS:
            _WARNED_CASTS.add(key)
            warn_at_user_line(f"{where}: an array of dtype {arr.dtype} fed to {what} is cast "
                              f"to {want}, dropping fractions (OneFlow's placeholders cast "
                              "it the same way); cast it yourself to silence this")
    return np.asarray(arr.astype(want), order="C")


def convert_argument(arg, ph, param, device_num=1):
    """Validate one argument against its annotation and copy it (spec §2.2).

    Returns the value the runtime feeds: an ndarray, a list of ndarrays (ListNumpy, one
    per device) or a list of lists (ListListNumpy). `device_num`: the length a list takes,
    or a tuple of the lengths it may take (the first named in errors).
    """
    where = f"argument {param!r}"
    lengths = device_num if isinstance(device_num, tuple) else (device_num,)
    if typing.get_origin(ph) is tuple:
        sub = typing.get_args(ph)
        if not isinstance(arg, (list, tuple)):
            raise JobArgumentError(f"type(arg_ndarray): {type(arg)} ({where} must be a tuple "
                                   f"of {len(sub)} values)")
        if len(arg) != len(sub):
            raise JobArgumentError(f"{len(arg)} v.s. {len(sub)} ({where} has the wrong length)")
        return tuple(convert_argument(a, s, f"{param}[{i}]", device_num)
                     for i, (a, s) in enumerate(zip(arg, sub)))
    if issubclass(ph, NumpyDef):
        if ph.shape == (1,):    # (other shapes: the error names the 0-d value's own shape)
            arg = as_fed(arg, ph.shape)
        if not isinstance(arg, np.ndarray):
            raise JobArgumentError(f"{where} must be a numpy.ndarray of shape {ph.shape}, "
                                   f"got {type(arg).__name__}")
        if arg.shape != ph.shape:
            raise JobArgumentError(f"{where} has shape {arg.shape}, expected exactly "
                                   f"{ph.shape} (tp.Numpy placeholders take no other shape)")
        return _cast_argument(arg, ph, where)
    if issubclass(ph, ListNumpyDef):
        if not isinstance(arg, (list, tuple)) or len(arg) not in lengths:
            raise JobArgumentError(f"{where} must be a list of {lengths[0]} ndarray(s) "
                                   f"(one per device), got {type(arg).__name__}"
                                   + (f" of length {len(arg)}" if isinstance(arg, (list, tuple)) else ""))
        out = []
        for i, x in enumerate(arg):
            x = as_fed(x, ph.shape)
            _check_list_item(x, ph, f"{where}[{i}]")
            if x.size > int(np.prod(ph.shape)):
                raise JobArgumentError(f"{where}[{i}] has shape {x.shape} ({x.size} elements), "
                                       f"more than the placeholder's {ph.shape}")
            out.append(_cast_argument(x, ph, f"{where}[{i}]"))
        return out
    if issubclass(ph, ListListNumpyDef):
        if not isinstance(arg, (list, tuple)) or len(arg) not in lengths:
            raise JobArgumentError(f"{where} must be a list of {lengths[0]} list(s) of ndarrays")
        out = []
        for i, items in enumerate(arg):
            if type(items) is not list:
                raise JobArgumentError(f"{where}[{i}] must be a list of ndarrays, "
                                       f"got {type(items).__name__}")
            items = [as_fed(x, ph.shape) for x in items]
            for j, x in enumerate(items):
                _check_list_item(x, ph, f"{where}[{i}][{j}]")
            total = sum(x.size for x in items)
            if total > int(np.prod(ph.shape)):
                raise JobArgumentError(f"{where}[{i}] holds {total} elements, more than the "
                                       f"placeholder's {ph.shape}")
            out.append([_cast_argument(x, ph, f"{where}[{i}][{j}]") for j, x in enumerate(items)])
        return out
    raise NotImplementedError("invalid parameter annotation %s found" % (ph,))


def _check_list_item(x, ph, where):
    if type(x) is not np.ndarray:
        raise JobArgumentError(f"{where} must be a numpy.ndarray, got {type(x).__name__}")
    if x.ndim != len(ph.shape):
        raise JobArgumentError(f"{where} has rank {x.ndim} (shape {x.shape}), expected rank "
                               f"{len(ph.shape)} like the placeholder {ph.shape}")


__getattr__ = missing_api("flow.typing")
