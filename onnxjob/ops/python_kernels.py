"""Ops whose kernel is a Python function: OneFlow's custom ops with a Python kernel
(`flow.experimental.custom_op_module(...).py_kernel()`, frontend/custom_op_module.py).

Such an op runs inside onnxruntime as a custom op of onnxruntime-extensions (`PyOp`, the
domain "ai.onnx.contrib"): onnxruntime calls the Python function with the inputs as NumPy
arrays, mid-graph, on the CPU. It is the field's way to run Python in an onnxruntime graph;
the plain onnxruntime wheel has no Python op of its own, so the package is an extra
(`pip install 'onnxjob[pyop]'`), imported only when a program defines such an op.

The nodes are of a fixed catalog of node types, `OneFlowPyKernel_<inputs>_<outputs>`
(up to 8 inputs and 4 outputs), all registered with onnxruntime-extensions at the first
such op; a node's string attribute `kernel` names the Python kernel it calls (a registry
here). NOTE: a fixed catalog, because onnxruntime-extensions keeps its custom op
definitions in one growing array: an op type registered while a session made with an
earlier one exists left that session's kernels pointing at freed memory, and freeing the
session crashed the process. The catalog's inputs and outputs are float64 (the graph casts
to and from the blobs' dtypes around the node; the kernel gets and returns arrays of the
blobs' own dtypes): integers pass exactly up to 2**53 in magnitude.

The output shapes and dtypes are what the kernel returns for inputs of ones of the traced
shapes (OneFlow takes them from the op's C++ shape rule, which onnxjob does not compile: a
kernel whose output shape depends on the values gets the shape it has for ones); at run
time outputs are cast to those dtypes.

A model that holds such a node runs where onnxruntime-extensions and the kernel's Python
code are.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.graph import registry
from onnxjob.graph.tracer import op
from onnxjob.runtime import custom_op_libraries
from onnxjob.source_info import user_location, warn_at_user_line

DOMAIN = "ai.onnx.contrib"
_EXTRA = "pip install 'onnxjob[pyop]' (onnxruntime-extensions)"

MAX_INPUTS, MAX_OUTPUTS = 8, 4
# the `kernel` attribute -> (kernel, input dtypes, output dtypes, output shapes)
_kernels = {}
_gradients = {}   # the `kernel` attribute -> the gradient rule of the op (emit), or None
_catalog = []     # [True] once the catalog is registered with onnxruntime-extensions


def extensions():
    """onnxruntime_extensions, or UnsupportedAPIError saying which extra to install."""
    try:
        import onnxruntime_extensions
    except ImportError:
        raise UnsupportedAPIError(
            f"{user_location()}: a custom op with a Python kernel runs in onnxruntime as an "
            f"onnxruntime-extensions PyOp: {_EXTRA}") from None
    return onnxruntime_extensions


def emit(op_type_name, kernel, inputs, num_outputs, gradient=None):
    """The outputs of op type `op_type_name` computed by `kernel(tuple of arrays)` on the
    Blobs `inputs`, as a node of the job being traced. `gradient(inputs, outputs,
    output_grads) -> input grads (Blob or None each)`, over Blobs of the op's own dtypes,
    is its gradient rule (None: a train job cannot differentiate through it)."""
    if not 1 <= len(inputs) <= MAX_INPUTS or not 1 <= num_outputs <= MAX_OUTPUTS:
        raise TraceError(f"{user_location()}: op type {op_type_name!r}: a Python kernel "
                         f"takes 1 to {MAX_INPUTS} inputs and makes 1 to {MAX_OUTPUTS} "
                         f"outputs here, not {len(inputs)} and {num_outputs}")
    probe = tuple(np.ones(x.shape, x.np_dtype) for x in inputs)
    try:
        outputs = _as_tuple(kernel(probe))
    except Exception as e:
        raise TraceError(f"{user_location()}: the Python kernel of op type {op_type_name!r} "
                         f"failed on inputs of ones of shapes "
                         f"{[x.shape for x in inputs]} (onnxjob runs it once so to learn its "
                         f"outputs' shapes): {type(e).__name__}: {e}") from e
    if len(outputs) != num_outputs:
        raise TraceError(f"{user_location()}: the Python kernel of op type {op_type_name!r} "
                         f"returns {len(outputs)} array(s); the op declares {num_outputs}")
    out_types = [(tuple(np.shape(o)), _dtype(np.asarray(o).dtype, op_type_name))
                 for o in outputs]
    _register_catalog()
    key = _kernel_key(op_type_name, (kernel, tuple(x.np_dtype for x in inputs),
                                     tuple(dt for _, dt in out_types),
                                     tuple(shape for shape, _ in out_types)))
    node_type = f"{DOMAIN}.OneFlowPyKernel_{len(inputs)}_{num_outputs}"
    as_double = [op("Cast", x, to=dtypes.float64.ir_dtype.value) for x in inputs]
    _gradients[key] = gradient
    made = op(node_type, *as_double, num_outputs=num_outputs, kernel=key)
    made = list(made) if num_outputs > 1 else [made]
    return [op("Cast", b, to=dtypes.from_numpy(dt).ir_dtype.value)
            for b, (_, dt) in zip(made, out_types)]


def _kernel_key(op_type_name, entry):
    """The `kernel` attribute of a node calling `entry` = (kernel, input dtypes, output
    dtypes, output shapes): one per distinct entry."""
    for key, known in _kernels.items():
        if known[0] is entry[0] and known[1:] == entry[1:]:
            return key
    key = f"{op_type_name}#{len(_kernels)}"
    _kernels[key] = entry
    return key


def _register_catalog():
    """Register the catalog's node types with onnxruntime-extensions and as primitives of
    the tracer (once)."""
    if _catalog:
        return
    ortx = extensions()
    kinds = ortx.PyCustomOpDef
    for n_in in range(1, MAX_INPUTS + 1):
        for n_out in range(1, MAX_OUTPUTS + 1):
            node_type = f"OneFlowPyKernel_{n_in}_{n_out}"
            ortx.onnx_op(op_type=node_type, inputs=[kinds.dt_double] * n_in,
                         outputs=[kinds.dt_double] * n_out,
                         attrs={"kernel": kinds.dt_string})(_call)
            registry.register(f"{DOMAIN}.{node_type}", _carried_types, _gradient,
                              domain=DOMAIN)
    custom_op_libraries.add(ortx.get_library_path())
    _catalog.append(True)


def _call(*arrays, kernel):
    """A catalog node's computation: the kernel named `kernel` on the inputs in their
    blobs' dtypes; its outputs as float64 (the graph casts them back)."""
    function, in_dtypes, out_dtypes, _ = _kernels[kernel]
    args = tuple(np.asarray(a).astype(dt) for a, dt in zip(arrays, in_dtypes))
    results = _as_tuple(function(args))
    out = [np.ascontiguousarray(np.asarray(r, dtype=dt), dtype=np.float64)
           for r, dt in zip(results, out_dtypes)]
    return out[0] if len(out) == 1 else tuple(out)


