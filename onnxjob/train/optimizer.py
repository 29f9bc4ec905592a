"""flow.optimizer: optimizers whose update nodes are emitted into the train graph (§5.6).

`minimize(loss)` only records the optimizer and loss on the job being traced; after the
body returns, the compiler runs autodiff and calls `apply(builder, grads, job_name)`,
which emits the schedule, clipping, regularization and per-variable updates. New values
become `builder.state_updates`, so one onnxruntime run is one whole train step.
"""
import warnings

import numpy as np

from onnxjob import dtypes
from onnxjob.frontend import initializers
from onnxjob.errors import TraceError
from onnxjob.train.lr_schedules import (  # noqa: F401  (re-exported as flow.optimizer.*)
    CosineDecayScheduler, CosineScheduler, CustomScheduler, ExponentialScheduler,
    InverseTimeScheduler, LinearCosineScheduler, LrScheduler, NaturalExpScheduler,
    PiecewiseConstantScheduler, PiecewiseScalingScheduler, PolynomialSchduler,
    PolynomialScheduler, warmup)
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import as_blob, current_builder, int64_constant, op
from onnxjob.frontend.variables import VariableSpec, variable_blob


class _ClipByGlobalNorm:
    def __init__(self, clip_norm):
        self.clip_norm = float(clip_norm)


class grad_clipping:
    @staticmethod
    def by_global_norm(clip_norm):
        return _ClipByGlobalNorm(clip_norm)


class loss_scale:
    @staticmethod
    def static_loss_scale(loss_scale_factor):
        return ("static", loss_scale_factor)

    @staticmethod
    def dynamic_loss_scale(initial_loss_scale=2 ** 30, increment_period=2000, multiplier=2.0):
        return ("dynamic", initial_loss_scale)


def _state(var_name, suffix, like, init=0.0):
    spec = VariableSpec(f"{var_name}-{suffix}", like.shape, like.np_dtype,
                        initializers.constant_initializer(init), trainable=False)
    return variable_blob(spec)


def _c(like, value):
    return as_blob(np.asarray(value, dtype=like.np_dtype), like=like)


class Optimizer:
    """Base: schedule + clipping + regularization, then `update(w, g, lr, t)` per variable."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        if isinstance(lr_scheduler, (int, float)):
            lr_scheduler = PiecewiseConstantScheduler([], [float(lr_scheduler)])
        self.lr_scheduler = lr_scheduler
        self.grad_clipping = grad_clipping
        self.loss_scale_factor = loss_scale_factor
        self.variables = variables

    def minimize(self, loss):
        """Record this optimizer and `loss` (a Blob or a list of Blobs) on the current job."""
        builder = current_builder("Optimizer.minimize")
        if builder.optimizer is not None and builder.optimizer is not self:
            raise TraceError("a job can have one optimizer; minimize() was already called")
        builder.optimizer = self
        builder.losses.extend(loss if isinstance(loss, (list, tuple)) else [loss])

    def apply(self, builder, grads, job_name):
        step_spec = VariableSpec(f"System-Train-TrainStep-{job_name}", (1,), np.int64,
                                 initializers.constant_initializer(0), trainable=False)
        step = variable_blob(step_spec)
        builder.state_updates[step.name] = op("Add", step, int64_constant(step, [1]))
        t = op("Cast", reshape_to(step, ()), to=1)
        lr = self.lr_scheduler.lr(t)
        if self.grad_clipping is not None:
            grads = self._clip(grads, self.grad_clipping.clip_norm)
        for name, g in grads.items():
            spec = builder.variable_specs[name]
            w = builder.variables[name]
            if self.variables is not None and name not in self.variables:
                continue
            reg = spec.regularizer
            if reg is not None and reg.l1:
                g = g + op("Sign", w) * _c(w, reg.l1)
            if reg is not None and reg.l2:
                g = g + w * _c(w, reg.l2)
            lr_w = lr if lr.np_dtype == w.np_dtype else op("Cast", lr, to=_ir(w))
            builder.state_updates[name] = self.update(name, w, g, lr_w, t)

    @staticmethod
    def _clip(grads, clip_norm):
        sq = [op("ReduceSum", g * g, int64_constant(g, list(range(len(g.shape)))), keepdims=0)
              for g in grads.values()]
        total = sq[0]
        for s in sq[1:]:
            total = total + s
        norm = op("Sqrt", total)
        scale = _c(norm, clip_norm) / op("Max", norm, _c(norm, clip_norm))
        return {n: g * scale for n, g in grads.items()}

    def update(self, name, w, g, lr, t):
        raise NotImplementedError


def _ir(blob):
    return dtypes.from_numpy(blob.np_dtype).ir_dtype.value


class SGD(Optimizer):
    """w -= lr*g (momentum 0), else m = beta*m - lr*g; w += m. Default momentum 0.9."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables)
        self.momentum = momentum

    def update(self, name, w, g, lr, t):
        if not self.momentum:
            return w - lr * g
        m = _state(name, "momentum", w)
        m_new = m * _c(m, self.momentum) - lr * g
        current_builder().state_updates[m.name] = m_new
        return w + m_new


