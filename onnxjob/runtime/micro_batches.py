"""Gradient accumulation's micro-batches, as OneFlow runs them.

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

Here the train graph is traced for one micro-batch and cut at its gradients; part A
(forward and backward) runs once per micro-batch, part B (the update) once per call, on
one device or a mirrored view's devices (runtime/mirrored_step.py: the gradients weighted
by the loss's element count) or over data-parallel ranks (runtime/data_parallel.py: each
rank's share of each micro-batch, the gradients added on the rank and all-reduced once).
Part A's moving statistics are stored after each micro-batch, for the next to read; its
other state (the train step's counter) is the first micro-batch's, as the call is one
step. This module splits one call's feeds into the micro-batches and packs the returned
values again; watched values (flow.watch, watch_diff) are not packed: OneFlow's watch op
runs once per micro-batch, and so does its handler (`PerMicroBatch`)."""
import numpy as np


def micro_batches(feeds, steps, placeholders, next_source_feeds=None):
    """The feeds of each of `steps` micro-batches: every placeholder's (a name in
    `placeholders`) rows split in `steps` equal parts (the job's argument checks gave them
    the placeholder's shape), the other feeds repeated, and each with the data readers'
    next values (`next_source_feeds(part)`, runtime/pipeline.py) where there are readers."""
    parts = [{} for _ in range(steps)]
    for name, value in feeds.items():
        if name in placeholders:
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
    if next_source_feeds is not None:
        for part in parts:
            part.update(next_source_feeds(part))
    return parts


def call_state(items, first, last, per_micro_batch):
    """Part A's state after one call ((variable, output) `items`): the last micro-batch's
    values of the variables in `per_micro_batch` (batch norm's moving statistics, updated
    per micro-batch in turn), the first's of the others (the train step's counter: the
    call is one step)."""
    return [late if variable in per_micro_batch else early
            for (variable, _), early, late in zip(items, first, last)]


def pack(values):
    """OneFlow's pack of one returned blob over the micro-batches: concatenated along the
    first axis, 0-d values stacked into a vector."""
    arrays = [np.asarray(v) for v in values]
    return np.stack(arrays) if arrays[0].ndim == 0 else np.concatenate(arrays)


class PerMicroBatch(list):
    """A watched value of each micro-batch, in turn: the job calls the watch's handler
    once per micro-batch (frontend/job_function.py)."""


def pack_outputs(outputs, returned):
    """One call's outputs from each micro-batch's `outputs` (lists of the returned values,
    then the watched ones): the first `returned` packed, the watched ones PerMicroBatch."""
    columns = list(zip(*outputs))
    return ([pack(values) for values in columns[:returned]] +
            [PerMicroBatch(values) for values in columns[returned:]])
