"""Elementwise and broadcasting ops: shape rules and gradient rules."""
import numpy as np

from onnxjob.graph.tracer import as_blob, op
from onnxjob.graph.registry import broadcast_shape, register, same_as_input


def _binary_infer(out_dtype=None):
    def infer(inputs, attrs, num_outputs):
        a, b = inputs
        if a.np_dtype != b.np_dtype:
            raise ValueError(f"dtypes differ: {a.np_dtype} and {b.np_dtype}")
        return [(broadcast_shape(a.shape, b.shape), out_dtype or a.np_dtype)]
    return infer


def _bool_infer(inputs, attrs, num_outputs):
    return [(broadcast_shape(*(x.shape for x in inputs)), np.dtype(bool))]


# Each rule returns gradients of the broadcast shape; the engine reduces them.
register("Add", _binary_infer(), lambda n, g, need: [g[0], g[0]])
register("Sub", _binary_infer(), lambda n, g, need: [g[0], op("Neg", g[0]) if need[1] else None])
register("Mul", _binary_infer(), lambda n, g, need: [
    op("Mul", g[0], n.inputs[1]) if need[0] else None,
    op("Mul", g[0], n.inputs[0]) if need[1] else None])
register("Div", _binary_infer(), lambda n, g, need: [
    op("Div", g[0], n.inputs[1]) if need[0] else None,
    op("Neg", op("Div", op("Mul", g[0], n.outputs[0]), n.inputs[1])) if need[1] else None])


def _minmax_grad(n, g, need):
    a, b = n.inputs
    pick_a = op("Equal", n.outputs[0], a)
    zero = as_blob(0, like=g[0])
    return [op("Where", pick_a, g[0], zero) if need[0] else None,
            op("Where", pick_a, zero, g[0]) if need[1] else None]


register("Max", _binary_infer(), _minmax_grad)
register("Min", _binary_infer(), _minmax_grad)


def _pow_grad(n, g, need):
    x, p = n.inputs
    gx = gp = None
    if need[0]:
        gx = op("Mul", g[0], op("Mul", p, op("Pow", x, op("Sub", p, as_blob(1, like=p)))))
    if need[1]:
        gp = op("Mul", g[0], op("Mul", n.outputs[0], op("Log", x)))
    return [gx, gp]


register("Pow", _binary_infer(), _pow_grad)
def _mod_lower(inputs, attrs, num_outputs):
    """Floor modulo of floats (fmod=0): onnxruntime runs Mod on floats only as C fmod, so
    it is emitted as x - floor(x / y) * y, which also gives its gradient."""
    x, y = inputs
    if attrs.get("fmod", 0) or not np.issubdtype(x.np_dtype, np.floating):
        return None
    return [op("Sub", x, op("Mul", op("Floor", op("Div", x, y)), y))]


register("Mod", _binary_infer(), None, differentiable=False, lower=_mod_lower)
for _cmp in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
    register(_cmp, _binary_infer(np.dtype(bool)), None, differentiable=False)
for _logic in ("And", "Or", "Xor"):
    register(_logic, _bool_infer, None, differentiable=False)
register("Not", same_as_input(), None, differentiable=False)


def _where_infer(inputs, attrs, num_outputs):
    c, a, b = inputs
    if a.np_dtype != b.np_dtype:
        raise ValueError(f"dtypes differ: {a.np_dtype} and {b.np_dtype}")
    return [(broadcast_shape(c.shape, a.shape, b.shape), a.np_dtype)]


def _where_grad(n, g, need):
    c = n.inputs[0]
    zero = as_blob(0, like=g[0])
    return [None, op("Where", c, g[0], zero) if need[1] else None,
            op("Where", c, zero, g[0]) if need[2] else None]


register("Where", _where_infer, _where_grad)

# -- unary ------------------------------------------------------------------------------
_unary = same_as_input()


def _one(like):
    return as_blob(1, like=like)


