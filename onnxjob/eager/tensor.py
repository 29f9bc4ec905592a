"""`flow.Tensor` and `flow.nn.Parameter`: eager tensors, computed as their ops are called.

OneFlow 0.4/0.5 expose an eager tensor beside the job functions: made from data, computed
op by op, differentiated with `tensor.backward()` / `flow.autograd.grad` and updated by the
optimizers of `flow.experimental.optim`. Here a tensor holds its value as a NumPy array;
a flow op called on tensors outside a job (any op of flow.math, flow.nn, ... : the same
functions a job's body calls) runs at once on onnxruntime through the tape
(eager/tape.py), which also records it for backward when an input requires gradients.
"""
import numbers
import operator

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import UnsupportedAPIError
from onnxjob.frontend.config import process_config
from onnxjob.graph.tracer import Blob, int64_constant, op, tracing
from onnxjob.source_info import user_location
from onnxjob.eager.tape import Tape, current_tape, grad_enabled
from onnxjob.ops import activations as _activations
from onnxjob.ops import casts as _casts
from onnxjob.ops import linalg as _linalg
from onnxjob.ops import math as _math
from onnxjob.ops import shapes as _shapes


class Tensor:
    """An eager tensor (OneFlow's flow.Tensor).

    `flow.Tensor(data)` takes an array, a (nested) list or a number; `flow.Tensor(2, 3)`
    makes a tensor of that shape, of zeros. The dtype is float32 unless `dtype` says
    otherwise, as OneFlow's constructor. `requires_grad=True` makes it a leaf whose
    gradient backward() accumulates in `.grad`."""

    # what onnxjob's op wrappers look for (frontend/blob_arguments.py)
    _eager_tensor = True
    __hash__ = object.__hash__      # (== is elementwise, as OneFlow's; identity hashes)

    def __init__(self, *args, dtype=None, device=None, requires_grad=False, placement=None,
                 sbp=None, is_consistent=False, is_lazy=False, data_initializer=None,
                 determining_initializer=None):
        # (device, placement, sbp, is_consistent, is_lazy: where it lives; onnxjob's eager
        # tensors live on the host of one process, which computes the same numbers)
        np_dtype = np.float32 if dtype is None else dtypes.to_numpy(dtype)
        if determining_initializer is not None:
            raise UnsupportedAPIError(f"{user_location()}: flow.Tensor(determining_initializer"
                                      "=...) is OneFlow's internal hook; give the data, or a "
                                      "shape with data_initializer=")
        if len(args) == 1 and isinstance(args[0], Tensor):
            value = args[0]._value
        elif len(args) == 1 and not isinstance(args[0], numbers.Integral):
            value = args[0]
        elif all(isinstance(a, numbers.Integral) for a in args):
            shape = tuple(int(a) for a in args)
            value = np.zeros(shape, np_dtype) if data_initializer is None else \
                data_initializer.sample(shape, np_dtype, _random_stream(), model_io=True)
        else:
            raise TypeError(f"flow.Tensor takes data (an array, list or tensor) or a shape of "
                            f"ints, got {args!r}")
        self._hold(np.array(value, dtype=np_dtype, order="C"), requires_grad)

    def _hold(self, array, requires_grad, tape=None, blob=None):
        """Set the state: the value `array` (taken as it is), no gradient yet, and the
        history `blob` on `tape` where it has one."""
        self._value = array
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._tape, self._blob = tape, blob

    @classmethod
    def _made(cls, array, tape=None, blob=None):
        """A tensor holding `array`, with its history `blob` on `tape` (then it requires
        gradients)."""
        tensor = cls.__new__(cls)
        tensor._hold(array, tape is not None, tape, blob)
        return tensor

    def _blob_in(self, tape):
        """The Blob of this tensor's history on `tape`, or None."""
        return self._blob if self._tape is tape else None

    def _set_value(self, array):
        """Replace the value (the optimizers' update), keeping dtype and shape."""
        self._value = np.asarray(array, dtype=self._value.dtype).reshape(self._value.shape)

    # -- what the tensor is ------------------------------------------------------------
    @property
    def shape(self):
        return tuple(self._value.shape)

    @property
    def dtype(self):
        return dtypes.from_numpy(self._value.dtype)

    @property
    def ndim(self):
        return self._value.ndim

    @property
    def is_leaf(self):
        """Whether it has no history: made by the user, or by ops that recorded none."""
        return self._tape is None

    @property
    def grad_fn(self):
        """None for a leaf, else the op that made it (its name)."""
        return None if self._blob is None else self._blob.producer.op_type

    def dim(self):
        return self._value.ndim

    def size(self, idx=None):
        return self.shape if idx is None else self.shape[idx]

    def numel(self):
        return int(self._value.size)

    nelement = numel

    def numpy(self):
        """A copy of the value."""
        return self._value.copy()

    def item(self):
        return self._value.item()

    def tolist(self):
        return self._value.tolist()

    def __len__(self):
        return len(self._value)

    def __repr__(self):
        return (f"tensor({np.array2string(self._value, separator=', ')}, "
                f"dtype=oneflow.{self.dtype.__name__})")

    __str__ = __repr__

    def __bool__(self):
        return bool(self._value)

    def __float__(self):
        return float(self._value)

    def __int__(self):
        return int(self._value)

    def __array__(self, dtype=None, copy=None):
        return self._value if dtype is None else self._value.astype(dtype)

    # -- gradients (backward(): eager/autograd.py adds it) ------------------------------
    def detach(self):
        """The same value with no history and no gradient."""
        return Tensor._made(self._value)

    def requires_grad_(self, requires_grad=True):
        if not self.is_leaf:
            raise RuntimeError("you can only change requires_grad flags of leaf variables")
        self.requires_grad = bool(requires_grad)
        return self

    def zeros_(self):
        self._value = np.zeros_like(self._value)
        return self

    zero_ = zeros_

    def fill_(self, value):
        self._value = np.full_like(self._value, value)
        return self

    def copy_(self, other):
        self._set_value(other._value if isinstance(other, Tensor) else other)
        return self

    # -- ops: the same op functions as a job's, run at once -----------------------------
    def __add__(self, other): return apply(operator.add, (self, other), {})
    def __radd__(self, other): return apply(operator.add, (other, self), {})
    def __sub__(self, other): return apply(operator.sub, (self, other), {})
    def __rsub__(self, other): return apply(operator.sub, (other, self), {})
    def __mul__(self, other): return apply(operator.mul, (self, other), {})
    def __rmul__(self, other): return apply(operator.mul, (other, self), {})
    def __truediv__(self, other): return apply(operator.truediv, (self, other), {})
    def __rtruediv__(self, other): return apply(operator.truediv, (other, self), {})
    def __neg__(self): return apply(operator.neg, (self,), {})
    def __matmul__(self, other): return self.matmul(other)
    def __pow__(self, exponent): return self.pow(exponent)
    def __eq__(self, other): return apply(operator.eq, (self, other), {})
    def __ne__(self, other): return apply(operator.ne, (self, other), {})
    def __lt__(self, other): return apply(operator.lt, (self, other), {})
    def __le__(self, other): return apply(operator.le, (self, other), {})
    def __gt__(self, other): return apply(operator.gt, (self, other), {})
    def __ge__(self, other): return apply(operator.ge, (self, other), {})

    def __getitem__(self, key):
        """Basic indexing: ints, slices (with steps), Ellipsis and None, differentiable."""
        return apply(_index, (self, key), {})

    def matmul(self, other):
        return _call(_linalg.matmul, self, other)

    def pow(self, exponent):
        return _call(_math.pow, self, exponent)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = shape[0]
        return _call(_shapes.reshape, self, list(shape))

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        return _call(_shapes.flatten, self, start_dim, end_dim)

    def transpose(self, dim0, dim1):
        perm = list(range(self.ndim))
        perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
        return _call(_shapes.transpose, self, perm)

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
            dims = dims[0]
        return _call(_shapes.transpose, self, list(dims))

    @property
    def T(self):
        return self.permute(*reversed(range(self.ndim)))

    def sum(self, dim=None, keepdim=False):
        return _call(_math.reduce_sum, self, dim, keepdim)

    def mean(self, dim=None, keepdim=False):
        return _call(_math.reduce_mean, self, dim, keepdim)

    def max(self, dim=None, keepdim=False):
        return _call(_math.reduce_max, self, dim, keepdim)

    def min(self, dim=None, keepdim=False):
        return _call(_math.reduce_min, self, dim, keepdim)

    def exp(self): return _call(_math.exp, self)
    def log(self): return _call(_math.log, self)
    def sqrt(self): return _call(_math.sqrt, self)
    def abs(self): return _call(_math.abs, self)
    def relu(self): return _call(_math.relu, self)
    def sigmoid(self): return _call(_math.sigmoid, self)
    def tanh(self): return _call(_math.tanh, self)
    def square(self): return _call(_math.square, self)

    def add(self, other): return self + other
    def sub(self, other): return self - other
    def mul(self, other): return self * other
    def div(self, other): return self / other

    def argmax(self, dim=-1):
        return _call(_math.argmax, self, dim)

    def squeeze(self, dim=None):
        return _call(_shapes.squeeze, self, dim if dim is None or isinstance(dim, (list, tuple))
                     else [dim])

    def unsqueeze(self, dim):
        return _call(_shapes.expand_dims, self, dim)

    def clamp(self, min=None, max=None):
        return _call(_math.clip_by_value, self, min, max)

    clip = clamp

    def float(self): return self.to(dtypes.float32)
    def double(self): return self.to(dtypes.float64)
    def int(self): return self.to(dtypes.int32)
    def long(self): return self.to(dtypes.int64)

    def softmax(self, dim=-1):
        return _call(_activations.softmax, self, dim)

    def to(self, dtype=None, *args, **kwargs):
        """A cast to `dtype` (devices: onnxjob's eager tensors live on the host)."""
        if dtype is None or isinstance(dtype, str):
            return self
        return _call(_casts.cast, self, dtype)


