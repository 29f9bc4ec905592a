"""flow.optimizer: optimizers whose update nodes are emitted into the train graph (§5.6).

`minimize(loss)` only records the optimizer and loss on the job being traced; after the
body returns, the compiler runs autodiff and calls `apply(builder, grads, job_name)`,
which emits what OneFlow 0.5's optimizer passes add to a train job, in their order:
train step, l1/l2 regularization, then per optimizer its learning rate schedule,
clipping by global norm and one update per variable (update_rules.py). A loss scale
multiplies the backward's seed (`loss_scale`, called before autodiff.backward) and apply
unscales the gradients first; a dynamic one keeps its scale and good-step counter in
variables and skips non-finite steps. New values become `builder.state_updates`, so one
onnxruntime run is one train step.
"""
import contextvars
import re
import weakref

import numpy as np
import onnx_ir as ir

from onnxjob.compat.generations import positional_is, two_generations, written_for_0_4
from onnxjob.errors import TraceError, missing_api
from onnxjob.frontend import initializers
from onnxjob.frontend.variables import VariableSpec, variable_blob
from onnxjob.graph.primitives.shape_ops import concat_flat, concat_flat_constant
from onnxjob.graph.tracer import current_builder, int64_constant, op
from onnxjob.source_info import user_location, warn_at_user_line
from onnxjob.train import flat_groups, update_rules as R
from onnxjob.train.lr_schedules import (  # noqa: F401  (re-exported as flow.optimizer.*)
    CosineDecayScheduler, CosineScheduler, CustomScheduler, ExponentialScheduler,
    InverseTimeScheduler, LinearCosineScheduler, LrScheduler, NaturalExpScheduler,
    PiecewiseConstantScheduler, PiecewiseScalingScheduler, PolynomialSchduler,
    PolynomialScheduler, warmup)


class by_global_norm:
    """flow.optimizer.grad_clipping.by_global_norm(clip_norm).

    As OneFlow 0.5 (ClipGradientByGlobalNorm), each gradient of the optimizer's variables
    (after l1/l2 regularization) is multiplied by min(1 / global_norm, 1 / clip_norm),
    i.e. divided by max(global_norm, clip_norm); for clip_norm = 1 that is the usual
    clipping, for other values it is not (OneFlow 0.5 drops the clip_norm factor)."""

    def __init__(self, clip_norm):
        self.clip_norm = clip_norm


class StaticLossScalePolicy:
    """flow.optimizer.loss_scale.static_loss_scale(loss_scale_factor).

    As OneFlow (oneflow/core/job_rewriter/autograd.cpp): the loss's initial gradient is
    multiplied by the float32 factor and every variable gradient by the float32 1/factor
    before regularization, clipping and the update; a factor of 1 does nothing. Nothing
    checks for overflow: a step whose scaled gradients overflow updates the variables with
    the inf/NaN it got, as OneFlow (only a dynamic policy counts non-finite values)."""

    def __init__(self, loss_scale_factor):
        self.loss_scale_factor = loss_scale_factor


class DynamicLossScalePolicy:
    """flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale, increment_period,
    multiplier).

    As OneFlow (dynamic_loss_scale_schedule_pass.cpp, autograd.cpp, auto_train_step.cpp):
    the float32 (1,) variable `System-Train-DynamicLossScale-<job>-LossScale` (initially
    initial_loss_scale) multiplies the loss's initial gradient and its reciprocal every
    variable gradient. A step whose unscaled gradients hold an inf or NaN changes no
    variable, no optimizer state and not the train step, divides the scale by multiplier
    (not below 1) and zeroes the int64 (1,) good-step counter
    `System-Train-DynamicLossScale-<job>-GoodStepCounter`; a finite step increments the
    counter, and at increment_period multiplies the scale (up to FLT_MAX) and zeroes it.
    Both variables are saved and loaded with the others."""

    def __init__(self, initial_loss_scale=2 ** 30, increment_period=2000, multiplier=2.0):
        self.initial_loss_scale = initial_loss_scale
        self.increment_period = increment_period
        self.multiplier = multiplier

    def _variables(self, job_name):
        """The specs of the job's (scale, good-step counter) variables, as OneFlow names
        them (DynamicLossScaleSchedulePass)."""
        prefix = f"System-Train-DynamicLossScale-{job_name}-"
        scale = VariableSpec(prefix + "LossScale", (1,), np.float32,
                             initializers.constant_initializer(self.initial_loss_scale),
                             trainable=False)
        counter = VariableSpec(prefix + "GoodStepCounter", (1,), np.int64,
                               initializers.constant_initializer(0), trainable=False)
        return scale, counter


class grad_clipping:
    """flow.optimizer.grad_clipping."""

    by_global_norm = by_global_norm


class loss_scale:
    """flow.optimizer.loss_scale."""

    static_loss_scale = StaticLossScalePolicy
    dynamic_loss_scale = DynamicLossScalePolicy


def _patterns(value):
    """A weight-decay pattern list: a string is one pattern; an empty list is none given, as
    OneFlow's wrappers add no includes/excludes message for it (every variable decays)."""
    if isinstance(value, str):
        return [value]
    return list(value) if value else None


# (variable name, its shape, picked rows) while an optimizer updates some rows of it alone
# (Optimizer._update_rows): its slots are read as those rows too
_ROWS = contextvars.ContextVar("onnxjob_updated_rows", default=None)


# while small variables are updated as one (train/flat_groups.py): their FlatGroup
_GROUP = contextvars.ContextVar("onnxjob_flat_group", default=None)


