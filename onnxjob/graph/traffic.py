"""The bytes a step moves through device memory, node by node: a model of where a GPU
step's time goes, computed from the graph alone.

On a GPU, every node that is not a convolution or a matrix product (COMPUTE_OPS; a
matrix-vector product is not one) runs at memory speed: its time is about the bytes it
reads and writes over the memory bandwidth (an H200's ~4.8 TB/s), so the sum of those
bytes is the part of a step that rewrites of the graph can move without a faster kernel.
`traffic(graph)` counts, for each node, each distinct input read once and each output
written once (a kernel that reads an input twice, as a batch norm's two statistics passes
may, counts once: a lower bound; a Gather reads the distinct rows it copies of its data);
views (memory_plan.ALIAS_OPS) move nothing. Nodes are
grouped by what made them, from the ORIGIN property the tracer records (graph/tracer.py):
the phase (forward, backward, update) and the op a composite expanded or whose gradient
rule ran, so that e.g. the batch norm's backward, the ReLU masks and the convolutions'
weight-gradient windows are told apart. A chain onnxruntime fuses into one kernel on the
CUDA EP counts as that kernel (`fused_chains`: the exact GELU, a transposed MatMul operand).
bench/traffic_model.py prints the table beside an estimate of PyTorch's passes.
"""
import collections
import dataclasses

import numpy as np
import onnx_ir as ir

from onnxjob.graph.memory_plan import ALIAS_OPS, value_bytes
from onnxjob.graph.tracer import ORIGIN

# ops that run at compute speed (cuDNN's convolutions, cuBLAS's products)
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "FusedMatMul", "Einsum"})
# readable names of the origins the groups are named after
_NAMES = {"onnxjob.BatchNormTrain": "batch norm", "Relu": "ReLU", "Add": "add",
          "MaxPool": "max pool", "AveragePool": "average pool", "Conv": "convolution",
          "onnxjob.Gelu": "GELU", "onnxjob.SoftmaxCrossEntropy": "loss",
          "onnxjob.SparseCrossEntropy": "loss", "onnxjob.SparseSoftmaxCrossEntropy": "loss",
          "onnxjob.SigmoidCrossEntropy": "loss",
          "LayerNormalization": "layer norm"}


@dataclasses.dataclass
class NodeTraffic:
    node: object
    group: str
    read: int
    written: int
    fused_away: bool = False    # no kernel of its own: fused into another's, or folded

    @property
    def moved(self):
        return self.read + self.written


def origin(node):
    """(phase, op) a node is part of: its ORIGIN property, else ("forward", its op)."""
    phase, _, op = node.metadata_props.get(ORIGIN, "forward").partition(":")
    return phase, op or None


def at_compute_speed(node):
    """Whether `node` runs at compute speed: a COMPUTE_OPS node but a matrix-vector
    product (a result with a last or second-to-last dimension of 1: one row or column of
    products, which reads its matrix once at memory speed)."""
    if node.op_type not in COMPUTE_OPS:
        return False
    shape = node.outputs[0].shape
    dims = list(shape) if shape is not None else []
    return not (node.op_type in ("MatMul", "Gemm") and len(dims) >= 2 and 1 in dims[-2:])


def group_of(node):
    """The group a node's traffic is counted in (see the module docstring)."""
    phase, op = origin(node)
    if at_compute_speed(node):
        return "convolutions and matmuls (compute)"
    if node.op_type == "Cast":
        return "casts"
    if phase == "update":
        return "optimizer"
    name = _NAMES.get(op or node.op_type, op or node.op_type)
    if phase == "backward" and op == "Conv":
        return "backward convolution (weight-gradient windows)"
    return f"{phase} {name}"


def node_traffic(node):
    """(bytes read, bytes written) of one node (0, 0 for a view)."""
    if node.op_type in ALIAS_OPS:
        return 0, 0
    inputs = {id(v): v for v in node.inputs if v is not None}
    read = sum(value_bytes(v) or 0 for v in inputs.values())
    written = sum(value_bytes(v) or 0 for v in node.outputs)
    if node.op_type == "Gather" and not node.domain and node.inputs[0] is not None:
        data = value_bytes(node.inputs[0]) or 0
        read += _gathered_bytes(node, data, written) - data
    return read, written


