"""`flow.get_variable`: named, session-wide variables seen by a job as graph inputs."""
import numpy as np

from onnxjob import dtypes
from onnxjob.compat.generations import positional_is, two_generations
from onnxjob.compat.zero_d_inputs import as_vector
from onnxjob.frontend import initializers, scope
from onnxjob.frontend.distribute import Distribute, assert_is_valid_distribute
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import current_builder
from onnxjob.source_info import user_location, warn_at_user_line


class VariableSpec:
    """What a variable is: name, shape, dtype, initializer, trainability, regularizer, and
    the random seed of its initial value (get_variable's random_seed; None: the session's)."""

    def __init__(self, name, shape, np_dtype, initializer, trainable=True, regularizer=None,
                 random_seed=None):
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.np_dtype = np.dtype(np_dtype)
        if initializer is not None and not isinstance(initializer, initializers.Initializer):
            # OneFlow's InitializerConf message, wherever a variable's initializer is given
            # (get_variable, every layer's *_initializer)
            initializer = initializers.from_initializer_conf(initializer)
        self.initializer = initializer
        self.trainable = trainable
        self.regularizer = regularizer
        self.random_seed = None if random_seed is None else int(random_seed)
        self.placed_on_cpu = False  # set per job: scope.oneflow_places_on_cpu


class Regularizer:
    def __init__(self, l1=0.0, l2=0.0):
        self.l1 = float(l1)
        self.l2 = float(l2)


class regularizers:
    """flow.regularizers.l1 / l2 / l1_l2."""

    @staticmethod
    def l1(l=0.01):
        return Regularizer(l1=l)

    @staticmethod
    def l2(l=0.01):
        return Regularizer(l2=l)

    @staticmethod
    def l1_l2(l1=0.01, l2=0.01):
        return Regularizer(l1=l1, l2=l2)


def variable_blob(spec, reuse=True):
    """What the job being traced reads for variable `spec` (created on first use): its
    Blob, or what the job's variable reader makes of it (under function_config.enable_ssp
    its stale value: frontend/ssp.py, which is built from ops and so sits above them)."""
    builder = current_builder("flow.get_variable")
    blob = _variable(builder, spec, reuse)
    read = builder.variable_reader
    return blob if read is None else read(builder, spec.name, blob)


def _variable(builder, spec, reuse):
    if spec.name in builder.variables:
        if not reuse:   # (OneFlow's words, its spelling included, then where and why)
            raise AssertionError(
                f"{user_location()}: varaible '{spec.name}' already exists, getting the same "
                "variable is not allowed when param reuse is False (two layers with one "
                "name, e.g. flow.layers.dense's default 'Dense': give each its own name=)")
        existing = builder.variable_specs[spec.name]
        if existing.shape != spec.shape or existing.np_dtype != spec.np_dtype:
            # OneFlow returns the job's variable of that name as it is (get_variable.py:
            # no check within a job; across jobs it asserts, as _check_same does); a trap
            warn_at_user_line(
                f"flow.get_variable({spec.name!r}, shape={spec.shape}, dtype={spec.np_dtype}): "
                f"this job already has it as {existing.shape} {existing.np_dtype}, which is "
                "returned, as in OneFlow")
        return builder.variables[spec.name]
    shared = builder.variable_registry.declare_variable(spec, _check_same)
    blob = builder.add_input(spec.name, spec.shape, spec.np_dtype)
    builder.variables[spec.name] = blob
    # One value shared by every job (the registry's spec and initializer), but whether this
    # job trains or regularizes it is this job's own call, as in OneFlow (a GAN's generator
    # is trainable in its own job and frozen in the discriminator's).
    builder.variable_specs[spec.name] = VariableSpec(
        spec.name, spec.shape, spec.np_dtype, shared.initializer, spec.trainable,
        spec.regularizer)
    # where OneFlow's gradient ops of the variable run (its regularizer's kernels differ)
    builder.variable_specs[spec.name].placed_on_cpu = scope.oneflow_places_on_cpu(builder)
    return blob


def _check_same(existing, spec):
    if existing.shape != spec.shape or existing.np_dtype != spec.np_dtype:
        raise TraceError(f"variable {spec.name!r} already exists with shape {existing.shape} "
                         f"and dtype {existing.np_dtype}; asked for {spec.shape}, {spec.np_dtype}")


