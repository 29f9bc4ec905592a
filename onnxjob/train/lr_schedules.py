"""Learning-rate schedules computed inside the graph from the train-step counter (§5.7).

`t` is the step as a float scalar Blob (0 at the first call). Each scheduler's `lr(t)`
emits a handful of scalar ops; `numpy_lr(t)` is the same rule in NumPy for tests.
"""
import math

import numpy as np

from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import as_blob, op


def _c(t, value):
    return as_blob(np.float32(value), like=t)


def _min(t, v):
    return op("Min", t, _c(t, v))


class _Warmup:
    def __init__(self, kind, steps, factor):
        self.kind, self.steps, self.factor = kind, steps, factor


class warmup:
    """flow.optimizer.warmup.linear / constant."""

    @staticmethod
    def linear(steps, start_multiplier):
        return _Warmup("linear", steps, start_multiplier)

    @staticmethod
    def constant(steps, multiplier):
        return _Warmup("constant", steps, multiplier)


class LrScheduler:
    """Base: `base_lr` decayed by `decay(t)`; optional warmup before the decay."""

    base_lr = 0.0

    def __init__(self, warmup=None):
        self.warmup = warmup

    def lr(self, t):
        decayed = self.decayed(t)
        if self.warmup is None:
            return decayed
        w = self.warmup
        if w.kind == "linear":
            mult = _c(t, w.factor) + _c(t, 1 - w.factor) * t * _c(t, 1.0 / w.steps)
        else:
            mult = _c(t, w.factor)
        warm = _c(t, self.base_lr) * mult
        return op("Where", op("Less", t, _c(t, w.steps)), warm, decayed)

    def numpy_lr(self, t):
        if self.warmup is not None and t < self.warmup.steps:
            w = self.warmup
            mult = w.factor + (1 - w.factor) * t / w.steps if w.kind == "linear" else w.factor
            return self.base_lr * mult
        return self.numpy_decayed(t)


class PiecewiseConstantScheduler(LrScheduler):
    def __init__(self, boundaries, values, warmup=None):
        super().__init__(warmup)
        assert len(values) == len(boundaries) + 1, (
            "PiecewiseConstantScheduler needs len(values) == len(boundaries) + 1")
        self.boundaries, self.values = list(boundaries), list(values)
        self.base_lr = values[0]

    def decayed(self, t):
        lr = _c(t, self.values[-1])
        for b, v in reversed(list(zip(self.boundaries, self.values))):
            lr = op("Where", op("LessOrEqual", t, _c(t, b)), _c(t, v), lr)
        return lr

    def numpy_decayed(self, t):
        for b, v in zip(self.boundaries, self.values):
            if t <= b:
                return v
        return self.values[-1]


class PiecewiseScalingScheduler(PiecewiseConstantScheduler):
    """base_lr * [1, *scale][i] for the first i with t <= boundaries[i] (OneFlow takes one
    scale per boundary; a single number scales every boundary alike)."""

    def __init__(self, base_lr, boundaries, scale, warmup=None):
        if isinstance(scale, (int, float)):
            scale = [scale] * len(boundaries)
        assert len(scale) == len(boundaries), (
            "PiecewiseScalingScheduler needs one scale per boundary (len(scale) == "
            f"len(boundaries)), got {len(scale)} and {len(boundaries)}")
        super().__init__(boundaries, [base_lr * s for s in [1.0] + list(scale)], warmup)
        self.base_lr = base_lr