def _state(var_name, suffix, like, init=0.0, shape=None):
    """Optimizer state variable `<var>-<suffix>` (OneFlow's name), initialized to `init`;
    while only some rows of the variable are updated, those rows of it; for a flat group's
    name, the concatenation of its members' slots."""
    group = _GROUP.get()
    if group is not None and var_name == group.name:
        return group.state(suffix, init, shape)
    picked = _ROWS.get()
    rows = None
    if picked is not None and picked[0] == var_name and shape is None:
        _, shape, rows = picked
    spec = VariableSpec(f"{var_name}-{suffix}", like.shape if shape is None else shape,
                        like.np_dtype, initializers.constant_initializer(init),
                        trainable=False)
    state = variable_blob(spec)
    return spec.name, state if rows is None else R.rows_of(state, rows)


def _as_updated(g, factor, keep, folds):
    """(gradient, pending factor) as an update takes them: the factor applied now unless
    the update `folds` it into its coefficients; 0 where `keep` (the update skips a
    non-finite step through its coefficients) is false, as g * 0 would be NaN there."""
    if not folds:
        g, factor = R.scaled(g, factor), None
    return R.gated(keep, g, R.attr(g, 0.0)), factor


def _regularized(ctx, names, w, g, factor):
    """(gradient, pending factor) of the variables `names` (one, or a flat group's, `w` and
    `g` their values or concatenations) with the L2 regularization the step deferred
    (ctx.deferred) applied: g * factor + l2 * w, as update_rules.regularize; none deferred:
    as they are."""
    regs = [ctx.deferred.get(n) for n in names]
    if regs[0] is None:
        return g, factor
    g = R.scaled(g, factor)
    if len({float(reg.l2) for reg in regs}) == 1:
        return R.regularize(w, g, regs[0]), None
    l2 = concat_flat_constant([np.float32(reg.l2) for reg in regs],
                              [ctx.builder.variables[n].shape for n in names], w)
    return g + l2 * w, None


def _store(ctx, new, keep):
    """Record an update's {state name: new value}: kept as it is where the update skips a
    non-finite step itself (`keep`), else behind the dynamic loss scale's select."""
    if keep is not None:
        ctx.kept.update(new)
    else:
        new = ctx.keep_unless_finite(new)
    ctx.builder.state_updates.update(new)


class _StepContext:
    """What the optimizers of one train step share: the builder, the int64 train step
    and the float32 Adam bias corrections (one per beta)."""

    def __init__(self, builder, step, sparse_names, dynamic_loss_scale):
        self.builder = builder
        self.step = step
        self.sparse_names = sparse_names
        self.dynamic_loss_scale = dynamic_loss_scale
        # a dynamic loss scale's "every gradient is finite" (a bool scalar, set once the
        # gradients are scaled), or None, and the state names whose updates keep their
        # value on a non-finite step already
        self.finite = None
        self.kept = set()
        # {variable: its L2 regularizer} applied in the update, to a flat group's
        # concatenation at once (_deferred_regularizers)
        self.deferred = {}
        self._corrections = {}

    def keep_unless_finite(self, new):
        """{state name: new value} -> each new value kept only where every gradient is
        finite, else the variable's value (a dynamic loss scale's skipped step), right
        after the update that made it: so the step never holds every variable's new value
        and old value at once (graph/memory_plan.py: ResNet50's step at batch 2 held 315
        MiB of new values before their selects, 121 MiB at its peak without)."""
        if self.finite is None:
            return new
        self.kept.update(new)
        return {n: op("Where", self.finite, b, self.builder.variables[n]) for n, b in new.items()}

    def bias_correction(self, beta):
        if beta not in self._corrections:
            self._corrections[beta] = R.adam_bias_correction(self.step, beta)
        return self._corrections[beta]


