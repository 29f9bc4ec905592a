"""The memory a compiled job's step needs: its live intermediates over the execution order.

onnxruntime allocates a node's outputs just before it runs the node and frees a value
right after its last reader ran; view ops (`ALIAS_OPS`) hand out their input's buffer. So
at each node the step holds every value made earlier and read later, plus the node's new
outputs, and the largest such sum is the step's planned peak. `plan(graph)` walks a graph
in an execution order and reports that peak, what is live at it, and how much of it the
forward keeps only for the backward.

The plan counts tensors only. Graph inputs (variables, optimizer state, feeds) are held
between steps and graph outputs (the next state, the loss) are written into buffers bound
before the step (IOBinding, CUDA graphs: runtime/cuda_graph.py): both are reported apart
from the intermediates' peak, and a step's device memory is their sum. Not counted:
cuDNN/cuBLAS workspaces and other scratch memory a kernel asks for while it runs, the
arena's rounding and fragmentation, and onnxruntime's in-place reuse of a dying input's
buffer (which only lowers a transient). It is the same on every execution provider, so a bound on it can be
checked without a GPU (tests/test_memory_plan.py) and compared with a GPU's measured peak
(bench/memory_plan.py, bench/bench_gpu.py).

Orders (`execution_order`):
- "model": the graph's own node order, which a CUDA train session runs (after onnxruntime's
  optimizer, runtime/graph_order.py).
- "onnxruntime-default": onnxruntime's default order (a reverse depth-first walk from the
  nodes nobody reads, inputs visited by node index: `Graph::ReverseDFSFrom`), which the
  other sessions run.
`session_order(device, is_train)` names the one a session runs. What it runs is the graph
as onnxruntime's optimizer rewrote it: runtime/executed_plan.py gives that graph in the
order a session ran it, for `plan`.
"""
import collections
import dataclasses
import math


# ops whose output is a view of input 0 (onnxruntime's kernels alias it: no new buffer)
ALIAS_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
ORDERS = ("model", "onnxruntime-default")


def session_order(device, is_train=True):
    """The order (one of ORDERS) an onnxjob session on `device` runs its nodes in
    (runtime/backend.py's optimized_session)."""
    return "model" if device == "cuda" and is_train else "onnxruntime-default"


def value_bytes(value):
    """Bytes of a tensor value with a static shape and known element type, else None."""
    if value is None or value.shape is None or value.type is None:
        return None
    dtype = getattr(value.type, "dtype", None)
    if dtype is None or any(not isinstance(d, int) for d in value.shape):
        return None
    return math.ceil(math.prod(value.shape) * dtype.itemsize)


def execution_order(graph, order="model"):
    """The nodes of `graph` (an onnx_ir Graph) in the order `order` (see ORDERS) runs them."""
    nodes = list(graph)
    if order == "model":
        return nodes
    if order != "onnxruntime-default":
        raise ValueError(f"unknown order {order!r}: one of {ORDERS}")
    index = {id(n): i for i, n in enumerate(nodes)}

    def producers(node):
        found = {id(v.producer()): v.producer() for v in node.inputs
                 if v is not None and v.producer() is not None and id(v.producer()) in index}
        return sorted(found.values(), key=lambda n: index[id(n)])

    leaves = [n for n in nodes if not any(v.uses() for v in n.outputs)]
    stack = [(n, False) for n in leaves]
    visited, result = set(), []
    while stack:
        node, leaving = stack.pop()
        if leaving:
            result.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        stack.extend((p, False) for p in producers(node) if id(p) not in visited)
    return result


@dataclasses.dataclass
class LiveValue:
    """A buffer live at the peak: the value that made it, its producer, its bytes."""
    value: object
    producer: object
    nbytes: int
    saved_for_backward: bool

    @property
    def kind(self):
        """(producer op type, element type name): how the breakdown groups buffers."""
        dtype = self.value.type.dtype.name if self.value.type is not None else "?"
        return self.producer.op_type, dtype


@dataclasses.dataclass
class MemoryPlan:
    """What `plan` found: bytes are int, positions index `order`."""
    order: list
    live_bytes: list        # at each node: intermediates live while it runs (its outputs too)
    peak_bytes: int         # the largest of live_bytes
    peak_index: int
    at_peak: list           # [LiveValue] live while the peak node runs
    held_bytes: int         # graph inputs and initializers (kept between steps)
    output_bytes: int       # graph outputs (the next state, the results)
    saved_bytes: int        # forward values the backward reads (train graphs; 0 otherwise)
    unsized: list           # values whose size is unknown (counted as 0)
    buffer_of: dict = dataclasses.field(repr=False)    # id(value) -> its buffer
    last_read: dict = dataclasses.field(repr=False)    # buffer -> last reader's position
    # intermediate buffer -> (position it is made at, last reader's position, bytes), in
    # the order they are made (graph/arena_model.py replays them through an arena)
    lifetimes: dict = dataclasses.field(repr=False, default_factory=dict)

    def last_read_position(self, value):
        """Position in `order` of the last node reading `value`'s buffer (through views
        too); None for held values (graph inputs, initializers, views of them)."""
        buf = self.buffer_of.get(id(value))
        return None if buf is None else self.last_read[buf]

    @property
    def step_bytes(self):
        """What the step holds at its peak: inputs, outputs and intermediates."""
        return self.held_bytes + self.output_bytes + self.peak_bytes

    @property
    def peak_node(self):
        return self.order[self.peak_index]

    def breakdown(self, top=None):
        """[((op type, dtype), count, bytes)] of the buffers live at the peak, largest
        first."""
        count, size = collections.Counter(), collections.Counter()
        for live in self.at_peak:
            count[live.kind] += 1
            size[live.kind] += live.nbytes
        return [(kind, count[kind], nbytes) for kind, nbytes in size.most_common(top)]

    def at_peak_saved_bytes(self):
        """Bytes live at the peak that the forward made for the backward."""
        return sum(v.nbytes for v in self.at_peak if v.saved_for_backward)


