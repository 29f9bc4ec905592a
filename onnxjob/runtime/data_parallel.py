"""One data-parallel train step: the train graph, traced at the whole batch, cut at its
gradients into two parts. Part A (forward and backward) is split into this rank's share
(graph/split_batch.py) and runs as stages where it holds collectives
(runtime/staged.py); its gradients, partial sums over the ranks' rows, are summed across
the ranks (runtime/distributed.py); part B, the optimizer's update, runs on the sums."""
import numpy as np
import onnx
import onnx.utils

from onnxjob.graph.split_batch import MEAN, SUM, WHOLE, Split, split_batch
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

    def __init__(self, model_bytes, compiled, store, create_session, job_name):
        model = onnx.load_from_string(model_bytes)
        self._store = store
        self._grads = list(compiled.gradient_outputs.values())
        self._user = list(compiled.output_names) + [w[0] for w in compiled.watch_outputs]
        updated = _ancestors_reach(model.graph, set(self._grads),
                                   set(compiled.state_outputs.values()))
        self._state_a = [(v, o) for v, o in compiled.state_outputs.items() if o not in updated]
        self._state_b = [(v, o) for v, o in compiled.state_outputs.items() if o in updated]
        graph_inputs = [i.name for i in model.graph.input]
        part_a = _extract(model, graph_inputs, self._user + self._grads +
                          [o for _, o in self._state_a])
        rank, ranks = distributed.world()
        kinds = split_batch(part_a, compiled.placeholder_names, rank, ranks, job_name)
        self._kinds = [kinds[o] for o in self._user]
        self._reduced_kinds = [kinds[o] for o in self._grads + [o for _, o in self._state_a]]
        for name, kind in zip(self._grads + [o for _, o in self._state_a], self._reduced_kinds):
            if isinstance(kind, Split):     # (a variable has no batch axis)
                raise RuntimeError(f"job {job_name!r}: {name!r} comes out split over the "
                                   "ranks' rows; a variable's update must not be")
        self._batch = _batch(part_a, compiled.placeholder_names, ranks)
        self._a = StagedSession(part_a, create_session)
        self._b = create_session(_extract(model, graph_inputs + self._grads,
                                          [o for _, o in self._state_b]).SerializeToString())
        self._variable_of = {i: v for v, i in compiled.variable_inputs.items()}
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
        # statistics), reduced by their kind: every rank then holds the same variables
        reduced = _reduce(results_a[n_user:], self._reduced_kinds)
        grads = reduced[:n_grads]
        results_b = self._b.run(None, self._feeds(self._inputs_b, feeds,
                                                  dict(zip(self._grads, grads))))
        for (variable, _), value in zip(self._state_a, reduced[n_grads:]):
            self._store[variable] = value
        for (variable, _), value in zip(self._state_b, results_b):
            self._store[variable] = value
        return [self._whole(v, kind) for v, kind in zip(results_a[:n_user], self._kinds)]

    def _whole(self, value, kind):
        """A step output as the whole batch's (as one process on the whole batch returns it)."""
        if isinstance(kind, Split):
            return distributed.gather_split(value, kind.axis, kind.inner, self._batch)
        return _reduce([value], [kind])[0]


def _reduce(values, kinds):
    """Each value made whole by its kind: partial sums summed and partial means averaged
    over the ranks (one collective per kind and dtype), whole values as they are."""
    out = list(values)
    for kind, mean in ((SUM, False), (MEAN, True)):
        where = [i for i, k in enumerate(kinds) if k == kind]
        if where:
            for i, value in zip(where, distributed.total([values[i] for i in where], mean)):
                out[i] = value
    assert all(k in (SUM, MEAN, WHOLE) for k in kinds), kinds
    return [np.asarray(v) for v in out]


def _batch(model, placeholder_names, ranks):
    """The whole batch: the placeholders' first dimension (the split part holds B / W)."""
    for value in model.graph.input:
        if value.name in placeholder_names:
            return value.type.tensor_type.shape.dim[0].dim_value * ranks
    return ranks
