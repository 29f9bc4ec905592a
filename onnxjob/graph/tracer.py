"""Tracing a job body into an onnx_ir graph.

Every user-level op reduces to `emit()`: it appends one ONNX node to the graph being
traced, runs the op's shape rule (shape errors are raised here, naming the user's line),
records the user's `file:line` on the node and returns one `Blob` per output.
"""
import contextlib
import functools
import itertools
import random
import sys
import threading

import numpy as np
import onnx_ir as ir

from onnxjob import dtypes
from onnxjob.compat.generations import written_for_0_4
from onnxjob.errors import ConcreteBlobError, OutsideJobError, TraceError, UnsupportedAPIError
from onnxjob.graph.name_scope import namespace_prefix
from onnxjob.graph.registry import get_primitive
from onnxjob.source_info import short_location, user_location, warn_at_user_line

OPSET = 17
# the metadata property of each node saying what it is part of (GraphBuilder.origin)
ORIGIN = "onnxjob.origin"
# a node's metadata key for what its failure at run time means (runtime/backend.run_error)
FAILURE = "onnxjob.failure"
_state = threading.local()


class TracedNode:
    """One traced op: the onnx_ir node plus the Blobs it reads and writes.

    A composite (see registry.register_composite) is one TracedNode without an onnx_ir
    node of its own: its parts are in the graph, but autodiff sees only the composite.
    """

    __slots__ = ("ir_node", "op_type", "inputs", "outputs", "attrs", "location")

    def __init__(self, ir_node, inputs, outputs, attrs, location, op_type=None):
        self.ir_node = ir_node
        self.op_type = op_type or ir_node.op_type
        self.inputs = inputs
        self.outputs = outputs
        self.attrs = attrs
        self.location = location


def integer_reciprocal(what, divisor):
    """The factor OneFlow multiplies an integer Blob by to divide it by the number
    `divisor`: 1 / divisor (1 / 0 taken as 0) cast to an integer, as its scalar_mul casts
    it to the Blob's dtype; warned at the user's line where that is not the quotient."""
    factor = 0.0 if divisor == 0 else 1.0 / float(divisor)
    if factor != int(factor):
        warn_at_user_line(f"{what} multiplies by int({factor:g}) = {int(factor)}, as OneFlow's "
                          "scalar_mul casts the factor to the Blob's dtype; cast the Blob to a "
                          "float dtype first for the quotient")
    return int(factor)


def reciprocal_no_nan_of(x):
    """1 / x, and 0 where x == 0, with a gradient of 0 there too (the reciprocal reads 1
    where x is 0): OneFlow's reciprocal_no_nan."""
    x_zero = op("Equal", x, as_blob(0, like=x))
    inverse = op("Reciprocal", op("Where", x_zero, as_blob(1, like=x), x))
    return op("Where", x_zero, as_blob(0, like=x), inverse)


