"""A traced predict graph with its batch axis made symbolic (`function_config.dynamic_batch`,
`flow.export(..., dynamic_batch=True)`).

A job is traced at its placeholders' shapes, so the batch size B (the placeholders' common
first dimension) is a number in the graph: in the inputs' and outputs' shapes, and in the
constants that carry it, such as the shape of `flow.reshape(x, (x.shape[0], -1))`.
`make_batch_symbolic` rewrites a ModelProto so that it runs on any number of rows:

* every placeholder input and every output gets the symbolic first dimension `batch`;
* each Reshape whose input carries the batch gets a constant target shape with -1 at the
  axis that carries it (found from the traced shapes: the output axis whose leading
  product equals the input's product before its batch axis), the others concrete;
* the graph is then checked: ONNX's shape inference runs node by node with B + 1 rows,
  and every output must have B + 1 rows and otherwise its traced shape. A node that does
  not infer, or an output that does not keep the rows (a reduction over the batch, a
  constant sized by the batch), raises a TraceError naming the op and the user's line.
"""
import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from onnxjob.errors import TraceError

BATCH_DIM = "batch"


def placeholder_batch(proto, placeholder_names, job_name):
    """B, the first dimension that every placeholder input of `proto` shares."""
    inputs = {v.name: v for v in proto.graph.input}
    batches = {}
    for name in placeholder_names:
        value = inputs.get(name)
        if value is None:
            continue        # a placeholder the graph does not read
        if not value.type.HasField("tensor_type"):
            raise TraceError(f"job {job_name!r}: dynamic batch needs tp.Numpy placeholders; "
                             f"{name!r} is not a tensor")
        dims = value.type.tensor_type.shape.dim
        if not dims or not dims[0].HasField("dim_value"):
            raise TraceError(f"job {job_name!r}: dynamic batch needs placeholders with a batch "
                             f"axis; {name!r} has shape {_dims(value.type)}")
        batches[name] = dims[0].dim_value
    if not batches:
        raise TraceError(f"job {job_name!r}: dynamic batch needs at least one placeholder")
    if len(set(batches.values())) > 1:
        raise TraceError(f"job {job_name!r}: dynamic batch needs every placeholder to have "
                         f"the same first dimension (the batch); got {batches}")
    return next(iter(batches.values()))


def make_batch_symbolic(proto, placeholder_names, job_name, row_outputs=None):
    """Rewrite `proto` (in place) to take any number of rows (module docstring).

    `row_outputs`: the outputs that must keep the rows (default: all); the others (watches)
    must keep the rows or not depend on them. Returns B, the traced batch size."""
    graph = proto.graph
    batch = placeholder_batch(proto, placeholder_names, job_name)
    other = batch + 1
    row_outputs = set(o.name for o in graph.output) if row_outputs is None else set(row_outputs)
    placeholders = set(placeholder_names)
    opsets = list(proto.opset_import)
    opset_of = {o.domain: o.version for o in opsets}

    traced = {}     # value name -> static shape at B (a tuple), where known
    for v in list(graph.input) + list(graph.value_info) + list(graph.output):
        shape = _static(v.type)
        if shape is not None:
            traced[v.name] = shape
    inits = {t.name: t for t in graph.initializer}
    for t in graph.initializer:
        traced[t.name] = tuple(t.dims)
    if any(n.output and n.output[0] not in traced for n in graph.node):
        inferred = shape_inference.infer_shapes(proto)
        for v in inferred.graph.value_info:
            shape = _static(v.type)
            if shape is not None:
                traced.setdefault(v.name, shape)

    types = {}      # value name -> TypeProto with `other` rows
    data = {}       # small integer constants (shape inference reads them)
    for v in graph.input:
        t = onnx.TypeProto()
        t.CopyFrom(v.type)
        if v.name in placeholders:
            t.tensor_type.shape.dim[0].dim_value = other
        types[v.name] = t
    for t in graph.initializer:
        types[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and \
                int(np.prod(t.dims)) <= 64:
            data[t.name] = t

    new_inits = []
    for node in graph.node:
        where = _where(node)
        if node.op_type == "Constant" and node.domain == "":
            tensor = _constant_tensor(node)
            if tensor is not None:
                tensor.name = node.output[0]
                types[node.output[0]] = onnx.helper.make_tensor_type_proto(
                    tensor.data_type, list(tensor.dims))
                data[node.output[0]] = tensor
                continue
        if node.op_type == "Reshape" and node.domain == "":
            replaced = _batch_free_reshape(node, traced, types, inits, data, batch, job_name)
            if replaced is not None:
                new_inits.append(replaced)
                types[replaced.name] = onnx.helper.make_tensor_type_proto(
                    replaced.data_type, list(replaced.dims))
                data[replaced.name] = replaced
                node.input[1] = replaced.name
        try:
            schema = onnx.defs.get_schema(node.op_type, opset_of.get(node.domain, 1), node.domain)
        except Exception:
            raise TraceError(f"job {job_name!r}: dynamic batch: op {node.op_type} "
                             f"({node.domain or 'onnx'}) has no shape rule to check the graph "
                             "with another batch size", location=where) from None
        try:
            out = shape_inference.infer_node_outputs(
                schema, node, {k: types[k] for k in node.input if k},
                {k: data[k] for k in node.input if k in data}, opset_imports=opsets,
                ir_version=proto.ir_version)
        except Exception as e:
            shapes = {k: _dims(types[k]) for k in node.input if k}
            raise TraceError(f"job {job_name!r}: dynamic batch: {node.op_type} {node.name!r} "
                             f"cannot run with {other} rows instead of {batch} (inputs {shapes}): "
                             f"{str(e).strip().splitlines()[-1]}; does the job use the batch "
                             "size as a number (a shape, a slice, a constant)?",
                             location=where) from None
        for name in node.output:
            if name:
                if name not in out or _static(out[name]) is None:
                    raise TraceError(f"job {job_name!r}: dynamic batch: the shape of "
                                     f"{node.op_type} {node.name!r}'s output {name!r} is not "
                                     f"known with {other} rows", location=where)
                types[name] = out[name]

    producer = {o: n for n in graph.node for o in n.output}
    for value in graph.output:
        before, after = traced.get(value.name), _static(types.get(value.name, onnx.TypeProto()))
        if before is None or after is None:
            raise TraceError(f"job {job_name!r}: dynamic batch: the shape of output "
                             f"{value.name!r} is not known")
        if before == after and value.name not in row_outputs:
            continue
        if not (before and before[0] == batch and after[0] == other and before[1:] == after[1:]):
            node = producer.get(value.name)
            raise TraceError(
                f"job {job_name!r}: dynamic batch: output {value.name!r} has shape {before} "
                f"with {batch} rows and {after} with {other}; a dynamic-batch job must return "
                "one row per input row (no reduction over the batch, no constant sized by it)",
                location=_where(node) if node is not None else None)
        value.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    for value in graph.input:
        if value.name in placeholders:
            value.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    # the traced intermediate shapes hold B: onnxruntime infers them again
    del graph.value_info[:]
    graph.initializer.extend(new_inits)
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output} | \
        {v.name for v in graph.input}
    kept = [t for t in graph.initializer if t.name in used]
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return batch


