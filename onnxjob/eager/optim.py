"""`flow.experimental.optim`: OneFlow 0.5's optimizers of eager parameters.

Each step applies OneFlow's update kernel to every parameter that has a gradient, with
the rules the job optimizers use (train/update_rules.py: OneFlow's model-update kernels,
hyperparameters rounded to float32 as OneFlow's op attributes), run on the parameter's
value and state on a scratch tape. As in OneFlow 0.5: the gradient is first multiplied by
`scale` (the loss scale the caller applied); Adam adds `weight_decay * w` to the
gradient (an L2 penalty) and AdamW decays the weight apart from it; neither corrects
the moments' bias; RMSprop runs without momentum, and OneFlow's kernel takes no weight
decay (a nonzero one warns once).
"""
import collections.abc

import numpy as np

from onnxjob.eager.tape import Tape
from onnxjob.eager.tensor import Tensor, is_tensor
from onnxjob.graph.tracer import tracing
from onnxjob.source_info import warn_at_user_line
from onnxjob.train import update_rules
from onnxjob.train.update_rules import attr


class ParamGroup:
    """Parameters updated with one set of options (`group["lr"]`, `group.parameters`)."""

    def __init__(self, parameters, options):
        self._parameters = list(parameters)
        self._options = dict(options)

    def __getitem__(self, key):
        return self._options[key]

    def __setitem__(self, key, value):
        self._options[key] = value

    def __contains__(self, key):
        return key in self._options

    @property
    def options(self):
        return self._options

    @property
    def parameters(self):
        return self._parameters


class Optimizer:
    """The base of the eager optimizers: `param_groups`, `zero_grad()`, `step()`."""

    def __init__(self, parameters=None, defaults=None):
        self.param_groups = []
        self._default_options = dict(defaults or {})
        self._state = {"step": 0}
        if parameters is not None:
            self._add_groups(parameters)

    def _add_groups(self, parameters):
        """One group of `parameters` (an iterator or list of tensors), or one per dict
        of a list of {"params": ..., option: value} (the options it names override the
        defaults)."""
        if is_tensor(parameters):
            parameters = [parameters]
        items = list(parameters) if isinstance(parameters, collections.abc.Iterable) else None
        if items is None:
            raise TypeError(f"an optimizer takes an iterable of parameters or of dicts, got "
                            f"{type(parameters).__name__}")
        if items and all(isinstance(item, dict) for item in items):
            for item in items:
                if "params" not in item:
                    raise KeyError("a parameter group needs its 'params'")
                options = {**self._default_options,
                           **{k: v for k, v in item.items() if k != "params"}}
                params = item["params"]
                self.param_groups.append(ParamGroup(
                    [params] if is_tensor(params) else params, options))
        else:
            self.param_groups.append(ParamGroup(items, self._default_options))
        for group in self.param_groups:
            for param in group.parameters:
                if not is_tensor(param) or not param.is_leaf:
                    raise ValueError("parameters must be leaf tensors (flow.nn.Parameter)")
                self._state.setdefault(id(param), {})

    def add_param_group(self, param_group):
        self._add_groups([param_group])

    def zero_grad(self, set_to_none=False):
        """Set every parameter's gradient to zeros (None with `set_to_none`)."""
        for group in self.param_groups:
            for param in group.parameters:
                if param.grad is not None:
                    param.grad = None if set_to_none else param.grad.zeros_()

    def state_dict(self):
        raise NotImplementedError("OneFlow 0.5's eager optimizers have no state_dict")

    def load_state_dict(self, state_dict):
        raise NotImplementedError("OneFlow 0.5's eager optimizers have no load_state_dict")

    def step(self, closure=None):
        """One update of every parameter with a gradient; returns `closure()`, if given,
        called first (it recomputes the loss)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for param in group.parameters:
                if param.grad is not None:
                    self._update(param, self._state[id(param)], group)
        self._state["step"] += 1
        return loss

    def _update(self, param, state, group):
        raise NotImplementedError

    def _slot(self, state, name, param):
        """The optimizer's `name` state tensor of `param`, zeros at first."""
        if name not in state:
            state[name] = Tensor._made(np.zeros_like(param._value))
        return state[name]


def _run(rule, tensors, updated):
    """`rule(*Blobs of tensors)` on a scratch tape; its results replace the values of
    `updated` (tensors, in the order of the results)."""
    tape = Tape(record=False)
    with tracing(tape):
        results = rule(*[tape.enter(t) for t in tensors])
    results = results if isinstance(results, (tuple, list)) else (results,)
    for tensor, blob in zip(updated, results):
        tensor._set_value(tape.value_of(blob))


def _gradient(w, g, scale, l2=0.0):
    """OneFlow's CastScaleRegularizeGradient (l1 = 0): g * scale + l2 * w."""
    if scale != 1.0:
        g = g * attr(g, scale)
    if l2:
        g = g + attr(w, l2) * w
    return g