class SGDW(SGD):
    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, momentum, grad_clipping)
        self.weight_decay = weight_decay or 0.0

    def update(self, name, w, g, lr, t):
        return super().update(name, w, g + w * _c(w, self.weight_decay), lr, t)


class Adam(Optimizer):
    """m, v moments; OneFlow's default is no bias correction."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 do_bias_correction=False, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.do_bias_correction = do_bias_correction

    def _moments(self, name, w, g):
        builder = current_builder()
        m, v = _state(name, "m", w), _state(name, "v", w)
        m_new = m * _c(m, self.beta1) + g * _c(g, 1 - self.beta1)
        v_new = v * _c(v, self.beta2) + g * g * _c(g, 1 - self.beta2)
        builder.state_updates[m.name] = m_new
        builder.state_updates[v.name] = v_new
        return m_new, v_new

    def _corrected_lr(self, lr, t):
        if not self.do_bias_correction:
            return lr
        # NOTE: 1 - beta2**t cancels badly in float32 (1e-4 relative at t=5): use float64.
        c1, c2 = _bias_corrections(t, self.beta1, self.beta2)
        return lr * op("Cast", op("Sqrt", c2) / c1, to=_ir(lr))

    def update(self, name, w, g, lr, t):
        m, v = self._moments(name, w, g)
        step = m / (op("Sqrt", v) + _c(v, self.epsilon))
        return w - self._corrected_lr(lr, t) * step


class AdamW(Adam):
    """Adam with decoupled weight decay: w -= lr * (adam_step + weight_decay * w)."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 do_bias_correction=False, loss_scale_factor=None, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, beta1, beta2, epsilon, do_bias_correction,
                         loss_scale_factor, grad_clipping)
        self.weight_decay = weight_decay or 0.0

    def update(self, name, w, g, lr, t):
        m, v = self._moments(name, w, g)
        step = m / (op("Sqrt", v) + _c(v, self.epsilon)) + w * _c(w, self.weight_decay)
        return w - self._corrected_lr(lr, t) * step


