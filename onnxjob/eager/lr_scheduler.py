"""`flow.experimental.optim.lr_scheduler`: learning rates of an eager optimizer's groups
set at each `step()`, with OneFlow 0.5's formulas (plain Python over `param_groups`)."""
import math
import types

from onnxjob.eager.optim import Optimizer


class LrScheduler:
    """The base: made with an optimizer, it records each group's `initial_lr` (or, with
    `last_step` >= 0 when resuming, expects it) and takes its first step at once."""

    def __init__(self, optimizer, last_step=-1, verbose=False):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer object")
        self._optimizer = optimizer
        for i, group in enumerate(optimizer.param_groups):
            if last_step == -1:
                group["initial_lr"] = group["lr"]
            elif "initial_lr" not in group:
                raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                               "when resuming an optimizer")
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_lr = []
        self.last_step = last_step
        self.verbose = verbose
        self.step()

    def get_lr(self):
        raise NotImplementedError

    def get_last_lr(self):
        return self.last_lr

    def print_lr(self, group_idx, lr):
        print(f"Adjusting learning rate of param_groups[{group_idx}] to {lr}")

    def step(self):
        """Advance one step and set each group's lr."""
        self.last_step += 1
        self.last_lr = self.get_lr()
        for i, group in enumerate(self._optimizer.param_groups):
            group["lr"] = self.last_lr[i]
            if self.verbose:
                self.print_lr(i, self.last_lr[i])

    def state_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "_optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


class StepLR(LrScheduler):
    """lr times `gamma` at every `step_size`-th step (the groups' current lr, so other
    changes to it compose)."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_step=-1, verbose=False):
        assert step_size > 0, f"step_size must greater than zero, but got {step_size}"
        assert gamma > 0.0, f"gamma must greater than zero, but got {gamma}"
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_step, verbose)

    def get_lr(self):
        decay = self.last_step != 0 and self.last_step % self.step_size == 0
        return [group["lr"] * (self.gamma if decay else 1)
                for group in self._optimizer.param_groups]


class LambdaLR(LrScheduler):
    """initial lr times `lr_lambda(step)` (one function, or one per group)."""

    def __init__(self, optimizer, lr_lambda, last_step=-1, verbose=False):
        groups = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != groups:
                raise ValueError(f"Expected {groups} lr_lambdas, but got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * groups
        super().__init__(optimizer, last_step, verbose)

    def get_lr(self):
        return [base * fn(self.last_step) for fn, base in zip(self.lr_lambdas, self.base_lrs)]

    def state_dict(self):
        """The state but the functions, whose attributes are kept where they are objects
        (a plain function or lambda is not saved)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_optimizer",
                                                                      "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else
                               dict(fn.__dict__) for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        for fn, saved in zip(self.lr_lambdas, state.pop("lr_lambdas")):
            if saved is not None:
                fn.__dict__.update(saved)
        self.__dict__.update(state)


class CosineDecayLR(LrScheduler):
    """initial lr times (1 - alpha) * 0.5 * (1 + cos(pi * step / steps)) + alpha before
    `steps`, and times alpha from then on."""

    def __init__(self, optimizer, steps, alpha=0.0, last_step=-1, verbose=False):
        assert steps > 0, f"steps must greater than zero, but got {steps}"
        self.steps = steps
        self.alpha = alpha
        super().__init__(optimizer, last_step, verbose)

    def get_lr(self):
        if self.last_step >= self.steps:
            return [base * self.alpha for base in self.base_lrs]
        cos_decay = 0.5 * (1 + math.cos(math.pi * self.last_step / self.steps))
        factor = (1 - self.alpha) * cos_decay + self.alpha
        return [base * factor for base in self.base_lrs]
