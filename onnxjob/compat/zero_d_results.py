"""0-d job results that also read as OneFlow <= 0.4's one-element vectors on the host.

A job hands a full reduction (a loss), an element count or the argmax of a vector back as
a 0-d array, OneFlow 0.5's shape, so `float(loss)` and `f"{loss:.3f}"` work. OneFlow <= 0.4
returned those values with shape (1,) (its `Shape::RemoveOnes` kept one axis), and
programs written for it index them: `loss = loss[0]`, `loss[-1]`, `loss[:1]`,
`len(loss)`, `for v in loss`. `ZeroDResult` is the 0-d array that also takes those forms
as the one-element vector did (compat/zero_d_inputs.py does the same for ops inside a
job); everything else about it is the plain 0-d array's, so its shape stays () and what
NumPy computes from it (`loss * 2`, `loss.mean()`) is NumPy's own scalar or array. Fed
back to a job, a 0-d array goes where 0.4's (1,) value went (`as_fed`).

A job defined by code written for OneFlow <= 0.4 (`import oneflow as flow`:
compat/generations.written_for_0_4) gets those values with 0.4's own shape, (1,)
(`host_results(values, as_vector=True)`): such programs also hand them to NumPy as vectors
(`np.concatenate(losses)`, `np.array_equal(out, [x])`, `out.tolist()[0]`), which no 0-d
array can stand in for; `float(loss)` works on them, and on the one-element arrays computed
from them, as with NumPy 1.x (VectorOfOne).
"""
import numbers

import numpy as np


def _reads_as_vector(key):
    """Whether `key` indexes a vector (an integer, a slice, or a 1-tuple of one), where
    a 0-d array would refuse it."""
    if isinstance(key, tuple):
        return len(key) == 1 and _reads_as_vector(key[0])
    if isinstance(key, (bool, np.bool_)):
        return False
    return isinstance(key, (numbers.Integral, slice))


_PYTHON_NUMBERS = (int, float, complex)


class _HostResult(np.ndarray):
    """A result array whose repr is the plain array's and whose derived arrays are plain:
    a ufunc's result (arithmetic, comparisons, reductions such as .mean()) is what it is
    for a plain array, a NumPy scalar or a plain ndarray (`_derived`), computed as NumPy
    1.x computed it where every operand is 0-d: a Python number counts as a 64-bit NumPy
    value there (`total = 0.0; total += loss` is float64, a Python float that json
    writes, as with the NumPy of OneFlow's time; NumPy 2 keeps the float32)."""

    def __repr__(self):
        return repr(np.asarray(self))

    def __reduce__(self):
        # pickled as the plain array: loadable where onnxjob is not installed
        return np.asarray(self).__reduce__()

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if method == "__call__" and all(np.ndim(x) == 0 for x in inputs):
            inputs = tuple(np.asarray(x) if type(x) in _PYTHON_NUMBERS else x for x in inputs)
        inputs = tuple(x.view(np.ndarray) if isinstance(x, _HostResult) else x for x in inputs)
        if out is not None:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, _HostResult) else o
                                  for o in out)
        result = getattr(ufunc, method)(*inputs, **kwargs)
        if isinstance(result, tuple):
            return tuple(self._derived(r) for r in result)
        return self._derived(result)

    def __array_wrap__(self, array, context=None, return_scalar=False):
        return self._derived(array, return_scalar)

    def _derived(self, value, return_scalar=False):
        """What NumPy computed from this result, as it is for a plain array."""
        if not isinstance(value, np.ndarray):
            return value
        value = value.view(np.ndarray)
        return value[()] if return_scalar or value.ndim == 0 else value


class ZeroDResult(_HostResult):
    """A 0-d ndarray that indexes, iterates and has len() as a (1,) vector (see the
    module doc); derived arrays of other shapes behave as plain ndarrays."""

    def __getitem__(self, key):
        if self.ndim == 0 and _reads_as_vector(key):
            return np.asarray(self).reshape(1)[key]
        return super().__getitem__(key)

    def __len__(self):
        return 1 if self.ndim == 0 else super().__len__()

    def __iter__(self):
        return iter(np.asarray(self).reshape(1)) if self.ndim == 0 else super().__iter__()


class HostArray(_HostResult):
    """A job's result array that, where it or an array taken from it has one element,
    converts to a Python number as NumPy 1.x let any one-element array do: `float(prob[:,
    1])`, `int(np.argmax(prob, 1))`, `"%.4f" % prob.max(axis=1)` of a batch-1 prediction
    (NumPy 2 refuses arrays of rank > 0 there). Views keep the class; what NumPy computes
    from it is a plain array unless it has one element."""

    def _derived(self, value, return_scalar=False):
        value = super()._derived(value, return_scalar)
        if type(value) is np.ndarray and value.size == 1:
            return value.view(VectorOfOne)
        return value

    def _number(self, kind):
        """kind(its one element), or NumPy's own refusal for a view of another size."""
        plain = np.asarray(self)
        return kind(plain.reshape(-1)[0]) if plain.size == 1 else kind(plain)

    def __float__(self):
        return self._number(float)

    def __int__(self):
        return self._number(int)

    def __complex__(self):
        return self._number(complex)


class VectorOfOne(HostArray):
    """OneFlow <= 0.4's one-element result, shape (1,), and any one-element array
    (`float(loss)`, `int(argmax)`, `"%.3f" % loss`); what NumPy computes from it with one
    element converts too (`total += loss`, `total / steps`, then `"%.3f" % total`, as a
    0.4 program formats its epoch's mean loss)."""


def host_result(array, as_vector=False):
    """`array` as the caller receives it: a 0-d ndarray as a ZeroDResult view, or with
    `as_vector` as OneFlow <= 0.4's (1,) vector (a VectorOfOne); any other numeric
    array as a HostArray view (a VectorOfOne where it has one element), so a batch-1
    prediction and the arrays taken from it convert to numbers (`int(pred)`, `"%d" %
    pred`, `float(prob[:, 1])`) as with the NumPy 1.x of OneFlow's time."""
    if type(array) is not np.ndarray:
        return array
    if array.ndim == 0:
        return array.reshape(1).view(VectorOfOne) if as_vector else array.view(ZeroDResult)
    if array.dtype.kind not in "biufc":
        return array
    return array.view(VectorOfOne) if array.size == 1 else array.view(HostArray)


def host_results(values, as_vector=False):
    """`values` (one array per device, or a tensor list) with each 0-d ndarray as a
    ZeroDResult, or with `as_vector` as a (1,) vector (see the module doc)."""
    return [host_result(v, as_vector) for v in values]


def as_fed(value, placeholder_shape):
    """`value`, an argument for a placeholder of `placeholder_shape`, as the (1,) vector
    OneFlow <= 0.4 returned if it is a 0-d ndarray and the placeholder has one axis; else
    `value` itself."""
    if isinstance(value, np.ndarray) and value.ndim == 0 and len(placeholder_shape) == 1:
        return value.reshape(1).view(np.ndarray)
    return value
