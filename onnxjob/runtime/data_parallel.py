"""One data-parallel train step: the train graph, traced at the whole batch, cut at its
gradients into two parts. Part A (forward and backward) is split into this rank's share
(graph/split_batch.py) and runs as stages where it holds collectives
(runtime/staged.py); its gradients, partial sums over the ranks' rows, are summed across
the ranks (runtime/distributed.py) in buckets started as soon as the stage that makes them
has run, so that they travel while later stages compute (as DDP's buckets;
function_config.all_reduce_group_min_mbyte sizes them, all_reduce_fp16 sends float32
gradients as float16); part B, the optimizer's update, runs on the sums.

On the CPU the values the collectives read are NumPy arrays; on CUDA they stay on the GPU
from part A's outputs to part B's inputs, torch tensors over onnxruntime's buffers
(runtime/value_paths.py)."""
import onnx
import onnx.utils

from onnxjob.graph.split_batch import MEAN, SUM, WHOLE, Split, split_batch
from onnxjob.runtime import backend, distributed, value_paths
from onnxjob.runtime.micro_batches import call_state, micro_batches, pack_outputs
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


def state_by_part(model, compiled):
    """([(variable, output)] of the state part A (forward + backward) updates, e.g. batch
    norm's moving statistics; those the update, part B, makes from the gradients)."""
    updated = _ancestors_reach(model.graph, set(compiled.gradient_outputs.values()),
                               set(compiled.state_outputs.values()))
    items = list(compiled.state_outputs.items())
    return [(v, o) for v, o in items if o not in updated], [(v, o) for v, o in items
                                                            if o in updated]


def part_feeds(names, feeds, store, variable_of, extra=None, stored=backend.host_array):
    """{input name: value} of a part's inputs `names`: `extra`'s, a variable's
    (`stored(store[variable_of[name]])`) or the feed's."""
    out = {}
    for name in names:
        if extra is not None and name in extra:
            out[name] = extra[name]
        elif name in variable_of:
            out[name] = stored(store[variable_of[name]])
        else:
            out[name] = feeds[name]
    return out


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
    at collectives); the gradients summed over the ranks; session B, the optimizer's
    update. Variables stay in the session's store as on one device: NumPy arrays on the
    CPU, OrtValues on the rank's GPU."""

    def __init__(self, model_bytes, compiled, store, create_session, job_name, config,
                 device="cpu", next_source_feeds=None):
        model = onnx.load_from_string(model_bytes)
        self._store = store
        self._grads = list(compiled.gradient_outputs.values())
        self._user = list(compiled.output_names) + [w[0] for w in compiled.watch_outputs]
        self._returned = len(compiled.output_names)
        self._state_a, self._state_b = state_by_part(model, compiled)
        graph_inputs = [i.name for i in model.graph.input]
        part_a = _extract(model, graph_inputs, self._user + self._grads +
                          [o for _, o in self._state_a])
        rank, ranks = distributed.world()
        kinds = split_batch(part_a, compiled.placeholder_names, rank, ranks, job_name)
        self._kinds = [kinds[o] for o in self._user]
        # the gradients, and the state the forward pass updates (batch norm's moving
        # statistics), by kind: reduced so that every rank holds the same variables
        self._reduced_kinds = {o: kinds[o] for o in self._grads + [o for _, o in self._state_a]}
        for name, kind in self._reduced_kinds.items():
            if isinstance(kind, Split):     # (a variable has no batch axis)
                raise RuntimeError(f"job {job_name!r}: {name!r} comes out split over the "
                                   "ranks' rows; a variable's update must not be")
        self._batch = _batch(part_a, compiled.placeholder_names, ranks)
        self._bucket_bytes = float(config.get("all_reduce_group_min_mbyte", 16)) * 2 ** 20
        self._half = bool(config.get("all_reduce_fp16", False))
        self._path = value_paths.for_device(device, backend.cuda_device_id())
        # gradient accumulation (runtime/micro_batches.py): part A runs once per micro-batch
        self._steps = compiled.accumulation_steps
        self._placeholders = set(compiled.placeholder_names)
        self._next_source_feeds = next_source_feeds
        self._moving = compiled.moving_statistics
        self._a = StagedSession(part_a, create_session, self._path)
        self._b = create_session(_extract(model, graph_inputs + self._grads,
                                          [o for _, o in self._state_b]).SerializeToString())
        self._variable_of = {i: v for v, i in compiled.variable_inputs.items()}
        order = self._a.output_names
        assert order == self._user + self._grads + [o for _, o in self._state_a], order
        self._inputs_a = self._a.input_names
        self._inputs_b = [i.name for i in self._b.get_inputs()]
        self._outputs_b = [o.name for o in self._b.get_outputs()]

    def _feeds(self, names, feeds, extra=None, stored=backend.host_array):
        return part_feeds(names, feeds, self._store, self._variable_of, extra, stored)

    def _reducer(self):
        return _BucketedReducer(self._reduced_kinds, self._bucket_bytes, self._half,
                                self._path.total_async)

    def run(self, feeds):
        """One step on this rank's rows `feeds` (with gradient accumulation, each
        micro-batch's share of this rank in turn, concatenated:
        distributed.local_rows): the user outputs as one process on the whole batch
        returns them."""
        resident = self._path.device_resident
        # on CUDA part A's outputs are torch tensors over onnxruntime's buffers, reduced
        # there, and part B reads the sums by DLPack; on the CPU they are NumPy arrays
        stored = _as_stored if resident else backend.host_array
        keep = self._path.stored if resident else _as_stored
        parts = [feeds] if self._steps == 1 else micro_batches(
            feeds, self._steps, self._placeholders, self._next_source_feeds)
        outputs, grads, state = self._forward_backward(parts, stored, keep)
        inputs_b = self._feeds(self._inputs_b, self._whole_placeholders(feeds), grads,
                               stored=stored)
        if resident:
            inputs_b = {name: self._path.feed(value) for name, value in inputs_b.items()}
            new = self._path.run(self._b, self._outputs_b, inputs_b)
        else:
            new = self._b.run(None, inputs_b)
        # the state part A made (batch norm's moving statistics: the last micro-batch's,
        # the rest, e.g. the step counter, the first's) with part B's, in one step
        self._store.replace_all(
            [v for v, _ in self._state_a] + [v for v, _ in self._state_b],
            [keep(state[o]) for _, o in self._state_a] + [keep(value) for value in new])
        host = self._path.host if resident else _as_stored
        per_part = [[self._whole(host(v), kind) for v, kind in zip(values, self._kinds)]
                    for values in outputs]
        return per_part[0] if self._steps == 1 else pack_outputs(per_part, self._returned)

    def _whole_placeholders(self, feeds):
        """`feeds` with the placeholders part B reads (the looked-up rows' indices of an
        update of those rows: train/optimizer.py, made only without accumulation) as the
        whole batch's, gathered from every rank's rows: each rank updates every row any
        rank looked up, as one process on the whole batch."""
        wanted = [name for name in self._inputs_b if name in self._placeholders]
        if not wanted:
            return feeds
        whole = dict(feeds)
        for name in wanted:
            whole[name] = distributed.gather_split(feeds[name], 0, 1, self._batch)
        return whole

    def _forward_backward(self, parts, stored, keep):
        """Part A on each micro-batch's feeds of `parts` in turn (one without gradient
        accumulation), each with its collectives: (each part's user outputs, the
        gradients summed over the ranks and averaged over the parts, the reduced state of
        part A). Each micro-batch's moving statistics are stored for the next to read;
        the gradients are added on this rank and reduced once, in the last part's
        buckets (OneFlow's acc before the model's all-reduce)."""
        outputs, pending = [], {}
        grads, steps = set(self._grads), len(parts)
        for k, feeds in enumerate(parts):
            last, reducer = k == steps - 1, self._reducer()

            def add(values, last=last, reducer=reducer):
                for name, value in values.items():
                    if name in grads and steps > 1:
                        value = value if name not in pending else pending.pop(name) + value
                        if not last:
                            pending[name] = value
                            continue
                        value = value / steps
                    reducer.add({name: value})
            results = self._a.run(self._feeds(self._inputs_a, feeds, stored=stored), add)
            reduced = reducer.finish()
            outputs.append(results[:len(self._user)])
            now = [reduced[o] for _, o in self._state_a]
            if k == 0:
                first = now
            if not last:
                moving = [(v, o) for v, o in self._state_a if v in self._moving]
                self._store.replace_all([v for v, _ in moving],
                                        [keep(reduced[o]) for _, o in moving])
        state = dict(zip([o for _, o in self._state_a],
                         call_state(self._state_a, first, now, self._moving)))
        return outputs, {name: reduced[name] for name in self._grads}, state

    def _whole(self, value, kind):
        """A step output as the whole batch's (as one process on the whole batch returns it)."""
        if isinstance(kind, Split):
            return distributed.gather_split(value, kind.axis, kind.inner, self._batch)
        if kind in (SUM, MEAN):
            return distributed.total([value], mean=kind == MEAN)[0]
        return value