class Blob:
    """A value inside a job body: static shape and dtype, no data.

    Supports `+ - * / %`, unary `-` and comparisons with Blobs and Python scalars. The
    distribution surface of OneFlow's blobs (`with_distribute`, `split_axis`,
    `parallel_size`, ...) is installed by frontend/distribute.py.
    """

    __slots__ = ("value", "shape", "np_dtype", "is_dynamic", "is_tensor_list", "producer",
                 "builder", "host_node", "given_op_name", "placement", "distribute_hint",
                 "__weakref__")

    def __init__(self, builder, value, shape, np_dtype, producer=None, is_dynamic=False,
                 is_tensor_list=False):
        self.builder = builder
        self.value = value
        self.shape = tuple(int(d) for d in shape)
        self.np_dtype = np.dtype(np_dtype)
        self.producer = producer
        self.is_dynamic = is_dynamic
        self.is_tensor_list = is_tensor_list
        self.host_node = None  # for graph inputs fed by the host pipeline (add_source)
        self.given_op_name = None  # the op's name flow.user_op_builder gave (op_name)
        self.distribute_hint = None  # blob.with_distribute's (frontend/distribute.py)
        # the placement scope it was made under (frontend/scope.py), for parallel_conf
        self.placement = builder.placement_in_effect() if builder.placement_in_effect else None

    # -- OneFlow blob surface -------------------------------------------------------
    @property
    def parallel_conf(self):
        """OneFlow's placement of the blob (`.device_tag()`, `.device_name()`): the
        placement scope it was made under. Advisory: onnxjob runs a job on one device."""
        if self.placement is None:
            raise AttributeError("this blob was not made in a job function: it has no "
                                 "placement (parallel_conf)")
        return self.placement

    @property
    def dtype(self):
        return dtypes.from_numpy(self.np_dtype)

    @property
    def name(self):
        return self.value.name

    logical_blob_name = unique_name = name

    @property
    def op_name(self):
        """The name of the op that made this Blob, as OneFlow's `lbi.op_name`: the name a
        flow.user_op_builder op was given (with its name scope), else the part of the
        logical blob name before its `/` ("scope-conv" of "scope-conv/out"); a variable's
        or placeholder's name has no `/` and is its own op name."""
        return self.given_op_name or self.value.name.rpartition("/")[0] or self.value.name

    @property
    def blob_name(self):
        """The output's name within its op, as OneFlow's `lbi.blob_name` ("out" of
        "scope-conv/out", "out1" of an op's second output)."""
        return self.value.name.rpartition("/")[2] if "/" in self.value.name else "out"

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def static_shape(self):
        """The blob's shape in the job, under the name OneFlow's blobs had before 0.2
        (remote_blob.py's ConsistentBlob.static_shape, whose `shape` returned it)."""
        return self.shape

    def __repr__(self):
        return f"Blob(name={self.name!r}, shape={self.shape}, dtype={self.dtype.__name__})"

    def __getattr__(self, name):
        # reached only when normal lookup failed: a class attribute (a property) that
        # raised AttributeError raises it again; any other public name is a OneFlow blob
        # attribute onnxjob lacks, said with the user's line (still an AttributeError,
        # so hasattr and getattr(blob, name, default) keep working)
        if name.startswith("_") or name in Blob.__slots__:
            raise AttributeError(name)
        if hasattr(type(self), name):
            return object.__getattribute__(self, name)
        if name in ("numpy", "numpy_list") and eager_requested_at is not None:
            # an eager job body reads its blobs' values (OneFlow's EagerBlobTrait)
            return functools.partial(_read_value, self, name == "numpy_list")
        why = _BLOB_ATTRIBUTE_REASONS.get(
            name, "it is not an attribute of OneFlow's lazy (job-body) blobs that onnxjob "
                  "provides")
        raise UnsupportedAPIError(f"{user_location()}: blob.{name} is not available on traced "
                                  f"Blob {self.name}: {why}")

    # -- Python protocols, as OneFlow's lazy blobs have them ----------------------------
    def __bool__(self):
        # OneFlow's lazy blob defines neither __bool__ nor __len__, so Python takes any
        # blob as true (`if bias_blob:` is a test for None); a comparison's int8 blob in an
        # `if` is a trap, hence a warning once per line
        if self.np_dtype == np.int8:
            _warn_truth_of_flag_once(self)
        return True

    def __iter__(self):
        raise ConcreteBlobError(
            f"{user_location()}: cannot iterate over traced Blob {self.name} of shape "
            f"{self.shape} (OneFlow's lazy blobs are not iterable either); index it with "
            "flow.slice / flow.gather or split it explicitly.")

    def __contains__(self, item):
        raise ConcreteBlobError(
            f"{user_location()}: `in` on traced Blob {self.name}: its values are not known "
            "while the job is traced (OneFlow's lazy blobs are not containers either)")

    def __len__(self):
        raise ConcreteBlobError(
            f"{user_location()}: len() of a traced Blob is not available (OneFlow's lazy "
            f"blobs have no len()); use blob.shape[0] "
            f"(= {self.shape[0] if self.shape else 'scalar'}) instead.")

    __hash__ = object.__hash__

    def __index__(self):
        raise ConcreteBlobError(f"{user_location()}: a traced Blob cannot be used as an index "
                                "(its value is not known while the job is traced)")

    def _no_number(self, kind):
        raise ConcreteBlobError(f"{user_location()}: {kind}() of traced Blob {self.name}: its "
                                "value is not known while the job is traced (a job returns "
                                "it, e.g. as tp.Numpy)")

    def __float__(self): return self._no_number("float")
    def __int__(self): return self._no_number("int")
    def __complex__(self): return self._no_number("complex")

    # -- operators ----------------------------------------------------------------------
    def _binary(self, op_type, other, reverse=False):
        given = other
        other = as_blob(other, like=self)
        a, b = (other, self) if reverse else (self, other)
        x, y = (given, self) if reverse else (self, given)
        # (3 frames up from by_tensor_shape: this, the operator, the operator's caller)
        return by_tensor_shape(op(op_type, a, b), x, y, op_type in ("Add", "Mul"), 3)

    def __add__(self, o):
        if self.builder.qat is not None and isinstance(o, Blob):
            # OneFlow's `+` of two Blobs may be an add_n, which QAT quantizes (ops/qat.py)
            return self.builder.qat.add(self, o, user_call=True)
        return self._binary("Add", o)

    def __radd__(self, o): return self._binary("Add", o, True)
    def __sub__(self, o): return self._binary("Sub", o)
    def __rsub__(self, o): return self._binary("Sub", o, True)
    def __mul__(self, o): return self._binary("Mul", o)
    def __rmul__(self, o): return self._binary("Mul", o, True)
    # `/` is OneFlow's flow.math.divide (blob_trait.py), which takes a Python number apart
    # (ops/math_ops.py divide): x / number multiplies by 1 / number (0 for 0; for an
    # integer Blob cast to its dtype), number / x multiplies reciprocal_no_nan(x)
    def __truediv__(self, o):
        if isinstance(o, (int, float)) and not isinstance(o, bool):
            if self.np_dtype.kind in "iu":
                return self._binary("Mul", integer_reciprocal("an integer Blob / a number", o))
            if self.np_dtype.kind == "f":
                return self._binary("Mul", 0.0 if o == 0 else 1.0 / float(o))
        return self._binary("Div", o)

    def __rtruediv__(self, o):
        if isinstance(o, (int, float)) and not isinstance(o, bool) and self.np_dtype.kind == "f":
            return op("Mul", reciprocal_no_nan_of(self), as_blob(o, like=self))
        return self._binary("Div", o, True)
    def __mod__(self, o): return self._binary("Mod", o)
    def __rmod__(self, o): return self._binary("Mod", o, True)
    def __neg__(self): return op("Neg", self)

    # Comparisons give OneFlow's boolean dtype, int8 (1 where true), as flow.math.equal ...
    def _compare(self, op_type, other):
        return op("Cast", self._binary(op_type, other), to=ir.DataType.INT8.value)

    def __eq__(self, o): return self._compare("Equal", o)
    def __lt__(self, o): return self._compare("Less", o)
    def __le__(self, o): return self._compare("LessOrEqual", o)
    def __gt__(self, o): return self._compare("Greater", o)
    def __ge__(self, o): return self._compare("GreaterOrEqual", o)

    def __ne__(self, o):
        return op("Cast", op("Not", self._binary("Equal", o)), to=ir.DataType.INT8.value)


