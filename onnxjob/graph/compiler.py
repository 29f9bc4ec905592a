"""Compile one job: trace the body, add backward + updates, run passes, emit ONNX."""
import onnx
import onnx_ir as ir

from onnxjob.errors import TraceError
from onnxjob import typing as tp
from onnxjob.graph import autodiff, batch_norm_coefficients, moving_averages, pass_cache
from onnxjob.graph.in_place import in_place_state
from onnxjob.graph.dynamic_batch import make_batch_symbolic
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from onnxjob.runtime import distributed
from onnxjob.source_info import warn_at_user_line
from onnxjob.passes import mixed_precision_type, run_default_pipeline

IR_VERSION = 8  # onnxruntime 1.31 reads IR <= 13; opset 17 needs 8
# the model metadata property listing the variables a train step may update in place
IN_PLACE = "onnxjob.in_place"


class CompiledGraph:
    """An emitted job graph and how its inputs/outputs map to the job's world.

    The graph is held as an onnx_ir.Model (after the passes), as its serialized bytes, or
    both: a job whose passes came from the cache (graph/pass_cache.py) has only the bytes
    until something asks for `model`."""

    def __init__(self, model, placeholder_names, variable_inputs, output_names, output_tree,
                 state_outputs, watch_outputs, has_sequences, is_train, sources=None,
                 gradient_outputs=None, serialized=None):
        self._model = model
        self._serialized = serialized
        self.placeholder_names = placeholder_names
        self.variable_inputs = variable_inputs  # variable name -> graph input fed with it
        self.output_names = output_names        # user-visible outputs, in tree order
        self.output_tree = output_tree
        self.state_outputs = state_outputs      # variable name -> output name
        self.watch_outputs = watch_outputs      # [(output name, handler, location)]
        self.has_sequences = has_sequences
        self.is_train = is_train
        self.sources = sources or {}            # graph input -> host node feeding it
        # variable -> output of its gradient (data-parallel train jobs only)
        self.gradient_outputs = gradient_outputs or {}
        # the loss's element count, an output of a mirrored step (runtime/mirrored_step.py)
        # and of an accumulating one (runtime/micro_batches.py)
        self.loss_count_output = None
        # function_config.train.num_gradient_accumulation_steps, and the variables each
        # micro-batch updates in turn (batch norms' moving statistics)
        self.accumulation_steps = 1
        self.moving_statistics = frozenset()
        # the variables whose next value may be written over their value (graph/in_place.py)
        self.in_place = frozenset()
        # where an eager body read a blob's value ("file:line"), else None (compile_job)
        self.values_read = None

    @property
    def variable_names(self):
        return list(self.variable_inputs)

    @property
    def model(self):
        """The graph after the passes, as an onnx_ir.Model."""
        if self._model is None:
            self._model = ir.from_proto(self.to_proto())
        return self._model

    def serialized(self):
        """The graph after the passes as ONNX bytes (what onnxruntime loads)."""
        if self._serialized is None:
            self._serialized = ir.to_proto(self._model).SerializeToString()
        return self._serialized

    def to_proto(self):
        if self._serialized is None:
            return ir.to_proto(self._model)
        proto = onnx.ModelProto()
        proto.ParseFromString(self._serialized)
        return proto


class DeclaringTrace:
    """What compile_job returns for an eager body traced without a call that failed on
    the zeros it read in place of values: the variables it declared stay declared."""

    def __init__(self, values_read):
        self.values_read = values_read


