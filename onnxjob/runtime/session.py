"""The default session: registered jobs, variables, compiled jobs and the run order.

States (spec §1.3): OPEN (jobs may be defined) -> RUNNING (first job call or checkpoint
call compiled every job; variables initialised). `clear_default_session()` starts over.
"""
import atexit
import collections
import concurrent.futures
import contextlib
import gc
import os
import sys
import threading
import zlib

import numpy as np
import onnx

from onnxjob.runtime import (arena_reserve, backend, cuda_graph,
                             data_parallel, distributed, eager_values, in_place, mirrored_step,
                             out_of_memory)
from onnxjob.frontend.seeded_values import seeded_values
from onnxjob.runtime.executor import Executor, interrupt_deferred
from onnxjob.runtime.lru import LeastRecentlyUsed
from onnxjob.graph.compiler import compile_job
from onnxjob.graph.tracer import VariableRegistry
from onnxjob.runtime.frozen import VariableStore, make_frozen_predictor
from onnxjob.runtime.pipeline import HostPipeline, PipelineRunner, prefetch_depth


class JobRuntime:
    """A compiled job bound to an onnxruntime session and the session's variables.

    On CUDA the variables are device-resident OrtValues bound with IOBinding, so a step
    never copies weights through the host, and steps replay as CUDA graphs where the job
    allows it (runtime/cuda_graph.py; otherwise one line says why). On CPU the variables
    are owned NumPy arrays that onnxruntime reads in place; plain `run` is used there
    because IOBinding costs ~30 us more per call for no saved copy. Predict jobs switch to
    a session with their variables as constants once those stop changing
    (runtime/frozen.py).
    """

    def __init__(self, job, compiled, session):
        self.job = job
        self.compiled = compiled
        self.store = session.variable_values
        self.device = session.device
        self.tf32 = session.tf32
        self.model_bytes = compiled.serialized()
        self._user_outputs = list(compiled.output_names) + [w[0] for w in compiled.watch_outputs]
        self._state_items = list(compiled.state_outputs.items())
        self._n_user = len(self._user_outputs)
        self._variable_inputs = list(compiled.variable_inputs.items())
        self._state_names = [v for v, _ in self._state_items]
        self._pipeline = PipelineRunner(HostPipeline(compiled.sources),
                                        prefetch_depth(job.config)) if compiled.sources else None
        self._frozen = None
        # the variables a step writes in place (graph/in_place.py; OneFlow's
        # function_config.enable_inplace(False) turns it off); mirrored and data-parallel
        # steps write none
        self._in_place = frozenset()
        if not self._user_outputs and not self._state_items:
            # a `-> None` predict job without watches: nothing to compute (and onnxruntime
            # refuses a graph without outputs)
            self.ort_session = None
            self._run = _nothing_to_compute
            return
        # gradient accumulation: the step runs part A once per micro-batch, each with its
        # own data readers' values (runtime/micro_batches.py)
        next_source_feeds = self._pipeline.next_feeds if self._pipeline is not None else None
        if compiled.loss_count_output is not None:
            # a mirrored step, or one device's accumulating step (runtime/mirrored_step.py);
            # (the job's CUDA options too: TF32 as the session chose, the arena)
            self.ort_session = None
            step = mirrored_step.MirroredStep(
                onnx.load_from_string(self.model_bytes), compiled, self.store,
                lambda model: backend.create_session(model, self.device, is_train=True,
                                                     cuda_options=self._cuda_options()),
                self.device, next_source_feeds)
            self._run = self._one_device_of_mirrored
            self.run_devices = step.run_devices
            return
        if compiled.gradient_outputs:
            # a data-parallel step (runtime/data_parallel.py); on CUDA its gradients stay
            # on this rank's GPU (runtime/value_paths.py)
            options = self._cuda_options() if self.device == "cuda" else None
            self.ort_session = None
            self._run = data_parallel.DataParallelStep(
                self.model_bytes, compiled, self.store,
                lambda model: backend.create_session(model, self.device, True, options),
                job.name, job.config, self.device, next_source_feeds).run
            return
        self._graph = None
        self._uncaptured = None     # a plain session for feeds the captured graphs do not fit
        if job.config.get("enable_inplace", True):
            self._in_place = compiled.in_place
        graph_obstacle = cuda_graph.obstacle(job, compiled) if self.device == "cuda" else ""
        self.ort_session, captures = self._create_session(use_cuda_graph=graph_obstacle is None)
        # graph output order is user outputs, watches, then state: checked, not assumed
        check_output_order(job.name, self.ort_session.get_outputs(),
                           self._user_outputs + [o for _, o in self._state_items])
        if self.device == "cuda" and not compiled.has_sequences:
            self._run = self._run_cuda
        elif self._in_place and self.device == "cpu" and not compiled.has_sequences:
            self._run = in_place.HostInPlaceStep(
                self.ort_session, self._variable_inputs, self._state_items,
                self._user_outputs, self._in_place, self.store).run
        else:
            self._run = self._run_host
        if captures:
            self._start_cuda_graph()
        elif graph_obstacle:
            cuda_graph.say_why(job.name, graph_obstacle)
        if not compiled.is_train and not self._state_items and \
                not cuda_graph.random_op_types(compiled):
            # (a frozen session's random nodes would start their generators again)
            self._frozen = make_frozen_predictor(job.config, self.model_bytes,
                                                 compiled.variable_inputs, self.store,
                                                 self._frozen_runner)

    def _create_session(self, use_cuda_graph=False):
        """(onnxruntime session, whether it captures CUDA graphs)."""
        try:
            session = backend.create_session(
                self.model_bytes, self.device, self.compiled.is_train, self._cuda_options(),
                cuda_graph=use_cuda_graph, cached=True,
                deterministic=self.job.config.get("cudnn_conv_use_deterministic_algo_only", False),
                arena_region=lambda: arena_reserve.region_bytes(
                    self.compiled, self.device, self._in_place))
            return session, use_cuda_graph
        except Exception as e:  # onnxruntime's own exception types
            if use_cuda_graph:
                # e.g. "all compute graph nodes have not been partitioned to the CUDA EP"
                cuda_graph.say_why(self.job.name, str(e).strip().splitlines()[0])
                return self._create_session(use_cuda_graph=False)
            explained = backend.session_error(e, self.compiled.model)
            if explained is None:
                raise
            raise explained from e

    def _cuda_options(self):
        return backend.cuda_provider_options(self.job.config, self.tf32)

    def _frozen_runner(self, model_bytes):
        """feeds -> outputs on `model_bytes`, this job with its variables as constants
        (runtime/frozen.py); on CUDA replayed as a graph when this job's steps are."""
        if self._graph is None:
            session = backend.create_session(model_bytes, self.device, False, self._cuda_options())
            return backend.run_function(session, self._user_outputs)
        try:
            session = backend.create_session(model_bytes, "cuda", False, self._cuda_options(),
                                             cuda_graph=True)
            runner = cuda_graph.CudaGraphRunner(session, [], [], self._user_outputs, self.store)
        except Exception as e:  # onnxruntime's own exception types, CaptureFailed
            cuda_graph.say_why(self.job.name, f"(frozen) {str(e).strip().splitlines()[0]}")
            session = backend.create_session(model_bytes, "cuda", False, self._cuda_options())
            return lambda feeds: session.run(None, feeds)

        def replay(feeds):
            if runner.fits(feeds):
                try:
                    return runner.run(feeds)
                except cuda_graph.CaptureFailed as e:
                    cuda_graph.say_why(self.job.name, f"(frozen) {e}")
                    runner.fits = lambda feeds: False
            return self._run(feeds)     # the fed session
        return replay

    def _start_cuda_graph(self):
        """Replay steps as CUDA graphs (the session was created for them)."""
        try:
            self._graph = cuda_graph.CudaGraphRunner(
                self.ort_session, self._variable_inputs, self._state_items,
                self._user_outputs, self.store, self._in_place)
        except cuda_graph.CaptureFailed as e:
            self._no_cuda_graph(str(e))
            return
        self._run = self._run_cuda_graph

    def _no_cuda_graph(self, reason):
        """Say why once and replace the session created for graphs by a plain one."""
        cuda_graph.say_why(self.job.name, reason)
        self.ort_session, _ = self._create_session(use_cuda_graph=False)
        self._graph = None
        self._run = self._run_cuda

    def run(self, feeds):
        """One run: `feeds` are the placeholders' arrays; the host pipeline adds its inputs;
        returns the user outputs and watched values (variables are updated in place).
        A run that cannot get memory raises DeviceMemoryError (runtime/out_of_memory.py)
        and changes no variable."""
        if self._pipeline is not None and self.compiled.accumulation_steps == 1:
            # (an accumulating step reads its micro-batches' values itself)
            feeds.update(self._pipeline.next_feeds(feeds))
        frozen = self._frozen.session_for_call() if self._frozen is not None else None
        try:
            if frozen is not None:
                return frozen(feeds)
            return self._run(feeds)
        except Exception as e:   # onnxruntime's own exception types
            failure = backend.memory_failure(e)
            if failure is None:
                explained = backend.run_error(e, self.job.name, self.compiled.model)
                if explained is None:
                    raise
                raise explained from e
            raise out_of_memory.device_memory_error(
                self.job.name, self.device, failure, self.compiled, self._in_place) from e

    def _one_device_of_mirrored(self, feeds):
        return self.run_devices([feeds])[0]

    def close(self):
        if self._pipeline is not None:
            self._pipeline.close()

    def _run_cuda(self, feeds):
        binding = self.ort_session.io_binding()
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        for var_name, input_name in self._variable_inputs:
            binding.bind_ortvalue_input(input_name, self.store[var_name])
        for name in self._user_outputs:
            binding.bind_output(name, "cpu")
        for var_name, out_name in self._state_items:
            if var_name in self._in_place:      # the next value over the value read
                binding.bind_ortvalue_output(out_name, self.store[var_name])
            else:
                binding.bind_output(out_name, self.device, backend.cuda_device_id())
        n = self._n_user
        with interrupt_deferred() if self._in_place else contextlib.nullcontext():
            self.ort_session.run_with_iobinding(binding)
            outs = binding.get_outputs()
            # an in-place variable keeps the OrtValue it had (which owns its memory)
            store = self.store
            store.replace_all(self._state_names, [
                store[v] if v in self._in_place else o
                for v, o in zip(self._state_names, outs[n:])])
        return [o.numpy() for o in outs[:n]]

    def _run_cuda_graph(self, feeds):
        if not self._graph.fits(feeds):
            # a smaller mirrored batch than the first: the session that captures would
            # replay its graph for the first shapes; a plain session runs this one
            if self._uncaptured is None:
                self._uncaptured, _ = self._create_session(use_cuda_graph=False)
            return self._run_host(feeds, self._uncaptured)
        try:
            return self._graph.run(feeds)
        except cuda_graph.CaptureFailed as e:
            self._no_cuda_graph(str(e))
            return self._run_cuda(feeds)

    def _run_host(self, feeds, session=None):
        store = self.store
        for var_name, input_name in self._variable_inputs:
            feeds[input_name] = backend.host_array(store[var_name])
        outs = (session or self.ort_session).run(None, feeds)
        n = self._n_user
        store.replace_all(self._state_names,
                          [backend.from_host(value, self.device) for value in outs[n:]])
        return outs[:n]


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Python's cycle collector off while a session starts. NOTE: tracing builds ~10^6
    objects (ResNet50's graphs), and each time the heap grew by a quarter a full collection
    walked all of them: ResNet50's start with filled caches took 0.56 s with the collector
    and 0.44-0.46 s without (one full collection afterwards: 0.04 s, left to run whenever
    it next triggers)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def check_output_order(job_name, outputs, expected):
    """Raise a RuntimeError naming the job when an onnxruntime session's `outputs`
    (NodeArgs) are not the output names `expected`, in that order."""
    order = [o.name for o in outputs]
    if order != expected:
        raise RuntimeError(f"job {job_name!r}: onnxruntime's session has the outputs {order}, "
                           f"expected {expected} (an internal error: please report it)")


def _nothing_to_compute(feeds):
    """A job with no outputs, watches or state (`-> None` predict job): nothing to run."""
    return []


class Session(VariableRegistry):
    """Jobs, variables and the execution order of one onnxjob session."""

    def __init__(self):
        super().__init__()
        self.jobs = collections.OrderedDict()
        self.variable_values = VariableStore()  # name -> owned ndarray (CPU) or CUDA OrtValue
        self.runtimes = {}
        self.is_running = False
        self.seed = None                # flow.config.seed as the session started
        self._variable_entropy = None   # the initial values' root entropy (initial_value)
        self._job_seed_base = None      # the jobs' random nodes' seed (see start)
        self.device = None
        self.tf32 = None
        self.data_parallel = False      # a rank of a data-parallel run (runtime/distributed.py)
        self.executor = Executor()
        # job function -> the fast path of its synchronous calls, or None where it has
        # none (frontend/fast_call.py); kept here so that none outlives this session
        self.fast_calls = {}
        # eager jobs whose bodies read values (runtime/eager_values.py): the graphs cut at
        # a value, by graph (least recently used first), and each job's last graph's bytes
        self.eager_cut_sessions = LeastRecentlyUsed(64)
        self._eager_graphs = {}
        # (job, feeds) of the eager call that starts the session, traced with its values
        self.first_call = None
        self._start_lock = threading.RLock()

    # -- jobs -----------------------------------------------------------------------------
    def register_job(self, job):
        if self.is_running:
            raise NotImplementedError(
                'no avaliable function found.\n"Session initialized"[True]\n'
                "Jobs cannot be defined after the session started (the first job or "
                "checkpoint call); call flow.clear_default_session() first.")
        # As OneFlow: a later job of the same name replaces the earlier one (keeping its
        # place in the compile order); the earlier wrapper then refuses to run.
        self.jobs[job.name] = job

    # -- variables ------------------------------------------------------------------------
    def variable_numpy(self, name):
        """A copy of the variable's current value."""
        return np.array(backend.host_array(self.variable_values[name]))

    def assign_variable(self, name, array):
        self.variable_values[name] = backend.to_device(array, self.device)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self, seed=None, tf32=None, memory_limit_mbyte=None):
        """Compile every registered job (definition order) and initialise variables.

        As OneFlow's session, one may start with no job yet (a checkpoint or
        get_all_variables call before any global function): it has no variables, and jobs
        defined afterwards are refused (see add_job).

        `seed` (flow.config.seed) makes the initial values and every job's random nodes
        reproducible; None draws fresh entropy. `tf32`
        (flow.config.enable_tensor_float_32_compute) allows TF32 math on the CUDA EP;
        `memory_limit_mbyte` (flow.config.device_memory_limit_mbyte) bounds onnxruntime's
        arenas."""
        if self.is_running:
            return
        # A Ctrl-C during the start is raised once it is done: one landing inside a
        # module's first import leaves Python's import lock held (CPython ignores the
        # interrupt there), and the thread drawing the initial values, importing too,
        # then waited for it forever (a hang of the first job call, about 1 in 8 when
        # Ctrl-C came in its first 40 ms).
        with interrupt_deferred(), self._start_lock, _cyclic_gc_paused():
            if self.is_running:
                return
            requested = None
            for job in self.jobs.values():
                requested = requested or job.config.get("execution_provider")
            self.device = backend.choose_device(requested)
            self.seed = seed
            self.tf32 = tf32
            backend.set_memory_limit(memory_limit_mbyte)
            self.data_parallel = distributed.enabled()
            self._job_seed_base = seed
            if self.data_parallel:
                # binds a rank on CUDA to its GPU before any variable is placed there
                distributed.use_device(self.device)
                if seed is None:
                    # the ranks' random nodes draw alike (rank 0's entropy): what every
                    # rank computes whole (a job reading its own data shuffles it, drops
                    # out of it, decode_random) must agree, or their weights drift apart;
                    # a rank's own rows draw apart (graph/split_rules.py's random_like)
                    self._job_seed_base = distributed.shared_seed()
            compiled = [(job, graph) for job, graph in
                        ((job, self._first_trace(job)) for job in self.jobs.values())
                        if not self._traced_at_each_call(job, graph)]
            if self.data_parallel:
                self._init_variables(seed)
                self._take_rank0_values(list(self.variable_values))
                self._create_runtimes(compiled)
            else:
                # The initial values are drawn while onnxruntime creates the sessions of the
                # jobs that do not read them on creation; both release the GIL (ResNet50's
                # start with a filled cache: ~0.1 s less).
                with concurrent.futures.ThreadPoolExecutor(1) as background:
                    drawn = background.submit(self._init_variables, seed)
                    self._create_runtimes(compiled, drawn.result)
                    drawn.result()
            self.is_running = True

    def add_job_while_running(self, job):
        """Compile `job` into the running session (eager mode, frontend/eager_jobs.py): its
        new variables are drawn (on data-parallel ranks, rank 0's values), the variables it
        shares with the other jobs keep their values, and a job of the same name is
        replaced, as OneFlow's eager mode replaces it."""
        with self._start_lock, _cyclic_gc_paused():
            self.sync()
            known = set(self.variable_values)
            graph = self._first_trace(job)
            self.draw_new_variables()
            if self.data_parallel:
                self._take_rank0_values([n for n in self.variable_values if n not in known])
            earlier = self.jobs.get(job.name)
            if earlier is not None:
                self.fast_calls.pop(earlier, None)
                self._close_runtime(job.name)
            self.jobs[job.name] = job
            if not self._traced_at_each_call(job, graph):
                self.runtimes[job.name] = JobRuntime(job, graph, self)

    def runtime_with_values(self, job, feeds):
        """The runtime of one call of an eager `job` whose body reads blob values: the body
        traced with the call's `feeds` at hand (runtime/eager_values.py); the last call's
        runtime where the trace is the same graph."""
        with self._start_lock, _cyclic_gc_paused():
            self.sync()
            if self.first_call is not None and self.first_call[0] is job:
                # the session's start traced this call's body with its values
                self.first_call = None
                return self.runtimes[job.name]
            reader = eager_values.ValueReader(self, job, feeds)
            graph = compile_job(job, self, self._job_seed(job), value_reader=reader)
            self.draw_new_variables()
            model_bytes = graph.serialized()
            runtime = self.runtimes.get(job.name)
            if runtime is None or runtime.job is not job or \
                    self._eager_graphs.get(job.name) != model_bytes:
                self._close_runtime(job.name)
                runtime = self.runtimes[job.name] = JobRuntime(job, graph, self)
                self._eager_graphs[job.name] = model_bytes
            return runtime

    def _first_trace(self, job):
        """`job` traced as the session starts (or as it is defined while the session
        runs). The job whose call starts the session (`first_call`, eager mode) is traced
        with that call's values: where its body reads values, that trace is its first
        call's graph."""
        reader = None
        if self.first_call is not None and self.first_call[0] is job:
            reader = eager_values.ValueReader(self, job, self.first_call[1])
        return eager_values.first_trace(
            lambda: compile_job(job, self, self._job_seed(job), value_reader=reader),
            with_values=reader is not None)

    def _traced_at_each_call(self, job, graph):
        """Whether `job`'s body read a blob's value (eager mode): then it is traced at each
        call (runtime_with_values). Its first trace made `graph` from zeros, to declare its
        variables, except for the call that started the session, whose graph it is."""
        job.reads_values = graph.values_read is not None
        first_call = self.first_call is not None and self.first_call[0] is job
        if first_call and not job.reads_values:
            self.first_call = None
        if first_call and job.reads_values:
            self._eager_graphs[job.name] = graph.serialized()
            return False
        return job.reads_values

    def _close_runtime(self, job_name):
        runtime = self.runtimes.pop(job_name, None)
        self._eager_graphs.pop(job_name, None)
        if runtime is not None:
            runtime.close()

    def draw_new_variables(self):
        """Draw the variables declared since the last draw (a job traced while the
        session runs)."""
        self._init_variables(self.seed)

    def _job_seed(self, job):
        """The seed of `job`'s random nodes: flow.config.seed's (on data-parallel ranks
        without one, a seed the ranks share), per job name (None: fresh entropy)."""
        base = self._job_seed_base
        return None if base is None else (base ^ zlib.crc32(job.name.encode()))

    def _take_rank0_values(self, names):
        """Variables `names` as rank 0 drew them (data-parallel ranks start equal)."""
        values = {n: self.variable_numpy(n) for n in names}
        for name, value in distributed.broadcast_from_rank0(values).items():
            self.variable_values[name] = backend.to_device(value, self.device)

    def _create_runtimes(self, compiled, values_ready=lambda: None):
        """A JobRuntime per compiled job; `values_ready()` waits for the initial values,
        which CPU train jobs do not read on creation (frozen predict and CUDA graphs do)."""
        for job, graph in compiled:
            if not (graph.is_train and self.device == "cpu"):
                values_ready()
            self.runtimes[job.name] = JobRuntime(job, graph, self)

    def _init_variables(self, seed):
        """Draw every variable not yet assigned. Each variable has its own random stream,
        derived from `seed` and its name, so its initial value does not depend on which
        other variables exist; the streams are drawn on a few threads (NumPy's generators
        release the GIL while they fill: ResNet50's 25M weights in about half the time)."""
        if self._variable_entropy is None:
            self._variable_entropy = np.random.SeedSequence(seed).entropy
        todo = [name for name in self.variable_specs if name not in self.variable_values]
        workers = min(os.cpu_count() or 1, 4)
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for name, value in zip(todo, pool.map(self.initial_value, todo)):
                self.variable_values[name] = backend.to_device(value, self.device, fresh=True)

    def initial_value(self, name):
        """The value variable `name` was drawn with at the start (a NumPy array), drawn
        again from its initializer and its own stream (or get_variable's random_seed)."""
        spec = self.variable_specs[name]
        if spec.random_seed is not None:    # get_variable's own seed: OneFlow's values
            value = seeded_values(spec.initializer, spec.shape, spec.np_dtype,
                                  spec.random_seed)
            if value is not None:
                return value
        stream = np.random.SeedSequence(self._variable_entropy,
                                        spawn_key=(zlib.crc32(name.encode()),))
        return spec.initializer.sample(spec.shape, spec.np_dtype,
                                       np.random.default_rng(stream), model_io=True)

    def reinitialize(self, names):
        """Set the variables `names` back to their initial values, as OneFlow's legacy
        model-init job draws each from its initializer with its own fixed seed (a
        data-parallel run takes rank 0's)."""
        names = list(names)
        self.sync()
        self.variable_values.replace_all(
            names, [backend.to_device(self.initial_value(n), self.device, fresh=True)
                    for n in names])
        if self.data_parallel:
            self._take_rank0_values(names)

    def sync(self):
        self.executor.sync()

    def close(self):
        self.executor.close()
        try:
            self.executor.sync()
        finally:
            self.executor.shutdown()
            for runtime in self.runtimes.values():
                runtime.close()
            if self.data_parallel:
                distributed.shutdown()


_default = [Session()]
# The same one-element list, read where a function call per job call counts (the fast
# path of frontend/job_function.py)
default_session_slot = _default


def default_session():
    return _default[0]


def clear_default_session():
    """Wait for pending runs, then drop every job and variable (spec §1.3)."""
    old = _default[0]
    _default[0] = Session()
    old.close()


def sync_default_session():
    """Wait for every queued run and callback; re-raise the first error one had."""
    session = _default[0]
    assert session.is_running, "sync_default_session: the session has not started"
    session.sync()


def _at_exit():
    try:
        _default[0].close()
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


atexit.register(_at_exit)
