"""`flow.user_op_builder` and its kin: OneFlow's op builders, over onnxjob's table of
OneFlow op types (onnxjob/ops/user_ops).

OneFlow's own Python ops, and programs that copy them, build ops by their registered
type name:

    y = (flow.user_op_builder("my_relu").Op("relu").Input("in", [x]).Output("out")
         .Build().InferAndTryRun().RemoteBlobList()[0])

Here `.Op(type)` looks the type up in onnxjob's table (an unknown one raises
UnsupportedAPIError naming it and the caller's line); `.Attr(name, value)` converts and
checks the value by the type of that attribute, as OneFlow's does; `.Build()` checks the
inputs, outputs and attributes against the op type's; `.InferAndTryRun()` builds it
from onnxjob's ops in the job being traced; `.RemoteBlobList()` returns its outputs in
the order `.Output(name, num)` declared them. The blobs' `op_name` is the op's name
with its name scope, as in OneFlow.

`user_op_module_builder(type)` / `consistent_user_op_module_builder(type)` are the
reusable form (one builder, `.OpName(name)` and `.Input` per call), with
`find_or_create_module(name, create)` caching a flow.nn.Module per job. The consistent
variants are the plain ones: onnxjob runs a job on one device.
"""

from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.frontend.extras import unique_str
from onnxjob.graph.name_scope import namespace_prefix
from onnxjob.graph.tracer import current_builder, op
from onnxjob.ops import user_ops
from onnxjob.ops.module import Module
from onnxjob.source_info import user_location, warn_at_user_line

_API = "flow.user_op_builder"


def _op_type(name):
    """The table's OpType `name`, or UnsupportedAPIError saying what there is instead."""
    found = user_ops.lookup(name)
    if found is not None:
        return found
    if name in user_ops.FLOW_ONLY:
        raise UnsupportedAPIError(
            f"{user_location()}: {_API}: OneFlow's op type {name!r} is not in onnxjob's table "
            f"of op types; onnxjob has it as {user_ops.FLOW_ONLY[name]} (call that instead)")
    hints = [f"{n!r}" + (f" ({flow})" if flow else "") for n, flow in user_ops.near_matches(name)]
    hint = f" Did you mean {' or '.join(hints)}?" if hints else ""
    raise UnsupportedAPIError(
        f"{user_location()}: {_API}: op type {name!r} is not in onnxjob's table of OneFlow op "
        "types (onnxjob has no OneFlow kernels: it builds each op type it knows from its own "
        f"ops, and a custom C++ op cannot run).{hint} "
        f"onnxjob.ops.user_ops.op_type_names() lists the {len(user_ops.op_type_names())} op "
        "types it has; write the computation with flow ops otherwise")


class UserOp:
    """An op of a job as a builder describes it (OneFlow's UserOp): `InferAndTryRun()`
    adds it to the job being traced, `RemoteBlobList()` / `RemoteBlobDict()` /
    `SoleOutputBlob()` give its outputs."""

    def __init__(self, op_name, op_type_name=None):
        self.op_name = op_name
        self.op_type = _op_type(op_type_name) if op_type_name is not None else None
        self.inputs = {}       # arg name -> list of Blobs (None: sized by InputSize only)
        self.outputs = {}      # arg name -> number of blobs, in declaration order
        self.attrs = {}        # attr name -> converted value
        self._results = None   # arg name -> list of Blobs, after InferAndTryRun

    @property
    def op_type_name(self):
        return self.op_type.name if self.op_type is not None else None

    def InferAndTryRun(self):
        """Build the op in the job being traced (its outputs are then ready)."""
        builder = current_builder(_API)
        if self.op_type is None:
            raise TraceError(f"{_API}({self.op_name!r}): no op type; call .Op(type) first")
        unset = [n for n, blobs in self.inputs.items() if blobs is None]
        if unset:
            raise TraceError(f"{_API}({self.op_name!r}): input {unset[0]!r} was sized with "
                             "InputSize but given no blobs; set them with .Input(name, blobs)")
        self.op_type.check_inputs(self.inputs)
        self.op_type.check_outputs(self.outputs)
        attrs = self.op_type.complete_attrs(self.attrs)
        first = len(builder.nodes)
        made = self.op_type(self.inputs, attrs)
        new_nodes = {id(n) for n in builder.nodes[first:]}
        results = {}
        for name, num in self.outputs.items():
            blobs = made.get(name, [])
            if len(blobs) != num:
                raise TraceError(f"{_API}: op type {self.op_type_name!r} makes {len(blobs)} "
                                 f"{name!r} blob(s) here; the builder declared {num}")
            # an output that is not new (an input, a shared constant) gets a node of its own,
            # so that naming it names nothing else
            blobs = [b if b.producer is not None and id(b.producer) in new_nodes
                     else op("Identity", b) for b in blobs]
            for b in blobs:
                b.given_op_name = self.op_name
            results[name] = blobs
        self._results = results
        return self

    def _outputs(self):
        if self._results is None:
            raise TraceError(f"{_API}({self.op_name!r}): call InferAndTryRun() before asking "
                             "for the outputs")
        return self._results

    def RemoteBlobList(self):
        """The outputs, in the order the builder declared them (by name, then index)."""
        return tuple(b for blobs in self._outputs().values() for b in blobs)

    def RemoteBlobDict(self):
        """{output name: [its blobs]}."""
        return {name: list(blobs) for name, blobs in self._outputs().items()}

    def SoleOutputBlob(self):
        """The only output."""
        blobs = self.RemoteBlobList()
        assert len(blobs) == 1, f"{self.op_name} has {len(blobs)} outputs, not one"
        return blobs[0]