def _as_output(builder, blob, name, taken):
    """Make `blob` a graph output called `name` (an Identity where it cannot be renamed)."""
    value = blob.value
    is_input = value in builder.graph.inputs or value.const_value is not None
    if is_input or value in taken or blob.is_tensor_list:
        value = builder.emit("Identity", [blob], {}, name=f"{name}/identity")[0].value
        if blob.is_tensor_list:
            value.type = blob.value.type
            value.shape = None
    name = builder.unique_value_name(name)
    value.name = name
    if blob.is_dynamic and not blob.is_tensor_list and value.shape is not None:
        # a mirrored input may be smaller than its placeholder, so may this output be:
        # its declared shape must not promise the placeholder's dims
        value.shape = ir.Shape([f"{name}_d{i}" for i in range(len(value.shape))])
    taken.add(value)
    builder.graph.outputs.append(value)
    return name


def compile_job(job, variable_registry=None, seed=None, value_reader=None):
    """Trace `job` and build its CompiledGraph (raises at the user's line on errors).

    `job` provides `name`, `is_train`, `config`, `location` and `trace(builder) ->
    (placeholder_names, output_blobs, output_tree)`, which runs the body on fresh
    placeholders and records its optimizer on the builder (frontend/job_function.py).
    `seed` seeds the job's random nodes (None: fresh entropy). `value_reader(blob)`
    gives the values an eager body reads (runtime/eager_values.py); without one such a
    body reads zeros, and the result's `values_read` says where it first read one (the
    graph is then one of zeros, for declaring the job's variables only).
    """
    _check_mixed_precision(job, getattr(variable_registry, "device", None))
    builder = GraphBuilder(job.name, is_train=job.is_train, variable_registry=variable_registry,
                           seed=seed)
    builder.value_reader = value_reader
    builder.device = getattr(variable_registry, "device", None)
    grads = {}      # the gradients made outputs: a data-parallel, mirrored or accumulating step
    accumulation = getattr(job, "accumulation_steps", 1)
    accumulation = accumulation if isinstance(accumulation, int) else 1   # (trace says why)
    mirrored_view = getattr(job, "mirrored_step", False)
    data_parallel = job.is_train and getattr(variable_registry, "data_parallel", False) \
        and not mirrored_view
    # (on one device an accumulating step runs per micro-batch as a mirrored one per device)
    mirrored = mirrored_view or (accumulation > 1 and not data_parallel)
    loss_count = None
    if data_parallel:
        builder.data_parallel_ranks = distributed.world()[1]
    # (data-parallel ranks feed the update every rank's indices: runtime/data_parallel.py)
    builder.update_sees_every_lookup = not mirrored and accumulation == 1
    with tracing(builder):
        try:
            placeholder_names, blobs, tree = job.trace(builder)
        except Exception:
            if builder.values_read is None or value_reader is not None:
                raise
            # the body failed on the zeros it read: it runs with its values at each call
            return DeclaringTrace(builder.values_read)
        # the batch norms' moving statistics, which each micro-batch of an accumulating
        # step updates in turn (runtime/micro_batches.py)
        moving_statistics = frozenset(builder.moving_averages)
        moving_averages.flush(builder)
        optimizer = builder.optimizer
        # As OneFlow, minimize() makes any job a train job: it sets the job config's
        # train_conf, which shares a protobuf oneof with predict_conf
        is_train = job.is_train or optimizer is not None
        if is_train:
            if optimizer is None:
                raise TraceError(
                    f"train job {job.name!r} has no optimizer: call e.g. "
                    "flow.optimizer.SGD(lr_scheduler).minimize(loss) in its body "
                    "(OneFlow: Check failed: "
                    "job().job_conf().train_conf().has_model_update_conf())",
                    location=job.location)
            loss_scale = optimizer.loss_scale(builder, job.name)
            all_grads = autodiff.backward(builder, builder.losses, loss_scale)
            batch_norm_coefficients.flush(builder)
            with builder.origin("update"):
                if mixed_precision_type(job.config) is not None:
                    all_grads = _float32_gradients(all_grads)
                optimizer.apply(builder, all_grads, job.name)
            if data_parallel or mirrored:
                grads = all_grads
            if mirrored:    # each device's gradient is combined by its loss's count
                loss = builder.losses[0]
                loss_count = autodiff.loss_instance_count(loss) if loss.is_dynamic \
                    else op("Size", loss)
        watch_outputs = _watch_outputs(builder)

    taken = set()
    output_names = [_as_output(builder, b, f"output_{i}", taken) for i, b in enumerate(blobs)]
    watch_named = []
    for i, (blob, handler, location) in enumerate(watch_outputs):
        watch_named.append((_as_output(builder, blob, f"watch_{i}", taken), handler, location))
    state_outputs = {}
    for var_name, blob in builder.state_updates.items():
        state_outputs[var_name] = _as_output(builder, blob, f"{var_name}/next", taken)
    # a data-parallel step is cut at its gradients (runtime/data_parallel.py)
    gradient_outputs = {var_name: _as_output(builder, grad, f"{var_name}/grad", taken)
                        for var_name, grad in grads.items()}
    loss_count_output = None if loss_count is None else _as_output(
        builder, loss_count, "loss_elem_count", taken)

    model = ir.Model(builder.graph, ir_version=IR_VERSION, producer_name="onnxjob")
    model, serialized, used_inputs, in_place = _run_passes(
        model, builder, job.config, getattr(variable_registry, "device", None), state_outputs)
    variable_inputs = {n: b.value.name for n, b in builder.variables.items()
                       if b.value.name in used_inputs}
    has_sequences = any(b.is_tensor_list for b in blobs) or any(
        isinstance(v.type, ir.SequenceType) for v in builder.graph.inputs
        if v.name in used_inputs)
    sources = {n: src for n, src in builder.sources.items() if n in used_inputs}
    if job.config.get("dynamic_batch", False):
        model, serialized = None, _batch_symbolic(job, model, serialized, placeholder_names,
                                                  output_names, sources)
    compiled = CompiledGraph(model, placeholder_names, variable_inputs, output_names, tree,
                             state_outputs, watch_named, has_sequences, is_train, sources,
                             gradient_outputs, serialized)
    compiled.loss_count_output = loss_count_output
    compiled.accumulation_steps = accumulation
    compiled.moving_statistics = moving_statistics
    compiled.in_place = in_place
    compiled.values_read = builder.values_read
    return compiled