class Optimizer:
    """Base: schedule, clipping and weight decay settings, and the update of a train step.

    `variables` is a list of variable names or a callable returning one (default: every
    variable of the job when minimize() is called); variables without a gradient (not
    trainable, not on the loss's path) are left alone.
    """

    _sparse_capable = False  # OneFlow has indexed-slices kernels for sgd/momentum/adam
    # OneFlow's FuseUpdateOpsPass folds the regularizer into this update's kernel
    _update_fuses_regularizer = False
    # a variable read only through a lookup and not named for indexed-slices updates is
    # said to be updated densely (LazyAdam, whose documentation promises row updates)
    _warns_dense_rows = False
    # the update is elementwise in the variable, its gradient and its slots: small
    # variables are updated as one (train/flat_groups.py)
    _elementwise_update = False
    # the update skips a dynamic loss scale's non-finite step through its scalar
    # coefficients (update_rules.gated), not a select over each new value: 2 passes over
    # the variable instead of 3 per new value
    _skips_by_coefficients = False
    # the update multiplies the gradient's pending scalar factor (unscaling, clipping) into
    # its own scalar coefficients (`_update`'s `factor`) instead of a pass over g first
    _folds_gradient_factor = False

    def __init__(self, lr_scheduler=None, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None,
                 weight_decay=None, weight_decay_includes=None, weight_decay_excludes=None):
        if isinstance(lr_scheduler, (int, float)):
            lr_scheduler = PiecewiseConstantScheduler([], [float(lr_scheduler)])
        self.lr_scheduler = lr_scheduler
        self.grad_clipping = grad_clipping
        self.train_step_lbn = train_step_lbn
        if loss_scale_factor is not None:
            if loss_scale_policy is not None:
                raise TraceError("give loss_scale_factor or loss_scale_policy, not both")
            loss_scale_policy = StaticLossScalePolicy(loss_scale_factor)
        self.loss_scale_policy = loss_scale_policy
        self.variables = variables
        if weight_decay is not None and weight_decay_includes is not None and \
                weight_decay_excludes is not None:   # (OneFlow asserts it with a rate only)
            raise TraceError("weight_decay_includes and weight_decay_excludes cannot both be "
                             "set; give the patterns of one of them")
        self.weight_decay = weight_decay
        self.weight_decay_includes = _patterns(weight_decay_includes)
        self.weight_decay_excludes = _patterns(weight_decay_excludes)
        self._job_variables = weakref.WeakKeyDictionary()
        # (names, job name, builder): the variables this object updates, fixed at its first
        # use as OneFlow's Optimizer.Variables() fixes them (see _names)
        self._fixed_variables = None
        # made by code written for OneFlow <= 0.4: Adam then updates as that release did
        self.written_for_0_4 = written_for_0_4()

    # -- recording ------------------------------------------------------------------------
    def minimize(self, loss):
        """Record this optimizer and `loss` (a Blob or a list of Blobs) on the current job."""
        builder = current_builder("Optimizer.minimize")
        self._minimize_location = user_location()   # for warnings at compile time
        if builder.optimizer is not None and builder.optimizer is not self:
            # OneFlow's minimize replaces the job's whole train conf (SetTrainConf): the
            # last optimizer updates, on its loss alone; a trap, so said (warnings shows
            # a line once)
            warn_at_user_line(
                f"{type(self).__name__}.minimize() replaces the {type(builder.optimizer).__name__} "
                "minimize() set earlier in this job, as in OneFlow: only this optimizer "
                "updates, on this loss (flow.optimizer.CombinedOptimizer applies several)")
        for member in self._members():
            member._names(builder)
        self._check_members(builder)
        builder.optimizer = self
        # As OneFlow's minimize: SetTrainConf replaces the job's train_conf, losses
        # declared before with flow.losses.add_loss included, then adds minimize's own
        # (a loss passed to both counts once)
        builder.losses[:] = loss if isinstance(loss, (list, tuple)) else [loss]

    def Variables(self):
        """The names of the variables this optimizer updates in the job being traced."""
        return self._names(current_builder("Optimizer.Variables"))

    def _variable_names(self, builder):
        if self.variables is None:
            return list(builder.variables)
        names = self.variables() if callable(self.variables) else self.variables
        return [names] if isinstance(names, str) else list(names)

    def _names(self, builder):
        """The names of the variables this optimizer updates in `builder`'s job. As
        OneFlow's Optimizer.Variables(), the list is made once per optimizer object, in the
        first job that uses it (by default that job's variables); an object shared by a
        later job with other variables leaves those untrained there, as in OneFlow, and
        says so once."""
        if builder not in self._job_variables:
            if self._fixed_variables is None:
                self._fixed_variables = (self._variable_names(builder), builder.job_name,
                                         weakref.ref(builder))
            names, first_job, first = self._fixed_variables
            if first() is not builder:      # (another job, or this one in a later session)
                _say_untrained(self, builder, names, first_job)
            # (OneFlow's FilterCurModelLbi2ModelDiffLbiByName: the names this job has; a
            # `variables=` name of no variable here is dropped)
            names = [n for n in names if n in builder.variable_specs]
            self._job_variables[builder] = names
        return self._job_variables[builder]

    def _members(self):
        return [self]

    def _check_members(self, builder):
        """Errors in how the optimizers of a job are combined (none for one optimizer)."""

    # -- the train step -------------------------------------------------------------------
    def loss_scale(self, builder, job_name):
        """What autodiff.backward multiplies the loss's initial gradient by: None (no policy,
        or a static factor of 1), a static factor (a float), or a dynamic policy's float32
        (1,) scale variable, created here with its good-step counter. Called by the
        compiler before backward; apply() unscales the gradients by the same value."""
        policy = self.loss_scale_policy
        state = None
        if isinstance(policy, DynamicLossScalePolicy):
            specs = policy._variables(job_name)
            state = [(spec.name, variable_blob(spec)) for spec in specs]
            scale = state[0][1]
        elif policy is not None and np.float32(policy.loss_scale_factor) != 1:
            scale = float(np.float32(policy.loss_scale_factor))
        else:
            scale = None
        # (on the builder: a table keyed by weak references to builders kept every
        # builder alive, as the state's Blobs refer to theirs)
        builder.loss_scale_state = (scale, state)
        return scale

    def apply(self, builder, grads, job_name, config=None):
        """Emit the train step's updates for `grads` ({variable name: gradient Blob}, already
        scaled by 1/elem_cnt(loss), or under a loss scale by loss_scale() alone) into
        `builder.state_updates`."""
        config = config if config is not None else builder.job_config
        before = set(builder.state_updates)
        dynamic = isinstance(self.loss_scale_policy, DynamicLossScalePolicy)
        if dynamic and self.train_step_lbn is not None:
            raise TraceError("a dynamic loss scale needs OneFlow's own train step: leave "
                             "train_step_lbn unset (OneFlow: Check failed: "
                             "!train_conf.has_dynamic_loss_scale_policy())")
        if self.loss_scale_policy is not None and builder.loss_scale_state is None:
            raise TraceError("internal: Optimizer.loss_scale() must be called before "
                             "autodiff.backward and apply()")
        scale, scale_state = builder.loss_scale_state or (None, None)
        # OneFlow's order (generate_backward_and_optimizer_op_confs.cpp, v0.5.0): 1/elem_cnt
        # and unscale, count the non-finite values of the unscaled gradients, regularize,
        # then per optimizer clip and update. Here the scalar factors (1/elem_cnt, 1/scale,
        # clipping) are multiplied together and applied once (update_rules.scaled; first,
        # where a regularizer reads the unscaled g), and the non-finite values are counted
        # in the gradients so scaled (finite exactly where the unscaled ones are).
        factors = {}
        if scale is not None and grads:
            # (a dynamic loss's gradients come divided by its run-time count: autodiff)
            loss = builder.losses[0]
            factors = R.unscale_factors(grads, scale,
                                        1 if loss.is_dynamic else int(np.prod(loss.shape)))
        ctx = _StepContext(builder, self._train_step(builder, job_name),
                           _indexed_slices_names(config), dynamic)
        ctx.fold_factors = _folds_factors(config)
        updated = {n for member in self._members() for n in member._names(builder)}
        for name in sorted(updated & set(grads) & set(builder.assigned_at)):
            builder.refuse_second_writer(name, f"{type(self).__name__}'s update",
                                         builder.assigned_at[name])
        ctx.deferred = self._deferred_regularizers(builder, grads)
        fused = _fused_regularizer_names(config, self._members(), builder)
        regularized = {}
        for name, g in grads.items():
            spec = builder.variable_specs[name]
            if spec.regularizer is not None and name in updated and name not in ctx.deferred:
                g = R.regularize(builder.variables[name], R.scaled(g, factors.pop(name, None)),
                                 spec.regularizer,
                                 cpu_kernel=spec.placed_on_cpu and name not in fused)
            regularized[name] = g
        scaled = [(member, member._scaled_gradients(ctx, regularized, factors))
                  for member in self._members()]
        if dynamic and grads:
            ready = {n: pair for _, group in scaled for n, pair in group.items()}
            ctx.finite = R.all_finite(list(ready.values()) + [
                (g, factors.get(n)) for n, g in regularized.items() if n not in ready])
        for member, group in scaled:
            member._update_group(ctx, group)
        if dynamic:
            self._skip_and_schedule(builder, ctx.finite, before, scale_state, ctx.kept)

    def _deferred_regularizers(self, builder, grads):
        """{variable: L2 regularizer} of the small variables whose regularization waits for
        their update (`_regularized`): g * factor + l2 * w, the same operations, on a flat
        group's concatenation at once (ResNet50: ~100 small variables, three kernels each
        before). Only where nothing reads the regularized gradient before the update (no
        gradient clipping: its norm does; a dynamic loss scale's check reads the scaled
        gradient, finite where the regularized one is) and the update is elementwise."""
        deferred = {}
        for member in self._members():
            if not member._elementwise_update or member.grad_clipping is not None:
                continue
            for name in member._names(builder):
                reg = builder.variable_specs[name].regularizer
                if name in grads and reg is not None and not reg.l1 and \
                        flat_groups.is_small(builder.variables[name]):
                    deferred[name] = reg
        return deferred

    def _skip_and_schedule(self, builder, finite, before, scale_state, kept):
        """A dynamic loss scale's end of the step: every state this step updates (the
        variables, their optimizer slots, the train step: OneFlow's skip_if inputs and
        TrainStep-AssignIfNot) keeps its value unless all gradients are finite (`kept`: the
        names _update_group did so already); then the scale and counter follow
        dynamic_loss_scale_schedule."""
        if finite is not None:
            for name in [n for n in builder.state_updates if n not in before and n not in kept]:
                builder.state_updates[name] = op("Where", finite, builder.state_updates[name],
                                                 builder.variables[name])
        else:
            # OneFlow's count_not_finite stays its constant-0 stub without gradients
            finite = builder.constant(np.array(True))
        (scale_name, scale), (counter_name, counter) = scale_state
        policy = self.loss_scale_policy
        builder.state_updates[scale_name], builder.state_updates[counter_name] = \
            R.dynamic_loss_scale_schedule(finite, scale, counter, policy.increment_period,
                                          policy.multiplier)

    def _train_step(self, builder, job_name):
        """The int64 (1,) train step this run uses (0 first); OneFlow's TrainStep variable
        is created and incremented unless train_step_lbn names the job's own counter."""
        if self.train_step_lbn is not None:
            return _step_blob(builder, self.train_step_lbn)
        spec = VariableSpec(f"System-Train-TrainStep-{job_name}", (1,), np.int64,
                            initializers.constant_initializer(0), trainable=False)
        step = variable_blob(spec)
        builder.state_updates[spec.name] = op("Add", step, int64_constant(step, [1]))
        return step

    def _scaled_gradients(self, ctx, grads, factors):
        """{name: (gradient, scalar factor or None)} of this optimizer's variables that have
        grads: the factor is what the gradient is still to be multiplied by (`factors`,
        {name: scalar or None}, and the clipping)."""
        names = [n for n in self._names(ctx.builder) if n in grads]
        group = {n: grads[n] for n in names}
        pending = {n: factors.get(n) for n in names}
        if names and self.grad_clipping is not None:
            # half gradients on a GPU overflow long before a dynamic loss scale squared
            # would: the scaled gradients' squares are summed as they are there
            bounded = ctx.fold_factors and ctx.builder.device == "cuda"
            pending = R.clip_by_global_norm(group, self.grad_clipping.clip_norm, pending,
                                            unscale_computed=not bounded)
        return {n: (group[n], pending[n]) for n in names}

    def _update_group(self, ctx, grads):
        """Schedule and updates of this optimizer's variables (`grads`: {name: (gradient,
        factor)}, from _scaled_gradients): the factor is applied in one pass over the
        gradient, or folded into the update's coefficients (_folds_gradient_factor)."""
        builder = ctx.builder
        if not grads:
            return
        if self._warns_dense_rows:
            _warn_dense_rows(self, ctx, grads)
        lr = self.lr_scheduler.lr(ctx.step)
        keep = ctx.finite if self._skips_by_coefficients else None
        folds = self._folds_gradient_factor and ctx.fold_factors
        for names in flat_groups.small_groups(self, ctx, grads):
            self._update_flat(ctx, names, grads, lr, keep, folds)
            grads = {n: pair for n, pair in grads.items() if n not in names}
        for name, (g, factor) in grads.items():
            w = builder.variables[name]
            g, factor = _regularized(ctx, [name], w, g, factor)
            g, factor = _as_updated(g, factor, keep, folds)
            extra = {"factor": factor} if self._folds_gradient_factor else {}
            indices = self._sparse_indices(ctx, name)
            if indices is None:
                new = self._update(ctx, name, w, g, R.cast_like(lr, w),
                                   self._weight_decay_rate(name), keep, **extra)
            else:
                new = self._update_rows(ctx, name, w, g, R.cast_like(lr, w), keep, extra,
                                        R.picked_rows(indices))
            _store(ctx, new, keep)

    def _update_flat(self, ctx, names, grads, lr, keep, folds):
        """The updates of the small variables `names` (one dtype, weight decay rate and
        gradient factor: flat_groups.small_groups) as one update of their concatenation,
        split back: the values _update_group gives each of them."""
        builder = ctx.builder
        group = flat_groups.FlatGroup(f"{names[0]}-onnxjob-flat-group",
                                      {n: builder.variables[n] for n in names}, _state)
        w = group.old[group.name]
        g, factor = _regularized(ctx, names, w, concat_flat([grads[n][0] for n in names]),
                                 grads[names[0]][1])
        g, factor = _as_updated(g, factor, keep, folds)
        extra = {"factor": factor} if self._folds_gradient_factor else {}
        token = _GROUP.set(group)
        try:
            new = self._update(ctx, group.name, w, g, R.cast_like(lr, w),
                               self._weight_decay_rate(names[0]), keep, **extra)
        finally:
            _GROUP.reset(token)
        for key, value in new.items():
            if keep is None and ctx.finite is not None:     # (keep_unless_finite, at once)
                value = op("Where", ctx.finite, value, group.old[key])
            parts = group.split(key, value)
            if ctx.finite is not None:
                ctx.kept.update(parts)
            builder.state_updates.update(parts)

    def _update_rows(self, ctx, name, w, g, lr, keep, extra, rows):
        """OneFlow's indexed-slices update: the rows `rows` of the variable and of its slots
        updated from their own values (each gradient row sums that row's lookups), written
        back; every other row stays as it was, bit for bit, and costs nothing (the update
        runs on the rows looked up, not on the whole embedding table)."""
        token = _ROWS.set((name, tuple(w.shape), rows))
        try:
            new = self._update(ctx, name, R.rows_of(w, rows), R.rows_of(g, rows), lr,
                               self._weight_decay_rate(name), keep, **extra)
        finally:
            _ROWS.reset(token)
        variables = ctx.builder.variables
        return {n: R.with_rows(variables[n], rows, value) for n, value in new.items()}

    def _weight_decay_rate(self, name):
        """OneFlow's GetOptimizerWeightDecayRate: the rate where the patterns (regular
        expressions, partial match on the variable name) let it apply, else 0."""
        if not self.weight_decay:
            return 0.0
        if self.weight_decay_includes is not None:
            hit = any(re.search(p, name) for p in self.weight_decay_includes)
        elif self.weight_decay_excludes is not None:
            hit = not any(re.search(p, name) for p in self.weight_decay_excludes)
        else:
            hit = True
        return self.weight_decay if hit else 0.0

    def _sparse_indices(self, ctx, name):
        """The Gather indices whose rows alone change (OneFlow's indexed-slices update), or
        None for a dense update. As OneFlow, only sgd/momentum/adam updates of included
        variables (function_config.indexed_slices_optimizer_conf) without regularizer,
        clipping or dynamic loss scale (whose gradient ops break the pattern) become
        sparse; nor under gradient accumulation (OneFlow's
        GradientAccumulationRewritePass runs before IndexedSlicesOptimizerRewritePass,
        whose pattern its accumulation breaks) or a mirrored step, whose update would see
        one part's lookups."""
        if name not in ctx.sparse_names:
            return None
        return self._lookup_rows(ctx, name)

    def _lookup_rows(self, ctx, name):
        """_sparse_indices' indices for a variable whether or not it is named."""
        if not self._sparse_capable or self.grad_clipping is not None or \
                ctx.dynamic_loss_scale or not ctx.builder.update_sees_every_lookup:
            return None
        if ctx.builder.variable_specs[name].regularizer is not None:
            return None
        return R.lookup_indices(ctx.builder, ctx.builder.variables[name])

    def _update(self, ctx, name, w, g, lr, weight_decay, keep=None):
        """{variable name: new value} for `w` and its optimizer state; `keep` (only for
        optimizers with _skips_by_coefficients) is the dynamic loss scale's bool "every
        gradient is finite", false on a step the update must leave as it was."""
        raise NotImplementedError


