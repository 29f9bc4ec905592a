"""A graph with collective nodes (graph/primitives/collectives.py) run as stages.

onnxruntime cannot run a collective, so the graph is cut at them: a node belongs to stage
k, where k is the number of collectives on its longest path from the graph's inputs.
Stage k is one onnxruntime session; after it runs, the collectives whose inputs it made
are performed together across the ranks (one bucket per kind and dtype), and stage k + 1
reads their results. A ResNet50 step with synchronized batch norm has one stage per
batch-norm depth forward and backward (about a hundred); a graph without collectives is
one stage.
"""
from onnx import helper

from onnxjob.graph.primitives.collectives import DOMAIN
from onnxjob.runtime.value_paths import HostPath

# the collective ops, in the order a stage performs them
_KINDS = ("AllGather", "AllReduceMean", "AllReduceSum")


class _Stage:
    __slots__ = ("nodes", "collectives", "session", "inputs", "outputs", "ready")

    def __init__(self):
        self.nodes, self.collectives = [], []
        self.session, self.inputs, self.outputs = None, [], []
        self.ready = []     # the graph outputs known once this stage and its collectives ran


def _collective_type(node, value_type):
    """The ValueInfoProto of a collective's output."""
    tensor = value_type.type.tensor_type
    dims = [d.dim_value for d in tensor.shape.dim]
    if node.op_type == "AllGather":
        ranks = next(a.i for a in node.attribute if a.name == "ranks")
        dims = [ranks] + dims
    return helper.make_tensor_value_info(node.output[0], tensor.elem_type, dims)


class StagedSession:
    """Runs `model` (an onnx ModelProto) as its stages; `create_session(model_bytes)` makes
    each stage's onnxruntime session. `path` (runtime/value_paths.py) says how values
    reach the collectives: NumPy arrays (HostPath) or torch tensors over onnxruntime's
    device buffers (DevicePath)."""

    def __init__(self, model, create_session, path=HostPath):
        self._path = path
        graph = model.graph
        self.input_names = [i.name for i in graph.input]
        self.output_names = [o.name for o in graph.output]
        types = {v.name: v for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
        initializers = {t.name: t for t in graph.initializer}
        stage_of = {}                   # value name -> the stage that makes it
        crossing = set(self.output_names)   # values read outside the stage that makes them
        stages = [_Stage()]
        for node in graph.node:         # (topologically sorted)
            k = max((stage_of.get(name, 0) for name in node.input if name), default=0)
            if node.domain == DOMAIN:
                crossing.add(node.input[0])
                stages[k].collectives.append(node)
                types[node.output[0]] = _collective_type(node, types[node.input[0]])
                stage_of[node.output[0]] = k + 1
                if len(stages) == k + 1:
                    stages.append(_Stage())
            else:
                crossing.update(n for n in node.input if n and stage_of.get(n, k) != k)
                stages[k].nodes.append(node)
                stage_of.update((out, k) for out in node.output if out)
        opsets = [o for o in model.opset_import if o.domain != DOMAIN]
        for k, stage in enumerate(stages):
            made = {out for node in stage.nodes for out in node.output if out}
            read = {name for node in stage.nodes for name in node.input if name}
            stage.inputs = sorted(read - made - initializers.keys())
            stage.outputs = sorted(made & crossing)
            if not stage.nodes:
                continue
            part = helper.make_graph(
                stage.nodes, f"{graph.name}_stage{k}", [types[n] for n in stage.inputs],
                [types[n] for n in stage.outputs],
                [initializers[n] for n in sorted(read & initializers.keys())])
            stage.session = create_session(helper.make_model(
                part, opset_imports=opsets, ir_version=model.ir_version).SerializeToString())
        for name in self.output_names:     # (an output no node makes is a feed: stage 0)
            stages[min(stage_of.get(name, 0), len(stages) - 1)].ready.append(name)
        self._stages = stages

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
            if stage.session is not None:
                results = path.run(stage.session, stage.outputs,
                                   {n: values[n] for n in stage.inputs})
                values.update(zip(stage.outputs, results))
            for kind in _KINDS:
                nodes = [n for n in stage.collectives if n.op_type == kind]
                if nodes:
                    results = path.collectives[kind]([path.export(values[n.input[0]])
                                                      for n in nodes])
                    values.update((n.output[0], path.ort_value(r))
                                  for n, r in zip(nodes, results))
            made = {n: path.export(values[n]) for n in stage.ready}
            outputs.update(made)
            if made and on_outputs is not None:
                on_outputs(made)
        return [outputs[name] for name in self.output_names]
