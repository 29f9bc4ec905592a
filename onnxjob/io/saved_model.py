"""`flow.saved_model`: OneFlow's saved-model builder, writing onnxjob's saved models.

    builder = flow.saved_model.ModelBuilder("models")
    signature = builder.ModelName("mlp").Version(1).AddFunction(predict_job) \\
        .AddSignature("regress")
    signature.Input("x", x_lbn).Output("y", y_lbn)   # logical blob names seen in the job
    builder.Save()

writes `models/1/`: one `<function>.onnx` per added predict job (flow.export's file: the
variables inside, the placeholders as inputs, outputs output_0, ...), the variables
again in OneFlow's checkpoint layout (`variables/`), and `saved_model.json`, the meta
data OneFlow keeps in saved_model.pb / .prototxt: the model's name and version, the
checkpoint folder, the default graph and, per graph, its file, default signature and
signatures (input and output names mapped to the ONNX graph's). OneFlow stores its
compiled op lists instead of ONNX, so the two formats do not load in each other;
flow.serving.InferenceSession loads onnxjob's.

A signature's logical blob names (`blob.logical_blob_name`) must be placeholders
(inputs) and returned blobs (outputs) of the job.
"""
import json
import os

from onnxjob.errors import missing_api

META_FILE = "saved_model.json"


class ModelBuilder:
    """Builds one version of a saved model under `save_path` (module docstring)."""

    DEFAULT_CHECKPOINT_DIR = "variables"
    DEFAULT_SAVED_MODEL_FILE_BASENAME = "saved_model"

    def __init__(self, save_path):
        if not isinstance(save_path, str):
            raise ValueError(f"param 'save_path' must be str, but got {save_path}")
        self.saved_model_dir_ = save_path
        self.version_ = None
        self.name = None
        self.default_graph_name = None
        self.graph_builders_ = {}

    def ModelName(self, model_name):
        """Set the model's name; returns the builder."""
        assert isinstance(model_name, str)
        self.name = model_name
        return self

    def Version(self, version):
        """Set the version (the folder Save writes); returns the builder."""
        assert isinstance(version, int)
        self.version_ = version
        return self

    def AddFunction(self, func):
        """A GraphBuilder for the global function `func` (a predict job)."""
        func_name = func.__name__
        if func_name in self.graph_builders_:
            raise ValueError(f"function with name {func_name} already exists")
        builder = GraphBuilder(func_name, self, func)
        self.graph_builders_[func_name] = builder
        if self.default_graph_name is None:
            self.default_graph_name = func_name
        return builder

    def _check_name_conflicts(self):
        names, lbns = set(), set()
        for graph in self.graph_builders_.values():
            for signature in graph.signature_builders_.values():
                for name, lbn in list(signature.inputs.items()) + list(signature.outputs.items()):
                    if name in names:
                        raise ValueError(f"input conflict, {name} already exist")
                    if lbn in lbns:
                        raise ValueError(f"input conflict, {lbn} already bind to other input")
                    names.add(name)
                    lbns.add(lbn)

    def Save(self, save_model_before_graph_complete=True):
        """Write the model's version folder (module docstring)."""
        from onnxjob.io import checkpoint
        from onnxjob.io.export import export
        self._check_name_conflicts()
        if self.version_ is None:
            raise ValueError("model version is not set")
        for graph in self.graph_builders_.values():
            if not graph.finished:
                graph.Finish()
        version_dir = os.path.join(self.saved_model_dir_, str(self.version_))
        if os.path.exists(version_dir):
            raise ValueError(f'Directory of model "{self.saved_model_dir_}" version '
                             f'"{self.version_}" already exist.')
        os.makedirs(version_dir)
        checkpoint.save(os.path.join(version_dir, self.DEFAULT_CHECKPOINT_DIR))
        graphs = {}
        for name, graph in self.graph_builders_.items():
            export(graph.func, os.path.join(version_dir, f"{name}.onnx"))
            graphs[name] = graph.meta()
        meta = {"name": self.name, "version": self.version_,
                "checkpoint_dir": self.DEFAULT_CHECKPOINT_DIR,
                "default_graph_name": self.default_graph_name, "graphs": graphs}
        with open(os.path.join(version_dir, META_FILE), "w") as f:
            json.dump(meta, f, indent=1)