# where the program called flow.enable_eager_execution(True), "file:line" (set by
# frontend/helpers.py; job functions still run lazily, so blob.numpy() names it)
eager_requested_at = None
_EAGER_ONLY = ("an eager blob's value; in a lazy job body the value is not known until the "
               "job runs (return the blob from the job, e.g. as tp.Numpy, or call "
               "flow.enable_eager_execution(True) before defining the job, as in OneFlow)")
# OneFlow blob attributes a job body cannot have, and why
_BLOB_ATTRIBUTE_REASONS = {
    "numpy": _EAGER_ONLY, "numpy_list": _EAGER_ONLY,
    "numpy_size": "the size of an eager blob's value in OneFlow's runtime; in onnxjob "
                  "blob.numpy().size (eager mode) or the blob's shape",
    "numpy_list_size": "the sizes of an eager blob's values in OneFlow's runtime; in "
                       "onnxjob blob.numpy_list() (eager mode) or the blob's shape",
    "blob_object": "OneFlow's eager runtime object",
}

_warned_truth_lines = set()


def _read_value(blob, as_list, rank=None):
    """`blob.numpy()` / `blob.numpy_list()` in an eager job body: the value the job's
    graph up to `blob` computes from this call's arguments and the variables
    (runtime/eager_values.py reads it). Where the body is traced with no call (the
    session's start) the value is zeros of the blob's shape: that trace only declares the
    job's variables, and the job is traced again at each call with its values."""
    if rank not in (None, 0):
        raise UnsupportedAPIError(f"{user_location()}: blob.numpy(rank={rank!r}): onnxjob "
                                  "runs one device, rank 0 (or None) only")
    builder = blob.builder
    if builder.values_read is None:
        builder.values_read = user_location()
    if builder.value_reader is None:
        value = np.zeros(blob.shape, blob.np_dtype)
    else:
        value = builder.value_reader(blob)
    return [value] if as_list else value