class SGD(Optimizer):
    """SGD (OneFlow's sgd_update), with momentum `momentum_update`: V = momentum * V -
    lr * g; w = w + V."""

    def __init__(self, parameters, lr=0.001, momentum=0.0, scale=1.0):
        assert lr >= 0.0, f"Invalid learning rate: {lr}"
        assert momentum >= 0.0, f"Invalid momentum: {momentum}"
        assert scale >= 0.0, f"Invalid scale factor: {scale}"
        super().__init__(parameters, dict(lr=lr, momentum=momentum, scale=scale))

    def _update(self, param, state, group):
        lr, beta, scale = group["lr"], group["momentum"], group["scale"]
        if beta == 0.0:
            _run(lambda w, g: update_rules.sgd(w, _gradient(w, g, scale), attr(w, lr), 0.0),
                 [param, param.grad], [param])
            return
        buf = self._slot(state, "momentum_buf", param)
        _run(lambda w, g, m: update_rules.momentum(w, _gradient(w, g, scale), m,
                                                   attr(w, lr), beta, 0.0),
             [param, param.grad, buf], [param, buf])


class Adam(Optimizer):
    """Adam as OneFlow 0.5's eager Adam: adam_update with `weight_decay` as an L2 penalty
    on the gradient, no bias correction."""

    def __init__(self, parameters, lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0,
                 amsgrad=False, scale=1.0):
        _check_adam(lr, betas, eps, weight_decay, amsgrad, scale)
        super().__init__(parameters, dict(lr=lr, betas=tuple(betas), eps=eps,
                                          weight_decay=weight_decay, amsgrad=amsgrad,
                                          scale=scale))

    _decoupled = False

    def _update(self, param, state, group):
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        decay, scale = group["weight_decay"], group["scale"]
        l2, weight_decay = (0.0, decay) if self._decoupled else (decay, 0.0)
        m, v = self._slot(state, "exp_avg", param), self._slot(state, "exp_avg_sq", param)
        _run(lambda w, g, m_, v_: update_rules.adam(
            w, _gradient(w, g, scale, l2), m_, v_, attr(w, lr), beta1, beta2, eps,
            weight_decay), [param, param.grad, m, v], [param, m, v])


class AdamW(Adam):
    """AdamW as OneFlow 0.5's: adam_update with the weight decay applied to the weight,
    lr * weight_decay * w, apart from the moments."""

    _decoupled = True


class RMSprop(Optimizer):
    """RMSprop (OneFlow's rmsprop_update): ms = alpha * ms + (1 - alpha) * g^2 (centered:
    minus the square of the mean gradient); w = w - lr * g / sqrt(ms + eps)."""

    def __init__(self, parameters, lr=0.001, alpha=0.99, eps=1e-08, weight_decay=0,
                 momentum=0.0, centered=False, scale=1.0):
        assert lr >= 0.0, f"Invalid learning rate: {lr}"
        assert alpha >= 0.0, f"Invalid alpha value: {alpha}"
        assert eps >= 0.0, f"Invalid epsilon value: {eps}"
        assert weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}"
        assert scale > 0.0, f"Invalid scale factor: {scale}"
        assert momentum == 0.0, "Not support momentum greater than zeros now!"
        if weight_decay:
            warn_at_user_line("flow.experimental.optim.RMSprop(weight_decay=...): OneFlow's "
                              "rmsprop_update kernel takes no weight decay; it is not applied")
        super().__init__(parameters, dict(lr=lr, alpha=alpha, eps=eps,
                                          weight_decay=weight_decay, centered=centered,
                                          scale=scale))

    def _update(self, param, state, group):
        lr, alpha, eps, scale = group["lr"], group["alpha"], group["eps"], group["scale"]
        square_avg = self._slot(state, "square_avg", param)
        if group["centered"]:
            grad_avg = self._slot(state, "grad_avg", param)
            _run(lambda w, g, ms, mg: update_rules.rmsprop(
                w, _gradient(w, g, scale), ms, attr(w, lr), alpha, eps, mg),
                [param, param.grad, square_avg, grad_avg], [param, square_avg, grad_avg])
        else:
            _run(lambda w, g, ms: update_rules.rmsprop(
                w, _gradient(w, g, scale), ms, attr(w, lr), alpha, eps)[:2],
                [param, param.grad, square_avg], [param, square_avg])


def _check_adam(lr, betas, eps, weight_decay, amsgrad, scale):
    assert lr >= 0.0, f"Invalid learning rate: {lr}"
    assert eps >= 0.0, f"Invalid epsilon value: {eps}"
    assert 0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}"
    assert 0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}"
    assert weight_decay >= 0.0, f"Invalid weight_decay value: {weight_decay}"
    assert scale > 0.0, f"Invalid scale factor: {scale}"
    assert amsgrad is False, "Not support AMSGrad now!"
