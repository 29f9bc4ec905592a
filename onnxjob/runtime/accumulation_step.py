"""One train step with gradient accumulation over micro-batches, as OneFlow runs it.

`function_config.train.num_gradient_accumulation_steps(n)`: OneFlow's
GradientAccumulationRewritePass (v0.5.0) unpacks each placeholder into n micro-batches
along its first axis, repeats each data reader n times per call (each reads its own
`batch_size`), runs forward and backward once per micro-batch with the same variables,
adds the micro-batches' gradients (the `repeat` op's gradient, `acc`) and scales them by
one over the loss's element count times n (autograd.cpp's ScaleModelDiffByLossInstanceNum
over the loss's time shape), applies one update, and packs each returned blob: the
micro-batches' values concatenated along the first axis (0-d values stacked). Batch
normalization normalizes each micro-batch by its own statistics and updates its moving
statistics once per micro-batch, in turn (NormalizationExponentialAverageAutoTickPass).

Here the train graph, traced for one micro-batch, is cut at its gradients as a mirrored
step's (runtime/mirrored_step.py): part A (forward and backward) runs once per
micro-batch, part B (the update) once on sum_k(g_k * c_k) / sum_k(c_k), c_k the loss's
element count (the same for every micro-batch: OneFlow's scaling). Part A's moving
statistics are stored after each micro-batch, for the next to read; its other state (the
train step's counter) is the first micro-batch's, as the step is one step.
"""
import numpy as np

from onnxjob.runtime.mirrored_step import MirroredStep, add_weighted


class AccumulationStep(MirroredStep):
    """`run(feeds)` -> the user outputs and watched values of one call, packed over its
    micro-batches. `feeds` holds each placeholder's whole batch; `next_source_feeds()`
    gives the data readers' values of one micro-batch (runtime/pipeline.py), or None.
    (The graph's cut and its two sessions are the mirrored step's.)"""

    def __init__(self, model, compiled, store, create_session, device, next_source_feeds):
        super().__init__(model, compiled, store, create_session, device)
        self._steps = compiled.accumulation_steps
        self._placeholders = set(compiled.placeholder_names)
        self._next_source_feeds = next_source_feeds
        self._moving = compiled.moving_statistics

    def _micro_batches(self, feeds):
        """The feeds of each micro-batch: every placeholder's rows split in `steps` equal
        parts (the job's argument checks gave them the placeholder's shape), each with the
        data readers' next values."""
        steps = self._steps
        parts = [dict() for _ in range(steps)]
        for name, value in feeds.items():
            if name in self._placeholders:
                value = np.asarray(value)
                if value.ndim == 0 or len(value) % steps:
                    raise ValueError(
                        f"input {name!r} of shape {value.shape}: gradient accumulation over "
                        f"{steps} micro-batches splits the first axis, which must divide "
                        f"by {steps}")
                for part, rows in zip(parts, np.split(value, steps)):
                    part[name] = rows
            else:
                for part in parts:
                    part[name] = value
        if self._next_source_feeds is not None:
            for part in parts:
                part.update(self._next_source_feeds(part))
        return parts

    def run(self, feeds):
        outputs, sums, total = [], None, 0.0
        micro_batches = self._micro_batches(feeds)
        for micro in micro_batches:
            user, grads, count, state = self._forward_backward(micro)
            outputs.append(user)
            sums = add_weighted(sums, grads, count)
            total += count
            # the moving statistics now, for the next micro-batch to read; the rest (the
            # train step's counter) the first micro-batch's, after the update
            self._store_all(self._state_a, state, self._moving.__contains__)
            if len(outputs) == 1:
                first_grads, first_state = grads, state
        self._update(micro_batches[0], sums, total, first_grads)
        self._store_all(self._state_a, first_state, lambda v: v not in self._moving)
        return [pack(values) for values in zip(*outputs)]


def pack(values):
    """OneFlow's pack of one returned blob over the micro-batches: concatenated along the
    first axis, 0-d values stacked into a vector."""
    arrays = [np.asarray(v) for v in values]
    return np.stack(arrays) if arrays[0].ndim == 0 else np.concatenate(arrays)
