"""`flow.global_function`: decorate a job body; the first call compiles and runs it."""
import functools
import inspect
import typing
import weakref

import numpy as np

from onnxjob import dtypes
from onnxjob.frontend import eager_jobs, results, scope, ssp
from onnxjob.frontend.fast_call import NOT_INLINE, make_fast_call
from onnxjob.frontend.helpers import default_parallel_num
from onnxjob import typing as tp
from onnxjob.frontend.config import FunctionConfig, started_session
from onnxjob.ops import qat
from onnxjob.ops._array_common import keep_batch_axis
from onnxjob.runtime import distributed
from onnxjob.runtime.micro_batches import PerMicroBatch
from onnxjob.runtime.session import default_session, default_session_slot
from onnxjob.train.legacy_train_conf import resolve_optimizer
from onnxjob.source_info import user_location, warn_at_user_line
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.compat.generations import written_for_0_4


class JobFunction:
    """A registered job: its signature, annotations, config, and how to call it."""

    def __init__(self, func, job_type, config):
        self.func = func
        self.name = func.__name__
        self.job_type = job_type
        self.config = config
        self.location = user_location()
        # defined by code written for OneFlow <= 0.4: 0-d results come back as (1,)
        self.written_for_0_4 = written_for_0_4()
        sig = inspect.signature(func)
        self.param_names, self.param_annotations = [], []
        annotated = []
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise AssertionError("no parameters like *args or **kwargs supported")
            self.param_names.append(p.name)
            if p.annotation is not p.empty:
                tp.check_parameter_annotation(p.annotation)
                annotated.append(True)
                self.param_annotations.append(p.annotation)
            elif p.default is not p.empty and tp.is_placeholder(p.default):
                annotated.append(False)  # old style: flow.FixedTensorDef(...) as default
                self.param_annotations.append(p.default)
            else:
                annotated.append(None)
                self.param_annotations.append(None)
        if any(a is True for a in annotated) and not all(a is True for a in annotated):
            raise NotImplementedError("All parameters of global function should be annotated")
        if any(a is None for a in annotated):
            missing = [n for n, a in zip(self.param_names, annotated) if a is None]
            raise NotImplementedError(f"{self.location}: parameters {missing} of job {self.name!r} "
                                      "need a placeholder annotation, e.g. "
                                      "tp.Numpy.Placeholder((100, 784))")
        ret = sig.return_annotation
        self.has_return_annotation = ret is not sig.empty
        self.return_annotation = ret if self.has_return_annotation else None
        if self.has_return_annotation:
            tp.check_return_annotation(ret)
        self.is_callback = self.has_return_annotation and tp.is_callback(ret)
        # a Callback or `-> None` call returns before its run: its arguments must be copied
        self._returns_before_run = self.is_callback or (
            self.has_return_annotation and self.return_annotation is None)
        # Fast path of __call__: every parameter a plain Numpy placeholder.
        self._numpy_params = None
        if all(tp.is_placeholder(a) and issubclass(a, tp.NumpyDef) for a in self.param_annotations):
            self._numpy_params = [(name, ann.shape, ann.np_dtype())
                                  for name, ann in zip(self.param_names, self.param_annotations)]
        # function_config.dynamic_batch(True): the placeholders' batch, calls take 1..B rows
        self._batch_rows = None
        if config.get("dynamic_batch", False) and self._numpy_params and all(
                len(shape) >= 1 for _, shape, _ in self._numpy_params):
            batches = {shape[0] for _, shape, _ in self._numpy_params}
            if len(batches) == 1:
                self._batch_rows = batches.pop()  # else the compiler says why it cannot
        # eager mode (frontend/eager_jobs.py, runtime/eager_values.py): whether the body
        # reads blob values (then it is traced at each call; Session sets it as it traces)
        # and the plain Python values it read at its last trace
        self.reads_values = False
        self.plain_inputs = {}
        self.caller = _fast_path_first(self)

    def _checked_feeds(self, args):
        """Per-device feeds after the full argument checks of spec §2.2."""
        device_feeds = None
        try:
            for arg, ann, pname in zip(args, self.param_annotations, self.param_names):
                value = tp.convert_argument(arg, ann, pname, _mirrored_list_lengths())
                device_feeds = _flat_feed(device_feeds, pname, ann, value)
        except tp.JobArgumentError as e:
            # the caller's line is looked up only when there is an error to report
            raise tp.JobArgumentError(f"{user_location()}: {e}") from None
        return device_feeds

    def _fewer_rows_feeds(self, args):
        """Feeds of a dynamic-batch call with n < B rows in every input, else None (a full
        batch, or a shape that the full checks report); raises, naming the caller's line,
        on more rows than the placeholders' B or different row counts."""
        rows = {}
        for arg, (name, shape, _) in zip(args, self._numpy_params):
            if not isinstance(arg, np.ndarray) or arg.ndim != len(shape) or \
                    arg.shape[1:] != shape[1:]:
                return None
            rows[name] = arg.shape[0]
        batch = self._batch_rows
        if any(n > batch for n in rows.values()):
            raise tp.JobArgumentError(
                f"{user_location()}: job {self.name!r} (dynamic batch) takes at most {batch} "
                f"rows per input (its placeholders' first dimension), got {rows}")
        if len(set(rows.values())) > 1:
            raise tp.JobArgumentError(
                f"{user_location()}: job {self.name!r} (dynamic batch): every input of a call "
                f"must have the same number of rows, got {rows}")
        n = next(iter(rows.values()))
        if n == batch:
            return None
        if n == 0:
            raise tp.JobArgumentError(f"{user_location()}: job {self.name!r} (dynamic batch) "
                                      f"takes 1 to {batch} rows, got 0")
        feeds = {}
        try:
            for arg, ann, (name, _, dtype) in zip(args, self.param_annotations,
                                                   self._numpy_params):
                if arg.dtype == dtype and not self._returns_before_run:
                    feeds[name] = np.asarray(arg, order="C")
                else:
                    feeds[name] = tp._cast_argument(arg, ann, f"argument {name!r}")
        except tp.JobArgumentError as e:
            raise tp.JobArgumentError(f"{user_location()}: {e}") from None
        return [feeds]

    def trace(self, builder):
        """Run the body once on fresh placeholders in `builder` (the compiler's call).

        Returns (placeholder names, output Blobs, output tree); the optimizer of the old
        `config.train.*` API is resolved onto the builder here. In eager mode the plain
        Python values the body reads are noted (a call that finds one changed traces the
        body again, frontend/eager_jobs.py).
        """
        self.plain_inputs = eager_jobs.plain_inputs(self.func) if eager_jobs.allowed() else {}
        with scope.job_body_scope(self.config):
            return self._trace(builder)

    def _trace(self, builder):
        # a data-parallel train step is traced at the whole (logical) batch, as on one
        # device, and split for the ranks afterwards (graph/split_batch.py)
        split = self.is_train and distributed.enabled() and not self.mirrored_step
        builder.job_function = self   # flow.current_global_function_desc()
        builder.placement_in_effect = scope.placement_tracker(
            self.config, getattr(builder.variable_registry, "device", None))
        micro = self._checked_accumulation_steps()
        args = [_placeholders(builder, ann, pname, split, micro)
                for pname, ann in zip(self.param_names, self.param_annotations)]
        qat.start(builder, self)   # function_config.enable_qat: fake quantization (ops/qat.py)
        ssp.start(builder, self)   # function_config.enable_ssp: stale variable reads
        ret = self.func(*args)
        blobs = []
        if self.has_return_annotation:
            try:
                tree = results.flatten(ret, self.return_annotation, self.name, blobs)
            except AssertionError as e:   # OneFlow's type; the job's line added
                raise AssertionError(f"{self.location}: {e}") from None
        else:
            tree = results.flatten_unannotated(ret, blobs, f"{self.location}: job {self.name}")
        if self.written_for_0_4:
            results.zero_d_as_vectors(tree)
        optimizer = resolve_optimizer(builder, self)
        if builder.qat is not None:
            blobs = builder.qat.close(blobs, optimizer)
        placeholder_names = [n for a in args for n in _flat_placeholder_names(a)]
        return placeholder_names, blobs, tree

    @property
    def mirrored_step(self):
        """Whether a train step of this job runs per device list element
        (runtime/mirrored_step.py): a mirrored-view train job (tp.ListNumpy /
        ListListNumpy placeholders) over several devices or data-parallel ranks."""
        lists = (tp.ListNumpyDef, tp.ListListNumpyDef)
        mirrored = any(isinstance(ann, type) and issubclass(ann, lists)
                       for ann in self.param_annotations)
        return mirrored and self.is_train and (
            default_parallel_num() > 1 or distributed.enabled())

    @property
    def accumulation_steps(self):
        """`function_config.train.num_gradient_accumulation_steps(n)` of a train job: each
        call's placeholders hold n micro-batches, and its body is traced for one of them
        (runtime/micro_batches.py); 1 otherwise."""
        steps = self.config.train_conf.get("num_gradient_accumulation_steps", 1)
        return 1 if steps is None or not self.is_train else steps

    def _checked_accumulation_steps(self):
        steps = self.accumulation_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise TraceError(f"function_config.train.num_gradient_accumulation_steps takes a "
                             f"whole number >= 1, got {steps!r}", location=self.location)
        return steps

    @property
    def is_train(self):
        if self.job_type is not None:
            return self.job_type == "train"
        return bool(self.config.train_conf)

    # -- calling --------------------------------------------------------------------------
    def _raise_replaced(self, session):
        later = session.jobs.get(self.name)
        where = f" by the definition at {later.location}" if later is not None else ""
        raise RuntimeError(f"{user_location()}: job function {self.name!r} defined at "
                           f"{self.location} was replaced{where} (as in OneFlow, a later "
                           "global function of the same name replaces the earlier one); call "
                           "the later one")

    def __call__(self, *args, **kwargs):
        return self.caller(*args, **kwargs)

    def _make_fast_call(self, session):
        """This job's FastCall in `session` (frontend/fast_call.py), or None: only
        synchronous calls of Numpy placeholders that run on one device have one."""
        if self._numpy_params is None or self._returns_before_run or (
                self.is_train and session.data_parallel) or self.plain_inputs:
            return None     # (eager mode's plain inputs: each call looks at them in _call)
        runtime = session.runtimes[self.name]
        wrap = None if self.has_return_annotation or _returns_nothing(runtime) else Future
        return make_fast_call(session, self._numpy_params, runtime, wrap)

    def _call(self, args, kwargs):
        """A call with every check (spec §2.2) and the executor's ordering; the fast path
        of later calls is made here."""
        session = default_session()
        # only a job replaced in its own session refuses; one from a cleared session runs
        # the current session's job of its name, as before
        current = session.jobs.get(self.name)
        if current is not self and getattr(self, "session_ref", lambda: None)() is session:
            if current is not None and current.func is self.func:
                # the same function decorated again (another config): OneFlow keys jobs
                # by name and runs the last definition, from either wrapper
                return current._call(args, kwargs)
            self._raise_replaced(session)
        if self.name not in session.jobs:
            raise RuntimeError(
                f"{user_location()}: job function {self.name!r} defined at {self.location} "
                "belongs to a session that flow.clear_default_session() ended, and the "
                "current session has no job of that name: define it again after the clear")
        if kwargs:
            raise TypeError(f"{user_location()}: job {self.name!r} takes positional arguments "
                            f"only, got keywords {sorted(kwargs)}")
        if len(args) != len(self.param_names):
            raise AssertionError(f"{user_location()}: job {self.name!r} takes "
                                 f"{len(self.param_names)} argument(s) {self.param_names}, "
                                 f"got {len(args)}")
        device_feeds = None
        if self._numpy_params is not None:
            # NOTE: copying a batch of 64 ImageNet images (38 MB) took ~5 ms on a 2-core CPU
            device_feeds = _exact_numpy_feeds(self._numpy_params, args, self._returns_before_run)
        if device_feeds is None and self._batch_rows is not None:
            device_feeds = self._fewer_rows_feeds(args)
        if device_feeds is None:
            device_feeds = self._checked_feeds(args)
        if not session.is_running:
            self._start_session(session, device_feeds)
        if self.is_train and session.data_parallel and not self.mirrored_step:
            steps = self.accumulation_steps
            device_feeds = [{name: distributed.local_rows(value, steps)
                             for name, value in feeds.items()} for feeds in device_feeds]
        if self.reads_values or self._eager_inputs_changed(session, device_feeds):
            runtime = self._runtime_with_values(session, device_feeds)
        else:
            if self not in session.fast_calls:
                session.fast_calls[self] = self._make_fast_call(session)
            runtime = session.runtimes[self.name]
        call = _BoundRun(runtime, device_feeds)
        executor = session.executor
        if self.is_callback:
            return executor.run_async(call, _deliver).register
        if self.has_return_annotation and self.return_annotation is None:
            executor.run_async(call, _drop)
            return None
        if not self.has_return_annotation:
            value = executor.run_sync(call)
            # a body that returns nothing: None, as OneFlow's LazyRun (no future to get)
            return None if _returns_nothing(runtime) else Future(value)
        return executor.run_sync(call)

    def _eager_inputs_changed(self, session, device_feeds):
        """Whether this eager job's body reads a plain Python value that changed since it
        was traced (frontend/eager_jobs.py); on several devices the change is not taken
        (said once)."""
        if not self.plain_inputs or not eager_jobs.allowed() or \
                not eager_jobs.inputs_changed(self.func, self.plain_inputs):
            return False
        if len(device_feeds) != 1 or session.data_parallel:
            if not getattr(self, "_said_inputs_kept", False):
                self._said_inputs_kept = True
                warn_at_user_line(
                    f"{user_location()}: job {self.name!r} (eager mode) reads a Python value "
                    "that changed since it was traced; on several devices or ranks onnxjob "
                    "keeps the traced value (define the job again, or feed the value)")
            return False
        return True

    def _start_session(self, session, device_feeds):
        """Start `session` at this call; in eager mode this job is traced with the call's
        values, in case its body reads them (Session.runtime_with_values)."""
        if eager_jobs.allowed() and len(device_feeds) == 1:
            session.first_call = (self, device_feeds[0])
        try:
            started_session()
        except BaseException:
            session.first_call = None
            raise

    def _runtime_with_values(self, session, device_feeds):
        """The runtime of this call of an eager job whose body reads blob values: the body
        traced again with the call's arguments (runtime/eager_values.py)."""
        if len(device_feeds) != 1 or session.data_parallel:
            raise UnsupportedAPIError(
                f"{user_location()}: job {self.name!r} reads blob values in its body "
                f"(blob.numpy(), eager mode) and runs on several devices or ranks; onnxjob "
                "reads such values on one device only (return the blob from the job, or "
                "flow.watch it)")
        session.fast_calls[self] = None
        return session.runtime_with_values(self, device_feeds[0])