class GraphBuilder:
    """One function of a saved model and its signatures."""

    def __init__(self, name, model_builder=None, func=None):
        if not isinstance(name, str):
            raise ValueError(f"param 'name' must be str, but got {name}")
        if model_builder is not None and not isinstance(model_builder, ModelBuilder):
            raise ValueError("param 'model_builder' must be a type of ModelBuilder or None")
        self.name_, self.owner_, self.func = name, model_builder, func
        self.finished_ = False
        self.default_signature_name = None
        self.signature_builders_ = {}
        self._inputs = self._outputs = None

    @property
    def name(self):
        return self.name_

    @property
    def finished(self):
        return self.finished_

    def AddSignature(self, signature_name):
        """A SignatureBuilder; the first added is the graph's default."""
        assert isinstance(signature_name, str)
        if signature_name in self.signature_builders_:
            raise ValueError(f"signature name {signature_name} already exists")
        builder = SignatureBuilder(signature_name, self)
        self.signature_builders_[signature_name] = builder
        if self.default_signature_name is None:
            self.default_signature_name = signature_name
        return builder

    def Finish(self):
        """Check every signature's blob names against the job's placeholders and outputs."""
        assert self.finished is False
        inputs, outputs = _interface_names(self.func)
        for signature in self.signature_builders_.values():
            for kind, names, known in (("input", signature.inputs, inputs),
                                       ("output", signature.outputs, outputs)):
                for name, lbn in names.items():
                    if lbn not in known:
                        raise ValueError(
                            f"signature {signature.name!r} of {self.name!r}: {kind} {name!r} "
                            f"is bound to {lbn!r}, which is not a job {kind} (the job's "
                            f"{kind}s are {sorted(known)})")
        self._inputs, self._outputs = inputs, outputs
        self.finished_ = True

    def meta(self):
        signatures = {
            s.name: {"inputs": {n: self._inputs[lbn] for n, lbn in s.inputs.items()},
                     "outputs": {n: self._outputs[lbn] for n, lbn in s.outputs.items()}}
            for s in self.signature_builders_.values()}
        return {"file": f"{self.name}.onnx", "default_signature_name":
                self.default_signature_name, "signatures": signatures}

    def OwnerModelBuilder(self):
        return self.owner_

    def AsDefault(self):
        if self.owner_ is not None:
            self.owner_.default_graph_name = self.name
        return self


class SignatureBuilder:
    """Named inputs and outputs of one graph, bound to logical blob names."""

    def __init__(self, name, graph_builder=None):
        if not isinstance(name, str):
            raise ValueError(f"param 'name' must be str, but got {name}")
        if graph_builder is not None and not isinstance(graph_builder, GraphBuilder):
            raise ValueError("param 'graph_builder' must be a type of GraphBuilder or None")
        self.name_, self.owner_ = name, graph_builder
        self.inputs, self.outputs = {}, {}

    @property
    def name(self):
        return self.name_

    def _bind(self, table, kind, name, lbn):
        assert isinstance(name, str) and isinstance(lbn, str)
        if name in table:
            graph = self.owner_.name if self.owner_ else None
            raise ValueError(f"{kind}_name ({name}) already exist in signature ({self.name}) of "
                             f"graph ({graph})")
        table[name] = lbn
        return self

    def Input(self, input_name, lbn):
        """Bind `input_name` to the job placeholder whose logical blob name is `lbn`."""
        return self._bind(self.inputs, "input", input_name, lbn)

    def Output(self, output_name, lbn):
        """Bind `output_name` to the returned blob whose logical blob name is `lbn`."""
        return self._bind(self.outputs, "output", output_name, lbn)

    def OwnerGraphBuilder(self):
        return self.owner_

    def AsDefault(self):
        if self.owner_ is not None:
            self.owner_.default_signature_name = self.name
        return self


def _interface_names(func):
    """({placeholder lbn: ONNX input name}, {returned blob lbn: ONNX output name}) of the
    global function `func`, from a trace of its body (blob names are deterministic)."""
    from onnxjob.frontend.config import started_session
    from onnxjob.graph.tracer import GraphBuilder as Tracer, tracing
    job = getattr(func, "job", None)
    if job is None:
        raise ValueError(f"AddFunction takes a @flow.global_function, got {func!r}")
    if job.is_train:
        raise ValueError(f"{job.name} is a train job: a saved model holds predict jobs")
    session = started_session(sync=True)
    compiled = session.runtimes[job.name].compiled
    builder = Tracer(job.name)
    with tracing(builder):
        placeholders, blobs, _ = job.trace(builder)
    inputs = {name: name for name in placeholders}
    outputs = {blob.logical_blob_name: out for blob, out in zip(blobs, compiled.output_names)}
    return inputs, outputs


__getattr__ = missing_api("flow.saved_model")
