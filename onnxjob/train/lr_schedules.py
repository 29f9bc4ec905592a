"""Learning-rate schedules computed inside the graph from the train-step counter (§5.7).

As OneFlow's learning_rate_schedule kernel: the base rate is a float32 attribute, the
warmup or decay is computed in float64 from the int64 train step (0 at the first call)
and the result is a float32 scalar. Each scheduler's `lr(step)` emits a handful of
scalar ops; `numpy_lr(t)` is the same rule in Python for tests.
"""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.compat.generations import print_deprecated
from onnxjob.errors import TraceError
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import as_blob, op
from onnxjob.train.update_rules import find_blob

_FLOAT64 = dtypes.float64.ir_dtype.value
_FLOAT32 = dtypes.float32.ir_dtype.value


def _d(t, value):
    return as_blob(np.float64(value), like=t)


def _cos(angle):
    """cos(angle) of a float64 scalar as Sin(pi/2 - angle): onnxruntime's CPU EP has a
    float64 Sin kernel in every release onnxjob takes (>= 1.21), a float64 Cos only in
    later ones (1.23 and 1.24 refuse it; 1.32 has it). pi/2 - angle is rounded once, within
    an ulp of pi/2 for the schedules' angles: far below the float32 result's rounding."""
    return op("Sin", _d(angle, math.pi / 2) - angle)


def _f32(value):
    """A float32 proto field read back as a double (OneFlow's `float learning_rate`)."""
    return float(np.float32(value))


class _Warmup:
    def __init__(self, kind, steps, factor):
        self.kind, self.steps, self.factor = kind, steps, factor


class warmup:
    """flow.optimizer.warmup.linear / constant."""

    @staticmethod
    def linear(steps, start_multiplier):
        """lr * (start + (1 - start) * step / steps) while step < steps."""
        return _Warmup("linear", steps, start_multiplier)

    @staticmethod
    def constant(steps, multiplier):
        """lr * multiplier while step < steps."""
        return _Warmup("constant", steps, multiplier)


class LrScheduler:
    """Base: `base_lr` (float32) decayed by `decayed(t)`; optional warmup before the decay.

    `lr_lbn` is the learning-rate Blob of a CustomScheduler."""

    def __init__(self, base_lr=None, lr_lbn=None, warmup=None):
        self.base_lr = base_lr
        self.lr_lbn = lr_lbn
        self.warmup = warmup

    def lr(self, step):
        """The float32 scalar learning rate of train step `step` (an int64 Blob)."""
        t = op("Cast", reshape_to(step, ()), to=_FLOAT64)
        lr = self.decayed(t)
        if self.warmup is not None:
            lr = op("Where", op("Less", t, _d(t, self.warmup.steps)), self._warm(t), lr)
        return op("Cast", lr, to=_FLOAT32)

    def _warm(self, t):
        w = self.warmup
        if w.kind == "linear":
            mult = _d(t, w.factor) + _d(t, 1.0 - w.factor) * (t / _d(t, w.steps))
        else:
            mult = _d(t, w.factor)
        return _d(t, _f32(self.base_lr)) * mult

    def numpy_lr(self, t):
        """The same rule in Python (float64, then rounded to float32)."""
        w = self.warmup
        if w is not None and t < w.steps:
            base = _f32(self.base_lr)
            if w.kind == "linear":
                return _f32(base * (w.factor + (1.0 - w.factor) * (t / w.steps)))
            return _f32(base * w.factor)
        return _f32(self.numpy_decayed(t))


class PiecewiseConstantScheduler(LrScheduler):
    """values[i] for the first i with step <= boundaries[i] (else the last value)."""

    def __init__(self, boundaries, values, warmup=None):
        assert len(values) == len(boundaries) + 1, (
            "PiecewiseConstantScheduler needs len(values) == len(boundaries) + 1")
        super().__init__(base_lr=values[0], warmup=warmup)
        self.boundaries, self.values = list(boundaries), list(values)

    def decayed(self, t):
        lr = _d(t, self.values[-1])
        for b, v in reversed(list(zip(self.boundaries, self.values))):
            lr = op("Where", op("LessOrEqual", t, _d(t, b)), _d(t, v), lr)
        return lr

    def numpy_decayed(self, t):
        for b, v in zip(self.boundaries, self.values):
            if t <= b:
                return v
        return self.values[-1]