class RMSProp(Optimizer):
    """mean_square = d*ms + (1-d)*g^2; w -= lr*g/sqrt(ms + eps) (centered: ms - mg^2)."""

    def __init__(self, lr_scheduler, decay_rate=0.99, epsilon=1e-8, centered=False,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        self.decay_rate, self.epsilon, self.centered = decay_rate, epsilon, centered

    def update(self, name, w, g, lr, t):
        builder = current_builder()
        d = self.decay_rate
        ms = _state(name, "mean_square", w)
        ms_new = ms * _c(ms, d) + g * g * _c(g, 1 - d)
        builder.state_updates[ms.name] = ms_new
        denom = ms_new
        if self.centered:
            mg = _state(name, "mean_gradient", w)
            mg_new = mg * _c(mg, d) + g * _c(g, 1 - d)
            builder.state_updates[mg.name] = mg_new
            denom = ms_new - mg_new * mg_new
        return w - lr * g / op("Sqrt", denom + _c(w, self.epsilon))


def _bias_corrections(t, beta1, beta2):
    """(1 - beta1**(t+1), 1 - beta2**(t+1)) as float64 scalars."""
    t64 = op("Cast", t, to=11)
    step = t64 + as_blob(np.float64(1.0), like=t64)
    one = as_blob(np.float64(1.0), like=t64)
    return (one - op("Pow", as_blob(np.float64(beta1), like=t64), step),
            one - op("Pow", as_blob(np.float64(beta2), like=t64), step))


def _norm(x):
    return op("Sqrt", op("ReduceSum", x * x, int64_constant(x, list(range(len(x.shape)))), keepdims=0))


class LAMB(Adam):
    """Adam direction (with bias correction) scaled by the trust ratio ||w|| / ||step||."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-6, weight_decay=0.0,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, beta1, beta2, epsilon, True, loss_scale_factor,
                         grad_clipping)
        self.weight_decay = weight_decay

    def update(self, name, w, g, lr, t):
        m, v = self._moments(name, w, g)
        c1, c2 = _bias_corrections(t, self.beta1, self.beta2)
        m_hat = m / op("Cast", c1, to=_ir(w))
        v_hat = v / op("Cast", c2, to=_ir(w))
        direction = m_hat / (op("Sqrt", v_hat) + _c(v, self.epsilon)) + w * _c(w, self.weight_decay)
        w_norm, d_norm = _norm(w), _norm(direction)
        zero = _c(w_norm, 0.0)
        ratio = op("Where", op("And", op("Greater", w_norm, zero), op("Greater", d_norm, zero)),
                   w_norm / op("Max", d_norm, _c(d_norm, 1e-30)), _c(w_norm, 1.0))
        return w - lr * ratio * direction


class LARS(Optimizer):
    """Momentum SGD with the layer-wise rate coeff*||w|| / (||g|| + wd*||w||)."""

    def __init__(self, lr_scheduler, momentum_beta=0.9, epsilon=1e-9, lars_coefficient=0.0001,
                 weight_decay=0.0, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping)
        self.momentum, self.epsilon = momentum_beta, epsilon
        self.coeff, self.weight_decay = lars_coefficient, weight_decay

    def update(self, name, w, g, lr, t):
        w_norm, g_norm = _norm(w), _norm(g)
        local_lr = lr * _c(w, self.coeff) * w_norm / (
            g_norm + _c(w, self.weight_decay) * w_norm + _c(w, self.epsilon))
        m = _state(name, "momentum", w)
        m_new = m * _c(m, self.momentum) - local_lr * (g + w * _c(w, self.weight_decay))
        current_builder().state_updates[m.name] = m_new
        return w + m_new


def _from_old_api(train_conf):
    """Optimizer described by config.train.primary_lr / model_update_conf (old API)."""
    conf = dict(train_conf.get("model_update_conf") or {"naive_conf": {}})
    lr = float(train_conf.get("primary_lr", 0.0))
    scheduler = PiecewiseConstantScheduler([], [lr])
    decay = conf.pop("learning_rate_decay", None)
    warm = conf.pop("warmup_conf", None)
    clip = conf.pop("clip_conf", None)
    conf.pop("weight_decay_conf", None)
    w = None
    if warm:
        kind, args = next(iter(warm.items()))
        w = (warmup.linear(args["warmup_batches"], args.get("start_multiplier", 0.0))
             if kind == "linear_conf" else warmup.constant(args["warmup_batches"], args["multiplier"]))
    if decay:
        kind, args = next(iter(decay.items()))
        steps = args.get("decay_batches", 1)
        if kind == "cosine_conf":
            scheduler = CosineScheduler(lr, steps, args.get("alpha", 0.0), warmup=w)
        elif kind == "polynomial_conf":
            scheduler = PolynomialScheduler(lr, steps, args.get("end_learning_rate", 0.0001),
                                            args.get("power", 1.0), args.get("cycle", False), w)
        elif kind == "exponential_conf":
            scheduler = ExponentialScheduler(lr, steps, args["decay_rate"],
                                             args.get("staircase", False), w)
        else:
            raise TraceError(f"learning_rate_decay {kind!r} is not supported")
    elif w is not None:
        scheduler = PiecewiseConstantScheduler([], [lr], warmup=w)
    clipping = grad_clipping.by_global_norm(clip["clip_by_global_norm"]["clip_norm"]) if clip else None
    kind, args = next(iter(conf.items()))
    if kind == "naive_conf":
        return SGD(scheduler, momentum=0, grad_clipping=clipping)
    if kind == "momentum_conf":
        return SGD(scheduler, momentum=args.get("beta", 0.9), grad_clipping=clipping)
    if kind in ("adam_conf", "lazy_adam_conf"):
        return Adam(scheduler, args.get("beta1", 0.9), args.get("beta2", 0.999),
                    args.get("epsilon", 1e-8), args.get("do_bias_correction", False),
                    grad_clipping=clipping)
    if kind == "rmsprop_conf":
        return RMSProp(scheduler, args.get("decay_rate", 0.99), args.get("epsilon", 1e-8),
                       args.get("centered", False), grad_clipping=clipping)
    if kind == "lamb_conf":
        return LAMB(scheduler, args.get("beta1", 0.9), args.get("beta2", 0.999),
                    args.get("epsilon", 1e-6), grad_clipping=clipping)
    if kind == "lars_conf":
        return LARS(scheduler, args.get("momentum_beta", 0.9), grad_clipping=clipping)
    raise TraceError(f"model_update_conf {kind!r} is not supported")


def resolve_optimizer(builder, job):
    """The job's optimizer: from minimize(), or from the old function_config API."""
    if builder.optimizer is not None:
        return builder.optimizer
    if job.config.train_conf and builder.losses:
        builder.optimizer = _from_old_api(job.config.train_conf)
    return builder.optimizer


def add_loss(loss):
    """Old API: declare the loss of a job configured with config.train.* (deprecated)."""
    warnings.warn("flow.losses.add_loss is deprecated: use flow.optimizer.X(...).minimize(loss)",
                  DeprecationWarning, stacklevel=2)
    current_builder("flow.losses.add_loss").losses.append(loss)