def _carried_types(inputs, attrs, num_outputs):
    """A catalog node's outputs: the kernel's shapes, as float64."""
    return [(shape, np.float64) for shape in _kernels[attrs["kernel"]][3]]


def warn_if_exported(proto, path):
    """Say that the model `proto` written to `path` holds Python-kernel nodes: it runs
    where onnxruntime-extensions is registered and the kernels are defined."""
    kernels = sorted({a.s.decode() for node in proto.graph.node if node.domain == DOMAIN
                      for a in node.attribute if a.name == "kernel"})
    if kernels:
        warn_at_user_line(
            f"{path}: the model holds nodes of custom ops with Python kernels "
            f"({', '.join(k.split('#')[0] for k in kernels)}; domain {DOMAIN}): onnxruntime "
            "runs it where onnxruntime-extensions' library is registered "
            "(SessionOptions.register_custom_ops_library(onnxruntime_extensions."
            "get_library_path())) and the kernels are defined as PyOps in the process, as "
            "onnxjob does (onnxjob/ops/python_kernels.py)")


def _gradient(node, gys, need):
    """A catalog node's gradient: the op's rule (emit's `gradient`) on Blobs of the op's
    own dtypes, the results as float64 (the node's inputs are the float64 casts)."""
    key = node.attrs["kernel"]
    rule = _gradients.get(key)
    if rule is None:
        raise UnsupportedAPIError(
            f"{user_location()}: op type {key.split('#')[0]!r} has a Python kernel and no "
            "gradient onnxjob can read (its C++ definition registers none in the form "
            "REGISTER_USER_OP_GRAD(...).SetBackwardOpConfGenFn with one backward op of the "
            "same module): a train job cannot differentiate through it (compute it with "
            "flow ops, or stop the gradient before it)")
    _, in_dtypes, out_dtypes, _ = _kernels[key]
    ins = [_cast(x, dt) for x, dt in zip(node.inputs, in_dtypes)]
    outs = [_cast(y, dt) for y, dt in zip(node.outputs, out_dtypes)]
    grads = [None if g is None else _cast(g, dt) for g, dt in zip(gys, out_dtypes)]
    return [None if g is None else _cast(g, np.float64) for g in rule(ins, outs, grads)]


def _cast(blob, dtype):
    return op("Cast", blob, to=dtypes.from_numpy(dtype).ir_dtype.value)


def _as_tuple(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _dtype(dtype, op_type_name):
    try:
        dtypes.from_numpy(dtype)
    except Exception:
        raise TraceError(f"{user_location()}: the Python kernel of op type {op_type_name!r} "
                         f"returns an array of dtype {dtype}, which no OneFlow blob "
                         "has") from None
    return np.dtype(dtype).type
