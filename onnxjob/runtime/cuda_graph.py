"""Job steps replayed as CUDA graphs: one launch per step instead of one per kernel.

onnxruntime's CUDA EP (`enable_cuda_graph`) captures a run the first time it sees a graph
id and replays it afterwards; a replay reads and writes the device addresses bound at
capture, so every input and output lives in a buffer of fixed address:

- feeds: one device buffer per placeholder, filled from the host before each step;
- user outputs: one device buffer each, copied to the host after the step;
- variables a step updates (a train job's weights and optimizer state): two buffer sets,
  A and B. A step cannot write its new state over the inputs it is reading, so steps
  alternate between two captured graphs, A -> B (graph id 1) and B -> A (graph id 2), and
  the session's variable store points at whichever set holds the current values; a
  variable the step may write in place (graph/in_place.py) has one buffer in both sets;
  set A is the store's own device values where they are on the device already (no
  second copy of the state);
- variables a job only reads: one buffer each.

A buffer is refreshed from the variable store when another writer (another job, a
checkpoint load, `flow.load_variables`) changed that variable since this job last saw
it: the store counts writes per variable (VariableStore.versions).

Jobs whose graphs cannot replay faithfully run without graphs, and the reason is printed
once: random ops (a replay would repeat the captured step's random numbers), lists of
tensors (shapes that change per call), outputs without a static shape, ops the CUDA EP
does not run (onnxruntime refuses to capture a graph with CPU nodes).
"""
import contextlib
import sys

import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from onnxjob import settings
from onnxjob.runtime import backend
from onnxjob.runtime.executor import interrupt_deferred

# ops whose results differ per run: a replay would repeat the numbers drawn at capture
RANDOM_OPS = {"Dropout", "RandomUniform", "RandomUniformLike", "RandomNormal",
              "RandomNormalLike", "Bernoulli", "Multinomial"}

NUMPY_DTYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64,
                 "tensor(float16)": np.float16, "tensor(int32)": np.int32,
                 "tensor(int64)": np.int64, "tensor(int8)": np.int8,
                 "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


class CaptureFailed(RuntimeError):
    """onnxruntime could not capture or replay the step as a CUDA graph."""


def obstacle(job, compiled):
    """Why `job` must run without CUDA graphs, or None when it may use them; "" when the
    user turned them off (nothing to say)."""
    if job.config.get("enable_cuda_graph", True) is False or \
            not settings.get("CUDA_GRAPH"):
        return ""
    if compiled.has_sequences:
        return "it returns lists of tensors, whose shapes change between calls"
    random_ops = random_op_types(compiled)
    if random_ops:
        return (f"its random ops ({', '.join(random_ops)}) would repeat the same numbers in "
                "every replay")
    return None


def random_op_types(compiled):
    """The sorted op types of `compiled`'s random nodes, subgraphs included: each keeps its
    generator's state in its session, so a replay or a new session repeats its numbers."""
    return sorted({n.op_type for n in ir.traversal.RecursiveGraphIterator(compiled.model.graph)
                   if n.op_type in RANDOM_OPS})


def say_why(job_name, reason):
    """The one line telling that a job runs without CUDA graphs."""
    print(f"onnxjob: job {job_name!r} runs without CUDA graphs: {reason}", file=sys.stderr)


