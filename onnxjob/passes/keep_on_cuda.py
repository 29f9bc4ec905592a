"""KeepOnCuda: rewrite the nodes onnxruntime's CUDA EP would leave to the CPU or fail on.

Runs only for jobs compiled for the CUDA EP. A node the CUDA EP does not take runs on the
CPU with a copy each way, and a step with any CPU node cannot be captured as a CUDA graph;
on ResNet50 (batch 64) three CPU ConvTransposes made the train step 8x slower.

Rewrite cases (exact: the same values, other kernels):
- MaxUnpool (the gradient of a non-overlapping MaxPool; no CUDA kernel)
      -> Reshape(ScatterElements(zeros(N), flat indices, flat gradient, axis=0), shape)
  where the zeros are Cast(Less(x, x)) of the MaxPool's input x when the indices come
  from one (false everywhere, NaN and inf included: made by each run, where onnxruntime
  would fold a ConstantOfShape into an initializer of x's size kept for the session);
  a MaxUnpool of constant zeros (the max pool gradient's zeros) is those zeros alone
- ConvTranspose with pads that differ at the two ends of an axis (the input gradient of
  a strided convolution; the CUDA kernel takes symmetric pads only)
      -> Slice(ConvTranspose with the smaller pad at both ends)
- ScatterND on data that is not float32/float16 (the CUDA kernel is registered for every
  type but fails at run time for int8, int32, int64 and float64)
      -> ScatterElements over the data seen as (rows addressed by the indices, rest)
- Concat of more than 32 inputs (the CUDA kernel refuses them while a CUDA graph is
  captured; a 7x7 convolution's weight-gradient columns concatenate 49)
      -> Concat of Concats of at most 32 inputs each
"""
import numpy as np
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import NodeEmitter, attr, const_array, replace_value, static_shape

_SCATTER_ND_ON_CUDA = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


def _max_unpool(graph, node):
    shape = static_shape(node.outputs[0])
    grad, indices = node.inputs[0], node.inputs[1]
    if shape is None or static_shape(grad) is None:
        return None
    e = NodeEmitter(graph, node, "cuda")
    dtype = grad.type.dtype
    total = int(np.prod(shape))
    flat = e.const(np.array([-1], np.int64))
    pooled = _pooled_input(indices, shape)
    if pooled is None:
        zeros = e.node("ConstantOfShape", [e.const(np.array([total], np.int64))], (total,),
                       dtype, value=ir.tensor(np.zeros(1, dtype.numpy())))
    else:
        false = e.node("Less", [pooled, pooled], shape, ir.DataType.BOOL)
        zeros_shaped = e.node("Cast", [false], shape, dtype, to=dtype)
        few = const_array(grad)
        if few is not None and not few.any():
            # zeros unpooled (the max pool gradient's zeros made at run time, graph/
            # primitives/pooling.py): the zeros themselves, no scatter copying them
            return zeros_shaped
        zeros = e.node("Reshape", [zeros_shaped, flat], (total,), dtype)
    flat_size = int(np.prod(static_shape(grad)))
    flat_idx = e.node("Reshape", [indices, flat], (flat_size,), ir.DataType.INT64)
    flat_grad = e.node("Reshape", [grad, flat], (flat_size,), dtype)
    scattered = e.node("ScatterElements", [zeros, flat_idx, flat_grad], (total,), dtype, axis=0)
    return e.node("Reshape", [scattered, e.const(np.array(shape, np.int64))], shape, dtype)


def _pooled_input(indices, shape):
    """The input of the MaxPool whose Indices (or a Slice of them) `indices` are, when it
    has the unpooled `shape`; else None."""
    source = indices.producer()
    while source is not None and source.op_type == "Slice":
        source = source.inputs[0].producer()
    if source is None or source.op_type != "MaxPool" or \
            static_shape(source.inputs[0]) != tuple(shape):
        return None
    return source.inputs[0]