def _fast_path_first(job):
    """`job(*args, **kwargs)` as the user calls it: the fast path of a synchronous call
    (frontend/fast_call.py, made by the first call in the running session; None before it
    and for jobs that have none), else `job._call` with every check. NOTE: this closure is
    the decorated function itself, with no JobFunction.__call__ or default_session() call
    in between: each Python call saved was 0.5-1 us on the loaded 2-core machine, 1-2%
    of the doc MLP's batch-1 run (bench_serving.py)."""
    sessions = default_session_slot

    def caller(*args, **kwargs):
        fast = sessions[0].fast_calls.get(job)
        if fast is not None and not kwargs:
            value = fast(args)
            if value is not NOT_INLINE:
                return value
        return job._call(args, kwargs)
    return caller


def _placeholders(builder, annotation, name, split=False, micro=1):
    """The placeholder Blob(s) of one parameter (a tuple of them for Tuple[...]); with
    `split` (data-parallel), a Numpy placeholder's batch must divide by the world size;
    with `micro` > 1 (gradient accumulation) the placeholder is one of that many
    micro-batches of the fed batch, which must divide by it (OneFlow's unpack)."""
    if typing.get_origin(annotation) is tuple:
        return tuple(_placeholders(builder, a, f"{name}_{i}", split, micro)
                     for i, a in enumerate(typing.get_args(annotation)))
    dynamic = issubclass(annotation, (tp.ListNumpyDef,))
    tensor_list = issubclass(annotation, tp.ListListNumpyDef)
    shape = annotation.shape
    if micro > 1:
        shape = micro_batch_shape(shape, micro, f"placeholder {name!r}")
    if split and issubclass(annotation, tp.NumpyDef):
        what = f"placeholder {name!r}" + (f" (one of {micro} micro-batches)" if micro > 1 else "")
        distributed.local_batch(shape, what)
    blob = builder.add_input(name, shape, annotation.np_dtype(), dynamic=dynamic,
                             tensor_list=tensor_list)
    blob.is_dynamic = dynamic or tensor_list
    keep_batch_axis(blob, getattr(annotation, "batch_axis", 0))
    builder.placeholders[blob.name] = blob
    return blob