def forward_nodes(graph, outputs):
    """ids of the nodes `outputs` (graph values, e.g. a train job's loss) depend on: the
    forward pass of a train graph, whose other nodes are the backward and the update."""
    seen, stack = set(), [v.producer() for v in outputs if v.producer() is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(v.producer() for v in node.inputs
                     if v is not None and v.producer() is not None)
    return seen


def plan_of(compiled, device, in_place=()):
    """The MemoryPlan of a compiled job (graph/compiler.py's CompiledGraph) as a `device`
    session runs it, `in_place` naming the variables its steps write in place."""
    return plan(compiled.model.graph, session_order(device, compiled.is_train),
                in_place_outputs=[compiled.state_outputs[v] for v in in_place])


def plan(graph, order="model", forward_outputs=(), in_place_outputs=()):
    """The MemoryPlan of one run of `graph` (an onnx_ir Graph with static shapes) in
    `order`. `forward_outputs`: the graph values a train step returns (its loss), whose
    ancestors are its forward pass; values they make and other nodes read count as saved
    for the backward. `in_place_outputs`: names of outputs written over their inputs
    (graph/in_place.py), which take no memory of their own."""
    nodes = execution_order(graph, order)
    position = {id(n): i for i, n in enumerate(nodes)}
    forward = forward_nodes(graph, forward_outputs) if forward_outputs else set()
    held = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    outputs = {id(v) for v in graph.outputs}

    # a buffer is the value that allocated it; an alias points to its source's buffer
    buffer_of, size, unsized = {}, {}, []
    last_read = {}          # buffer -> position of the last node reading it (or a view of it)
    saved = set()           # buffers made by the forward and read by the backward
    forward_made = set()
    for i, node in enumerate(nodes):
        for v in node.inputs:
            if v is None or id(v) not in buffer_of:
                continue
            buf = buffer_of[id(v)]
            last_read[buf] = i
            if buf in forward_made and id(node) not in forward:
                saved.add(buf)
        for k, v in enumerate(node.outputs):
            source = node.inputs[0] if node.inputs else None
            if node.op_type in ALIAS_OPS and k == 0 and source is not None:
                if id(source) in held:
                    continue        # a view of a variable or a feed: held memory
                if id(source) in buffer_of:
                    buffer_of[id(v)] = buffer_of[id(source)]
                    continue
            nbytes = value_bytes(v)
            if nbytes is None:
                unsized.append(v)
                nbytes = 0
            buffer_of[id(v)] = id(v)
            size[id(v)] = (v, node, nbytes)
            last_read[id(v)] = i        # freed at once when nobody reads it
            if id(node) in forward:
                forward_made.add(id(v))
    # graph outputs (and intermediates that are views of them) are bound buffers
    bound = {buffer_of[v] for v in outputs if v in buffer_of}
    allocated_at = {buf: position[id(node)] for buf, (_, node, _) in size.items()
                    if buf not in bound}
    freed_after = collections.defaultdict(list)
    for buf, at in last_read.items():
        freed_after[at].append(buf)
    made_at = collections.defaultdict(list)
    for buf, at in allocated_at.items():
        made_at[at].append(buf)

    live, live_set, timeline = 0, set(), []
    peak, peak_index, peak_set = -1, 0, set()
    for i in range(len(nodes)):
        for buf in made_at[i]:
            live += size[buf][2]
            live_set.add(buf)
        timeline.append(live)
        if live > peak:
            peak, peak_index, peak_set = live, i, set(live_set)
        for buf in freed_after[i]:
            if buf in live_set:
                live -= size[buf][2]
                live_set.discard(buf)
    at_peak = sorted((LiveValue(size[b][0], size[b][1], size[b][2], b in saved)
                      for b in peak_set), key=lambda lv: -lv.nbytes)
    held_bytes = sum(value_bytes(v) or 0 for v in {id(v): v for v in list(graph.inputs) + list(
        graph.initializers.values())}.values())
    in_place_names = set(in_place_outputs)
    in_place = {buffer_of[id(v)] for v in graph.outputs
                if v.name in in_place_names and id(v) in buffer_of}
    output_bytes = sum(size[b][2] for b in bound - in_place)
    lifetimes = {buf: (at, last_read[buf], size[buf][2]) for buf, at in allocated_at.items()}
    return MemoryPlan(nodes, timeline, max(peak, 0), peak_index, at_peak, held_bytes,
                      output_bytes, sum(size[b][2] for b in saved - bound), unsized, buffer_of,
                      last_read, lifetimes)