def _asymmetric_conv_transpose(graph, node):
    pads = attr(node, "pads")
    shape = static_shape(node.outputs[0])
    if not pads or shape is None:
        return None
    nd = len(pads) // 2
    begin, end = pads[:nd], pads[nd:]
    if begin == end:
        return None
    low = [min(b, f) for b, f in zip(begin, end)]
    wide = list(shape[:2]) + [shape[2 + i] + (begin[i] - low[i]) + (end[i] - low[i])
                              for i in range(nd)]
    attributes = {name: a.value for name, a in node.attributes.items()}
    attributes["pads"] = low + low
    e = NodeEmitter(graph, node, "cuda")
    dtype = node.outputs[0].type.dtype
    full = e.node("ConvTranspose", list(node.inputs), wide, dtype, **attributes)
    starts = [begin[i] - low[i] for i in range(nd)]
    ends = [starts[i] + shape[2 + i] for i in range(nd)]
    axes = list(range(2, 2 + nd))
    return e.node("Slice", [full, e.const(np.array(starts, np.int64)),
                            e.const(np.array(ends, np.int64)), e.const(np.array(axes, np.int64))],
                  shape, dtype)


def _scatter_nd(graph, node):
    data, indices, updates = node.inputs[:3]
    d_shape, i_shape, u_shape = static_shape(data), static_shape(indices), static_shape(updates)
    if data.type is None or data.type.dtype in _SCATTER_ND_ON_CUDA or \
            None in (d_shape, i_shape, u_shape):
        return None
    k = i_shape[-1]
    rows, rest = int(np.prod(i_shape[:-1])), list(d_shape[k:])
    strides = [int(np.prod(d_shape[j + 1:k])) for j in range(k)]
    e = NodeEmitter(graph, node, "cuda")
    dtype, int64 = data.type.dtype, ir.DataType.INT64
    if indices.type.dtype != int64:
        indices = e.node("Cast", [indices], i_shape, int64, to=int64)
    weighted = e.node("Mul", [indices, e.const(np.array(strides, np.int64))], i_shape, int64)
    linear = e.node("ReduceSum", [weighted, e.const(np.array([-1], np.int64))],
                    i_shape[:-1], int64, keepdims=0)
    column = e.node("Reshape", [linear, e.const(np.array([rows] + [1] * len(rest), np.int64))],
                    [rows] + [1] * len(rest), int64)
    spread = e.node("Expand", [column, e.const(np.array([rows] + rest, np.int64))],
                    [rows] + rest, int64)
    flat_updates = e.node("Reshape", [updates, e.const(np.array([rows] + rest, np.int64))],
                          [rows] + rest, dtype)
    table_shape = [int(np.prod(d_shape[:k]))] + rest
    table = e.node("Reshape", [data, e.const(np.array(table_shape, np.int64))], table_shape, dtype)
    reduction = attr(node, "reduction", "none")
    extra = {} if reduction == "none" else {"reduction": reduction}
    scattered = e.node("ScatterElements", [table, spread, flat_updates], table_shape, dtype,
                       axis=0, **extra)
    return e.node("Reshape", [scattered, e.const(np.array(d_shape, np.int64))], d_shape, dtype)


CONCAT_INPUTS_IN_CUDA_GRAPHS = 32


def _wide_concat(graph, node):
    inputs = list(node.inputs)
    if len(inputs) <= CONCAT_INPUTS_IN_CUDA_GRAPHS:
        return None
    shapes = [static_shape(v) for v in inputs]
    out = node.outputs[0]
    if None in shapes or out.type is None:
        return None
    axis = attr(node, "axis") % len(shapes[0])
    e = NodeEmitter(graph, node, "cuda")

    def concat(values, value_shapes):
        if len(values) == 1:
            return values[0]
        shape = list(value_shapes[0])
        shape[axis] = sum(s[axis] for s in value_shapes)
        return e.node("Concat", values, shape, out.type.dtype, axis=axis)
    width = CONCAT_INPUTS_IN_CUDA_GRAPHS
    groups = [concat(inputs[i:i + width], shapes[i:i + width])
              for i in range(0, len(inputs), width)]
    return concat(groups, [static_shape(g) for g in groups])


_REWRITES = {"MaxUnpool": _max_unpool, "ConvTranspose": _asymmetric_conv_transpose,
             "ScatterND": _scatter_nd, "Concat": _wide_concat}


class KeepOnCuda(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for node in list(graph):
            rewrite = _REWRITES.get(node.op_type)
            if rewrite is None or node.graph is None:
                continue
            replacement = rewrite(graph, node)
            if replacement is None:
                continue
            if not replace_value(node.outputs[0], replacement):
                continue        # left for RemoveUnusedNodes: the old node stays correct
            graph.remove(node, safe=True)
            modified = True
        return PassResult(model, modified)
