"""Export a compiled job as a self-contained `.onnx` file.

A predict job's variables become initializers holding their current values, so the file
runs in plain onnxruntime with only the job's placeholders as inputs.

A train job becomes a **train step**: forward, backward and the optimizer's update, with
every variable it updates (weights, optimizer state, step counter) a graph input and its
new value a `<variable>/next` output. The current values travel in the file as
initializers named `<input>/initial`, which no node reads: a caller reads them once, feeds
the placeholders and the state, and feeds each step's `/next` outputs back as the next
step's state. (They are not defaults of the inputs: onnxruntime-node does not let a caller
override an input that has an initializer, and silently keeps the initializer.) Variables
the step reads but never updates become constants. The model's metadata property
`onnxjob.train_step` describes this in JSON (documented in docs/train-anywhere.md):

    {"format": "onnxjob.train_step", "version": 1,
     "feeds":   [{"name", "shape", "dtype"}, ...],            the placeholders
     "outputs": [{"name", "shape", "dtype"}, ...],            what the job returns
     "state":   [{"variable", "input", "output", "initial", "shape", "dtype"}, ...],
     "fixed":   [{"variable", "initializer", "shape", "dtype"}, ...]}   constants

Each node keeps the user's `file:line` in its `source` metadata property.
"""
import json

import numpy as np
import onnx
from onnx import helper

from onnxjob.ops import python_kernels
from onnxjob.errors import TraceError
from onnxjob.graph import dynamic_batch
from onnxjob.io.model_file import save_checked
from onnxjob.frontend.config import started_session


def _job_name(job_fn):
    return job_fn.job.name if hasattr(job_fn, "job") else str(job_fn)


def job_model_proto(job_fn, with_variables=True, values=None):
    """The ModelProto of `job_fn` (a decorated job); starts the session if needed.
    `values`: {variable name: array} written instead of those variables' current values."""
    session = started_session(sync=True)
    current = session.variable_numpy

    def value_of(variable):
        return np.asarray(values[variable] if values and variable in values else
                          current(variable))
    runtime = session.runtimes.get(_job_name(job_fn))
    if runtime is None:
        raise TraceError(f"expected a job function (decorated with @flow.global_function) "
                         f"or its name, got {job_fn!r}; this session's jobs: "
                         f"{sorted(session.runtimes) or 'none'}")
    proto = onnx.ModelProto()
    proto.CopyFrom(runtime.compiled.to_proto())
    if with_variables and runtime.compiled.is_train:
        _make_train_step(proto, runtime.compiled, value_of)
    elif with_variables:
        graph = proto.graph
        keep = []
        variable_of_input = {i: v for v, i in runtime.compiled.variable_inputs.items()}
        for value_info in graph.input:
            if value_info.name in variable_of_input:
                array = value_of(variable_of_input[value_info.name])
                graph.initializer.append(onnx.numpy_helper.from_array(array, value_info.name))
            else:
                keep.append(value_info)
        del graph.input[:]
        graph.input.extend(keep)
    return proto


TRAIN_STEP_FORMAT = "onnxjob.train_step"


def set_dynamic_batch(job_fn, proto, dynamic):
    """Write the batch axis of predict job `job_fn`'s placeholders and row outputs in
    `proto` as the symbolic dimension "batch" (`dynamic`), or as the placeholders' batch."""
    job = job_fn.job
    session = started_session()
    compiled = session.runtimes[job.name].compiled
    if dynamic_batch.is_symbolic(proto) == dynamic:
        return
    if not dynamic:
        dynamic_batch.fix_batch(proto, job._batch_rows)
        return
    if compiled.is_train:
        raise TraceError(f"job {job.name!r}: export(dynamic_batch=True) applies to predict "
                         "jobs; a train step takes exactly its placeholders' shapes",
                         location=job.location)
    dynamic_batch.make_batch_symbolic(proto, compiled.placeholder_names, job.name,
                                      row_outputs=compiled.output_names)


def _make_train_step(proto, compiled, value_of):
    """Give every variable input an initializer (its current value) and describe the
    step's feeds, outputs and state pairs in the model's metadata (module docstring)."""
    graph = proto.graph
    info = {v.name: v for v in list(graph.input) + list(graph.output)}

    def describe(name, **extra):
        tensor = info[name].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param
                for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        return {**extra, **({"name": name} if not extra else {}), "shape": dims, "dtype": dtype}

    state, fixed, constant_inputs = [], [], set()
    for variable, input_name in compiled.variable_inputs.items():
        value = value_of(variable)
        output_name = compiled.state_outputs.get(variable)
        if output_name is None:
            fixed.append(describe(input_name, variable=variable, initializer=input_name))
            graph.initializer.append(onnx.numpy_helper.from_array(value, input_name))
            constant_inputs.add(input_name)
        else:
            initial = f"{input_name}/initial"
            state.append(describe(input_name, variable=variable, input=input_name,
                                  output=output_name, initial=initial))
            graph.initializer.append(onnx.numpy_helper.from_array(value, initial))
    kept = [i for i in graph.input if i.name not in constant_inputs]
    del graph.input[:]
    graph.input.extend(kept)
    outputs = list(compiled.output_names) + [w[0] for w in compiled.watch_outputs]
    description = {"format": TRAIN_STEP_FORMAT, "version": 1,
                   "feeds": [describe(n) for n in compiled.placeholder_names],
                   "outputs": [describe(n) for n in outputs],
                   "state": state, "fixed": fixed}
    entry = proto.metadata_props.add()
    entry.key, entry.value = TRAIN_STEP_FORMAT, json.dumps(description)


def export(job_fn, path, check=True, dynamic_batch=None, half_weights=False):
    """Write `job_fn`'s graph with current variable values to `path` (checked by onnx):
    a predict job's variables as constants, a train job as a train step (module
    docstring).

    `dynamic_batch=True` writes a predict job's batch axis (its tp.Numpy placeholders'
    first dimension) as the symbolic dimension "batch" of the inputs and outputs, so the
    file runs on any number of rows (graph/dynamic_batch.py; a job that uses the batch
    size as a number raises, naming the line); False writes the placeholders' batch; None
    (the default) keeps the job's own `function_config.dynamic_batch`.
    `half_weights`: a predict job under AMP stores the weights it computes with in half
    precision (io/half_weights.py), a file about half the size.
    A model whose weights are past protobuf's 2 GiB limit is written with them beside it
    in `<path>.data` (ONNX external data; io/model_file.py), with a warning."""
    proto = job_model_proto(job_fn)
    python_kernels.warn_if_exported(proto, path)
    if dynamic_batch is not None:
        set_dynamic_batch(job_fn, proto, bool(dynamic_batch))
    if half_weights:
        _store_half_weights(proto, job_fn)
    save_checked(proto, path, check=check)
    return path


def _store_half_weights(proto, job_fn):
    """export(..., half_weights=True): io/half_weights.py, refused where no weight is cast
    to half (a job without enable_auto_mixed_precision(True))."""
    from onnxjob.io.half_weights import store_half_weights
    if store_half_weights(proto)[0] == 0:
        raise ValueError(f"export(half_weights=True): job {_job_name(job_fn)!r} casts no "
                         "float32 weight to half; the option applies to predict jobs under "
                         "function_config.enable_auto_mixed_precision(True)")