def _gathered_bytes(node, data, written):
    """The bytes of its data a Gather reads: the rows it copies, each distinct one once,
    not the whole data (an embedding table; one chunk of a weight gradient's windows,
    conv_weight_grad.COLUMN_CHUNK_BYTES), and at most what it writes."""
    indices, shape = node.inputs[1], node.inputs[0].shape
    axis = node.attributes.get_int("axis", 0)
    if indices is None or indices.const_value is None or shape is None or \
            not isinstance(shape[axis], int) or not shape[axis]:
        return min(data, written)
    rows = len(np.unique(indices.const_value.numpy()))
    return min(data, written, data // shape[axis] * rows)


def hidden_kernels(node):
    """Small kernels the CUDA EP launches for `node` besides its own: a half
    BatchNormalization casts its scale, B, mean and var to float32 one kernel each before
    cuDNN's (cuDNN takes float32 parameters for half data, and the kernel is registered
    for parameters of X's type only: core/providers/cuda/nn/batch_norm.cc), so a
    per-channel affine made of one costs five launches."""
    if node.op_type == "BatchNormalization" and not node.domain and node.inputs and \
            node.inputs[0] is not None and node.inputs[0].type is not None and \
            node.inputs[0].type.dtype == ir.DataType.FLOAT16:
        return 4
    return 0


# a kernel moving at most this many bytes takes about its launch's time on a GPU
SMALL_KERNEL_BYTES = 256 << 10
# pieces a CUDA Concat or Split passes to its kernel as arguments when they are equal
_SAME_SIZE_PIECES = 32


def host_table_bytes(node):
    """Bytes onnxruntime's CUDA EP builds on the host and copies to the device each run for
    `node`: a Concat or Split of pieces of different sizes along the axis, or of more than
    32, fills a table of every index along the axis (8 bytes each; core/providers/cuda/
    tensor/concat.cc, split.cc); equal pieces, 32 at most, take none. 0 for other nodes."""
    if node.op_type not in ("Concat", "Split"):
        return 0
    whole = node.outputs[0] if node.op_type == "Concat" else node.inputs[0]
    pieces = node.inputs if node.op_type == "Concat" else node.outputs
    axis = node.attributes["axis"].value if "axis" in node.attributes else 0
    if whole.shape is None or len(pieces) < 2 or any(p.shape is None for p in pieces):
        return 0
    axis %= len(whole.shape)
    sizes = {p.shape[axis] for p in pieces}
    if len(sizes) == 1 and len(pieces) <= _SAME_SIZE_PIECES:
        return 0
    return 8 * int(whole.shape[axis])


@dataclasses.dataclass
class Traffic:
    nodes: list     # [NodeTraffic]

    def by_group(self):
        """{group: (nodes, bytes moved)}, largest first."""
        count, moved = collections.Counter(), collections.Counter()
        for t in self.nodes:
            count[t.group] += 1
            moved[t.group] += t.moved
        return {g: (count[g], b) for g, b in moved.most_common()}

    def memory_bound_bytes(self):
        """Bytes moved by the nodes that run at memory speed (all but at_compute_speed's)."""
        return sum(t.moved for t in self.nodes if not at_compute_speed(t.node))

    def compute_bytes(self):
        return sum(t.moved for t in self.nodes if at_compute_speed(t.node))

    def kernels(self, small=SMALL_KERNEL_BYTES):
        """(kernels a step launches, those that move at most `small` bytes): every node
        but views, the nodes fused into another's kernel and those constant folding
        computes at session creation, plus the small kernels a node launches inside its
        own (`hidden_kernels`). A small kernel's time is its launch and drain, a few
        microseconds on a GPU however few bytes it moves."""
        by_op = self.kernels_by_op(small)
        return (sum(k for k, _ in by_op.values()), sum(s for _, s in by_op.values()))

    def kernels_by_op(self, small=SMALL_KERNEL_BYTES):
        """{(group, op type): (kernels, small ones)} as `kernels` counts them, most
        launches first; a node's hidden kernels under (group, "<op> (inside)")."""
        launches, few = collections.Counter(), collections.Counter()
        for t in self.nodes:
            if t.node.op_type in ALIAS_OPS or t.fused_away:
                continue
            key = (t.group, t.node.op_type)
            launches[key] += 1
            few[key] += t.moved <= small
            hidden = hidden_kernels(t.node)
            if hidden:     # (small however large the node)
                inside = (t.group, f"{t.node.op_type} (inside)")
                launches[inside] += hidden
                few[inside] += hidden
        return {key: (count, few[key]) for key, count in launches.most_common()}

    def host_table_bytes(self):
        """Bytes of the index tables the step's Concat and Split nodes copy from the host
        each run (`host_table_bytes`): host work and a copy per node outside CUDA graphs,
        a copy per node in a replay."""
        return sum(host_table_bytes(t.node) for t in self.nodes if not t.fused_away)



def traffic(graph):
    """The Traffic of one run of `graph` (an onnx_ir Graph with static shapes). The chains
    onnxruntime's optimizer fuses into one kernel on the CUDA EP (`fused_chains`) count as
    that kernel: its last node reads the chain's inputs and writes its output, the others
    move nothing."""
    fused = fused_chains(graph)
    folded = constant_nodes(graph)
    counted = []
    for node in graph:
        read, written = node_traffic(node)
        if id(node) in fused:
            read, written = fused[id(node)]
        if id(node) in folded:
            read, written = 0, 0
        counted.append(NodeTraffic(node, group_of(node), read, written,
                                   id(node) in folded or
                                   id(node) in fused and fused[id(node)] == (0, 0)))
    return Traffic(counted)


_RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                         "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"})