def _warn_truth_of_flag_once(blob):
    """Warn, once per user line, that an int8 blob (a comparison's) in a truth test is
    always true: OneFlow's lazy blobs are, whatever their values."""
    where = user_location()
    if where in _warned_truth_lines:
        return
    _warned_truth_lines.add(where)
    warn_at_user_line(f"{where}: the truth value of traced Blob {blob.name} (int8, as a "
                      "comparison gives) is always True in a job, as for OneFlow's lazy "
                      "blobs: the test does not look at its values (flow.math.where selects "
                      "by them)")


class VariableRegistry:
    """Variable specs by name; a session holds one for all of its jobs."""

    def __init__(self):
        self.variable_specs = {}

    def declare_variable(self, spec, check_same):
        """The registered spec named `spec.name` (registering `spec` if new). A later
        job's declaration with an initializer sets the one the value is drawn from, as
        OneFlow 0.3-0.5 initializes a variable from the last job declaring it (its
        session's table of interface ops is filled in job order); a value drawn or
        loaded already stays."""
        existing = self.variable_specs.get(spec.name)
        if existing is None:
            self.variable_specs[spec.name] = spec
            return spec
        check_same(existing, spec)
        if spec.initializer is not None:
            existing.initializer = spec.initializer
            existing.random_seed = spec.random_seed
        return existing

    def has_variable(self, name):
        return name in self.variable_specs