class UserOpModule(UserOp):
    """The op of a module builder; InitOpKernel() is OneFlow's eager hook (nothing to do
    in a lazy job)."""

    opkernel_object = None

    def InitOpKernel(self):
        self.opkernel_object = None


class UserOpConfBuilder:
    """Sets up one UserOp: `.Op(type)`, `.Input(name, blobs)`, `.Output(name, num)`,
    `.Attr(name, value)`, then `.Build()`."""

    def __init__(self, op_name, op_type_name=None, op_class=UserOp):
        self.user_op_ = op_class(namespace_prefix() + op_name, op_type_name)

    def Op(self, op_type_name):
        """The op's registered type name."""
        self.user_op_.op_type = _op_type(op_type_name)
        return self

    def OpName(self, op_name):
        """Rename the op (with the current name scope)."""
        self.user_op_.op_name = namespace_prefix() + op_name
        return self

    def Input(self, input_name, input_blob_list):
        """Set input `input_name` to the blobs of the list (replacing what it had)."""
        assert isinstance(input_blob_list, (tuple, list)), (
            f"{_API}: Input({input_name!r}, ...) takes a list of blobs, got "
            f"{type(input_blob_list).__name__}")
        self.user_op_.inputs[input_name] = list(input_blob_list)
        if self.user_op_.op_type is not None:
            self.user_op_.op_type.check_input(input_name, list(input_blob_list))
        return self

    def InputSize(self, input_name, input_blob_size):
        """Declare input `input_name` with `input_blob_size` blobs, set later by Input()."""
        assert input_blob_size >= 0 and input_name not in self.user_op_.inputs
        self.user_op_.inputs[input_name] = None
        return self

    def Output(self, output_name, num=1):
        """Declare output `output_name` with `num` blobs."""
        assert isinstance(num, int) and num >= 1, f"{_API}: Output num must be an int >= 1"
        self.user_op_.outputs[output_name] = num
        if self.user_op_.op_type is not None:
            self.user_op_.op_type.check_output(output_name, num)
        return self

    def Attr(self, attr_name, attr_value, attr_type_name=None):
        """Set attribute `attr_name`, converted by the type its op type gives it."""
        if attr_type_name is not None:
            warn_at_user_line(f"{_API}: the attr_type_name argument of Attr is deprecated (as "
                              "in OneFlow); the attribute's type comes from its op type",
                              DeprecationWarning)
        op_type = self.user_op_.op_type
        if op_type is None:
            raise TraceError(f"{_API}({self.user_op_.op_name!r}): call .Op(type) before "
                             f".Attr({attr_name!r}, ...): the type of an attribute comes from "
                             "its op type")
        self.user_op_.attrs[attr_name] = op_type.convert_attr(attr_name, attr_value)
        return self

    def CheckAndComplete(self):
        """Check the inputs, outputs and attributes against the op type."""
        op_ = self.user_op_
        if op_.op_type is None:
            raise TraceError(f"{_API}({op_.op_name!r}): no op type; call .Op(type) first")
        op_.op_type.check_inputs({n: b for n, b in op_.inputs.items() if b is not None})
        op_.op_type.check_outputs(op_.outputs)
        op_.op_type.complete_attrs(op_.attrs)
        return self

    def Build(self):
        """The op, checked (call InferAndTryRun() on it)."""
        return self.CheckAndComplete().user_op_