def micro_batch_shape(shape, steps, what):
    """`shape` with its first dimension divided by `steps` (gradient accumulation's
    micro-batches); raises TraceError when it does not divide."""
    if not shape or shape[0] % steps:
        raise TraceError(
            f"{what} of shape {tuple(shape)}: function_config.train."
            f"num_gradient_accumulation_steps({steps}) splits each call's batch into {steps} "
            f"micro-batches along the first axis, which must divide by {steps} (OneFlow's "
            "unpack: Check failed: in_shape.At(0) % unpack_num == 0)")
    return (shape[0] // steps,) + tuple(shape[1:])


def _flat_placeholder_names(args):
    if isinstance(args, tuple):
        return [n for a in args for n in _flat_placeholder_names(a)]
    return [args.name]


def _exact_numpy_feeds(params, args, copy):
    """Feeds for arrays that match their Numpy placeholders exactly, else None. With
    `copy` (a call that returns before its run) each is copied, so that the caller may
    reuse its array at once; a synchronous call has finished its run when it returns, and
    its feeds are the caller's arrays (C-ordered)."""
    feeds = {}
    for arg, (name, shape, dtype) in zip(args, params):
        if type(arg) is not np.ndarray or arg.shape != shape or arg.dtype != dtype:
            return None  # the full checks (and their error messages) take over
        feeds[name] = arg.copy() if copy else np.asarray(arg, order="C")
    return [feeds]


class _BoundRun:
    """One queued run of a job: feeds in, the caller's value (shaped by the tree) out.

    Mirrored jobs over several devices run once per device; each output is then the
    list of per-device values.
    """

    __slots__ = ("runtime", "device_feeds")

    def __init__(self, job_runtime, device_feeds):
        self.runtime = job_runtime
        self.device_feeds = device_feeds

    def __call__(self):
        compiled = self.runtime.compiled
        if compiled.loss_count_output is not None and len(self.device_feeds) > 1:
            # a mirrored train step over several devices
            per_device = self.runtime.run_devices(self.device_feeds)
        else:
            per_device = [self.runtime.run(feeds) for feeds in self.device_feeds]
        outs = [list(values) for values in zip(*per_device)]
        n_user = len(compiled.output_names)
        for values, (_, handler, _) in zip(outs[n_user:], compiled.watch_outputs):
            if isinstance(values[0], PerMicroBatch):    # once per micro-batch, as OneFlow
                for micro in zip(*values):
                    handler(list(micro))
            else:
                handler(values)
        return results.build(compiled.output_tree, outs[:n_user])


def _returns_nothing(runtime):
    """Whether the job body of `runtime` returned nothing (None)."""
    return runtime.compiled.output_tree is None


def _deliver(pending, value):
    pending.deliver(value)


def _drop(pending, value):
    return None


def _mirrored_list_lengths():
    """The lengths a mirrored argument's list may have: one element per device of the
    job's default placement (helpers.default_parallel_num: GPUs, or CPUs); over
    data-parallel ranks also one, the rank's own (docs/distributed.md)."""
    count = default_parallel_num()
    return (count, 1) if distributed.enabled() else count


def _flat_feed(device_feeds, name, annotation, value):
    """Add one checked argument to the per-device feed dicts (a list, one per device)."""
    if typing.get_origin(annotation) is tuple:
        for i, (a, v) in enumerate(zip(typing.get_args(annotation), value)):
            device_feeds = _flat_feed(device_feeds, f"{name}_{i}", a, v)
        return device_feeds
    if issubclass(annotation, (tp.ListNumpyDef, tp.ListListNumpyDef)):
        per_device = list(value)  # one array (or list of arrays) per device
    else:
        per_device = [value]
    if device_feeds is None:
        device_feeds = [{} for _ in per_device]
    if len(per_device) == 1 and len(device_feeds) > 1:
        per_device = per_device * len(device_feeds)  # a consistent input, seen by every device
    elif len(device_feeds) == 1 and len(per_device) > 1:
        device_feeds = [dict(device_feeds[0]) for _ in per_device]
    for feeds, v in zip(device_feeds, per_device):
        feeds[name] = v
    return device_feeds


class Future:
    """Result of a job without a return annotation: `.get()` once, or `.async_get(cb)`."""

    def __init__(self, value):
        self._value = value
        self._delivered = False

    def get(self):
        assert not self._delivered, "this result was already delivered (get() may be used once)"
        self._delivered = True
        return self._value

    def async_get(self, callback):
        callback(self.get())


def global_function(type="predict", function_config=None):
    """Decorator for a job function (spec §1). Nothing is traced until the first call."""
    if isinstance(type, FunctionConfig):
        print("WARNING: flow.global_function(func_config) is deprecated. Please replace it "
              "with flow.global_function(type, func_config).")
        function_config, job_type = type, None
    else:
        assert type in ("train", "predict"), (
            f"global_function type must be 'train' or 'predict', got {type!r} "
            "(use @flow.global_function(), with parentheses)")
        job_type = type
    return _job_decorator(job_type, function_config)


def function(function_config=None):
    """`@flow.function(func_config)`: OneFlow's job decorator before its 0.1 release (June
    2020), which global_function replaced. As global_function(func_config), the job is a
    train job when func_config sets a train conf (config.train.primary_lr /
    model_update_conf), the optimizer of that era."""
    if function_config is not None and not isinstance(function_config, FunctionConfig):
        raise TypeError(f"{user_location()}: flow.function takes a FunctionConfig, got "
                        f"{function_config!r}")
    return _job_decorator(None, function_config)


def _job_decorator(job_type, function_config):
    """The decorator registering a job of `job_type` ("train", "predict", or None: from
    the config's train conf) with `function_config` (copied)."""
    session = default_session()
    if session.is_running and not eager_jobs.allowed():
        raise NotImplementedError('no avaliable function found.\n"Session initialized"[True]\n'
                                  "call flow.clear_default_session() before defining new jobs")
    config = (function_config or FunctionConfig()).clone()
    if function_config is not None and job_type is not None:
        function_config.job_type = job_type

    def decorator(func):
        job = JobFunction(func, job_type, config)
        session = default_session()
        if session.is_running and eager_jobs.allowed():
            # eager mode: a job (re)defined while the session runs
            job = eager_jobs.running_job_for(session, job)
        else:
            session.register_job(job)
        job.session_ref = weakref.ref(session)   # weak: a cleared session's memory goes

        wrapper = functools.wraps(func)(job.caller)
        wrapper.job = job
        return wrapper
    return decorator


def FixedTensorDef(shape, dtype=None, batch_axis=0, split_axis="same_with_batch_axis",
                   name=None):
    """Deprecated placeholder used as a parameter default (pre-typing style; OneFlow 0.1.0's
    `split_axis` is taken: one device)."""
    print("WARNING: flow.FixedTensorDef is deprecated, use oneflow.typing.Numpy.Placeholder")
    return tp.Numpy.Placeholder(tuple(shape), dtype or dtypes.float, batch_axis)


def MirroredTensorDef(shape, dtype=None, batch_axis=0, name=None):
    """Deprecated mirrored placeholder used as a parameter default (pre-typing style)."""
    print("WARNING: flow.MirroredTensorDef is deprecated, use oneflow.typing.ListNumpy.Placeholder")
    return tp.ListNumpy.Placeholder(tuple(shape), dtype or dtypes.float, batch_axis)


def MirroredTensorListDef(shape, dtype=None, batch_axis=0, name=None):
    """OneFlow <= 0.3's deprecated tensor-list placeholder used as a parameter default: a
    tp.ListListNumpy.Placeholder."""
    print("WARNING: flow.MirroredTensorListDef is deprecated, use "
          "oneflow.typing.ListListNumpy.Placeholder")
    return tp.ListListNumpy.Placeholder(tuple(shape), dtype or dtypes.float, batch_axis)