_lazy_adam_dense_warned = weakref.WeakSet()


def _warn_dense_rows(optimizer, ctx, grads):
    """Say once per optimizer that a variable read only through a lookup, which its
    documentation promises row updates, is updated densely (not named for them)."""
    if optimizer in _lazy_adam_dense_warned:
        return
    dense = [n for n in grads if n not in ctx.sparse_names
             and optimizer._lookup_rows(ctx, n) is not None]
    if not dense:
        return
    _lazy_adam_dense_warned.add(optimizer)
    name = dense[0]
    warn_at_user_line(
        f"LazyAdam updates every row of {name!r} (and its moments), as OneFlow's code does "
        "without function_config.indexed_slices_optimizer_conf: name the variable there "
        f"(include_op_names=dict(op_name=[{name!r}])) to update only the rows looked up",
        location=getattr(optimizer, "_minimize_location", None))


def _step_blob(builder, lbn):
    """The job's int64 one-element Blob named `lbn` (train_step_lbn)."""
    blob = R.find_blob(builder, lbn)
    if blob is None:
        raise TraceError(f"train_step_lbn {lbn!r} names no blob of this job (pass the "
                         "logical_blob_name of an int64 blob of shape (1,))")
    if blob.np_dtype != np.int64 or int(np.prod(blob.shape)) != 1:
        raise TraceError(f"train_step_lbn {lbn!r} must be an int64 blob of one element, got "
                         f"{blob.np_dtype} {blob.shape}")
    return blob


