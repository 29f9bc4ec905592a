"""The optimizer of a job configured with OneFlow's old train API: function_config's
`train.primary_lr(...)` and `train.model_update_conf(...)` (a dict of the proto), with
`flow.losses.add_loss` naming the loss, translated into flow.optimizer objects."""
from onnxjob.errors import TraceError
from onnxjob.train.lr_schedules import (
    CosineScheduler, ExponentialScheduler, InverseTimeScheduler, LinearCosineScheduler,
    NaturalExpScheduler, PiecewiseConstantScheduler, PiecewiseScalingScheduler,
    PolynomialScheduler, warmup)
from onnxjob.train.optimizer import (
    LAMB, LARS, SGD, Adam, LazyAdam, RMSProp, StaticLossScalePolicy, by_global_norm)


def optimizer_of_train_conf(train_conf, written_for_0_4=False):
    """Optimizer described by config.train.primary_lr / model_update_conf (old API), for a
    job of code written for OneFlow <= 0.4 where `written_for_0_4`."""
    conf = dict(train_conf.get("model_update_conf") or {"naive_conf": {}})
    lr = float(train_conf.get("primary_lr", 0.0))
    decay = conf.pop("learning_rate_decay", None)
    warm = conf.pop("warmup_conf", None)
    clip = conf.pop("clip_conf", None)
    wd = conf.pop("weight_decay_conf", None)
    scheduler = _old_api_scheduler(lr, decay, _old_api_warmup(warm))
    clipping = by_global_norm(clip["clip_by_global_norm"]["clip_norm"]) if clip else None
    if len(conf) != 1:
        raise TraceError("model_update_conf needs exactly one optimizer (naive_conf, "
                         "momentum_conf, rmsprop_conf, lars_conf, adam_conf, lazy_adam_conf or "
                         f"lamb_conf), got {sorted(conf) or 'none'}")
    kind, args = next(iter(conf.items()))
    args = args or {}
    if kind == "naive_conf":
        opt = SGD(scheduler, momentum=0, grad_clipping=clipping)
    elif kind == "momentum_conf":
        opt = SGD(scheduler, momentum=args.get("beta", 0.9), grad_clipping=clipping)
    elif kind in ("adam_conf", "lazy_adam_conf"):
        cls = Adam if kind == "adam_conf" else LazyAdam
        opt = cls(scheduler, args.get("beta1", 0.9), args.get("beta2", 0.999),
                  args.get("epsilon", 1e-8), grad_clipping=clipping)
        # NOTE: the proto default of do_bias_correction is true in OneFlow 0.5 (Adam's
        # Python default is false); adam_conf's was false in 0.1-0.4 but 0.3.0
        # (job_conf.proto / op_conf.proto), lazy_adam_conf's true (adam_optm.cpp forced it)
        default = not (written_for_0_4 and kind == "adam_conf")
        opt.do_bias_correction = args.get("do_bias_correction", default)
    elif kind == "rmsprop_conf":
        opt = RMSProp(scheduler, args.get("decay_rate", 0.99), args.get("epsilon", 1e-8),
                      args.get("centered", False), grad_clipping=clipping)
    elif kind == "lamb_conf":
        opt = LAMB(scheduler, args.get("beta1", 0.9), args.get("beta2", 0.999),
                   args.get("epsilon", 1e-6), grad_clipping=clipping)
    elif kind == "lars_conf":
        opt = LARS(scheduler, args.get("momentum_beta", 0.9), args.get("epsilon", 1e-9),
                   args.get("lars_coefficient", 0.0001), grad_clipping=clipping)
    else:
        raise TraceError(f"model_update_conf {kind!r} is not supported")
    if wd:
        opt.weight_decay = wd.get("weight_decay_rate", 0.0)
        opt.weight_decay_includes = (wd.get("includes") or {}).get("pattern")
        opt.weight_decay_excludes = (wd.get("excludes") or {}).get("pattern")
    if train_conf.get("loss_scale_factor") is not None:
        opt.loss_scale_policy = StaticLossScalePolicy(train_conf["loss_scale_factor"])
    return opt