class PiecewiseScalingScheduler(LrScheduler):
    """base_lr * [1, *scale][i] for the first i with step <= boundaries[i] (OneFlow takes
    one scale per boundary; a single number scales every boundary alike)."""

    def __init__(self, base_lr, boundaries, scale, warmup=None):
        if not isinstance(scale, (list, tuple, np.ndarray)):     # (a NumPy scalar too)
            scale = [float(scale)] * len(boundaries)
        assert len(scale) == len(boundaries), (
            "PiecewiseScalingScheduler needs one scale per boundary (len(scale) == "
            f"len(boundaries)), got {len(scale)} and {len(boundaries)}")
        super().__init__(base_lr=base_lr, warmup=warmup)
        self.boundaries, self.scales = list(boundaries), [1.0] + list(scale)

    def decayed(self, t):
        scale = _d(t, self.scales[-1])
        for b, s in reversed(list(zip(self.boundaries, self.scales))):
            scale = op("Where", op("LessOrEqual", t, _d(t, b)), _d(t, s), scale)
        return scale * _d(t, _f32(self.base_lr))

    def numpy_decayed(self, t):
        for b, s in zip(self.boundaries, self.scales):
            if t <= b:
                return s * _f32(self.base_lr)
        return self.scales[-1] * _f32(self.base_lr)


class CosineScheduler(LrScheduler):
    """base_lr * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, steps) / steps)) + alpha)."""

    def __init__(self, base_lr, steps, alpha=0.0, warmup=None):
        super().__init__(base_lr=base_lr, warmup=warmup)
        self.steps, self.alpha = steps, alpha

    def decayed(self, t):
        cur = op("Min", t, _d(t, self.steps))
        cos = _d(t, 0.5) * (_d(t, 1.0) + _cos(_d(t, math.pi) * cur / _d(t, self.steps)))
        return _d(t, _f32(self.base_lr)) * (_d(t, 1.0 - self.alpha) * cos + _d(t, self.alpha))

    def numpy_decayed(self, t):
        t = min(t, self.steps)
        cos = 0.5 * (1.0 + math.cos(math.pi * t / self.steps))
        return _f32(self.base_lr) * ((1.0 - self.alpha) * cos + self.alpha)


CosineDecayScheduler = CosineScheduler


class LinearCosineScheduler(LrScheduler):
    """base_lr * ((alpha + linear) * cosine + beta), both of min(step, steps) / steps."""

    def __init__(self, base_lr, steps, num_periods=0.5, alpha=0.0, beta=0.001, warmup=None):
        super().__init__(base_lr=base_lr, warmup=warmup)
        self.steps, self.num_periods, self.alpha, self.beta = steps, num_periods, alpha, beta

    def decayed(self, t):
        cur = op("Min", t, _d(t, self.steps))
        steps = _d(t, self.steps)
        linear = (steps - cur) / steps
        cos = _cos(_d(t, math.pi * 2.0 * self.num_periods) * cur / steps)
        cosine = _d(t, 0.5) * (_d(t, 1.0) + cos)
        factor = (_d(t, self.alpha) + linear) * cosine + _d(t, self.beta)
        return _d(t, _f32(self.base_lr)) * factor

    def numpy_decayed(self, t):
        t = min(t, self.steps)
        linear = (self.steps - t) / self.steps
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * self.num_periods * t / self.steps))
        return _f32(self.base_lr) * ((self.alpha + linear) * cosine + self.beta)