def _folds_factors(config):
    """Whether the updates of a job fold a gradient's scalar factor into their own
    coefficients (`_folds_gradient_factor`): under float16 mixed precision only. The
    product of a coefficient (a learning rate, 1 - beta) and the factor must stay a normal
    float32: a dynamic loss scale on float32 gradients climbs until they overflow, to
    2**120 and more, where 1 / scale times a coefficient is subnormal and rounds the step,
    while half gradients bound the scale far below that. And the choice is the same for a
    job with and without a loss scale, so their steps keep the same bits under a
    power-of-two scale (OneFlow's kernels unscale the gradient first)."""
    from onnxjob.passes import mixed_precision_type
    return config is not None and mixed_precision_type(config) == ir.DataType.FLOAT16


def _fused_regularizer_names(config, members, builder):
    """The variables whose regularizer OneFlow's FuseUpdateOpsPass folds into their update
    (function_config.enable_fuse_model_update_ops): updated by sgd/momentum/adam/rmsprop/
    lars, with no clipping (whose ops read the regularized gradient: its pattern needs
    one consumer). The fused kernels' L1 term is 0 at w = 0 on the CPU too
    (update_rules.regularize)."""
    if config is None or not config.get("enable_fuse_model_update_ops"):
        return set()
    return {n for m in members if m._update_fuses_regularizer and m.grad_clipping is None
            for n in m._names(builder)}


