"""One data-parallel train step: the train graph cut at its gradients into two parts,
with the gradients averaged across ranks between them (runtime/distributed.py). The
first part runs as stages where it holds collectives (runtime/staged.py)."""
import onnx
import onnx.utils

from onnxjob.runtime import backend, distributed
from onnxjob.runtime.staged import StagedSession


def _ancestors_reach(graph, sources, targets):
    """The subset of `targets` (value names) computed from any of `sources`."""
    producer = {out: node for node in graph.node for out in node.output}
    memo = {}

    def reaches(name):
        if name in sources:
            return True
        if name not in memo:
            memo[name] = False      # cycles cannot occur; this also stops re-visits
            node = producer.get(name)
            memo[name] = node is not None and any(reaches(i) for i in node.input if i)
        return memo[name]
    return {t for t in targets if reaches(t)}


def _extract(model, inputs, outputs):
    """The part of `model` computing `outputs` from `inputs`, keeping only used inputs."""
    part = onnx.utils.Extractor(model).extract_model(list(inputs), list(outputs))
    used = {i for node in part.graph.node for i in node.input} | set(outputs)
    kept = [i for i in part.graph.input if i.name in used]
    del part.graph.input[:]
    part.graph.input.extend(kept)
    return part


class DataParallelStep:
    """Runs a train job compiled with its gradients as extra outputs
    (`compiled.gradient_outputs`): part A, forward + backward on this rank's rows (staged
    at synchronized batch norms); the averaged gradients; session B, the optimizer's
    update. Variables stay NumPy arrays in the session's store, as on one CPU."""

    def __init__(self, model_bytes, compiled, store, create_session):
        model = onnx.load_from_string(model_bytes)
        self._store = store
        self._grads = list(compiled.gradient_outputs.values())
        self._user = list(compiled.output_names) + [w[0] for w in compiled.watch_outputs]
        updated = _ancestors_reach(model.graph, set(self._grads),
                                   set(compiled.state_outputs.values()))
        self._state_a = [(v, o) for v, o in compiled.state_outputs.items() if o not in updated]
        self._state_b = [(v, o) for v, o in compiled.state_outputs.items() if o in updated]
        graph_inputs = [i.name for i in model.graph.input]
        self._a = StagedSession(_extract(model, graph_inputs, self._user + self._grads +
                                         [o for _, o in self._state_a]), create_session)
        self._b = create_session(_extract(model, graph_inputs + self._grads,
                                          [o for _, o in self._state_b]).SerializeToString())
        self._variable_of = {i: v for v, i in compiled.variable_inputs.items()}
        placeholders = {i.name: i for i in model.graph.input}
        first = placeholders[compiled.placeholder_names[0]] if compiled.placeholder_names else None
        self._rows = first.type.tensor_type.shape.dim[0].dim_value if first is not None else 0
        order = self._a.output_names
        assert order == self._user + self._grads + [o for _, o in self._state_a], order
        self._inputs_a = self._a.input_names
        self._inputs_b = [i.name for i in self._b.get_inputs()]

    def _feeds(self, names, feeds, extra=None):
        out = {}
        for name in names:
            if extra is not None and name in extra:
                out[name] = extra[name]
            elif name in self._variable_of:
                out[name] = backend.host_array(self._store[self._variable_of[name]])
            else:
                out[name] = feeds[name]
        return out

    def run(self, feeds):
        results_a = self._a.run(self._feeds(self._inputs_a, feeds))
        n_user, n_grads = len(self._user), len(self._grads)
        # the gradients, and the state the forward pass updates (batch norm's moving
        # statistics), averaged: every rank then holds the same variables
        averaged = distributed.average(results_a[n_user:])
        grads = averaged[:n_grads]
        results_b = self._b.run(None, self._feeds(self._inputs_b, feeds,
                                                  dict(zip(self._grads, grads))))
        for (variable, _), value in zip(self._state_a, averaged[n_grads:]):
            self._store[variable] = value
        for (variable, _), value in zip(self._state_b, results_b):
            self._store[variable] = value
        return [distributed.whole_batch(v, self._rows) for v in results_a[:n_user]]
