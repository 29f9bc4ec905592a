"""A data-parallel train graph traced at the whole batch, split into one rank's part.

A data-parallel job is traced exactly as on one device, at its placeholders' shapes (the
logical batch B, OneFlow's consistent view). `split_batch` then rewrites the graph (the
forward and backward part of the step, runtime/data_parallel.py) into what rank r of W
computes on its B/W rows. Every value gets one of four kinds, propagated node by node
from the placeholders (split on axis 0) and the variables (whole):

* whole (OneFlow's broadcast): the same on every rank, the logical value;
* split(axis, inner): this rank's share of the logical value along `axis`. The batch
  may be merged with other axes (a Reshape to (C, H * W * N), as the convolution's weight
  gradient makes): the axis then holds outer x B x inner elements of which the rank has
  outer x B/W x inner; `inner` is the product of the axes merged after the batch;
* partial sum: the logical value is the sum of the ranks' values (a sum over the batch);
* partial mean: the logical value is the mean of the ranks' values (a mean over the batch:
  each rank has as many rows).

Each op has a rule (`_RULES`): elementwise ops on split values stay split, a whole operand
with the batch's extent is sliced to the rank's rows; a MatMul, Gemm or Conv that
contracts the batch axis makes a partial sum; a ReduceSum / ReduceMean over the batch a
partial sum / mean; partial values go through linear ops (Add, Sub, Mul or Div by a whole
value, Neg, Reshape, ...) as they are, and become whole by a collective
(graph/primitives/collectives.py: AllReduceSum / AllReduceMean, which cut the step into
stages, runtime/staged.py) where a nonlinear op reads them; constants that hold the batch
size (Reshape targets, MaxUnpool output shapes) are rewritten for the rank's rows. An op
without a rule runs as it is when all of its inputs are whole; otherwise, and where no
rule applies (a slice of some rows, a concatenation along the batch, the maximum over
it), the split stops with a TraceError naming the node and the user's line.

The graph's outputs are then reduced by their kind (`OUTPUT_KINDS`): split outputs are
gathered, partial sums summed, partial means averaged, whole ones taken as they are.
"""
import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

from onnxjob.errors import TraceError
from onnxjob.graph.primitives.collectives import DOMAIN
from onnxjob.graph.split_kinds import MEAN, SUM, WHOLE, Split
from onnxjob.graph.split_rules import RULES as _RULES


class SplitError(TraceError):
    """A graph that cannot be split for data-parallel training, naming the node."""


def _where(node):
    for prop in node.metadata_props:
        if prop.key == "source":
            return prop.value
    return None


# -- the graph being rewritten --------------------------------------------------------------

