"""Names NumPy and Python removed after OneFlow's job-function releases (2020-2021), given
back to the scripts `python -m onnxjob run` runs.

Programs written for OneFlow ran on NumPy 1.x and Python 3.6-3.8, and real ones use names
those releases had: `np.float` / `np.int` / `np.bool` / `np.object` as dtypes (removed in
NumPy 1.24), `np.string_`, `np.NaN`, `np.asfarray`, `np.mat` (removed in NumPy 2.0),
`collections.Mapping` and `from collections import Iterable` (removed in Python 3.10),
`inspect.getargspec` (removed in Python 3.11). On today's releases each stops such a
program with an AttributeError or ImportError in its own code before or after its jobs
run. `restore_removed_names()` answers them as the old releases did, each with one
warning at the first line that uses it (the name, the release that removed it, what it is
given as). Names still present are never replaced: a lookup only reaches these when the
module has no such attribute (PEP 562's module `__getattr__`, which NumPy's own removal
messages already use), and only for the program's code: a lookup from an installed library
or the standard library (a feature test such as `hasattr(np, "float_")`) gets the installed
release's answer. One removed behaviour comes back the same way: `np.fromstring(data,
dtype)` without `sep` (its binary mode, removed in NumPy 2: `cv2.imdecode(np.fromstring(
jpeg_bytes, np.uint8), 1)`, OneFlow's summary tags) reads the bytes as 1.x did, for the
program's calls; every other call is NumPy's own. And NumPy's print options are 1.x's
(`legacy="1.25"`: a scalar in a printed list or dict reads `0.75`, not `np.float32(0.75)`).

It runs in the runner's process and in the child processes it gives the alias to
(compat/oneflow_alias.py), never on `import onnxjob`: a library user's NumPy stays as
installed.
"""
import collections
import collections.abc
import inspect
import os
import site
import sys
import sysconfig
import warnings

import numpy as np


def _asfarray(a, dtype=np.float64):
    """NumPy 1.x's asfarray: `a` as an array of a floating dtype (float64 unless `dtype`
    is inexact)."""
    if not np.issubdtype(dtype, np.inexact):
        dtype = np.float64
    return np.asarray(a, dtype=dtype)


def _msort(a):
    """NumPy 1.x's msort: a copy sorted along the first axis."""
    return np.sort(a, axis=0)


def _in1d(ar1, ar2, assume_unique=False, invert=False):
    """NumPy 1.x's in1d: whether each element of `ar1`, flattened, is in `ar2`."""
    return np.isin(np.ravel(ar1), ar2, assume_unique=assume_unique, invert=invert)


def _asscalar(a):
    """NumPy 1.x's asscalar: the array's one element as a Python scalar."""
    return a.item()


_NUMPY_1_24 = "NumPy 1.24"      # (deprecated in 1.20; the builtin types they stood for)
_NUMPY_2_0 = "NumPy 2.0"
# name: (what it is given as, the release that removed it)
NUMPY_NAMES = {
    "float": (float, _NUMPY_1_24), "int": (int, _NUMPY_1_24), "bool": (bool, _NUMPY_1_24),
    "object": (object, _NUMPY_1_24), "str": (str, _NUMPY_1_24),
    "complex": (complex, _NUMPY_1_24), "unicode": (str, _NUMPY_1_24),
    "long": (int, _NUMPY_1_24),     # (NumPy 2 has np.long again, its C long: kept)
    "asscalar": (_asscalar, "NumPy 1.23"),
    "float_": (np.float64, _NUMPY_2_0), "complex_": (np.complex128, _NUMPY_2_0),
    "string_": (np.bytes_, _NUMPY_2_0), "unicode_": (np.str_, _NUMPY_2_0),
    "int0": (np.intp, _NUMPY_2_0), "uint0": (np.uintp, _NUMPY_2_0),
    "bool8": (np.bool_, _NUMPY_2_0), "cfloat": (np.complex128, _NUMPY_2_0),
    "singlecomplex": (np.complex64, _NUMPY_2_0), "longfloat": (np.longdouble, _NUMPY_2_0),
    "clongfloat": (np.clongdouble, _NUMPY_2_0), "longcomplex": (np.clongdouble, _NUMPY_2_0),
    "NaN": (np.nan, _NUMPY_2_0), "Inf": (np.inf, _NUMPY_2_0),
    "Infinity": (np.inf, _NUMPY_2_0), "infty": (np.inf, _NUMPY_2_0),
    "PINF": (np.inf, _NUMPY_2_0), "NINF": (-np.inf, _NUMPY_2_0),
    "PZERO": (0.0, _NUMPY_2_0), "NZERO": (-0.0, _NUMPY_2_0),
    "product": (np.prod, _NUMPY_2_0), "cumproduct": (np.cumprod, _NUMPY_2_0),
    "alltrue": (np.all, _NUMPY_2_0), "sometrue": (np.any, _NUMPY_2_0),
    "round_": (np.round, _NUMPY_2_0), "asfarray": (_asfarray, _NUMPY_2_0),
    "mat": (np.asmatrix, _NUMPY_2_0), "msort": (_msort, _NUMPY_2_0),
    "issubclass_": (issubclass, _NUMPY_2_0),
    # deprecated in NumPy 2.0, removed in 2.4
    "in1d": (_in1d, "NumPy 2.4"), "trapz": (getattr(np, "trapezoid", None), "NumPy 2.4"),
}

_ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")


def _getargspec(func):
    """Python 3.10's inspect.getargspec: (args, varargs, keywords, defaults) of `func`;
    ValueError for keyword-only parameters or annotations, as it raised."""
    args, varargs, varkw, defaults, kwonlyargs, _, annotations = inspect.getfullargspec(func)
    if kwonlyargs or annotations:
        raise ValueError("Function has keyword-only parameters or annotations, use "
                         "inspect.signature() API which can support them")
    return _ArgSpec(args, varargs, varkw, defaults)


_warned = set()
# installed libraries and the standard library: a lookup there is a feature test (e.g.
# `hasattr(np, "float_")` to tell NumPy 1 from 2), answered as the installed release does
_INSTALLED = tuple({os.path.join(os.path.realpath(folder), "") for folder in [
    *(sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib", "platstdlib")),
    *site.getsitepackages(), site.getusersitepackages()]})


def _from_program(filename):
    """Whether code in `filename` is the program's (not an installed library's, nor the
    standard library's)."""
    return not os.path.realpath(filename).startswith(_INSTALLED)


def _give(module_name, name, value, removed_in):
    """`value` for the removed `module_name.name`, with one warning at the user's line."""
    if (module_name, name) not in _warned:
        _warned.add((module_name, name))
        warnings.warn(f"{module_name}.{name} was removed in {removed_in}; python -m onnxjob "
                      f"run gives {_described(value)}", UserWarning, stacklevel=3)
    return value


_NUMPY_FROMSTRING = np.fromstring


def _fromstring(string, dtype=float, count=-1, *, sep="", **kwargs):
    """NumPy 1.x's fromstring: with `sep` empty (its binary mode, deprecated in NumPy 1.14
    and since removed) the bytes of `string` (a str as UTF-8, as 1.x read it) as a new
    array of `dtype`, for the program's code (`cv2.imdecode(np.fromstring(data, np.uint8),
    1)`, OneFlow's summary tags); any other call is NumPy's own."""
    if sep == "" and _from_program(sys._getframe(1).f_code.co_filename):
        if ("numpy", "fromstring") not in _warned:
            _warned.add(("numpy", "fromstring"))
            warnings.warn("numpy.fromstring's binary mode (no sep) was removed in NumPy 2; "
                          "python -m onnxjob run reads the bytes as numpy.frombuffer(...)"
                          ".copy()", UserWarning, stacklevel=2)
        data = string.encode() if isinstance(string, str) else string
        return np.frombuffer(data, dtype=dtype, count=count).copy()
    return _NUMPY_FROMSTRING(string, dtype, count, sep=sep, **kwargs)


def _described(value):
    """How a warning names what a removed name is given as."""
    if getattr(value, "__module__", None) == __name__:
        return "the old function"
    if isinstance(value, type) or callable(value):
        module = getattr(value, "__module__", None)
        module = "numpy" if module and module.startswith("numpy") else module
        return value.__name__ if module in (None, "builtins") else f"{module}.{value.__name__}"
    return repr(value)


def _extend_getattr(module, names):
    """Make `module`'s attribute lookups that fail answer `names` ({name: (value, removed
    in)}) before the module's own __getattr__ (if any) is asked."""
    own = module.__dict__.get("__getattr__")
    if getattr(own, "restores_removed_names", False):
        return

    def __getattr__(name):
        if name in names and _from_program(sys._getframe(1).f_code.co_filename):
            value, removed_in = names[name]
            return _give(module.__name__, name, value, removed_in)
        if own is not None:
            return own(name)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
    __getattr__.restores_removed_names = True
    module.__getattr__ = __getattr__


def restore_removed_names():
    """Give NumPy's, collections' and inspect's removed names back (see the module doc),
    and np.fromstring its binary mode; calling it again does nothing."""
    _extend_getattr(np, NUMPY_NAMES)
    np.fromstring = _fromstring
    # NumPy 2 prints a scalar as `np.float32(0.75)` inside lists and dicts (a program's
    # printed metrics); NumPy 1.x, OneFlow's, printed `0.75`
    np.set_printoptions(legacy="1.25")
    _extend_getattr(collections, {
        name: (getattr(collections.abc, name), "Python 3.10 (collections.abc has it)")
        for name in collections.abc.__all__ if name not in collections.__dict__})
    if sys.version_info >= (3, 11):
        _extend_getattr(inspect, {"getargspec": (_getargspec, "Python 3.11")})