def _indexed_slices_names(config):
    """Variable names of function_config.indexed_slices_optimizer_conf(dict(
    include_op_names=dict(op_name=[...]))) (with enable, default True)."""
    conf = config.get("indexed_slices_optimizer_conf") if config is not None else None
    if not conf:
        return set()
    try:
        if not conf.get("enable", True):
            return set()
        return set(conf["include_op_names"]["op_name"])
    except (AttributeError, KeyError, TypeError):
        raise TraceError("indexed_slices_optimizer_conf takes dict(include_op_names=dict("
                         f"op_name=[variable names...])), got {conf!r}") from None


class SGD(Optimizer):
    """Stochastic gradient descent: w -= lr * g (momentum 0), else OneFlow's momentum
    update m = beta*m - lr*g; w += m. Default momentum 0.9."""

    _sparse_capable = True
    _update_fuses_regularizer = True
    _folds_gradient_factor = True
    _elementwise_update = True

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables)
        self.momentum = momentum or 0.0

    def _update(self, ctx, name, w, g, lr, weight_decay, keep=None, factor=None):
        if not self.momentum:
            return {name: R.sgd(w, g, lr, weight_decay, factor)}
        m_name, m = _state(name, "momentum", w)
        w_new, m_new = R.momentum(w, g, m, lr, self.momentum, weight_decay, factor)
        return {name: w_new, m_name: m_new}


class SGDW(SGD):
    """SGD with decoupled weight decay: w -= lr * (g + wd*w) (momentum 0), else
    m = beta*m - lr*g; w += m - lr*wd*w."""

    def __init__(self, lr_scheduler, loss_scale_factor=None, momentum=0.9, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        Optimizer.__init__(self, lr_scheduler, loss_scale_factor, grad_clipping,
                           train_step_lbn, loss_scale_policy, variables, weight_decay,
                           weight_decay_includes, weight_decay_excludes)
        self.momentum = momentum or 0.0


class Adam(Optimizer):
    """Adam as OneFlow's adam_update: m, v moments; with do_bias_correction (off by default
    in OneFlow 0.5) w -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps), bc = 1 - beta**(step+1)."""

    _sparse_capable = True
    _update_fuses_regularizer = True
    _skips_by_coefficients = True
    _folds_gradient_factor = True
    _elementwise_update = True

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 do_bias_correction=False, loss_scale_factor=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.do_bias_correction = do_bias_correction

    def _update(self, ctx, name, w, g, lr, weight_decay, keep=None, factor=None):
        m_name, m = _state(name, "m", w)
        v_name, v = _state(name, "v", w)
        if self.written_for_0_4:    # that generation's kernel (compat/generations.py)
            w_new, m_new, v_new = R.adam_0_4(
                w, g, m, v, lr, self.beta1, self.beta2, self.epsilon, weight_decay,
                ctx.step if self.do_bias_correction else None, keep, factor)
            return {name: w_new, m_name: m_new, v_name: v_new}
        corrections = None
        if self.do_bias_correction:
            corrections = (R.cast_like(ctx.bias_correction(self.beta1), w),
                           R.cast_like(ctx.bias_correction(self.beta2), w))
        w_new, m_new, v_new = R.adam(w, g, m, v, lr, self.beta1, self.beta2, self.epsilon,
                                     weight_decay, corrections, keep, factor)
        return {name: w_new, m_name: m_new, v_name: v_new}


class AdamW(Adam):
    """Adam with decoupled weight decay: the Adam step, then w -= lr * wd * w."""

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 do_bias_correction=False, loss_scale_factor=None, weight_decay=None,
                 weight_decay_includes=None, weight_decay_excludes=None, grad_clipping=None,
                 train_step_lbn=None, loss_scale_policy=None, variables=None):
        Optimizer.__init__(self, lr_scheduler, loss_scale_factor, grad_clipping,
                           train_step_lbn, loss_scale_policy, variables, weight_decay,
                           weight_decay_includes, weight_decay_excludes)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon
        self.do_bias_correction = do_bias_correction


