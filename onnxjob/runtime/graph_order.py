"""A session that runs a train graph in the graph's own node order, after onnxruntime's
optimizer has rewritten it (CUDA train sessions: runtime/backend.py).

onnxjob's passes place each node where the step's memory plan wants it (graph/memory_plan.py:
RecomputeCheapValues makes values again after the peak, the update comes after the backward).
onnxruntime's priority-based order keeps a graph's order (Kahn's algorithm, ties by node
index) only while its optimizer adds no node: a fused node takes the highest index, and
while one waits every node ready earlier runs first, so the update's passes over the
variables and the recomputed values ran in the forward (ResNet50's float32 step at batch 2:
554 MiB where the plan says 224, as run on the CPU EP and profiled; runtime/executed_plan.py).
Its default order (a depth-first walk back from the outputs) keeps fusions in place but
computes the gradients' float32 copies as soon as it can (ResNet50's mixed-precision step at
batch 2: 167 MiB where the graph's own order plans 121).

So a first session optimizes the graph and writes it out (`optimized_model_filepath`); its
nodes are put back in the graph's order (`reorder_like`: a node onnxruntime made goes where
the node it is named after was, else as soon as its inputs are made), and the session that
runs the step loads that file with the optimizer off and the priority-based order.
"""
import heapq
import os
import tempfile

import onnx
import onnxruntime as ort


def session_in_graph_order(model_bytes, opts, providers, disabled, make=None, keep=None):
    """A session on `providers` that runs `model_bytes` as onnxruntime's optimizer (with
    `opts` and the `disabled` transformers) rewrites it, in the order of `model_bytes`'
    nodes. `make(bytes, opts)` builds the final session (default: an InferenceSession
    on `providers`); the optimizing session is returned when the final one cannot be
    made (`fallback_reason` on it says why). `keep(bytes)` is given the reordered model
    once a final session runs it (the session cache stores it)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "optimized.onnx")
        final_path, profiling = opts.optimized_model_filepath, opts.enable_profiling
        # (the optimizing session never runs: no profile of its own)
        opts.optimized_model_filepath, opts.enable_profiling = path, False
        optimizing = ort.InferenceSession(model_bytes, opts, providers=providers,
                                          disabled_optimizers=disabled)
        optimized = onnx.load(path)
    opts.enable_profiling = profiling
    original = onnx.ModelProto.FromString(model_bytes)
    reorder_like(optimized.graph, [n.name for n in original.graph.node])
    opts.optimized_model_filepath = final_path
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    reordered = optimized.SerializeToString()
    try:
        if make is not None:
            final = make(reordered, opts)
        else:
            final = ort.InferenceSession(reordered, opts, providers=providers)
    except Exception as e:      # onnxruntime's own error types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        optimizing.fallback_reason = reason[:300]
        return optimizing
    if keep is not None:
        keep(reordered)
    return final


def reorder_like(graph, names):
    """Reorder `graph`'s nodes (a GraphProto, in place) to follow the node names `names`:
    a node keeps the (first) position of its own name, or of the longest prefix of its name (cut at
    a '/') that is in `names` (onnxruntime names a fused node after the node it replaces),
    else goes just before its first reader, else (an output) as soon as its inputs are
    made. The result is a topological order (Kahn's algorithm, ties by that position)."""
    position = {}
    for i, name in enumerate(names):
        if name:
            position.setdefault(name, i)
    nodes = list(graph.node)
    producer = {out: k for k, node in enumerate(nodes) for out in node.output if out}
    made_from = [{producer[v] for v in _read_names(node) if v in producer} - {k}
                 for k, node in enumerate(nodes)]
    waiting = [len(sources) for sources in made_from]
    readers = [[] for _ in nodes]
    for k, sources in enumerate(made_from):
        for p in sources:
            readers[p].append(k)
    topological = _kahn(nodes, made_from, readers, waiting, lambda k: k)
    if topological is None:
        return      # a cycle (never in a valid graph): leave the file's own order
    key = [_named_position(node.name, position) for node in nodes]
    for k in reversed(topological):     # unnamed: just before its first reader
        if key[k] is None and readers[k]:
            key[k] = min((key[r] for r in readers[k] if key[r] is not None), default=None)
    for k in topological:               # else as soon as its inputs are made
        if key[k] is None:
            key[k] = max((key[p] for p in made_from[k]), default=-1)
    order = _kahn(nodes, made_from, readers, waiting, lambda k: (key[k], k))
    reordered = [nodes[k] for k in order]
    del graph.node[:]       # (the removed messages stay valid; extend copies them back)
    graph.node.extend(reordered)


def _kahn(nodes, made_from, readers, waiting, priority):
    """Node indices in a topological order, the ready node of least `priority(k)` first;
    None if the nodes have a cycle."""
    waiting = list(waiting)
    ready = [(priority(k), k) for k in range(len(nodes)) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for r in readers[k]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, (priority(r), r))
    return order if len(order) == len(nodes) else None


def _named_position(name, position):
    if name in position:
        return position[name]
    cut = name.rfind("/")
    while cut > 0:
        if name[:cut] in position:
            return position[name[:cut]]
        cut = name.rfind("/", 0, cut)
    return None


# ops with subgraphs, whose nodes may read values of the outer graph
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})


def _read_names(node):
    """The value names `node` reads: its inputs and what its subgraphs read from outside."""
    names = [v for v in node.input if v]
    if node.op_type not in _CONTROL_FLOW:
        return names
    for attribute in node.attribute:
        graphs = list(attribute.graphs) + ([attribute.g] if attribute.HasField("g") else [])
        for sub in graphs:
            made = {out for n in sub.node for out in n.output} | {
                v.name for v in sub.input} | {t.name for t in sub.initializer}
            names += [v for n in sub.node for v in _read_names(n) if v not in made]
    return names
