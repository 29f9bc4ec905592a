"""The host side of a job: values made before every run and the graph inputs they feed.

Jobs that make or read their own data (flow.data.decode_random, ofrecord_reader and its
decoders, the image ops, flow.random.CoinFlip) build a small graph of HostNodes while
they are traced. Each node computes one value per run from its input nodes' values: a
batch of raw records, decoded images, a resized batch, coin flips. Nodes that end in a
fixed-shape array feed a graph input (GraphBuilder.add_source, which keeps them in
`builder.sources`); the Blob of that input keeps its node (`blob.host_node`), so host
ops can read it too (CropMirrorNormalize reads CoinFlip's batch).

Before every run the job's HostPipeline evaluates each node once, in trace order (readers
keep their place in the files). By default a Prefetcher does this on a background thread
`depth` runs ahead, so onnxruntime does not wait on reading and decoding when the
pipeline keeps up; an error there (a truncated file, a missing feature) is raised at the
job call that needed the batch, with the original message and traceback.
"""
import queue
import threading

import numpy as np

from onnxjob import settings


class HostNode:
    """One value made on the host per run: `compute(*values of inputs)`."""

    __slots__ = ("name", "compute", "inputs")

    def __init__(self, name, compute, inputs=()):
        self.name = name
        self.compute = compute
        self.inputs = tuple(inputs)

    def __repr__(self):
        return f"HostNode({self.name})"


class FedValue(HostNode):
    """What the call being run feeds to placeholder `input_name`: its array, or for a
    tp.ListListNumpy placeholder its list of arrays (the host ops read job arguments
    through it: flow.tensor_list_to_tensor_buffer, per-image blobs of the detection ops)."""

    __slots__ = ("input_name",)

    def __init__(self, name, input_name):
        super().__init__(name, None)
        self.input_name = input_name


class HostPipeline:
    """The host nodes feeding one job's graph inputs."""

    def __init__(self, feeds=None):
        self.feeds = dict(feeds or {})  # graph input name -> HostNode
        # a pipeline reading the call's own arguments runs in the call, not ahead of it
        self.reads_feeds = any(isinstance(n, FedValue) for n in _all_nodes(self.feeds.values()))

    def made_from_feeds_only(self):
        """Whether every value is made from the call's arguments alone (no reader, whose
        stream a run would advance)."""
        return all(isinstance(n, FedValue) for n in _all_nodes(self.feeds.values())
                   if not n.inputs)

    def feed(self, input_name, node):
        self.feeds[input_name] = node

    def restricted_to(self, input_names):
        """The pipeline of the inputs in `input_names` (those the optimized graph reads)."""
        return HostPipeline({n: node for n, node in self.feeds.items() if n in input_names})

    def make_feeds(self, fed=None):
        """{graph input name: array} for one run: every node evaluated once, inputs first;
        `fed` holds the placeholders' values of the call (read by FedValue nodes). A tensor
        list (flow.tensor_buffer_to_tensor_list) is fed as its list of arrays."""
        values = {}

        def value_of(node):
            if node not in values:
                if isinstance(node, FedValue):
                    values[node] = fed[node.input_name]
                else:
                    values[node] = node.compute(*(value_of(i) for i in node.inputs))
            return values[node]

        return {name: _feed_value(value_of(node)) for name, node in self.feeds.items()}

    def __bool__(self):
        return bool(self.feeds)


def _all_nodes(roots):
    seen, stack = set(), list(roots)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.inputs)
    return seen


def _feed_value(value):
    if isinstance(value, list):
        return [np.asarray(a, order="C") for a in value]
    return np.asarray(value, order="C")


def prefetch_depth(config=None):
    """Runs made ahead: `function_config.prefetch(n)`, else $ONNXJOB_PREFETCH, else 2;
    0 makes every batch inline, in the calling thread."""
    value = config.get("prefetch") if config is not None else None
    if value is None:
        value = settings.get("PREFETCH")
    return value


class _Failure:
    def __init__(self, error):
        self.error = error


class Prefetcher:
    """Makes `make()`'s results `depth` ahead on one background thread, in order. After a
    failure every later `next()` raises it again (the stream cannot go on)."""

    def __init__(self, make, depth):
        self._make = make
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = None
        self._failure = None

    def next(self):
        if self._failure is not None:
            raise self._failure.error
        if self._thread is None:
            self._thread = threading.Thread(target=self._produce, name="onnxjob-data",
                                            daemon=True)
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, _Failure):
            self._failure = item
            raise item.error
        return item

    def _produce(self):
        while not self._stop.is_set():
            try:
                item = self._make()
            except BaseException as e:  # handed to the consumer, which raises it
                item = _Failure(e)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class PipelineRunner:
    """One job's feeds from its pipeline, prefetched or inline (see prefetch_depth). As
    with the prefetcher, after a failure every later call raises it again: readers are
    left mid-stream and cannot go on."""

    def __init__(self, pipeline, depth):
        self._pipeline = pipeline
        self._prefetcher = Prefetcher(pipeline.make_feeds, depth) if depth and \
            not pipeline.reads_feeds else None
        self._failure = None

    def next_feeds(self, fed=None):
        """The host-made feeds of one run; `fed`: the placeholders' values of the call."""
        if self._prefetcher is not None:
            return self._prefetcher.next()
        if self._failure is not None:
            raise self._failure
        try:
            return self._pipeline.make_feeds(fed)
        except BaseException as e:
            # a bad argument spoils only its own call; a reader's stream cannot go on
            if not self._pipeline.reads_feeds:
                self._failure = e
            raise

    def close(self):
        if self._prefetcher is not None:
            self._prefetcher.close()