class LazyAdam(Adam):
    """Adam with bias correction. As OneFlow 0.2-0.5's code (adam_optm.cpp reads
    lazy_adam_conf into a dense adam_update), the update touches only the rows a Gather
    looked up in the step (weights and moments) for the variables named in
    function_config.indexed_slices_optimizer_conf, and every row of the others: its
    documentation's "only updates the element that has gradient" holds with that
    config only, which is said once for a looked-up variable left dense."""

    _warns_dense_rows = True

    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-8,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, beta1, beta2, epsilon, True, loss_scale_factor,
                         grad_clipping, train_step_lbn, loss_scale_policy, variables)


class RMSProp(Optimizer):
    """mean_square = d*ms + (1-d)*g^2; w -= lr*g/sqrt(ms + eps) (centered: ms - mg^2)."""

    _elementwise_update = True
    _update_fuses_regularizer = True

    def __init__(self, lr_scheduler, decay_rate=0.99, epsilon=1e-8, centered=False,
                 loss_scale_factor=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables)
        self.decay_rate, self.epsilon, self.centered = decay_rate, epsilon, centered

    def _update(self, ctx, name, w, g, lr, weight_decay, keep=None):
        ms_name, ms = _state(name, "mean_square", w)
        mg_name, mg = _state(name, "mean_gradient", w) if self.centered else (None, None)
        # NOTE: OneFlow's rmsprop kernel takes weight_decay but does not use it.
        w_new, ms_new, mg_new = R.rmsprop(w, g, ms, lr, self.decay_rate, self.epsilon, mg)
        new = {name: w_new, ms_name: ms_new}
        if self.centered:
            new[mg_name] = mg_new
        return new


class LAMB(Optimizer):
    """LAMB as OneFlow's lamb_update: the bias-corrected Adam direction (weight decay
    excluded) scaled by the trust ratio ||w|| / ||direction||, then w -= lr * ratio *
    (direction + wd*w). The bias corrections come from state beta1_t / beta2_t.
    OneFlow <= 0.3's positional order (grad_clipping sixth, no weight decay arguments) is
    accepted too (compat/generations.py)."""

    _skips_by_coefficients = True
    _folds_gradient_factor = True

    @two_generations(("self", "lr_scheduler", "beta1", "beta2", "epsilon", "loss_scale_factor",
                      "grad_clipping", "train_step_lbn", "loss_scale_policy"),
                     positional_is(6, by_global_norm))
    def __init__(self, lr_scheduler, beta1=0.9, beta2=0.999, epsilon=1e-6,
                 loss_scale_factor=None, weight_decay=None, weight_decay_includes=None,
                 weight_decay_excludes=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables, weight_decay, weight_decay_includes,
                         weight_decay_excludes)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def _update(self, ctx, name, w, g, lr, weight_decay, keep=None, factor=None):
        states = self._states(name, w)
        new = R.lamb(w, g, *(state for _, state in states), lr, self.beta1, self.beta2,
                     self.epsilon, weight_decay, keep, factor)
        return dict(zip([name] + [n for n, _ in states], new))

    def _states(self, name, w):
        """[(name, blob)] of m, v, beta1_t, beta2_t."""
        return [_state(name, "m", w), _state(name, "v", w),
                _state(name, "beta1_t", w, np.float32(self.beta1), shape=(1,)),
                _state(name, "beta2_t", w, np.float32(self.beta2), shape=(1,))]

    def _update_group(self, ctx, grads):
        """The group's updates as update_rules.lamb_group: the per-variable scalars of every
        float32 variable computed as vectors (the same values as one `lamb` each)."""
        builder = ctx.builder
        names = [n for n in grads if builder.variables[n].np_dtype == np.float32]
        if len(names) < 2:
            return super()._update_group(ctx, grads)
        lr = R.cast_like(self.lr_scheduler.lr(ctx.step), builder.variables[names[0]])
        keep = ctx.finite
        items, states = [], {}
        for name in names:
            # (lamb_group makes a skipped step's gradients 0, a stack's at once)
            g, factor = _as_updated(*grads[name], None, ctx.fold_factors)
            w = builder.variables[name]
            states[name] = self._states(name, w)
            items.append((w, g, *(state for _, state in states[name]),
                          self._weight_decay_rate(name), factor))
        for name, new in zip(names, R.lamb_group(items, lr, self.beta1, self.beta2,
                                                 self.epsilon, keep)):
            _store(ctx, dict(zip([name] + [n for n, _ in states[name]], new)), keep)
        rest = {n: pair for n, pair in grads.items() if n not in names}
        if rest:
            super()._update_group(ctx, rest)