def _get_variable_is_old(args):
    """OneFlow <= 0.4 put `distribute` ninth, where 0.5 has `nd_sbp`: a scheme there (or a
    bool tenth argument, the old `reuse`) means the old order."""
    return positional_is(8, Distribute)(args) or positional_is(9, bool)(args)


def _default_initializer(builder):
    """The job's function_config.default_initializer_conf(dict(...)) as an initializer, or
    None: OneFlow gives it to the variables created without one
    (set_default_variable_conf.cpp)."""
    job = getattr(builder, "job_function", None)
    conf = job.config.get("default_initializer_conf") if job is not None else None
    if conf is None:
        return None
    if isinstance(conf, dict):
        from google.protobuf import json_format
        from onnxjob.compat.protos import initializer_conf_pb2
        conf = json_format.ParseDict(conf, initializer_conf_pb2().InitializerConf())
    return initializers.from_initializer_conf(conf)


@two_generations(("name", "shape", "dtype", "initializer", "regularizer", "trainable",
                  "model_name", "random_seed", "distribute", "reuse"), _get_variable_is_old)
def get_variable(name, shape=None, dtype=dtypes.float32, initializer=None, regularizer=None,
                 trainable=None, model_name=None, random_seed=None, nd_sbp=None,
                 distribute=None, reuse=True, parallel_distribution=None):
    """A variable shared by name across the session's jobs (spec §5.5).

    `initializer` is an onnxjob initializer (flow.*_initializer) or OneFlow's
    `initializer_conf_pb2.InitializerConf` message. `nd_sbp` / `distribute` (a
    flow.distribute scheme) are accepted; onnxjob keeps the whole variable on one device.
    `parallel_distribution` is OneFlow 0.4's name of `nd_sbp`.
    """
    if distribute is not None:
        assert_is_valid_distribute(distribute)
    assert isinstance(shape, (list, tuple)), "param shape should be a list or tuple of dimension"
    full = scope.full_name(name)
    builder = current_builder("flow.get_variable")
    if initializer is None and full not in builder.variables:
        initializer = _default_initializer(builder)
        if initializer is None and not builder.variable_registry.has_variable(full):
            raise TraceError(f"flow.get_variable({name!r}): no initializer given; pass e.g. "
                             "initializer=flow.zeros_initializer()")
    spec = VariableSpec(full, shape, dtypes.to_numpy(dtype), initializer,
                        True if trainable is None else bool(trainable), regularizer, random_seed)
    return variable_blob(spec, reuse=reuse)


# OneFlow's function is `api_get_variable`: code generators read the name (oneflow_convert's
# x2oneflow skips the variables' calls by it when it writes a job's code)
get_variable.__name__ = get_variable.__qualname__ = "api_get_variable"


def assign(ref, value, dtype=None, name=None):
    """Set variable `ref` to `value` after this run (a state update, as in OneFlow); a 0-d
    `value` sets a (1,) variable, as OneFlow <= 0.4's one-element full reductions did
    (compat/zero_d_inputs.py)."""
    builder = current_builder("flow.assign")
    names = [n for n, b in builder.variables.items() if b is ref]
    if not names:
        raise TraceError(f"flow.assign: the first argument must be a variable of this job "
                         f"(from flow.get_variable), got {getattr(ref, 'name', ref)!r}")
    value = as_vector(value, where=tuple(ref.shape) == (1,))
    if tuple(value.shape) != tuple(ref.shape) or value.np_dtype != ref.np_dtype:
        raise TraceError(f"flow.assign: value {value.shape} {value.np_dtype} does not fit "
                         f"variable {names[0]!r} {ref.shape} {ref.np_dtype}")
    name = names[0]
    if name in builder.assigned_at:
        builder.refuse_second_writer(name, f"the flow.assign at {builder.assigned_at[name]}",
                                     user_location())
    if name in builder.moving_averages:
        builder.refuse_second_writer(name, "a batch normalization's moving average",
                                     user_location())
    builder.assigned_at[name] = user_location()
    builder.state_updates[name] = value
    job = getattr(builder, "job_function", None)
    steps = getattr(job, "accumulation_steps", 1)
    if isinstance(steps, int) and steps > 1:
        warn_at_user_line(
            f"flow.assign of {name!r} in job {builder.job_name!r}, which accumulates "
            f"gradients over {steps} micro-batches: onnxjob keeps the first micro-batch's "
            "value, once per call (every micro-batch reads the value before the call); "
            "OneFlow's accumulation rewrite gives the assign a copy of the variable "
            "(a repeat op), so its writes do not reach the variable there")