def constant_nodes(graph):
    """ids of the nodes whose inputs are all constants (initializers, constant values, or
    outputs of such nodes): onnxruntime's constant folding computes them once, at session
    creation (under mixed precision, the casts of constant per-channel vectors)."""
    constant = {id(v) for v in graph.initializers.values()}
    folded = set()
    for node in graph:
        if node.op_type in _RANDOM_OPS or node.domain not in ("", "ai.onnx"):
            continue
        inputs = [v for v in node.inputs if v is not None]
        if all(id(v) in constant or v.const_value is not None for v in inputs) and \
                (inputs or node.op_type == "Constant"):
            folded.add(id(node))
            constant.update(id(v) for v in node.outputs)
    return folded


def fused_chains(graph):
    """{id(node): (bytes read, bytes written)} for the nodes onnxruntime's optimizer fuses
    into another kernel on the CUDA EP (as on the CPU EP): the chains its GeluFusion makes
    one Gelu kernel of, y = (x * (erf(x / sqrt(2)) + 1)) * 0.5 in any operand order with
    every inner value read by the chain alone (graph/primitives/elementwise.py's
    gelu_formula emits it), and a Transpose of the last two axes that one MatMul alone
    reads, which its MatmulTransposeFusion folds into the product (FusedMatMul)."""
    fused = {}
    for node in graph:
        if _transposed_for_matmul(node):
            fused[id(node)] = (0, 0)
            continue
        chain = _gelu_chain(node)
        if chain is None:
            continue
        x = chain[0].inputs[0]
        for part in chain[:-1]:
            fused[id(part)] = (0, 0)
        fused[id(node)] = (value_bytes(x) or 0, value_bytes(node.outputs[0]) or 0)
    return fused


def _transposed_for_matmul(node):
    if node.op_type != "Transpose" or node.domain:
        return False
    perm = node.attributes.get("perm")
    perm = list(perm.as_ints()) if perm is not None else None
    rank = len(perm) if perm else 0
    if rank < 2 or perm != list(range(rank - 2)) + [rank - 1, rank - 2]:
        return False
    out = node.outputs[0]
    uses = out.uses()
    return (not out.is_graph_output() and len(uses) == 1 and
            uses[0].node.op_type == "MatMul" and not uses[0].node.domain)


def _gelu_chain(last):
    """[Div, Erf, Add, Mul, Mul] ending at `last`, or None."""
    inner = _other_operand(last, "Mul", 0.5)
    if inner is None:
        return None
    mul = _only_reader_producer(inner, "Mul")
    if mul is None:
        return None
    for x, plus in (mul.inputs, reversed(mul.inputs)):
        add = _only_reader_producer(plus, "Add")
        erf_out = _other_operand(add, "Add", 1.0)
        erf = _only_reader_producer(erf_out, "Erf") if erf_out is not None else None
        div = _only_reader_producer(erf.inputs[0], "Div") if erf is not None else None
        if div is not None and div.inputs[0] is x and _is_constant(div.inputs[1], 2 ** 0.5):
            return [div, erf, add, mul, last]
    return None


def _other_operand(node, op_type, constant):
    """The other operand of a binary `op_type` node with one constant operand equal to
    `constant`, else None."""
    if node is None or node.op_type != op_type or node.domain or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if _is_constant(b, constant):
        return a
    return b if _is_constant(a, constant) else None


def _only_reader_producer(value, op_type):
    """The `op_type` node making `value` when one node reads it and it is no graph output."""
    if value is None or value.is_graph_output() or len(value.uses()) != 1:
        return None
    node = value.producer()
    return node if node is not None and node.op_type == op_type and not node.domain else None


def _is_constant(value, number):
    """Whether `value` is a one-element constant `number`, or a Cast of one (which
    onnxruntime's constant folding makes a constant before it fuses)."""
    cast = value.producer() if value is not None else None
    if cast is not None and cast.op_type == "Cast" and not cast.domain:
        value = cast.inputs[0]
    if value is None or value.const_value is None:
        return False
    array = value.const_value.numpy()
    return array.size == 1 and abs(float(array.reshape(())) - number) <= 1e-3 * abs(number)