class PolynomialScheduler(LrScheduler):
    """(base_lr - end) * (1 - cur / decay_steps)**power + end. Without `cycle`, cur =
    min(step, steps) and decay_steps = steps; with it, cur = max(step, 1) (OneFlow counts
    step 0 as 1) and decay_steps = steps * ceil(cur / steps)."""

    def __init__(self, base_lr, steps, end_learning_rate=0.0001, power=1.0, cycle=False,
                 warmup=None):
        super().__init__(base_lr=base_lr, warmup=warmup)
        self.steps, self.end, self.power, self.cycle = steps, end_learning_rate, power, cycle

    def decayed(self, t):
        steps = _d(t, self.steps)
        if self.cycle:
            cur = op("Max", t, _d(t, 1.0))
            steps = steps * op("Ceil", cur / steps)
        else:
            cur = op("Min", t, steps)
        frac = op("Pow", _d(t, 1.0) - cur / steps, _d(t, self.power))
        return _d(t, _f32(self.base_lr) - self.end) * frac + _d(t, self.end)

    def numpy_decayed(self, t):
        steps = float(self.steps)
        if self.cycle:
            cur = max(float(t), 1.0)
            steps = steps * math.ceil(cur / steps)
        else:
            cur = min(float(t), steps)
        return (_f32(self.base_lr) - self.end) * (1.0 - cur / steps) ** self.power + self.end


class PolynomialSchduler(PolynomialScheduler):
    """OneFlow's misspelled, deprecated name of PolynomialScheduler."""

    def __init__(self, base_lr, steps, end_learning_rate=0.0001, power=1.0, cycle=False,
                 warmup=None):
        print_deprecated("optimizer.PolynomialSchduler", "optimizer.PolynomialScheduler")
        super().__init__(base_lr, steps, end_learning_rate, power, cycle, warmup)


class _RateScheduler(LrScheduler):
    """Decay by p = step / steps (floored with `staircase`)."""

    def __init__(self, base_lr, steps, decay_rate, staircase=False, warmup=None):
        super().__init__(base_lr=base_lr, warmup=warmup)
        self.steps, self.rate, self.staircase = steps, decay_rate, staircase

    def _p(self, t):
        p = t / _d(t, self.steps)
        return op("Floor", p) if self.staircase else p

    def _np_p(self, t):
        p = t / self.steps
        return math.floor(p) if self.staircase else p


class ExponentialScheduler(_RateScheduler):
    """base_lr * decay_rate**p."""

    def decayed(self, t):
        return _d(t, _f32(self.base_lr)) * op("Pow", _d(t, self.rate), self._p(t))

    def numpy_decayed(self, t):
        return _f32(self.base_lr) * self.rate ** self._np_p(t)


class InverseTimeScheduler(_RateScheduler):
    """base_lr / (1 + decay_rate * p)."""

    def decayed(self, t):
        return _d(t, _f32(self.base_lr)) / (_d(t, 1.0) + _d(t, self.rate) * self._p(t))

    def numpy_decayed(self, t):
        return _f32(self.base_lr) / (1.0 + self.rate * self._np_p(t))


class NaturalExpScheduler(_RateScheduler):
    """base_lr * exp(-decay_rate * p)."""

    def decayed(self, t):
        return _d(t, _f32(self.base_lr)) * op("Exp", _d(t, -self.rate) * self._p(t))

    def numpy_decayed(self, t):
        return _f32(self.base_lr) * math.exp(-self.rate * self._np_p(t))


class CustomScheduler(LrScheduler):
    """The learning rate is a one-element Blob computed by the job itself: the Blob or its
    logical_blob_name (OneFlow passes the name)."""

    def __init__(self, lbn):
        super().__init__(lr_lbn=lbn)

    def lr(self, step):
        lr = self.lr_lbn
        if isinstance(lr, str):
            lr = find_blob(step.builder, lr)
        if lr is None or not np.issubdtype(lr.np_dtype, np.floating) \
                or int(np.prod(lr.shape)) != 1:
            raise TraceError(f"CustomScheduler({self.lr_lbn!r}) needs a floating blob of one "
                             "element of this job")
        lr = reshape_to(lr, ())
        return lr if lr.np_dtype == np.float32 else op("Cast", lr, to=_FLOAT32)