class LARS(Optimizer):
    """Momentum SGD with the layer-wise rate coeff*||w|| / (eps + ||g|| + wd*||w||);
    the weight decay is applied outside the momentum, as OneFlow's lars_update. OneFlow
    <= 0.3's positional order (grad_clipping sixth) is accepted too."""

    _update_fuses_regularizer = True

    @two_generations(("self", "lr_scheduler", "momentum_beta", "epsilon", "lars_coefficient",
                      "loss_scale_factor", "grad_clipping", "train_step_lbn",
                      "loss_scale_policy"), positional_is(6, by_global_norm))
    def __init__(self, lr_scheduler, momentum_beta=0.9, epsilon=1e-9, lars_coefficient=0.0001,
                 loss_scale_factor=None, weight_decay=None, weight_decay_includes=None,
                 weight_decay_excludes=None, grad_clipping=None, train_step_lbn=None,
                 loss_scale_policy=None, variables=None):
        super().__init__(lr_scheduler, loss_scale_factor, grad_clipping, train_step_lbn,
                         loss_scale_policy, variables, weight_decay, weight_decay_includes,
                         weight_decay_excludes)
        self.momentum_beta, self.epsilon = momentum_beta, epsilon
        self.lars_coefficient = lars_coefficient

    def _update(self, ctx, name, w, g, lr, weight_decay, keep=None):
        m_name, m = _state(name, "momentum", w)
        w_new, m_new = R.lars(w, g, m, lr, self.momentum_beta, self.epsilon,
                              self.lars_coefficient, weight_decay)
        return {name: w_new, m_name: m_new}


class CombinedOptimizer(Optimizer):
    """Several optimizers in one job, each updating its own `variables` (no overlap); they
    share the train step and the loss-scale policy."""

    def __init__(self, optimizers, loss_scale_factor=None, train_step_lbn=None,
                 loss_scale_policy=None):
        super().__init__(None, loss_scale_factor, None, train_step_lbn, loss_scale_policy)
        for o in optimizers:
            if isinstance(o, CombinedOptimizer):
                raise TraceError("CombinedOptimizer cannot contain a CombinedOptimizer")
            if o.train_step_lbn is not None or o.loss_scale_policy is not None:
                raise TraceError("set train_step_lbn and the loss scale on the "
                                 "CombinedOptimizer, not on the optimizers it combines")
        self.optimizers = list(optimizers)

    def _members(self):
        return self.optimizers

    def _check_members(self, builder):
        seen = {}
        for i, o in enumerate(self.optimizers):
            for name in o._names(builder):
                if name in seen:
                    raise TraceError(f"CombinedOptimizer: variable {name!r} is given to "
                                     f"optimizers {seen[name]} and {i}; each variable may "
                                     "have one optimizer")
                seen[name] = i

    def Variables(self):
        """The variable names of each combined optimizer (a list per optimizer)."""
        builder = current_builder("Optimizer.Variables")
        return [o._names(builder) for o in self.optimizers]


def _say_untrained(optimizer, builder, names, first_job):
    """Warn where `optimizer`, whose variables job `first_job` fixed, leaves trainable
    variables of `builder`'s job untrained."""
    listed = set(names)
    left = [n for n, spec in builder.variable_specs.items()
            if spec.trainable and n not in listed]
    if left:
        shown = ", ".join(repr(n) for n in left[:5]) + (", ..." if len(left) > 5 else "")
        warn_at_user_line(
            f"job {builder.job_name!r}: this {type(optimizer).__name__} object's variables "
            f"were fixed in job {first_job!r} (OneFlow computes Optimizer.Variables() once per "
            f"object), so {shown} are not updated here, as in OneFlow; make the optimizer "
            "inside each job function to update them")


def add_loss(loss):
    """Old API: declare the loss of a job configured with config.train.* (OneFlow's
    `flow.losses.add_loss`, still part of its 0.5 API, so no warning). A later
    `minimize` replaces what was declared here, as in OneFlow."""
    builder = current_builder("flow.losses.add_loss")
    job = getattr(builder, "job_function", None)
    if builder.optimizer is None and job is not None and not job.is_train:
        # OneFlow: global_function(type="predict"), the default with function_config= by
        # keyword, takes the config's predict_conf, which clears its train_conf (one
        # oneof), and add_loss stops (job_build_and_infer_ctx.cpp)
        raise TraceError(f"flow.losses.add_loss in job {builder.job_name!r}, which has no "
                         "train configuration: a predict job (global_function's default type, "
                         "also where function_config= is given by keyword, which drops the "
                         "config's train settings as OneFlow does); write "
                         "@flow.global_function(type=\"train\", function_config=...) (OneFlow: "
                         "job has no TrainConf when adding loss logical blob name)")
    losses = builder.losses
    if any(known is loss for known in losses):
        # OneFlow aborts on it (autograd.cpp, ScaleModelDiffByLossInstanceNum: Check failed:
        # loss_lbi2op_node.emplace(...).second); counted twice it would double the gradient
        raise TraceError(f"flow.losses.add_loss: {getattr(loss, 'name', loss)!r} is already a "
                         "loss of this job (minimize() declares its loss itself)")
    losses.append(loss)


__getattr__ = missing_api("flow.optimizer")