class _Rewriter:
    def __init__(self, model, placeholder_names, rank, ranks, job_name):
        self.graph = model.graph
        self.rank, self.ranks, self.job_name = rank, ranks, job_name
        self.shapes = {}        # value name -> logical shape (tuple of ints)
        self.dtypes = {}        # value name -> TensorProto elem type
        for v in list(self.graph.input) + list(self.graph.value_info) + list(self.graph.output):
            t = v.type.tensor_type
            if v.type.HasField("tensor_type") and t.HasField("shape") and \
                    all(d.HasField("dim_value") for d in t.shape.dim):
                self.shapes[v.name] = tuple(d.dim_value for d in t.shape.dim)
                self.dtypes[v.name] = t.elem_type
        self.constants = {}     # value name -> numpy array (initializers, Constant nodes)
        for t in self.graph.initializer:
            self.constants[t.name] = numpy_helper.to_array(t)
            self.shapes[t.name] = tuple(t.dims)
            self.dtypes[t.name] = t.data_type
        self.kinds = {}
        placeholders = set(placeholder_names)
        dynamic = [i.name for i in self.graph.input if i.name in placeholders and
                   i.name not in self.shapes]
        if dynamic:
            # NOTE: OneFlow's mirrored view gives each device its own list element; a rank
            # would take its own, with the loss normalized by all ranks' rows
            raise SplitError(f"job {job_name!r}: data-parallel training takes consistent-view "
                             f"jobs (tp.Numpy placeholders); {dynamic} are mirrored "
                             "(tp.ListNumpy / dynamic) placeholders, which it does not split. "
                             "Use tp.Numpy.Placeholder and pass the whole batch on every rank")
        batches = {self.shapes[i.name][0] for i in self.graph.input
                   if i.name in placeholders and self.shapes.get(i.name)}
        if len(batches) > 1:
            raise SplitError(f"job {job_name!r}: data-parallel training needs every placeholder "
                             f"to have the same first dimension (the batch); got {sorted(batches)}")
        self.batch = batches.pop() if batches else None
        for i in self.graph.input:
            self.kinds[i.name] = Split(0) if i.name in placeholders and \
                self.shapes.get(i.name) else WHOLE
        for name in self.constants:
            self.kinds.setdefault(name, WHOLE)
        self.nodes = []         # the rewritten node list
        self.new_initializers = []
        self.new_value_info = []
        # conversions made once per value, whatever number of nodes read them:
        self._rows = {}         # (whole value, axis, inner) -> the rank's rows of it
        self._converted = {}    # (partial value, "whole" | "sum") -> its collective / scaling
        self._count = 0
        self.node = None        # the node being rewritten (for errors and new names)
        self._producers = None  # value name -> (node, output index), made on first use

    # -- helpers -----------------------------------------------------------------------------
    def fail(self, why):
        node = self.node
        raise SplitError(f"job {self.job_name!r}: data-parallel training cannot split "
                         f"{node.op_type} {node.name!r} over the ranks: {why}",
                         location=_where(node))

    def fresh(self, stem):
        self._count += 1
        return f"{self.node.name or self.node.op_type}/split{self._count}/{stem}"

    def constant(self, array, stem="const"):
        name = self.fresh(stem)
        array = np.asarray(array)
        self.new_initializers.append(numpy_helper.from_array(array, name))
        self.constants[name] = array
        self.shapes[name] = array.shape
        self.kinds[name] = WHOLE
        return name

    def emit(self, op_type, inputs, like, kind, domain="", shape=None, **attrs):
        """A new node before the current one; its output has `like`'s dtype and shape
        (or `shape`, logical)."""
        out = self.fresh(op_type)
        node = helper.make_node(op_type, inputs, [out], domain=domain, **attrs)
        node.metadata_props.extend(self.node.metadata_props)
        self.nodes.append(node)
        self.shapes[out] = self.shapes.get(like) if shape is None else tuple(shape)
        self.dtypes[out] = self.dtypes.get(like)
        self.kinds[out] = kind
        if self.shapes[out] is not None and self.dtypes[out] is not None:
            # (stages read the types of the values that cross them: runtime/staged.py)
            self.new_value_info.append(helper.make_tensor_value_info(
                out, self.dtypes[out], list(self.shapes[out])))
        return out

    def scalar(self, value, like):
        dtype = helper.tensor_dtype_to_np_dtype(self.dtypes.get(like, onnx.TensorProto.FLOAT))
        return self.constant(np.array(value, dtype=dtype), "scale")

    def const_value(self, name):
        """The array of a constant input (an initializer or a Constant node's output)."""
        return self.constants.get(name) if name else None

    def producer(self, name):
        """(node, output index) of the graph's node that makes `name`, or (None, None)."""
        if self._producers is None:
            self._producers = {out: (node, i) for node in self.graph.node
                               for i, out in enumerate(node.output) if out}
        return self._producers.get(name, (None, None))

    def rank_of(self, name):
        if self.shapes.get(name) is None:
            self.fail(f"the shape of {name!r} is not known")
        return len(self.shapes[name])

    # -- conversions --------------------------------------------------------------------------
    def whole(self, name):
        """`name` as a whole value: partial values are all-reduced (a collective)."""
        kind = self.kinds[name]
        if kind == WHOLE:
            return name
        if isinstance(kind, Split):
            self.fail(f"it needs the whole batch of {name!r} (split over the ranks along axis "
                      f"{kind.axis}), which this rank does not have")
        key = (name, "whole")
        if key not in self._converted:
            collective = "AllReduceSum" if kind == SUM else "AllReduceMean"
            self._converted[key] = self.emit(collective, [name], name, WHOLE, domain=DOMAIN)
        return self._converted[key]

    def partial_sum(self, name):
        """`name` as a partial sum: a whole value or a partial mean divided by W."""
        if self.kinds[name] == SUM:
            return name
        key = (name, "sum")
        if key not in self._converted:
            self._converted[key] = self.emit(
                "Mul", [name, self.scalar(1.0 / self.ranks, name)], name, SUM)
        return self._converted[key]

    def rows(self, name, axis, inner):
        """This rank's share of the whole value `name` along `axis` (see Split)."""
        key = (name, axis, inner)
        if key not in self._rows:
            self._rows[key] = self._make_rows(name, axis, inner)
        return self._rows[key]

    def _make_rows(self, name, axis, inner):
        shape = self.shapes[name]
        outer = shape[axis] // (self.batch * inner)
        if outer * self.batch * inner != shape[axis]:
            self.fail(f"{name!r} of shape {shape} does not hold the batch ({self.batch}) "
                      f"along axis {axis}")
        share = self.batch // self.ranks
        atoms = shape[:axis] + (outer, self.batch, inner) + shape[axis + 1:]
        local = list(shape)
        local[axis] //= self.ranks
        array = self.const_value(name)
        if array is not None:
            part = array.reshape(atoms)[(slice(None),) * (axis + 1) +
                                        (slice(self.rank * share, (self.rank + 1) * share),)]
            out = self.constant(np.ascontiguousarray(part).reshape(local), "rows")
            self.kinds[out] = Split(axis, inner)
            self.shapes[out] = shape
            return out
        kind = Split(axis, inner)
        if outer == 1 and inner == 1:
            start, end, at = ([v] for v in (self.rank * share, (self.rank + 1) * share, axis))
            return self.emit("Slice", [name] + [self.constant(np.array(v, np.int64))
                                                for v in (start, end, at)], name, kind)
        # the batch as an axis of its own, the rank's rows of it, then the axes merged back
        atoms_out = self.emit("Reshape", [name, self.constant(np.array(atoms, np.int64))],
                              name, WHOLE, shape=atoms)
        start, end = self.rank * share, (self.rank + 1) * share
        part = self.emit("Slice", [atoms_out] + [self.constant(np.array([v], np.int64))
                                                 for v in (start, end, axis + 1)],
                         atoms_out, Split(axis + 1, inner), shape=atoms)
        out = self.emit("Reshape", [part, self.constant(np.array(local, np.int64))], name, kind)
        return out

    # -- the pass -------------------------------------------------------------------------------
    def run(self):
        for node in self.graph.node:
            self.node = node
            if node.op_type == "Constant" and node.domain == "":
                self._constant(node)
                continue
            if any(name and name not in self.kinds for name in node.input):
                missing = [n for n in node.input if n and n not in self.kinds]
                self.fail(f"its inputs {missing} are not known")
            rule = _RULES.get((node.domain, node.op_type))
            if rule is None:
                self._generic(node)
            else:
                rule(self, node)
        del self.graph.node[:]
        self.graph.node.extend(self.nodes)
        self.graph.initializer.extend(self.new_initializers)
        self.graph.value_info.extend(self.new_value_info)
        self._local_types()

    def _constant(self, node):
        for attr in node.attribute:
            if attr.name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(attr.t)
        self.kinds[node.output[0]] = WHOLE
        self.nodes.append(node)

    def _generic(self, node):
        for i, name in enumerate(node.input):
            if name:
                node.input[i] = self.whole(name)
        self.finish(node, [WHOLE] * len(node.output))

    def finish(self, node, kinds):
        self.nodes.append(node)
        for out, kind in zip(node.output, kinds):
            if out:
                self.kinds[out] = kind

    def _local_types(self):
        """Value shapes as this rank holds them (the split axes divided by W)."""
        for v in list(self.graph.input) + list(self.graph.value_info) + list(self.graph.output):
            kind = self.kinds.get(v.name)
            if isinstance(kind, Split) and v.type.HasField("tensor_type"):
                dim = v.type.tensor_type.shape.dim[kind.axis]
                dim.dim_value = dim.dim_value // self.ranks


def split_batch(model, placeholder_names, rank, ranks, job_name):
    """Rewrite `model` (an onnx ModelProto traced at the whole batch, in place) into rank
    `rank` of `ranks`'s part; returns {output name: kind} (WHOLE, SUM, MEAN or a Split)."""
    rewriter = _Rewriter(model, placeholder_names, rank, ranks, job_name)
    rewriter.run()
    return {o.name: rewriter.kinds[o.name] for o in model.graph.output}


def kind_while_tracing(graph, value, placeholder_names, ranks, job_name):
    """The kind `value` of an onnx_ir `graph` still being traced would have on `ranks`
    data-parallel ranks (None where the graph so far cannot be split): the graph up to
    here is split as the whole step will be, with `value` as its one output."""
    outputs = list(graph.outputs)
    graph.outputs.clear()
    graph.outputs.append(value)
    try:
        proto = ir.to_proto(ir.Model(graph, ir_version=8))  # compiler.IR_VERSION
    finally:
        graph.outputs.clear()
        graph.outputs.extend(outputs)
    try:
        return split_batch(proto, placeholder_names, 0, ranks, job_name)[value.name]
    except SplitError:
        return None
