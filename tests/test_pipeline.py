"""The host pipeline: values a job makes before each run, prefetched on a thread."""
import threading
import time

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph.tracer import current_builder
from onnxjob.runtime.pipeline import HostNode


def counting_job(fail_at=None, delay=0.0, config=None):
    """A job fed by a host node that counts its runs (and fails at run `fail_at`)."""
    made = []

    def make():
        if delay:
            time.sleep(delay)
        if len(made) == fail_at:
            raise OSError(f"part-00000: record {len(made)} is truncated")
        made.append(threading.current_thread().name)
        return np.full((2,), len(made) - 1, np.float32)

    @flow.global_function(function_config=config)
    def job() -> tp.Numpy:
        builder = current_builder()
        return builder.add_source("counter", (2,), np.float32, HostNode("counter", make)) * 1.0

    return job, made


def test_batches_come_in_order_from_the_prefetch_thread():
    job, made = counting_job()
    assert [float(job()[0]) for _ in range(5)] == [0, 1, 2, 3, 4]
    assert set(made) == {"onnxjob-data"}
    # at most `prefetch` (2) batches queued ahead, plus the one waiting to be queued
    assert len(made) <= 5 + 2 + 1


def test_prefetch_zero_makes_batches_inline():
    config = flow.function_config()
    config.prefetch(0)
    job, made = counting_job(config=config)
    assert [float(job()[0]) for _ in range(3)] == [0, 1, 2]
    assert made == ["MainThread"] * 3


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_failing_batch_raises_at_the_call_that_needs_it_and_after(prefetch):
    config = flow.function_config()
    config.prefetch(prefetch)
    job, _ = counting_job(fail_at=2, config=config)
    assert float(job()[0]) == 0 and float(job()[0]) == 1
    for _ in range(2):  # the stream cannot go on: every later call says why, none hangs
        with pytest.raises(OSError, match="record 2 is truncated"):
            job()


def test_prefetching_makes_the_next_batches_while_the_caller_works():
    """Between two calls the thread makes the next batches (up to the prefetch depth of 2),
    so their making overlaps the caller's own work. (How much time that saves is measured
    in bench/bench_pipeline.py.)"""
    job, made = counting_job(delay=0.01)
    job()
    deadline = time.monotonic() + 10       # a bound for a stuck thread, not a speed check
    while len(made) < 1 + 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # the one consumed, 2 queued ahead, and at most one made and waiting to be queued
    assert 1 + 2 <= len(made) <= 1 + 2 + 1, made


def test_prefetch_zero_makes_nothing_between_calls():
    config = flow.function_config()
    config.prefetch(0)
    job, made = counting_job(delay=0.01, config=config)
    job()
    time.sleep(0.1)
    assert len(made) == 1


def test_host_nodes_see_each_others_values_once_per_run():
    """A node read by two others is computed once per run (readers keep their place)."""
    calls = []

    def base():
        calls.append(1)
        return np.arange(3, dtype=np.float32) + len(calls)

    @flow.global_function()
    def job() -> tp.Numpy:
        builder = current_builder()
        node = HostNode("base", base)
        a = builder.add_source("a", (3,), np.float32, HostNode("a", lambda v: v, [node]))
        b = builder.add_source("b", (3,), np.float32, HostNode("b", lambda v: 2 * v, [node]))
        return a + b

    np.testing.assert_array_equal(job(), 3 * (np.arange(3) + 1))
    np.testing.assert_array_equal(job(), 3 * (np.arange(3) + 2))


def test_inputs_only_host_nodes_read_are_not_fed_to_the_graph():
    """A host-made Blob read only by another host node (CoinFlip's batch read by
    CropMirrorNormalize) is no graph input: nothing is converted or fed for it."""
    from onnxjob.runtime.session import default_session

    @flow.global_function()
    def job() -> tp.Numpy:
        builder = current_builder()
        raw = builder.add_source("raw", (3,), np.float32,
                                 HostNode("raw", lambda: np.ones(3, np.float32)))
        doubled = HostNode("doubled", lambda v: v * 2, [raw.host_node])
        return builder.add_source("doubled", (3,), np.float32, doubled) + 0.0

    np.testing.assert_array_equal(job(), [2, 2, 2])
    graph = default_session().runtimes["job"].compiled.model.graph
    assert [v.name for v in graph.inputs] == ["doubled"]
