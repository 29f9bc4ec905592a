"""A graph with collective nodes (graph/primitives/collectives.py) run as stages.

onnxruntime cannot run a collective, so the graph is cut at them: a node belongs to stage
k, where k is the number of collectives on its longest path from the graph's inputs. A
ResNet50 step with synchronized batch norm has one stage per batch-norm depth forward and
backward (about a hundred); a graph without collectives is one stage.

On the CPU a stage is two onnxruntime sessions. The first makes what the stage's
collectives read (their ancestors in the stage); then the collectives start, together
across the ranks (one per kind and dtype), and the second session runs the stage's other
nodes while they travel; then the stage waits for them and stage k + 1 reads their results.
In a backward pass the second session is the weight gradients (a third of its work: nothing
after them waits for them), which so hide gloo's latency and the ranks' uneven arrival; a
forward stage has little besides its statistics, so its collectives are waited for. The
same on CUDA over gloo; over NCCL a stage is one session, its collectives after it
(value_paths.DevicePath.overlap_collectives says why).

Each node runs in the first session that reads its outputs (not earlier), and a view op
(Reshape, Squeeze, ...) in every session that reads it: what a forward pass makes only for
its backward is made there, and fewer values are written out of one session for another.
"""
from onnx import helper

from onnxjob.graph.primitives.collectives import DOMAIN
from onnxjob.runtime.value_paths import HostPath

# the collective ops, in the order a stage starts them
_KINDS = ("AllGather", "AllReduceMean", "AllReduceSum")


class _Run:
    """One onnxruntime session over some of a stage's nodes."""
    __slots__ = ("nodes", "session", "inputs", "outputs")

    def __init__(self, nodes):
        self.nodes, self.session, self.inputs, self.outputs = nodes, None, [], []


class _Stage:
    __slots__ = ("collectives", "before", "during", "ready")

    def __init__(self):
        self.collectives = []
        self.before = self.during = None    # _Runs: before the collectives, while they travel
        self.ready = []     # the graph outputs known once this stage and its collectives ran


def _collective_type(node, value_type):
    """The ValueInfoProto of a collective's output."""
    tensor = value_type.type.tensor_type
    dims = [d.dim_value for d in tensor.shape.dim]
    if node.op_type == "AllGather":
        ranks = next(a.i for a in node.attribute if a.name == "ranks")
        dims = [ranks] + dims
    return helper.make_tensor_value_info(node.output[0], tensor.elem_type, dims)


