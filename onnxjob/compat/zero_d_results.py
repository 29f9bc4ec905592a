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


class _HostResult(np.ndarray):
    """A result array whose repr is the plain array's and whose derived arrays are plain:
    a ufunc's result (arithmetic, comparisons, reductions such as .mean()) is what it is
    for a plain array, a NumPy scalar or a plain ndarray."""

    def __repr__(self):
        return repr(np.asarray(self))

    def __array_wrap__(self, array, context=None, return_scalar=False):
        array = array.view(np.ndarray)
        return array[()] if return_scalar or array.ndim == 0 else array


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


class VectorOfOne(_HostResult):
    """OneFlow <= 0.4's one-element result, shape (1,), that also converts to a Python
    number as NumPy 1.x let any one-element array do (`float(loss)`, `int(argmax)`,
    `"%.3f" % loss`; NumPy 2 refuses arrays of rank > 0 there). What NumPy computes from
    it with shape (1,) converts too (`total += loss`, `total / steps`, then `"%.3f" % total`,
    as a 0.4 program formats its epoch's mean loss); derived arrays of other shapes are
    plain."""

    def __array_wrap__(self, array, context=None, return_scalar=False):
        result = super().__array_wrap__(array, context, return_scalar)
        if type(result) is np.ndarray and result.shape == (1,):
            return result.view(VectorOfOne)
        return result

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


def host_result(array, as_vector=False):
    """`array` as the caller receives it: a 0-d ndarray as a ZeroDResult view, or with
    `as_vector` as OneFlow <= 0.4's (1,) vector (a VectorOfOne); any other one-element
    array as a VectorOfOne view too, so a batch-1 prediction converts to a number
    (`int(pred)`, `"%d" % pred`) as it did with the NumPy 1.x of OneFlow's time."""
    if type(array) is not np.ndarray:
        return array
    if array.ndim == 0:
        return array.reshape(1).view(VectorOfOne) if as_vector else array.view(ZeroDResult)
    return array.view(VectorOfOne) if array.size == 1 else array


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