def fix_batch(proto, batch):
    """Give the symbolic batch dimension of `proto`'s inputs and outputs the value `batch`."""
    for value in list(proto.graph.input) + list(proto.graph.output):
        if value.type.HasField("tensor_type"):
            for dim in value.type.tensor_type.shape.dim:
                if dim.dim_param == BATCH_DIM:
                    dim.dim_value = batch


def is_symbolic(proto):
    return any(d.dim_param == BATCH_DIM for v in proto.graph.input
               if v.type.HasField("tensor_type") for d in v.type.tensor_type.shape.dim)


def _batch_free_reshape(node, traced, types, inits, data, batch, job_name):
    """A new shape initializer for Reshape `node` whose input carries the batch (None when
    it does not); raises when the batch axis cannot be found in the target."""
    where = _where(node)
    src, shape_name, out = node.input[0], node.input[1], node.output[0]
    before, after = traced.get(src), _static(types.get(src, onnx.TypeProto()))
    if before is None or after is None or before == after:
        return None
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    target = traced.get(out)
    if shape_name not in inits and shape_name not in data or target is None or \
            len(changed) != 1 or len(before) != len(after):
        raise TraceError(f"job {job_name!r}: dynamic batch: Reshape {node.name!r} of an input "
                         f"of shape {before} to a shape that is not a traced constant",
                         location=where)
    axis = changed[0]
    lead = int(np.prod(before[:axis]))
    for j in range(len(target) if before[axis] % batch == 0 else 0):
        if int(np.prod(target[:j])) > lead:
            break
        if int(np.prod(target[:j])) == lead and target[j] % batch == 0:
            new = np.array(target, dtype=np.int64)
            new[j] = -1     # the other axes are the traced numbers, none of them the batch
            return numpy_helper.from_array(new, f"{node.name}/batch_free_shape")
    raise TraceError(f"job {job_name!r}: dynamic batch: Reshape {node.name!r} from {before} "
                     f"to {target} mixes the batch axis ({axis}) with other axes; keep the "
                     "batch as the leading factor of one axis", location=where)


def _constant_tensor(node):
    for attr in node.attribute:
        if attr.name == "value":
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attr.t)
            return tensor
    return None


def _static(type_proto):
    """The static shape (a tuple of ints) of a tensor type, None if not fully known."""
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = type_proto.tensor_type.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(d.dim_value for d in dims)


def _dims(type_proto):
    if not type_proto.HasField("tensor_type"):
        return "?"
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in type_proto.tensor_type.shape.dim)


def _where(node):
    for prop in node.metadata_props:
        if prop.key == "source":
            return prop.value
    return "<unknown>"