class CudaGraphRunner:
    """Runs one job's steps as CUDA graph replays (see the module docstring).

    `session` was created with `enable_cuda_graph`; `variable_inputs` are (variable,
    graph input) pairs, `state_items` (variable, graph output) pairs, `user_outputs` the
    graph outputs returned to the caller; `store` is the session's VariableStore;
    `in_place` names the variables written over their own buffer."""

    def __init__(self, session, variable_inputs, state_items, user_outputs, store,
                 in_place=frozenset()):
        self._session = session
        self._in_place = frozenset(in_place)
        self._store = store
        outputs = {o.name: o for o in session.get_outputs()}
        self._output_specs = [_static_spec(outputs[name]) for name in user_outputs]
        self._variable_inputs = list(variable_inputs)
        self._state = dict(state_items)             # variable -> graph output
        self._feed_buffers = None                   # graph input -> device buffer
        self._output_buffers = [_device_buffer(shape, dtype) for shape, dtype in self._output_specs]
        self._sets = None                           # [A, B]: variable -> device buffer
        self._bindings = None
        self._run_options = [_graph_run_options(1), _graph_run_options(2)]
        self._captured = [False, False]
        self._parity = 0
        self._seen_version = {}                     # variable -> store version in our buffer
        self._user_outputs = list(user_outputs)

    def fits(self, feeds):
        """Whether `feeds` have the shapes and dtypes the captured graphs were bound to."""
        if self._feed_buffers is None:
            return True
        for name, value in feeds.items():
            buffer = self._feed_buffers.get(name)
            if buffer is None or tuple(buffer.shape()) != value.shape or \
                    NUMPY_DTYPES.get(buffer.data_type()) != value.dtype:
                return False
        return True

    def run(self, feeds):
        """One step: returns the user outputs as NumPy arrays and points the store at the
        updated variables. Raises CaptureFailed when onnxruntime cannot capture."""
        if self._bindings is None:
            self._bind(feeds)
        p = self._parity
        for name, value in feeds.items():
            self._feed_buffers[name].update_inplace(np.asarray(value, order="C"))
        self._refresh_variables(self._sets[p])
        # the in-place variables land with the others (a SIGINT costs ~13 us to defer)
        with interrupt_deferred() if self._in_place else contextlib.nullcontext():
            if self._captured[p] or self._capture(p):
                self._session.run_with_iobinding(self._bindings[p], self._run_options[p])
            if self._state:
                written = self._sets[1 - p]
                for variable in self._state:
                    self._store[variable] = written[variable]
                    self._seen_version[variable] = self._store.versions[variable]
                self._parity = 1 - p
        return [buffer.numpy() for buffer in self._output_buffers]

    def _capture(self, p):
        """Capture graph `p` without letting the capture advance the step. onnxruntime's
        first run of a graph id executes the graph more than once (regular runs that size
        its arena, then the capture and a replay, all inside one `run`): harmless for
        values written to the other buffer set, but a variable written in place would be
        updated each time. So the in-place variables are saved before and put back after,
        and the step itself is the next run, the first plain replay. Returns whether that
        run is still to make (with nothing written in place, the capturing run was the step)."""
        buffers = self._sets[p]
        saved = {v: _host_copy(buffers[v]) for v in self._in_place if v in buffers}
        try:
            self._session.run_with_iobinding(self._bindings[p], self._run_options[p])
        except Exception as e:   # onnxruntime's own exception types
            if backend.memory_failure(e) is not None:
                raise   # (out of memory: the step fails, graphs stay on)
            raise CaptureFailed(str(e).strip().splitlines()[0]) from e
        finally:
            for variable, value in saved.items():
                buffers[variable].update_inplace(value)
        self._captured[p] = True
        return bool(saved)

    def _bind(self, feeds):
        """Allocate the fixed buffers and make the two bindings (one without state)."""
        self._feed_buffers = {name: _device_buffer(v.shape, v.dtype) for name, v in feeds.items()}
        set_a, set_b = {}, {}
        for variable, _ in self._variable_inputs:
            stored = self._store[variable]
            if _on_device(stored):
                # the store's device value is the first set's buffer: a copy of it would
                # hold a second copy of the state in the arena (~1.2 GiB for BERT-base's
                # weights and LAMB slots), freed after the first step but kept by the arena
                set_a[variable] = stored
                shape, dtype = tuple(stored.shape()), NUMPY_DTYPES[stored.data_type()]
            else:
                value = np.asarray(backend.host_array(stored), order="C")
                set_a[variable], shape, dtype = _device_value(value), value.shape, value.dtype
            self._seen_version[variable] = self._store.versions[variable]
            set_b[variable] = (_device_buffer(shape, dtype)
                               if variable in self._state and variable not in self._in_place
                               else set_a[variable])
        self._sets = [set_a, set_b]
        self._bindings = [self._make_binding(set_a, set_b), self._make_binding(set_b, set_a)]

    def _make_binding(self, reads, writes):
        binding = self._session.io_binding()
        for name, buffer in self._feed_buffers.items():
            binding.bind_ortvalue_input(name, buffer)
        for variable, input_name in self._variable_inputs:
            binding.bind_ortvalue_input(input_name, reads[variable])
        for name, buffer in zip(self._user_outputs, self._output_buffers):
            binding.bind_ortvalue_output(name, buffer)
        for variable, output_name in self._state.items():
            binding.bind_ortvalue_output(output_name, writes[variable])
        return binding

    def _refresh_variables(self, buffers):
        """Copy into `buffers` every variable written by someone else since we saw it."""
        store, versions, seen = self._store, self._store.versions, self._seen_version
        for variable, _ in self._variable_inputs:
            version = versions[variable]
            if seen[variable] != version:
                value = store[variable]
                if value is not buffers[variable]:
                    buffers[variable].update_inplace(
                        np.asarray(backend.host_array(value), order="C"))
                seen[variable] = version


def _graph_run_options(graph_id):
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", str(graph_id))
    return options


def _static_spec(node_arg):
    """(shape, dtype) of a graph output, or CaptureFailed when its shape is not static."""
    shape = node_arg.shape
    if any(not isinstance(d, int) for d in shape) or node_arg.type not in NUMPY_DTYPES:
        raise CaptureFailed(f"output {node_arg.name!r} has no static shape and type "
                            f"({node_arg.type}{list(shape)})")
    return tuple(shape), NUMPY_DTYPES[node_arg.type]


def _host_copy(value):
    """A host copy of the OrtValue `value` (numpy() copies a device value, views a host one)."""
    array = value.numpy()
    return array.copy() if value.device_name().lower() == "cpu" else array


_DEVICE = "cuda"     # where the buffers live (tests: "cpu", over CPU OrtValues)


def _on_device(value):
    """Whether `value` (a stored variable value) is an OrtValue on the buffers' device."""
    return isinstance(value, ort.OrtValue) and value.device_name().lower() == _DEVICE \
        and value.data_type() in NUMPY_DTYPES


def _device_value(array):
    return backend.to_device(array, "cuda")


def _device_buffer(shape, dtype):
    """A buffer for the whole run, made as a variable's value is (in the arena the
    sessions share where there is one: runtime/device_values.py)."""
    return backend.to_device(np.zeros(shape, dtype), "cuda")