def _old_api_warmup(warm):
    if not warm:
        return None
    kind, args = next(iter(warm.items()))
    args = args or {}
    steps = _conf_field(args, "warmup_batches", kind, "warmup_conf")
    if kind == "linear_conf":
        return warmup.linear(steps, args.get("start_multiplier", 0.0))
    if kind == "constant_conf":
        return warmup.constant(steps, _conf_field(args, "multiplier", kind, "warmup_conf"))
    raise TraceError(f"warmup_conf {kind!r} is not a kind of OneFlow's WarmupConf "
                     "(constant_conf, linear_conf)")


_RATE_SCHEDULERS = {"exponential_conf": ExponentialScheduler,
                    "inverse_time_conf": InverseTimeScheduler,
                    "natural_exp_conf": NaturalExpScheduler}
_DECAY_KINDS = ("piecewise_constant_conf", "piecewise_scaling_conf", "cosine_conf",
                "linear_cosine_conf", "polynomial_conf") + tuple(_RATE_SCHEDULERS)


def _conf_field(args, key, kind, conf="learning_rate_decay"):
    """A required field of an old-API proto conf given as a dict."""
    if key not in args:
        raise TraceError(f"{conf} {kind!r} needs {key!r} (a required field of OneFlow's "
                         "proto)")
    return args[key]


def _old_api_scheduler(lr, decay, w):
    """The scheduler of model_update_conf's `learning_rate_decay`: every kind of OneFlow's
    LearningRateDecayConf, as its learning_rate_schedule kernel computes it from
    primary_lr (piecewise_constant_conf's values replace it; the warmup still starts from
    it)."""
    if not decay:
        return PiecewiseConstantScheduler([], [lr], warmup=w)
    kind, args = next(iter(decay.items()))
    args = args or {}
    if kind not in _DECAY_KINDS:
        raise TraceError(f"learning_rate_decay {kind!r} is not a kind of OneFlow's "
                         f"LearningRateDecayConf ({', '.join(_DECAY_KINDS)})")
    if kind in ("piecewise_constant_conf", "piecewise_scaling_conf"):
        # the proto holds every value / scale, the first included (for the scales usually
        # 1, which flow.optimizer.PiecewiseScalingScheduler prepends itself): one more than
        # the boundaries, as OneFlow's kernel checks
        field = "values" if kind == "piecewise_constant_conf" else "scales"
        boundaries, values = list(args.get("boundaries", [])), list(args.get(field, []))
        if len(values) != len(boundaries) + 1:
            raise TraceError(f"learning_rate_decay {kind!r} needs one more of {field!r} than "
                             f"of 'boundaries', got {len(values)} and {len(boundaries)}")
    if kind == "piecewise_constant_conf":
        sched = PiecewiseConstantScheduler(boundaries, values, warmup=w)
        sched.base_lr = lr
        return sched
    if kind == "piecewise_scaling_conf":
        sched = PiecewiseScalingScheduler(lr, boundaries, values[1:], warmup=w)
        sched.scales = values
        return sched
    steps = _conf_field(args, "decay_batches", kind)
    if kind == "cosine_conf":
        return CosineScheduler(lr, steps, args.get("alpha", 0.0), warmup=w)
    if kind == "linear_cosine_conf":
        return LinearCosineScheduler(lr, steps, args.get("num_periods", 0.5),
                                     args.get("alpha", 0.0), args.get("beta", 0.001), warmup=w)
    if kind == "polynomial_conf":
        return PolynomialScheduler(lr, steps, args.get("end_learning_rate", 0.0001),
                                   args.get("power", 1.0), args.get("cycle", False), w)
    return _RATE_SCHEDULERS[kind](lr, steps, _conf_field(args, "decay_rate", kind),
                                  args.get("staircase", False), w)


def resolve_optimizer(builder, job):
    """The job's optimizer: from minimize(), or from the old function_config API.

    Records the job's function_config for apply()."""
    builder.job_config = job.config
    if builder.optimizer is not None:
        return builder.optimizer
    if job.config.train_conf and builder.losses:
        builder.optimizer = optimizer_of_train_conf(job.config.train_conf,
                                                    getattr(job, "written_for_0_4", False))
    return builder.optimizer
