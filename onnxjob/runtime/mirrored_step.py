"""One train step of a mirrored-view job over several devices in one process.

OneFlow's mirrored view (`default_logical_view(flow.scope.mirrored_view())`, tp.ListNumpy
placeholders, a list element per device) runs the job on each device with that device's
rows; the model's gradients are summed over the devices and scaled by one over the loss's
element count summed over the devices (spec §5.6), then one update is applied. Here the
train graph is cut at its gradients (as for data-parallel ranks, runtime/data_parallel.py):
part A (forward and backward) runs once per device list element, each with its own
batch statistics, dropout draws and dynamic row count; part B, the optimizer's update,
runs once on the combined gradients.

Part A's gradients come divided by their own device's loss element count c_d (the graph
outputs it too); the combined gradient is sum_d(g_d * c_d) / sum_d(c_d). State that the
forward pass updates (batch norm's moving statistics) is taken from the first device, the
replica OneFlow's checkpoints save.

With gradient accumulation (runtime/micro_batches.py) each device list element is split
into the micro-batches, part A runs once per micro-batch of each element, all weighted
as above, and each device's returned values are packed over its micro-batches; one
device's accumulating step (a consistent-view job) is the step of one element.

Across data-parallel ranks (runtime/distributed.py) each rank runs its own list elements:
given one element per rank (the list OneFlow's master process passes), rank r runs element
r; given one element, a rank runs it as its own device's (each rank feeding its own data,
as with DDP). The weighted sums and counts are added over the ranks, the first element's
state comes from rank 0, and with one element per rank every rank returns all of them.
"""
import numpy as np

from onnxjob.runtime import backend, device_accumulation, distributed
from onnxjob.runtime.data_parallel import _extract, part_feeds, state_by_part
from onnxjob.runtime.micro_batches import call_state, micro_batches, pack_outputs