register("Identity", _unary, lambda n, g, need: [g[0]])
register("Neg", _unary, lambda n, g, need: [op("Neg", g[0])])
# NOTE: ReLU grad as Where(y > 0) measured within noise of Mul-by-mask; Where needs no Cast.
register("Relu", _unary, lambda n, g, need: [
    op("Where", op("Greater", n.outputs[0], as_blob(0, like=g[0])), g[0], as_blob(0, like=g[0]))])
register("LeakyRelu", _unary, lambda n, g, need: [
    op("Where", op("Greater", n.inputs[0], as_blob(0, like=g[0])), g[0],
       op("Mul", g[0], as_blob(n.attrs.get("alpha", 0.01), like=g[0])))])
register("Sigmoid", _unary, lambda n, g, need: [
    op("Mul", g[0], op("Mul", n.outputs[0], op("Sub", _one(g[0]), n.outputs[0])))])
register("Tanh", _unary, lambda n, g, need: [
    op("Mul", g[0], op("Sub", _one(g[0]), op("Mul", n.outputs[0], n.outputs[0])))])
register("Exp", _unary, lambda n, g, need: [op("Mul", g[0], n.outputs[0])])
register("Log", _unary, lambda n, g, need: [op("Div", g[0], n.inputs[0])])
register("Sqrt", _unary, lambda n, g, need: [
    op("Div", op("Mul", g[0], as_blob(0.5, like=g[0])), n.outputs[0])])
register("Reciprocal", _unary, lambda n, g, need: [
    op("Neg", op("Mul", g[0], op("Mul", n.outputs[0], n.outputs[0])))])
register("Abs", _unary, lambda n, g, need: [op("Mul", g[0], op("Sign", n.inputs[0]))])
def _softplus_lower(inputs, attrs, num_outputs):
    """onnxruntime's CPU Softplus is float32 only: other dtypes use the overflow-free
    log(1 + exp(-|x|)) + max(x, 0)."""
    x = inputs[0]
    if x.np_dtype == np.float32:
        return None
    tail = op("Log", op("Add", _one(x), op("Exp", op("Neg", op("Abs", x)))))
    return [op("Add", tail, op("Max", x, as_blob(0, like=x)))]


register("Softplus", _unary, lambda n, g, need: [op("Mul", g[0], op("Sigmoid", n.inputs[0]))],
         lower=_softplus_lower)
register("Erf", _unary, lambda n, g, need: [op(
    "Mul", g[0], op("Mul", as_blob(2 / np.sqrt(np.pi), like=g[0]),
                    op("Exp", op("Neg", op("Mul", n.inputs[0], n.inputs[0])))))])
for _flat in ("Sign", "Floor", "Ceil", "Round"):
    register(_flat, _unary, None, differentiable=False)
register("IsNaN", lambda i, a, k: [(i[0].shape, np.dtype(bool))], None, differentiable=False)


def _clip_grad(n, g, need):
    x = n.inputs[0]
    keep = None
    if len(n.inputs) > 1 and n.inputs[1] is not None:
        keep = op("GreaterOrEqual", x, n.inputs[1])
    if len(n.inputs) > 2 and n.inputs[2] is not None:
        upper = op("LessOrEqual", x, n.inputs[2])
        keep = upper if keep is None else op("And", keep, upper)
    gx = g[0] if keep is None else op("Where", keep, g[0], as_blob(0, like=g[0]))
    return [gx, None, None][:len(n.inputs)]


register("Clip", _unary, _clip_grad)


def _cast_infer(inputs, attrs, num_outputs):
    from onnx_ir import DataType
    return [(inputs[0].shape, DataType(attrs["to"]).numpy())]


def _cast_grad(n, g, need):
    from onnxjob import dtypes
    x = n.inputs[0]
    if not dtypes.is_floating(x.np_dtype):
        return [None]
    return [op("Cast", g[0], to=dtypes.from_numpy(x.np_dtype).ir_dtype.value)]


register("Cast", _cast_infer, _cast_grad)
register("Cos", _unary, lambda n, g, need: [op("Neg", op("Mul", g[0], op("Sin", n.inputs[0])))])
register("Sin", _unary, lambda n, g, need: [op("Mul", g[0], op("Cos", n.inputs[0]))])