def _batch_symbolic(job, model, serialized, placeholder_names, output_names, sources):
    """The bytes of the job's graph with a symbolic batch axis (graph/dynamic_batch.py),
    for `function_config.dynamic_batch(True)`: predict jobs on tp.Numpy placeholders only."""
    if job.is_train:
        raise TraceError(f"job {job.name!r}: function_config.dynamic_batch applies to predict "
                         "jobs; a train job takes exactly its placeholders' shapes",
                         location=job.location)
    if sources:
        raise TraceError(f"job {job.name!r}: function_config.dynamic_batch needs a job fed by "
                         "its placeholders only; this one reads data the job makes itself "
                         f"({sorted(sources)})", location=job.location)
    for annotation in getattr(job, "param_annotations", ()):
        if not (tp.is_placeholder(annotation) and issubclass(annotation, tp.NumpyDef)):
            raise TraceError(f"job {job.name!r}: function_config.dynamic_batch needs "
                             "tp.Numpy.Placeholder parameters only", location=job.location)
    proto = ir.to_proto(model) if serialized is None else onnx.ModelProto.FromString(serialized)
    make_batch_symbolic(proto, placeholder_names, job.name, row_outputs=output_names)
    return proto.SerializeToString()


def _check_mixed_precision(job, device):
    """bfloat16 AMP only where onnxruntime can run it (said before tracing, at the job)."""
    if mixed_precision_type(job.config) == ir.DataType.BFLOAT16 and device != "cuda":
        raise TraceError(
            f"job {job.name!r}: mixed_precision_data_type(flow.bfloat16) needs the CUDA "
            "execution provider; onnxruntime's CPU provider has no bfloat16 MatMul, Gemm or "
            "Conv kernels. Use flow.float16 (the default), which the CPU runs through float32 "
            "kernels", location=job.location)