class MirroredStep:
    """`run_devices([feeds per device])` -> [user outputs and watched values per device]."""

    def __init__(self, model, compiled, store, create_session, device,
                 next_source_feeds=None):
        self._store, self._device = store, device
        # gradient accumulation: the micro-batches of each device list element, each with
        # the data readers' next values (`next_source_feeds`, runtime/pipeline.py)
        self._steps = compiled.accumulation_steps
        self._placeholders = set(compiled.placeholder_names)
        self._next_source_feeds = next_source_feeds
        self._moving = compiled.moving_statistics
        self._grads = list(compiled.gradient_outputs.values())
        self._count = compiled.loss_count_output
        self._user = list(compiled.output_names) + [w[0] for w in compiled.watch_outputs]
        self._returned = len(compiled.output_names)
        self._state_a, self._state_b = state_by_part(model, compiled)
        graph_inputs = [i.name for i in model.graph.input]
        self._outputs_a = (self._user + self._grads + [self._count] +
                           [o for _, o in self._state_a])
        self._a = create_session(_extract(model, graph_inputs,
                                          self._outputs_a).SerializeToString())
        self._b = create_session(_extract(model, graph_inputs + self._grads,
                                          [o for _, o in self._state_b]).SerializeToString())
        self._variable_of = {i: v for v, i in compiled.variable_inputs.items()}
        self._inputs_a = [i.name for i in self._a.get_inputs()]
        self._inputs_b = [i.name for i in self._b.get_inputs()]
        # one device's accumulation on the device (runtime/device_accumulation.py), made
        # at its first step
        self._make_device_runs = lambda: device_accumulation.DeviceRuns(
            self, device, create_session, [_output_type(model, g) for g in self._grads])
        self._device_runs = None

    def _feeds(self, names, feeds, extra=None, stored=backend.host_array):
        return part_feeds(names, feeds, self._store, self._variable_of, extra, stored)

    def _forward_backward(self, feeds):
        """Part A on one device's or micro-batch's `feeds`: (user outputs and watched
        values, gradients, the loss's element count, the state part A updates)."""
        results = self._a.run(self._outputs_a, self._feeds(self._inputs_a, feeds))
        n_user, n_grads = len(self._user), len(self._grads)
        return (results[:n_user], results[n_user:n_user + n_grads],
                float(np.asarray(results[n_user + n_grads])), results[n_user + n_grads + 1:])

    def _update(self, feeds, sums, total, like):
        """Part B on sum_d(g_d * c_d) / sum_d(c_d) (`sums` and `total`), in the dtypes of
        the gradients `like`; stores the state it makes."""
        grads = {name: (s / total).astype(g.dtype)
                 for name, s, g in zip(self._grads, sums, like)}
        self._store_all(self._state_b, self._b.run(None, self._feeds(self._inputs_b, feeds,
                                                                      grads)))

    def _store_all(self, items, values, which=None):
        """Store `values` as the variables of `items` ((variable, output) pairs), those
        that `which(variable)` accepts where it is given."""
        for (variable, _), value in zip(items, values):
            if which is None or which(variable):
                self._store[variable] = backend.from_host(value, self._device)

    def run_devices(self, device_feeds):
        rank, ranks = distributed.world() if distributed.enabled() else (0, 1)
        if ranks > 1 and len(device_feeds) == ranks:
            mine = [device_feeds[rank]]
        elif ranks > 1 and len(device_feeds) != 1:
            raise ValueError(
                f"a mirrored train step on {ranks} ranks takes a list of {ranks} elements (one "
                f"per rank) or of one (this rank's own), got {len(device_feeds)}")
        else:
            mine = device_feeds
        steps = self._steps
        parts = [[feeds] if steps == 1 else micro_batches(
            feeds, steps, self._placeholders, self._next_source_feeds) for feeds in mine]
        if steps > 1 and device_accumulation.applies(self._device, ranks, len(mine)):
            return [self._accumulate_on_device(parts[0])]
        outputs, sums, total = [[] for _ in mine], None, 0.0
        for k in range(steps):
            for device, device_parts in enumerate(parts):
                user, grads, count, state = self._forward_backward(device_parts[k])
                outputs[device].append(user)
                sums = add_weighted(sums, grads, count)
                total += count
                if device == 0 and k == 0:
                    first_grads, first_state = grads, state
                if device == 0 and steps > 1:
                    # the moving statistics now, for the next micro-batch to read
                    self._store_all(self._state_a, state, self._moving.__contains__)
                    last_state = state
        if steps > 1:
            first_state = call_state(self._state_a, first_state, last_state, self._moving)
        if ranks > 1:
            summed = distributed.total(sums + [np.array([total])])
            sums, total = summed[:-1], float(summed[-1][0])
            state = distributed.broadcast_from_rank0(dict(enumerate(first_state)))
            first_state = [state[i] for i in range(len(first_state))]
        self._update(parts[0][0], sums, total, first_grads)
        self._store_all(self._state_a, first_state)
        outputs = [values[0] if steps == 1 else pack_outputs(values, self._returned)
                   for values in outputs]
        if ranks > 1 and len(device_feeds) == ranks:
            outputs = [out for gathered in distributed.all_gather_objects(outputs)
                       for out in gathered]
        return outputs

    def _accumulate_on_device(self, parts):
        """One device's accumulating step over the micro-batches' feeds `parts`, its
        gradients and state kept on the device (runtime/device_accumulation.py): the
        user outputs and watched values, packed over the micro-batches."""
        if self._device_runs is None:
            self._device_runs = self._make_device_runs()
        runs, outputs, mean, total = self._device_runs, [], None, 0.0
        moving = [i for i, (v, _) in enumerate(self._state_a) if v in self._moving]
        for feeds in parts:
            user, grads, count, state = runs.forward_backward(feeds)
            outputs.append(user)
            mean = runs.running_mean(mean, grads, total, count)
            total += count
            # the moving statistics now, for the next micro-batch to read; the rest (the
            # train step's counter) the first micro-batch's, after the update
            for i in moving:
                self._store[self._state_a[i][0]] = runs.stored(state[i])
            if len(outputs) == 1:
                first_state = state
        new = runs.update(parts[0], mean)
        kept = call_state(self._state_a, first_state, state, self._moving)
        self._store.replace_all(
            [v for v, _ in self._state_a] + [v for v, _ in self._state_b],
            [runs.stored(value) for value in kept + new])
        return pack_outputs(outputs, self._returned)


def _output_type(model, name):
    """The element type of graph output `name` of `model` (an onnx ModelProto)."""
    return next(o.type.tensor_type.elem_type for o in model.graph.output if o.name == name)


def add_weighted(sums, grads, count):
    """`sums` (float64 arrays, or None for none yet) plus `grads` * `count`."""
    weighted = [np.asarray(g, np.float64) * count for g in grads]
    return weighted if sums is None else [s + w for s, w in zip(sums, weighted)]
