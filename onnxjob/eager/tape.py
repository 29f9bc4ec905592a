"""The tape: eager tensor ops recorded as an onnxjob graph and run as they are recorded.

An op called on eager tensors (onnxjob/eager/tensor.py) is traced by the same op
functions a job's body calls, into a `Tape` (a GraphBuilder); each node is run when it is
appended (eager/node_runner.py), so every Blob of the tape has its value at once. The
tape is what backward() differentiates, with the gradient rules of the job compiler
(graph/autodiff.py `gradients`): its gradient nodes are run the same way.

A tape records the ops whose inputs require gradients while gradients are enabled
(`flow.no_grad()` turns that off); other ops run in a scratch tape of their own. A
backward() ends the tape it ran on (unless told to retain it): later ops start a new one,
and a tensor of the old tape enters the new one as a leaf. The current tape is held
weakly: it lives as long as a tensor of it does.
"""
import threading
import weakref

import numpy as np

from onnxjob.errors import UnsupportedAPIError
from onnxjob.graph.autodiff import propagate_requires
from onnxjob.graph.tracer import GraphBuilder, VariableRegistry
from onnxjob.source_info import user_location
from onnxjob.eager.node_runner import run_node

_state = threading.local()


def grad_enabled():
    """Whether ops record for backward in this thread (flow.no_grad() turns it off)."""
    return getattr(_state, "grad_enabled", True)


def set_grad_enabled(enabled):
    """Set grad_enabled() for this thread; returns the previous setting."""
    previous = grad_enabled()
    _state.grad_enabled = bool(enabled)
    return previous


def current_tape():
    """The tape ops that record append to, made when there is none alive."""
    ref = getattr(_state, "tape", None)
    tape = ref() if ref is not None else None
    if tape is None or tape.ended:
        tape = Tape(record=True)
        _state.tape = weakref.ref(tape)
    return tape


class Tape(GraphBuilder):
    """Eager ops as a graph, each node run as it is appended (see the module docstring).

    `values`: value name -> array of every value so far; `leaves`: id(tensor) -> (tensor,
    its array when imported, Blob) for the tensors that entered as graph inputs;
    `requiring`: ids of the Blobs that depend on a leaf requiring gradients; `cut`: ids of
    the inputs that stand for a tensor whose history is on an ended tape."""

    def __init__(self, record):
        # (a recording tape traces ops as a train job's body does: the forms their
        # gradients need, dropout active)
        super().__init__("eager", is_train=record, variable_registry=_NoVariables())
        self.record = record
        self.batch_norm_coefficients = None     # (nodes run as emitted: nothing to batch)
        self.values = {}
        self.leaves = {}
        self.requiring = set()
        self.cut = set()
        self.ended = False
        self._ran = set()           # the ir.Nodes run
        self._scanned = set()       # the TracedNodes looked at for `requiring`

    def emit(self, op_type, inputs, attrs=None, num_outputs=1, name=None, location=None):
        outs = super().emit(op_type, inputs, attrs, num_outputs=num_outputs, name=name,
                            location=location)
        self._run_new_nodes()
        self._track_requiring()
        return outs

    def value_of(self, blob):
        """The array of `blob` (a Blob of this tape)."""
        return self._array(blob.value)

    def enter(self, tensor):
        """The Blob standing for `tensor` in this tape: its own where it was computed here,
        else a graph input holding its value (a leaf of this tape)."""
        own = tensor._blob_in(self)
        if own is not None:
            return own
        array = tensor._value
        entry = self.leaves.get(id(tensor))
        if entry is not None and entry[1] is array:
            return entry[2]
        blob = self.add_input("leaf", array.shape, array.dtype)
        self.values[blob.value.name] = array
        self.leaves[id(tensor)] = (tensor, array, blob)
        if self.record and tensor.requires_grad:
            self.requiring.add(id(blob))
            if not tensor.is_leaf:
                self.cut.add(id(blob))      # its history ended with another tape
        return blob

    def _run_new_nodes(self):
        for node in _unseen_tail(self.graph, self._ran):
            arrays = [None if v is None else self._array(v) for v in node.inputs]
            for value, array in zip(node.outputs, run_node(node, arrays,
                                                           self.graph.opset_imports)):
                self.values[value.name] = array

    def _array(self, value):
        if value.name in self.values:
            return self.values[value.name]
        if value.const_value is None:
            raise UnsupportedAPIError(
                f"{user_location()}: {value.name} has no value on eager tensors: it is made "
                "as a job runs (a data reader's or host op's); call such ops in a job")
        return np.asarray(value.const_value.numpy())

    def _track_requiring(self):
        # (a composite replaces the TracedNodes of its parts with its own: walk back to
        # the last one seen rather than keep an index)
        propagate_requires(_unseen_tail(self.nodes, self._scanned), self.requiring)


def _unseen_tail(items, seen):
    """The items after the last one in `seen` (in order), added to `seen`."""
    tail = []
    for item in reversed(items):
        if item in seen:
            break
        tail.append(item)
    tail.reverse()
    seen.update(tail)
    return tail


class _NoVariables(VariableRegistry):
    """The tape's variable registry: job variables (flow.get_variable, the layers that
    make weights) are refused, naming the line."""

    def declare_variable(self, spec, check_same):
        raise UnsupportedAPIError(
            f"{user_location()}: variable {spec.name!r}: flow.get_variable and the layers "
            "that make weights (flow.layers.dense, ...) create a job's variables; on eager "
            "tensors make the weight a flow.nn.Parameter and call the op with it "
            "(flow.matmul, flow.nn.conv2d, ...)")
