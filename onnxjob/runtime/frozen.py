"""Predict jobs with the variables baked in as constants, once the variables stop changing.

onnxruntime's CPU layout optimizer (NCHWc: blocked convolutions and pools) only rewrites a
Conv whose weight is a constant initializer. A job fed its variables as inputs never gets
it, and on the doc LeNet the blocked conv is about a third faster (bench/bench_models.py
prints both). So after `threshold` consecutive calls of a predict job that saw the same
variable values, a second session is built with those values as initializers and used for
as long as the values stay the same; any write to a variable (a train step, a checkpoint
load) sends the job back to the fed session and restarts the count.

The count keeps a loop that alternates training and prediction from rebuilding a session
per call; the threshold is `function_config.freeze_variables_after(n)`, else the
ONNXJOB_FREEZE_AFTER environment variable, else 8; 0 turns this off. Jobs whose variables
exceed 1 GiB stay fed (the frozen model must fit one protobuf), and so do jobs with random
nodes: a new session's generators would start again from their seeds, and every re-freeze
would repeat the draws of the calls after the last one (OneFlow's random kernels keep one
generator per op for the whole session). Results of the two
sessions agree to float rounding (different kernels), not bit for bit.

On CUDA the same holds for other reasons: with constant weights onnxruntime folds each
inference batch norm into its convolution, and a served ResNet50 then runs as fast as
plain onnxruntime on the exported file (bench/bench_gpu.py).
"""
import onnx
from onnx import numpy_helper

from onnxjob import settings
from onnxjob.runtime import backend

# The frozen model carries the weights inside one protobuf, which cannot exceed 2 GiB.
MAX_FROZEN_BYTES = 1 << 30


class VariableStore(dict):
    """name -> stored variable value; `version` counts writes, so readers can tell when any
    value changed, and `versions[name]` is the count at the last write of `name`. Values
    are replaced, never modified in place, except by train steps: the variables a step
    writes over their own values (graph/in_place.py; stored again, so their versions
    count the write) and the two buffer sets a CUDA graph runner alternates between
    (runtime/cuda_graph.py), each rewritten two steps after it was stored."""

    def __init__(self):
        super().__init__()
        self.version = 0
        self.versions = {}

    def __setitem__(self, name, value):
        self.version += 1
        self.versions[name] = self.version
        super().__setitem__(name, value)

    def replace_all(self, names, values):
        """Store `values` under `names` in one step that a Ctrl-C cannot split: a step's
        new weights, optimizer state and step counter land together or not at all."""
        new = dict(zip(names, values))
        first = self.version + 1
        self.versions.update(zip(new, range(first, first + len(new))))
        self.version = first + len(new) - 1
        # NOTE: versions first: an interrupt before the values land only costs a re-freeze
        dict.update(self, new)


def freeze_threshold(config):
    value = config.get("freeze_variables_after")
    if value is not None:
        return value        # checked where it was set
    return settings.get("FREEZE_AFTER")


def frozen_model_bytes(model_bytes, variable_inputs, values):
    """`model_bytes` with the graph inputs of `variable_inputs` ({variable name: input
    name}) turned into initializers holding the variables' `values`."""
    model = onnx.load_from_string(model_bytes)
    names = set(variable_inputs.values())
    kept = [i for i in model.graph.input if i.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(
        numpy_helper.from_array(backend.host_array(values[var]), input_name)
        for var, input_name in variable_inputs.items())
    return model.SerializeToString()


def make_frozen_predictor(config, model_bytes, variable_inputs, store, make_runner):
    """A FrozenPredictor for a predict job without state outputs, or None when the job
    reads no variable, its threshold is 0, or its variables are too big to embed.
    `make_runner(frozen_model_bytes)` returns a callable running feeds -> outputs."""
    threshold = freeze_threshold(config)
    if not variable_inputs or not threshold:
        return None
    size = sum(backend.host_array(store[name]).nbytes for name in variable_inputs)
    if size > MAX_FROZEN_BYTES:
        return None
    return FrozenPredictor(model_bytes, variable_inputs, store, threshold, make_runner)


class FrozenPredictor:
    """Chooses, per call of one predict job, between the fed session and a session with
    the current variable values as constants (see the module docstring)."""

    def __init__(self, model_bytes, variable_inputs, store, threshold, make_runner):
        self._make_runner = make_runner
        self._model_bytes = model_bytes
        self._variable_inputs = dict(variable_inputs)
        self._store = store
        self._threshold = threshold
        self._seen_version = None
        self._calls_at_version = 0
        self._session = None
        self._session_version = None

    def session_for_call(self):
        """The frozen runner (feeds -> outputs) for this call, or None to run the fed one."""
        version = self._store.version
        if self._session is not None and self._session_version == version:
            return self._session
        self._session = None        # stale: let its memory go now
        if version != self._seen_version:
            self._seen_version, self._calls_at_version = version, 0
        self._calls_at_version += 1
        if self._calls_at_version < self._threshold:
            return None
        frozen = frozen_model_bytes(self._model_bytes, self._variable_inputs, self._store)
        self._session = self._make_runner(frozen)
        self._session_version = version
        return self._session
