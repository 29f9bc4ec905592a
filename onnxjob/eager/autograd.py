"""`flow.autograd.backward` / `grad` and `flow.no_grad` for eager tensors.

The gradients are built on the tape the outputs were computed on (eager/tape.py), with the
job compiler's gradient rules (graph/autodiff.py `gradients`), and run as they are built.
As in OneFlow and PyTorch: backward() accumulates into the `.grad` of the leaves that
require gradients, an output that is not a scalar needs its gradient given, and the
tape ends with backward() unless `retain_graph=True` (a second backward through the same
ops then says so)."""
import numpy as np

from onnxjob.eager.tape import Tape, set_grad_enabled
from onnxjob.eager.tensor import Tensor, is_tensor
from onnxjob.graph import autodiff
from onnxjob.graph.tracer import tracing


def backward(outputs, out_grads=None, retain_graph=False, create_graph=False):
    """Accumulate d(outputs)/d(leaf) into each leaf's `.grad` (`out_grads`: the outputs'
    gradients, None for scalar outputs)."""
    outputs, out_grads = _pairs(outputs, out_grads)
    tape, sources, grads = _gradients(outputs, out_grads, None, retain_graph, create_graph)
    for tensor, blob in sources:
        grad = grads.get(id(blob))
        if grad is None:
            continue
        value = tape.value_of(grad)
        if tensor.grad is None:
            tensor.grad = Tensor._made(np.array(value, dtype=tensor._value.dtype))
        else:
            tensor.grad = Tensor._made(tensor.grad._value + value)


def grad(outputs, inputs, out_grads=None, retain_graph=False, create_graph=False):
    """The tuple of d(outputs)/d(input) for each of `inputs` (tensors the outputs were
    computed from); nothing is accumulated."""
    outputs, out_grads = _pairs(outputs, out_grads)
    inputs = [inputs] if is_tensor(inputs) else list(inputs)
    tape, sources, grads = _gradients(outputs, out_grads, inputs, retain_graph, create_graph)
    result = []
    for tensor, blob in sources:
        g = grads.get(id(blob))
        if g is None:
            raise RuntimeError("One of the differentiated Tensors appears to not have been "
                               "used in the graph")
        result.append(Tensor._made(np.array(tape.value_of(g))))
    return tuple(result)


class no_grad:
    """Context manager and decorator: ops run inside record nothing for backward (their
    results do not require gradients). Job functions record no eager autograd, so it
    changes nothing in a job: a train job still differentiates its loss."""

    def __enter__(self):
        self._previous = set_grad_enabled(False)
        return self

    def __exit__(self, *exc):
        set_grad_enabled(self._previous)
        return False

    def __call__(self, func):
        def wrapper(*args, **kwargs):
            with no_grad():
                return func(*args, **kwargs)
        return wrapper


def _pairs(outputs, out_grads):
    outputs = [outputs] if is_tensor(outputs) else list(outputs)
    if out_grads is None or is_tensor(out_grads):
        out_grads = [out_grads] * len(outputs) if out_grads is None else [out_grads]
    out_grads = list(out_grads)
    if len(out_grads) != len(outputs):
        raise ValueError(f"{len(outputs)} outputs but {len(out_grads)} gradients")
    for i, (out, g) in enumerate(zip(outputs, out_grads)):
        if not out.requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not "
                               "have a grad_fn")
        if g is None and out.numel() != 1:
            raise RuntimeError("grad can be implicitly created only for scalar outputs "
                               f"(output {i} has shape {out.shape}): pass its gradient")
    return outputs, out_grads


def _gradients(outputs, out_grads, inputs, retain_graph, create_graph):
    """(tape, [(tensor, Blob)] of the sources, {id(Blob): gradient Blob}). The sources
    are `inputs`, or with None every leaf of the tape that requires gradients."""
    tapes = {id(t._tape): t._tape for t in outputs if t._tape is not None}
    if len(tapes) > 1:
        raise RuntimeError("the outputs were computed on separate tapes (a backward ran "
                           "between them without retain_graph=True)")
    if not tapes:       # leaves: their gradient is the seed itself
        seeds = [g._value if g is not None else np.ones(t.shape, t._value.dtype)
                 for t, g in zip(outputs, out_grads)]
        return _leaf_gradients(outputs, seeds, inputs)
    tape = next(iter(tapes.values()))
    previous = set_grad_enabled(create_graph)
    try:
        with tracing(tape):
            blobs = [tape.enter(t) for t in outputs]
            seeds = [tape.enter(g) if g is not None else
                     tape.constant(np.ones(t.shape, t._value.dtype), "grad_seed")
                     for t, g in zip(outputs, out_grads)]
            if inputs is None:
                sources = [(t, b) for t, _, b in tape.leaves.values()
                           if t.is_leaf and t.requires_grad]
            else:
                sources = [(t, tape.enter(t)) for t in inputs]
            cut = [b for _, _, b in tape.leaves.values() if id(b) in tape.cut]
            grads = autodiff.gradients(tape, blobs, seeds, [b for _, b in sources] + cut)
    finally:
        set_grad_enabled(previous)
    if any(grads.get(id(b)) is not None for b in cut):
        raise RuntimeError("Trying to backward through the graph a second time: a tensor "
                           "on the way was computed before an earlier backward(), which "
                           "ended its graph; specify retain_graph=True in that backward")
    if not retain_graph:
        tape.ended = True
    return tape, sources, grads


def _leaf_gradients(outputs, seeds, inputs):
    """_gradients of leaf outputs: d(leaf)/d(leaf) is the seed, and nothing else."""
    tape = Tape(record=False)
    with tracing(tape):
        sources = [(t, tape.enter(t)) for t in (outputs if inputs is None else inputs)]
        grads = {}
        for tensor, blob in sources:
            for out, seed in zip(outputs, seeds):
                if out is tensor:
                    grads[id(blob)] = tape.constant(np.asarray(seed), "grad_seed")
    return tape, sources, grads


def _tensor_backward(self, gradient=None, retain_graph=False, create_graph=False):
    """`tensor.backward(gradient=None, retain_graph=False)`: backward([tensor], ...)."""
    backward(self, gradient, retain_graph, create_graph)


Tensor.backward = _tensor_backward