class Parameter(Tensor):
    """`flow.nn.Parameter(tensor, requires_grad=True)`: a leaf tensor an optimizer
    updates, sharing the given tensor's value."""

    def __init__(self, data, requires_grad=True):
        self._hold(data._value if isinstance(data, Tensor) else np.asarray(data, np.float32),
                   requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


_streams = {}


def _random_stream():
    """The generator of eager random values: one per process seed (flow.manual_seed /
    flow.config.seed), so a seeded program draws the same values each run."""
    seed = process_config.random_seed
    if seed not in _streams:
        _streams[seed] = np.random.default_rng(seed)
    return _streams[seed]


def is_tensor(value):
    return getattr(type(value), "_eager_tensor", False)


def apply(fn, args, kwargs):
    """`fn(*args, **kwargs)` for an op function `fn`, with the eager tensors among the
    arguments (in lists and tuples too) entered into a tape: the op runs at once, and
    the Blobs it returns come back as tensors (in the same structure)."""
    tensors = [t for t in _flat((args, kwargs)) if is_tensor(t)]
    record = grad_enabled() and any(t.requires_grad for t in tensors)
    tape = current_tape() if record else Tape(record=False)
    with tracing(tape):
        result = fn(*_entered(tape, args), **_entered(tape, kwargs))
    return _as_tensors(tape, result)


def _flat(value):
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flat(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flat(item)
    else:
        yield value


def _entered(tape, value):
    if is_tensor(value):
        return tape.enter(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_entered(tape, v) for v in value)
    if isinstance(value, dict):
        return {k: _entered(tape, v) for k, v in value.items()}
    return value


def _as_tensors(tape, value):
    if isinstance(value, Blob):
        array = tape.value_of(value)
        if tape.record and id(value) in tape.requiring:
            return Tensor._made(array, tape, value)
        return Tensor._made(array)
    if isinstance(value, (list, tuple)):
        return type(value)(_as_tensors(tape, v) for v in value)
    return value


def _index(blob, key):
    """`blob[key]` for basic indexing, as Slice, Squeeze and Unsqueeze nodes."""
    key = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in key) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    taking = sum(k is not None and k is not Ellipsis for k in key)
    if taking > len(blob.shape):
        raise IndexError(f"too many indices for a tensor of {len(blob.shape)} dimensions")
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (len(blob.shape) - taking) + key[at + 1:]
    starts, ends, axes, steps, squeeze, new_axes = [], [], [], [], [], []
    axis = 0
    for k in key:
        if k is None:
            new_axes.append(axis + len(new_axes) - len(squeeze))
            continue
        size = blob.shape[axis]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            if (start, stop, step) != (0, size, 1):
                # (a negative step's stop of -1 means "past the start": INT_MIN for ONNX)
                starts.append(start)
                ends.append(stop if stop >= 0 else -(2 ** 63))
                axes.append(axis)
                steps.append(step)
        elif isinstance(k, numbers.Integral):
            index = int(k) + size if k < 0 else int(k)
            if not 0 <= index < size:
                raise IndexError(f"index {int(k)} is out of bounds for dimension {axis} "
                                 f"with size {size}")
            starts.append(index)
            ends.append(index + 1)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        else:
            raise IndexError(f"onnxjob's eager tensors take ints, slices, ... and None as "
                             f"indices, got {type(k).__name__}")
        axis += 1
    out = blob
    if axes:
        out = op("Slice", out, *(int64_constant(out, v) for v in (starts, ends, axes, steps)))
    if squeeze:
        out = op("Squeeze", out, int64_constant(out, squeeze))
    if new_axes:
        out = op("Unsqueeze", out, int64_constant(out, new_axes))
    return out


def _call(fn, *args):
    """Op function `fn` (a job body's) on tensors."""
    return apply(fn, args, {})