class CosineScheduler(LrScheduler):
    def __init__(self, base_lr, steps, alpha=0.0, warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps, self.alpha = base_lr, steps, alpha

    def decayed(self, t):
        cos = op("Cos", _min(t, self.steps) * _c(t, math.pi / self.steps))
        frac = _c(t, (1 - self.alpha) * 0.5) * (_c(t, 1.0) + cos) + _c(t, self.alpha)
        return _c(t, self.base_lr) * frac

    def numpy_decayed(self, t):
        t = min(t, self.steps)
        return self.base_lr * ((1 - self.alpha) * 0.5 * (1 + math.cos(math.pi * t / self.steps))
                               + self.alpha)


CosineDecayScheduler = CosineScheduler


class LinearCosineScheduler(LrScheduler):
    def __init__(self, base_lr, steps, num_periods=0.5, alpha=0.0, beta=0.001, warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps = base_lr, steps
        self.num_periods, self.alpha, self.beta = num_periods, alpha, beta

    def decayed(self, t):
        tm = _min(t, self.steps)
        linear = (_c(t, self.steps) - tm) * _c(t, 1.0 / self.steps)
        cos = op("Cos", tm * _c(t, math.pi * 2 * self.num_periods / self.steps))
        cosine = _c(t, 0.5) * (_c(t, 1.0) + cos)
        return _c(t, self.base_lr) * ((_c(t, self.alpha) + linear) * cosine + _c(t, self.beta))

    def numpy_decayed(self, t):
        t = min(t, self.steps)
        linear = (self.steps - t) / self.steps
        cosine = 0.5 * (1 + math.cos(math.pi * 2 * self.num_periods * t / self.steps))
        return self.base_lr * ((self.alpha + linear) * cosine + self.beta)


class PolynomialScheduler(LrScheduler):
    def __init__(self, base_lr, steps, end_learning_rate=0.0001, power=1.0, cycle=False,
                 warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps, self.end = base_lr, steps, end_learning_rate
        self.power, self.cycle = power, cycle

    def decayed(self, t):
        if self.cycle:
            periods = op("Max", op("Ceil", t * _c(t, 1.0 / self.steps)), _c(t, 1.0))
            decay_steps = periods * _c(t, self.steps)
            frac = _c(t, 1.0) - t / decay_steps
        else:
            frac = _c(t, 1.0) - _min(t, self.steps) * _c(t, 1.0 / self.steps)
        return _c(t, self.base_lr - self.end) * op("Pow", frac, _c(t, self.power)) + _c(t, self.end)

    def numpy_decayed(self, t):
        if self.cycle:
            decay_steps = self.steps * max(math.ceil(t / self.steps), 1)
            frac = 1 - t / decay_steps
        else:
            frac = 1 - min(t, self.steps) / self.steps
        return (self.base_lr - self.end) * frac ** self.power + self.end


PolynomialSchduler = PolynomialScheduler


class _RateScheduler(LrScheduler):
    def __init__(self, base_lr, steps, decay_rate, staircase=False, warmup=None):
        super().__init__(warmup)
        self.base_lr, self.steps, self.rate, self.staircase = base_lr, steps, decay_rate, staircase

    def _p(self, t):
        p = t * _c(t, 1.0 / self.steps)
        return op("Floor", p) if self.staircase else p

    def _np_p(self, t):
        p = t / self.steps
        return math.floor(p) if self.staircase else p


class ExponentialScheduler(_RateScheduler):
    def decayed(self, t):
        return _c(t, self.base_lr) * op("Pow", _c(t, self.rate), self._p(t))

    def numpy_decayed(self, t):
        return self.base_lr * self.rate ** self._np_p(t)


class InverseTimeScheduler(_RateScheduler):
    def decayed(self, t):
        return _c(t, self.base_lr) / (_c(t, 1.0) + _c(t, self.rate) * self._p(t))

    def numpy_decayed(self, t):
        return self.base_lr / (1 + self.rate * self._np_p(t))


class NaturalExpScheduler(_RateScheduler):
    def decayed(self, t):
        return _c(t, self.base_lr) * op("Exp", _c(t, -self.rate) * self._p(t))

    def numpy_decayed(self, t):
        return self.base_lr * math.exp(-self.rate * self._np_p(t))


class CustomScheduler(LrScheduler):
    """The learning rate is a Blob computed by the job itself."""

    def __init__(self, lr_blob):
        super().__init__(None)
        self.lr_blob = lr_blob

    def decayed(self, t):
        return reshape_to(self.lr_blob, ())