def _feeding(nodes, names):
    """The nodes of `nodes` (topologically sorted) that `names` are computed from, in order."""
    producer = {out: node for node in nodes for out in node.output if out}
    needed, todo = set(), list(names)
    while todo:
        node = producer.get(todo.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            todo.extend(name for name in node.input if name)
    return [node for node in nodes if id(node) in needed]


def _split_stages(nodes, overlap=True):
    """The stages of a graph of `nodes` (a list, topologically sorted), each with its
    collectives and its nodes in two runs, and {value: the stage that makes it} (a
    collective's result: the next stage). With `overlap`, a stage's nodes that its
    collectives do not wait for run while they travel (the second run); without, all run
    before them."""
    stage_of, stages, by_stage = {}, [_Stage()], [[]]      # by_stage[k]: stage k's nodes
    for node in nodes:
        k = max((stage_of.get(name, 0) for name in node.input if name), default=0)
        if node.domain == DOMAIN:
            stages[k].collectives.append(node)
            stage_of[node.output[0]] = k + 1
            if len(stages) == k + 1:
                stages.append(_Stage())
                by_stage.append([])
        else:
            by_stage[k].append(node)
            stage_of.update((out, k) for out in node.output if out)
    for stage, stage_nodes in zip(stages, by_stage):
        before = (_feeding(stage_nodes, [n.input[0] for n in stage.collectives])
                  if overlap else stage_nodes)
        taken = {id(node) for node in before}
        stage.before = _Run(before)
        stage.during = _Run([node for node in stage_nodes if id(node) not in taken])
    return stages, stage_of


# ops whose output onnxruntime makes without a copy, from their first input
_VIEWS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def _sink(runs, nodes, kept):
    """Move each node to the first run that reads its outputs where its own run does not,
    and copy a view op (_VIEWS) into every run that reads its output; `kept`: the values
    that must come out of the run that makes them (graph outputs, collectives' inputs).

    A value made in one run and read in another is a session output there, which
    onnxruntime must write out: a Reshape then copies, a Transpose no longer fuses into the
    MatMul after it, an Add cannot write over an input. A forward pass makes much that
    only its backward reads (weights and activations rearranged for the gradients); made
    where it is read, those values stay inside one session (ResNet50 over 2 ranks at batch
    8: 2-6% less time in the stages' sessions, a rank's peak memory 1.78 GB, was 2.27)."""
    run_of = {id(node): i for i, run in enumerate(runs) for node in run.nodes}
    readers = {}        # value -> the runs that read it, as placed so far
    placed = {}         # id(node) -> the runs it is in
    for node in reversed(nodes):        # (the readers of a node come after it)
        if node.domain == DOMAIN:
            continue            # (its input is kept: made where it is)
        reading = set().union(*(readers.get(out, ()) for out in node.output if out))
        if not reading or any(out in kept for out in node.output):
            targets = {run_of[id(node)]}
        elif node.op_type in _VIEWS:
            targets = reading
        else:
            targets = {min(reading)}
        placed[id(node)] = targets
        for name in node.input:
            if name:
                readers.setdefault(name, set()).update(targets)
    for run in runs:
        run.nodes = []
    for node in nodes:
        for i in sorted(placed.get(id(node), ())):
            runs[i].nodes.append(node)


class StagedSession:
    """Runs `model` (an onnx ModelProto) as its stages; `create_session(model_bytes)` makes
    each stage's onnxruntime sessions. `path` (runtime/value_paths.py) says how values
    reach the collectives: NumPy arrays (HostPath) or torch tensors over onnxruntime's
    device buffers (DevicePath). `overlap`: the stage's other nodes run while its
    collectives travel (default: the path's choice); `sink`: nodes are moved to the
    session that reads their outputs (bench/bench_stages.py compares the four)."""

    def __init__(self, model, create_session, path=HostPath, overlap=None, sink=True):
        self._path = path
        overlap = path.overlap_collectives if overlap is None else overlap
        graph = model.graph
        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        types = {v.name: v for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
        initializers = {t.name: t for t in graph.initializer}
        # one list of the nodes for every step below: nodes are told apart by id(), and
        # protobuf makes a new Python object for a node each time it is read from the graph
        # once the last one is gone (its id may then be another node's)
        nodes = list(graph.node)
        stages, stage_of = _split_stages(nodes, overlap)
        runs = [run for stage in stages for run in (stage.before, stage.during)]
        if sink:
            _sink(runs, nodes, set(self.output_names) |
                  {node.input[0] for stage in stages for node in stage.collectives})
        made_in = [{out for node in run.nodes for out in node.output if out} for run in runs]
        # values read outside the session that makes them
        crossing = set(self.output_names)
        for stage in stages:
            for node in stage.collectives:
                crossing.add(node.input[0])
                types[node.output[0]] = _collective_type(node, types[node.input[0]])
        for made, run in zip(made_in, runs):
            crossing.update(name for node in run.nodes for name in node.input
                            if name and name not in made)
        opsets = [o for o in model.opset_import if o.domain != DOMAIN]
        for i, (made, run) in enumerate(zip(made_in, runs)):
            read = {name for node in run.nodes for name in node.input if name}
            run.inputs = sorted(read - made - initializers.keys())
            run.outputs = sorted(made & crossing)
            if not run.nodes:
                continue
            part = helper.make_graph(
                run.nodes, f"{graph.name}_stage{i // 2}_{'ab'[i % 2]}",
                [types[n] for n in run.inputs], [types[n] for n in run.outputs],
                [initializers[n] for n in sorted(read & initializers.keys())])
            run.session = create_session(helper.make_model(
                part, opset_imports=opsets, ir_version=model.ir_version).SerializeToString())
        for name in self.output_names:     # (an output no node makes is a feed: stage 0)
            stages[min(stage_of.get(name, 0), len(stages) - 1)].ready.append(name)
        self._stages = stages

    @property
    def stage_count(self):
        return len(self._stages)

    def run(self, feeds, on_outputs=None):
        """The graph's outputs (in order) for `feeds` {input name: value}, as the path
        exports them (arrays or tensors). After each stage, `on_outputs({name: value})`
        gets the graph outputs that stage made (so that their all-reduce overlaps the
        stages after it: runtime/data_parallel.py)."""
        path = self._path
        # between stages values stay onnxruntime's (OrtValues): no copy of the activations
        # the backward stages read; only the collectives' inputs are exported
        values = {name: path.feed(value) for name, value in feeds.items()}
        outputs = {}
        for stage in self._stages:
            self._run(stage.before, values)
            waits = []
            for kind in _KINDS:
                nodes = [n for n in stage.collectives if n.op_type == kind]
                if nodes:
                    waits.append((nodes, path.start_collective[kind](
                        [path.export(values[n.input[0]]) for n in nodes])))
            self._run(stage.during, values)
            for nodes, wait in waits:
                values.update((n.output[0], path.ort_value(r)) for n, r in zip(nodes, wait()))
            made = {n: path.export(values[n]) for n in stage.ready}
            outputs.update(made)
            if made and on_outputs is not None:
                on_outputs(made)
        return [outputs[name] for name in self.output_names]

    def _run(self, run, values):
        if run.session is not None:
            results = self._path.run(run.session, run.outputs,
                                     {n: values[n] for n in run.inputs})
            values.update(zip(run.outputs, results))