class _BucketedReducer:
    """Collects the values to reduce as part A's stages make them; a bucket of one kind
    starts its all-reduce once it holds `bucket_bytes` (every rank makes the same values
    in the same order, so the ranks' buckets match)."""

    def __init__(self, kinds, bucket_bytes, half, total_async=distributed.total_async):
        self._kinds, self._bucket_bytes, self._half = kinds, bucket_bytes, half
        self._total_async = total_async     # on NumPy arrays or on torch tensors
        self._pending = {SUM: [], MEAN: []}     # kind -> [(name, array)]
        self._started = []                      # [(names, wait)]
        self._out = {}

    def add(self, outputs):
        for name, value in outputs.items():
            kind = self._kinds.get(name)
            if kind is None:
                continue            # a user output
            if kind == WHOLE:
                self._out[name] = value
                continue
            self._pending[kind].append((name, value))
            if sum(v.nbytes for _, v in self._pending[kind]) >= self._bucket_bytes:
                self._start(kind)

    def _start(self, kind):
        names, values = zip(*self._pending[kind])
        self._pending[kind] = []
        self._started.append((names, self._total_async(
            list(values), mean=kind == MEAN, half=self._half)))

    def finish(self):
        """{name: reduced array (or tensor)} for every value added."""
        for kind in (SUM, MEAN):
            if self._pending[kind]:
                self._start(kind)
        for names, wait in self._started:
            self._out.update(zip(names, wait()))
        return self._out


def _as_stored(value):
    """A variable's stored value as a device step feeds it: a GPU OrtValue or a CPU array,
    as it is (runtime/value_paths.py DevicePath.feed)."""
    return value


def _batch(model, placeholder_names, ranks):
    """The whole batch: the placeholders' first dimension (the split part holds B / W)."""
    for value in model.graph.input:
        if value.name in placeholder_names:
            return value.type.tensor_type.shape.dim[0].dim_value * ranks
    return ranks