class UserOpModuleBuilder(UserOpConfBuilder):
    """A builder of one op type reused for several ops (OpName and Input per call)."""

    def __init__(self, op_type_name):
        super().__init__(op_type_name, op_type_name, op_class=UserOpModule)

    @property
    def user_op_module(self):
        return self.user_op_

    def Op(self, op_type_name):
        raise ValueError(f"user op module builder of {op_type_name} can't call "
                         "'.Op(op_type_name)' method")


class BuiltinOp:
    """`flow.builtin_op(op_type_name, op_name=None)`: OneFlow 0.5's op declared once and
    applied to inputs: `.Input(name, num)`, `.Output(name, num)` and `.Attr(name, value)`
    declare it, `.Build()` (or `.op`) gives it, and `op(*blobs, **attrs)` adds one op of
    the type to the job being traced, its inputs the blobs in declaration order, its
    attributes those of `.Attr` and of the call, and returns its outputs (a tuple, in
    declaration order). OneFlow applies it to eager tensors; here to a job's blobs."""

    def __init__(self, op_type_name, op_name=None):
        self._type = _op_type(op_type_name)
        self._name = op_name
        self._inputs = []       # [(arg name, number of blobs)]
        self._outputs = {}      # arg name -> number of blobs
        self._attrs = {}

    def Input(self, input_name, num=1):
        assert isinstance(num, int) and num >= 1, "flow.builtin_op: Input num must be >= 1"
        self._inputs.append((input_name, num))
        return self

    def Output(self, output_name, num=1):
        assert isinstance(num, int) and num >= 1, "flow.builtin_op: Output num must be >= 1"
        self._type.check_output(output_name, num)
        self._outputs[output_name] = num
        return self

    def Attr(self, attr_name, attr_value, attr_type_name=None):
        self._attrs[attr_name] = self._type.convert_attr(attr_name, attr_value)
        return self

    def Build(self):
        return self

    op = property(Build)

    def __call__(self, *blobs, **attrs):
        expected = sum(num for _, num in self._inputs)
        if len(blobs) != expected:
            names = ", ".join(f"{n} x{num}" for n, num in self._inputs) or "none"
            raise TraceError(f"{user_location()}: flow.builtin_op({self._type.name!r}) takes "
                             f"{expected} input blob(s) ({names}), got {len(blobs)}")
        builder = UserOpConfBuilder(self._name or unique_str(self._type.name + "_"),
                                    self._type.name)
        blobs = iter(blobs)
        for name, num in self._inputs:
            builder.Input(name, [next(blobs) for _ in range(num)])
        for name, num in self._outputs.items():
            builder.Output(name, num)
        for name, value in {**self._attrs, **attrs}.items():
            builder.Attr(name, value)
        return builder.Build().InferAndTryRun().RemoteBlobList()


def user_op_builder(op_name):
    """A builder of the op called `op_name` (in the current name scope): give it a type
    with .Op(type), inputs, outputs and attributes, then .Build().InferAndTryRun()."""
    return UserOpConfBuilder(op_name)


def consistent_user_op_builder(op_name):
    """user_op_builder (one device: consistent and mirrored views agree)."""
    return UserOpConfBuilder(op_name)


def user_op_module_builder(op_type_name):
    """A reusable builder of op type `op_type_name` (see UserOpModuleBuilder)."""
    return UserOpModuleBuilder(op_type_name)


def consistent_user_op_module_builder(op_type_name):
    """user_op_module_builder (one device)."""
    return UserOpModuleBuilder(op_type_name)


def find_or_create_module(module_name, create, reuse=False):
    """The module `module_name` of the job being traced, made by `create()` (a
    flow.nn.Module) the first time; asking again needs reuse=True, as in OneFlow."""
    assert callable(create)
    builder = current_builder("flow.find_or_create_module")
    modules, seen = builder.user_op_modules
    if module_name not in modules:
        module = create()
        assert isinstance(module, Module), (
            f"flow.find_or_create_module: create() must return a flow.nn.Module, got "
            f"{type(module).__name__}")
        modules[module_name] = module
    elif not reuse:
        assert module_name not in seen, (
            f"duplicated module_name `{module_name}' in global_function `{builder.job_name}'")
    seen.add(module_name)
    return modules[module_name]