class GraphBuilder:
    """The graph of one job while its body is traced (and while autodiff extends it)."""

    def __init__(self, job_name, is_train=False, variable_registry=None, seed=None):
        self.job_name = job_name
        self.is_train = is_train
        # Seeds of the job's random nodes and data sources: reproducible when the session
        # was given a seed (flow.config.seed), else Python's `random` module itself, as
        # OneFlow's ops draw their seeds (random.randint at each op: a program's
        # random.seed(n) repeats its dropout masks and shuffles from run to run).
        self.random = random if seed is None else random.Random(seed)
        # Variables are shared by name across the jobs of a session: the session is the
        # registry. Graphs built on their own (tests, tools) get a private one.
        self.variable_registry = variable_registry or VariableRegistry()
        self.graph = ir.Graph(inputs=[], outputs=[], nodes=[], opset_imports={"": OPSET},
                              name=job_name)
        self.nodes = []            # TracedNode, in trace order
        self.variables = {}        # variable name -> Blob (graph input)
        self.variable_specs = {}   # variable name -> VariableSpec
        self.state_updates = {}    # variable name -> Blob with its value after the step
        self.moving_averages = {}  # variable name -> its update (graph/moving_averages.py)
        # variable name -> the user's line of its flow.assign: OneFlow compiles a variable
        # with one writer per job (refuse_second_writer)
        self.assigned_at = {}
        # batch norms' backward coefficients (graph/batch_norm_coefficients.py)
        self.batch_norm_coefficients = []
        self.watches = []          # (Blob, handler, is_diff, location)
        self.sources = {}          # graph input name -> the host node feeding it
        self.placeholders = {}     # graph input name -> the job parameter's Blob
        self.fed_nodes = {}        # graph input name -> the host node reading its fed value
        self.losses = []
        self.optimizer = None
        # the train step's records for Optimizer.apply (train/optimizer.py): the job's
        # function_config and Optimizer.loss_scale's (scale, its state variables)
        self.job_config = None
        self.loss_scale_state = None
        # flow.find_or_create_module's ({module name: module}, names asked for), per job
        # as OneFlow keeps them (frontend/user_op_builder.py)
        self.user_op_modules = ({}, set())
        self.gradients = {}        # id(Blob) -> its gradient Blob (filled by autodiff)
        self.loss_elem_count = 1   # autodiff's 1/N scale, undone for watch_diff
        self.grad_seed_scale = 1.0  # the backward's seed over OneFlow's (autodiff._seed_scale)
        # the world size of a data-parallel train step (runtime/distributed.py; 1 only where
        # a test runs one rank through it); None: not one
        self.data_parallel_ranks = None
        # whether the update runs once on the whole batch's values (not once per micro-batch
        # or mirrored device, whose update reads the first part's placeholders): a row
        # update of the looked-up rows needs every lookup's indices (train/optimizer.py)
        self.update_sees_every_lookup = True
        # the device compile_job traces for ("cpu", "cuda"; None elsewhere): a gradient
        # rule may choose its formulation by it (graph/primitives/conv_weight_grad.py)
        self.device = None
        self.location_override = None
        # what the nodes emitted now are part of, recorded on each as its ORIGIN metadata
        # property (graph/traffic.py groups a step's work by it): "forward", "backward" or
        # "update", then ":" and the composite being expanded or, in the backward, the
        # op whose gradient rule runs (set by `origin`)
        self.phase, self.origin_op = "forward", None
        # () -> the placement new Blobs record (Blob.parallel_conf), set while a job
        # function is traced (frontend/job_function.py); None elsewhere
        self.placement_in_effect = None
        # ops/qat.py's QatTracer while a job under function_config.enable_qat is traced:
        # its `consume` sees the inputs of every node emitted
        self.qat = None
        # (builder, name, Blob) -> what the job's ops read for a variable, where that is not
        # the variable itself: frontend/ssp.py's stale read under function_config.enable_ssp
        self.variable_reader = None
        # eager mode (runtime/eager_values.py): Blob -> its value for this call, where the
        # body is traced with a call's arguments; values_read: where the body first read a
        # value ("file:line"), else None
        self.value_reader = None
        self.values_read = None
        self._counter = itertools.count()
        self._const_cache = {}
        self._used_names = set()   # node names
        self._value_names = set()  # graph input, initializer and node output names

    # -- naming -------------------------------------------------------------------------
    def fresh_name(self, hint):
        """A generated node name, never equal to another node's (user-given or generated)."""
        return self.unique_name(f"{hint}_{next(self._counter)}")

    def unique_name(self, name):
        """`name` (with the namespace prefix), suffixed if a node already uses it."""
        name = namespace_prefix() + name
        if name in self._used_names:
            name = f"{name}_{next(self._counter)}"
        self._used_names.add(name)
        return name

    def unique_value_name(self, name):
        """`name`, suffixed if a graph value already has it (ONNX needs unique names: a
        placeholder and a variable may share one in OneFlow)."""
        if name in self._value_names:
            stem = name
            while name in self._value_names:
                name = f"{stem}_{next(self._counter)}"
        self._value_names.add(name)
        return name

    # -- values -------------------------------------------------------------------------
    def add_input(self, name, shape, np_dtype, dynamic=False, tensor_list=False):
        """A graph input named `name` (or a unique variant: read `blob.name`)."""
        name = self.unique_value_name(name)
        ir_dtype = dtypes.from_numpy(np_dtype).ir_dtype
        if tensor_list:
            value = ir.Value(name=name, type=ir.SequenceType(ir.TensorType(ir_dtype)))
        else:
            dims = [f"{name}_d{i}" if dynamic else d for i, d in enumerate(shape)]
            value = ir.Value(name=name, type=ir.TensorType(ir_dtype), shape=ir.Shape(dims))
        self.graph.inputs.append(value)
        return Blob(self, value, shape, np_dtype, is_dynamic=dynamic, is_tensor_list=tensor_list)

    def add_source(self, name, shape, np_dtype, node, dynamic=False, tensor_list=False):
        """A graph input filled before every run with the value of host node `node`
        (runtime/pipeline.py: decode_random, data readers and decoders), so the job needs
        no placeholder for it. `dynamic`: each run's array may be smaller than `shape`;
        `tensor_list`: the node gives a list of arrays (a tp.ListListNumpy value)."""
        blob = self.add_input(name, shape, np_dtype, dynamic=dynamic, tensor_list=tensor_list)
        blob.is_dynamic = dynamic or tensor_list
        blob.host_node = node
        self.sources[blob.name] = node
        return blob

    def constant(self, array, name_hint="const"):
        """A Blob holding `array` as an initializer (small constants are shared)."""
        array = np.asarray(array, order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        key = None
        if array.size <= 16:
            key = (array.dtype.str, array.shape, array.tobytes())
            if key in self._const_cache:
                return self._const_cache[key]
        name = self.unique_value_name(f"{name_hint}_{next(self._counter)}")
        # (ir.Tensor, not ir.tensor: the latter's protocol checks take ~50 us a constant,
        # ~70 ms of a ResNet50 train job's compile with its ~1300 constants)
        value = ir.Value(name=name, const_value=ir.Tensor(array, name=name),
                         type=ir.TensorType(dtypes.from_numpy(array.dtype).ir_dtype),
                         shape=ir.Shape(array.shape))
        self.graph.register_initializer(value)
        blob = Blob(self, value, array.shape, array.dtype)
        if key is not None:
            self._const_cache[key] = blob
        return blob

    # -- nodes --------------------------------------------------------------------------
    def emit(self, op_type, inputs, attrs=None, num_outputs=1, name=None, location=None):
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        if self.qat is not None:
            inputs = self.qat.consume(inputs)
        prim = get_primitive(op_type)
        location = location or self.location_override or short_location()
        for i, x in enumerate(inputs):
            if x is not None and not isinstance(x, Blob):
                # a value of the host pipeline (ops/host.HostValue) says what it is
                if hasattr(type(x), "as_graph_input"):
                    inputs[i] = x = x.as_graph_input(op_type)
                    continue
                raise TraceError(f"{op_type}: input {i} is {type(x).__name__}, expected a Blob")
            if x is not None and x.builder is not self:
                raise TraceError(f"{op_type}: input {x.name} belongs to another job's graph; "
                                 "Blobs cannot be shared between job functions")
        if prim.expand is not None:
            return self._emit_composite(prim, inputs, attrs, num_outputs, location)
        if prim.lower is not None:
            with self.location(location):
                lowered = prim.lower(list(inputs), attrs, num_outputs)
            if lowered is not None:
                return lowered
        try:
            out_types = prim.infer(inputs, attrs, num_outputs)
        except TraceError:
            raise
        except (ValueError, AssertionError, IndexError) as e:
            shapes = ", ".join(str(x.shape) if x is not None else "None" for x in inputs)
            raise TraceError(f"{op_type} cannot take inputs of shapes ({shapes}): {e}",
                             location=user_location()) from None
        node_name = self.unique_name(name) if name else self.fresh_name(op_type)
        dynamic = any(x is not None and x.is_dynamic for x in inputs) or bool(
            prim.data_dependent and prim.data_dependent(inputs))
        # NOTE: a value computed from a dynamic Blob declares no dims: its static shape is
        # only its largest, and a declared dim would let onnxruntime fold Shape() of it
        outputs = [ir.Value(name=self.unique_value_name(
                                f"{node_name}/out{i}" if i else f"{node_name}/out"),
                            type=ir.TensorType(dtypes.from_numpy(dt).ir_dtype),
                            shape=ir.Shape([None] * len(shape) if dynamic else shape))
                   for i, (shape, dt) in enumerate(out_types)]
        origin = self.phase if self.origin_op is None else f"{self.phase}:{self.origin_op}"
        node = ir.node(prim.node_type, [x.value if x is not None else None for x in inputs],
                       attributes={k: _ir_attr(k, v) for k, v in attrs.items()},
                       outputs=outputs, name=node_name, domain=prim.domain,
                       metadata_props={"source": location, ORIGIN: origin})
        if prim.domain:
            self.graph.opset_imports.setdefault(prim.domain, 1)
        self.graph.append(node)
        blobs = [Blob(self, v, shape, dt) for v, (shape, dt) in zip(outputs, out_types)]
        traced = TracedNode(node, list(inputs), blobs, attrs, location, op_type=prim.op_type)
        for b in blobs:
            b.producer = traced
            # a 0-d value has one shape whatever its inputs' sizes (a full reduction of the
            # rows argwhere picked): it is static, as OneFlow's triplet losses return it
            b.is_dynamic = dynamic and len(b.shape) > 0
        self.nodes.append(traced)
        return blobs

    def _emit_composite(self, prim, inputs, attrs, num_outputs, location):
        """Emit a composite's parts, then record them as one TracedNode (see TracedNode)."""
        first = len(self.nodes)
        with self.location(location), self.origin(self.phase, self.origin_op or prim.op_type):
            outs = list(prim.expand(list(inputs), attrs, num_outputs))
        del self.nodes[first:]
        # an output that is an input (or a constant) would get a second producer
        outs = [op("Identity", b) if b.producer is None or any(b is x for x in inputs) else b
                for b in outs]
        del self.nodes[first:]
        traced = TracedNode(None, list(inputs), outs, attrs, location, op_type=prim.op_type)
        for b in outs:
            b.producer = traced
        self.nodes.append(traced)
        return outs

    def refuse_second_writer(self, name, other, assign_line):
        """A flow.assign (at `assign_line`) of variable `name`, which `other` (a phrase)
        also writes in this job: OneFlow's compiler takes one mutable consumer per variable
        and job (job_completer.cpp, SetCtrlInOpName4VariableOp: Check failed:
        mutable_consumer == nullptr); here one of the two writes would be lost."""
        raise TraceError(f"flow.assign writes variable {name!r}, which {other} also writes in "
                         f"job {self.job_name!r}: OneFlow gives a variable one writer per job "
                         "(its compiler stops: Check failed: mutable_consumer == nullptr); "
                         "write it once, or in a job of its own", location=assign_line)

    @contextlib.contextmanager
    def origin(self, phase, op_type=None):
        """Nodes emitted inside are part of `phase` ("forward", "backward", "update") and,
        when given, of `op_type` (a composite's expansion, an op's gradient rule)."""
        old = self.phase, self.origin_op
        self.phase, self.origin_op = phase, op_type
        try:
            yield
        finally:
            self.phase, self.origin_op = old

    @contextlib.contextmanager
    def location(self, location):
        """Nodes emitted inside carry `location` (gradient nodes inherit the forward one)."""
        old = self.location_override
        self.location_override = location
        try:
            yield
        finally:
            self.location_override = old


@contextlib.contextmanager
def tracing(builder):
    """Make `builder` the graph that ops called in this thread append to."""
    old = getattr(_state, "builder", None)
    _state.builder = builder
    try:
        yield builder
    finally:
        _state.builder = old


def current_builder(api_name="this op"):
    builder = getattr(_state, "builder", None)
    if builder is None:
        raise OutsideJobError(f"{api_name} can only be used inside a job function body "
                         "(a function decorated with @flow.global_function)")
    return builder


def builder_or_none():
    """The builder of the job being traced, or None outside a job body."""
    return getattr(_state, "builder", None)


def in_job():
    return builder_or_none() is not None


# modules whose wrappers pass a public op's call through (the guard of flow.* ops, the
# keyword renames of older releases)
_CALL_WRAPPERS = ("onnxjob.frontend.blob_arguments", "onnxjob.compat.generations")


def from_user_code(frame):
    """Whether `frame` (a caller's), past onnxjob's call wrappers, is the program's, not
    onnxjob's own code (whose arithmetic on its own scalars keeps broadcasting's shapes)."""
    while frame is not None and frame.f_globals.get("__name__") in _CALL_WRAPPERS:
        frame = frame.f_back
    return frame is not None and not frame.f_globals.get("__name__", "").startswith("onnxjob.")


def by_tensor_shape(result, x, y, commutes, caller_depth):
    """`result` of an arithmetic op on operands `x` and `y` as OneFlow 0.5 shapes it where
    both are Blobs, one 0-d and the other (1,): its math ops take a (1,) Blob as the
    scalar of scalar_<op>_by_tensor, whose output has the other operand's shape
    (scalar_by_tensor_op.cpp): 0-d for add and multiply either way round, for subtract and
    divide where x is the 0-d one (`commutes` False); broadcasting gives (1,) otherwise
    (a Python number is a scalar op's: the Blob's shape). Only for the program's own call
    (the frame `caller_depth` frames above this one, from_user_code) in code not written
    for OneFlow <= 0.4, whose reductions were (1,) themselves."""
    if result.shape != (1,) or not (isinstance(x, Blob) and isinstance(y, Blob)):
        return result
    pairs = [((), (1,)), ((1,), ())] if commutes else [((), (1,))]
    if (x.shape, y.shape) not in pairs or not from_user_code(sys._getframe(caller_depth)) \
            or written_for_0_4():
        return result
    return op("Reshape", result, int64_constant(result, []))


def op(op_type, *inputs, num_outputs=1, name=None, **attrs):
    """Emit one primitive; returns its single output (or the list if num_outputs > 1)."""
    builder = None
    for x in inputs:
        if isinstance(x, Blob):
            builder = x.builder
            break
    builder = builder or current_builder(op_type)
    outs = builder.emit(op_type, list(inputs), attrs, num_outputs=num_outputs, name=name)
    return outs[0] if num_outputs == 1 else outs


def int64_constant(like, values):
    """An int64 constant (shapes, axes, indices) in the graph of Blob `like`."""
    return as_blob(np.asarray(values, dtype=np.int64), like=like, dtype=np.int64)


def as_blob(x, like=None, dtype=None):
    """A Blob for `x`: Blobs pass through, Python/NumPy scalars and arrays become constants."""
    if isinstance(x, Blob):
        return x
    builder = like.builder if like is not None else current_builder()
    if dtype is None:
        dtype = like.np_dtype if like is not None else None
    return builder.constant(dtypes.scalar_array(x, dtype))


def _ir_attr(name, value):
    """`value` as an onnx_ir attribute. The common kinds are built directly: onnx_ir's own
    inference checks every value against its runtime Protocols, slow enough to be a tenth
    of a ResNet50 trace."""
    kind = type(value)
    if kind is int or kind is bool:
        return ir.AttrInt64(name, int(value))
    if kind is float:
        return ir.AttrFloat32(name, value)
    if kind is str:
        return ir.AttrString(name, value)
    if kind is np.ndarray:
        return ir.AttrTensor(name, ir.tensor(value))
    if (kind is list or kind is tuple) and value:
        kinds = {type(x) for x in value}
        if kinds <= {int, bool}:
            return ir.AttrInt64s(name, [int(x) for x in value])
        if kinds == {float}:
            return ir.AttrFloat32s(name, list(value))
        if kinds == {str}:
            return ir.AttrStrings(name, list(value))
    return value    # anything else: onnx_ir converts it