def _float32_gradients(grads):
    """Each gradient through an explicit Cast to its own (the variable's) type, for AMP
    jobs: a no-op in the traced graph; after onnxjob/passes/auto_mixed_precision.py, where
    the backward computed a gradient in half, it is the cast back to float32 that keeps
    the optimizer's state and updates in float32 (OneFlow's master weights)."""
    return {name: op("Cast", g, to=ir.DataType.from_numpy(g.np_dtype).value)
            for name, g in grads.items()}


def _run_passes(model, builder, config, device, state_outputs):
    """(model after the passes or None, its bytes or None, names of its graph inputs, the
    variables a step may update in place): the pipeline's result from the cache
    (graph/pass_cache.py, bytes only), else the passes run on `model` and their result is
    stored. NOTE: what this does after the passes is cached with them; the key holds
    onnxjob's version (or its source's hash), so a change here is a miss without a
    pass_cache.FORMAT bump."""
    cache_path = None
    digest = pass_cache.graph_digest(model) if pass_cache.enabled(config) else None
    if digest is not None:
        cache_path = pass_cache.path_for(digest, device, mixed_precision_type(config))
        cached = pass_cache.load(cache_path, model)
        if cached is not None:
            serialized, input_names, metadata = cached
            return None, serialized, input_names, _in_place_of(metadata)
    run_default_pipeline(model, config, device)
    # host-made inputs only other host nodes read (a resized batch that CropMirrorNormalize
    # crops on the host) are not fed to the graph
    for value in list(model.graph.inputs):
        if value.name in builder.sources and not value.uses() and value not in model.graph.outputs:
            model.graph.inputs.remove(value)
    if state_outputs:
        variable_inputs = {n: b.value.name for n, b in builder.variables.items()}
        model.metadata_props[IN_PLACE] = "\n".join(sorted(
            in_place_state(model.graph, variable_inputs, state_outputs)))
    serialized = None
    if cache_path is not None and len(model.graph):
        # (a job of no nodes, e.g. one that only creates a summary writer, is not kept: the
        # cache takes an empty graph for a damaged entry)
        serialized = ir.to_proto(model).SerializeToString()
        pass_cache.store(cache_path, serialized)
    return (model, serialized, {v.name for v in model.graph.inputs},
            _in_place_of(model.metadata_props))


def _in_place_of(metadata):
    """The variables a model's IN_PLACE metadata property names."""
    return frozenset(name for name in metadata.get(IN_PLACE, "").split("\n") if name)


def _watch_outputs(builder):
    outs = []
    for blob, handler, is_diff, location in builder.watches:
        if is_diff:
            grad = builder.gradients.get(id(blob))
            if grad is None:
                # as OneFlow's add_lbi_diff_watcher.cpp, which serves the diffs the backward
                # makes and skips the others: a predict job's (model code shared with a
                # train job), a blob off the loss's path; its handler is not called
                _warn_once(location, f"flow.watch_diff: {blob.name} has no gradient in "
                           f"job {builder.job_name!r} (a predict job, or a blob not on the path "
                           "from a trainable variable to the loss): its handler is not called")
                continue
            # As OneFlow (add_lbi_diff_watcher.cpp watches the backward's own diffs): not
            # divided by elem_cnt, and multiplied by the loss scale, if any, not unscaled.
            blob = grad * builder.loss_elem_count if builder.loss_elem_count != 1 else grad
        outs.append((blob, handler, location))
    return outs


_warned_at = set()


def _warn_once(location, message):
    """Warn `message` once for the user's line `location` ("file.py:12")."""
    if location in _warned_at:
        return
    _warned_at.add(location)
    warn_at_user_line(message, location=location)


def check_model(proto):
    """onnx.checker with full shape inference (what an exported file must pass)."""
    onnx.checker.check_model(proto, full_check=True)
