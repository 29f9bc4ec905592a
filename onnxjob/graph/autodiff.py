"""Reverse-mode differentiation of a traced graph, emitting standard ONNX ops only.

The engine walks the forward nodes from the loss backwards, asks each primitive's rule
(see `primitives/`) for input cotangents, sums fan-in, reduces broadcast axes and stops
at non-differentiable values. Like OneFlow, the seed is ones of the loss shape and every
variable gradient is scaled by 1/elem_cnt(loss); the scale is folded into the seed. Under
a loss scale the seed is the scale, as OneFlow, and the optimizer divides the variable
gradients by elem_cnt and unscales them (train/optimizer.py).
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import MissingGradientError, TraceError
from onnxjob.graph.registry import get_primitive
from onnxjob.graph.primitives.shape_ops import reshape_to
from onnxjob.graph.tracer import Blob, int64_constant, op


def _requires_grad(builder, sources):
    """ids of the Blobs whose value depends differentiably on `sources`.

    Integer values carry gradients too, as in OneFlow, whose cast passes the diff back
    cast to the input's dtype (a float Blob cast to int32, multiplied and cast back gets
    an int32 diff); booleans and the outputs of non-differentiable ops (comparisons,
    argmax, ...) do not."""
    live = {id(b) for b in sources}
    propagate_requires(builder.nodes, live)
    return live


def propagate_requires(nodes, live):
    """Add to `live` (ids of Blobs that depend differentiably on the sources) the
    outputs of `nodes` (TracedNodes, in trace order) that depend on one of them; the
    eager tape (onnxjob/eager/tape.py) calls it node by node as ops are recorded."""
    for node in nodes:
        if not get_primitive(node.op_type).differentiable:
            continue
        if any(x is not None and id(x) in live for x in node.inputs):
            live.update(id(out) for out in node.outputs if out.np_dtype != np.bool_)


def unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added to a value of `shape`."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    lead = len(grad.shape) - len(shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape)
                                if d == 1 and grad.shape[lead + i] != 1]
    if axes:
        grad = op("ReduceSum", grad, int64_constant(grad, axes), keepdims=1)
    return reshape_to(grad, shape)


def _zeros_like(blob):
    return op("ConstantOfShape", int64_constant(blob, blob.shape), value=np.zeros(1, blob.np_dtype))


def _cast(x, np_dtype):
    if x.np_dtype == np_dtype:
        return x
    return op("Cast", x, to=dtypes.from_numpy(np_dtype).ir_dtype.value)


def _seed(builder, loss, elem_cnt, loss_scale):
    """The initial gradient of `loss`: without a loss scale, 1/elem_cnt in the loss dtype;
    with one, as OneFlow's GenerateOriginDiffLbi (oneflow/core/job_rewriter/autograd.cpp,
    v0.5.0), the scale cast to the loss dtype (the static factor: constant_like; the
    dynamic scale: cast and scalar_mul_by_tensor of ones), 1/elem_cnt being applied to the
    variable gradients by the optimizer (update_rules.unscale), so float32 overflows where
    OneFlow's does: in the backward and, data-parallel, in the sum of the ranks' gradients."""
    if loss.is_dynamic:
        ones = op("ConstantOfShape", op("Shape", loss), value=np.ones(1, loss.np_dtype))
        if loss_scale is None:
            return ones
        scale = reshape_to(loss_scale, ()) if isinstance(loss_scale, Blob) else \
            builder.constant(np.asarray(np.float32(loss_scale)), "loss_scale")
        return ones * _cast(scale, loss.np_dtype)
    if loss_scale is None and not dtypes.is_floating(loss.np_dtype):
        return builder.constant(np.ones(loss.shape, loss.np_dtype), "grad_seed")
    if loss_scale is None:
        return builder.constant(np.full(loss.shape, 1.0 / elem_cnt, dtype=loss.np_dtype),
                                "grad_seed")
    if not isinstance(loss_scale, Blob):
        return builder.constant(np.full(loss.shape, np.float32(loss_scale), dtype=loss.np_dtype),
                                "grad_seed")
    ones = builder.constant(np.ones(loss.shape, loss.np_dtype), "grad_seed")
    return ones * _cast(reshape_to(loss_scale, ()), loss.np_dtype)


def _seed_scale(loss, elem_cnt, loss_scale):
    """onnxjob's seed over OneFlow's: 1/elem_cnt where `_seed` folds it in (OneFlow applies
    it to the variable gradients instead), else 1 (under a loss scale both seeds are the
    scale). A rule whose OneFlow kernel ignores the incoming gradient (a constant
    gradient) multiplies its constant by it, to sit in onnxjob's backward as in OneFlow's."""
    if loss_scale is not None or loss.is_dynamic or not dtypes.is_floating(loss.np_dtype):
        return 1.0
    return 1.0 / elem_cnt


def backward(builder, losses, loss_scale=None):
    """Gradients {variable name: Blob} of the trainable variables of `builder`.

    `loss_scale` (Optimizer.loss_scale: None, a float or a float32 one-element Blob)
    multiplies the seed, so every gradient, watched ones included, comes out scaled, and
    none is divided by elem_cnt (Optimizer.apply divides and unscales)."""
    if not losses:
        raise TraceError("minimize() was given no loss")
    shapes = {l.shape for l in losses}
    if len(shapes) != 1:
        raise TraceError(f"all losses passed to minimize must share one shape, got {shapes}")
    elem_cnt = int(np.prod(losses[0].shape))
    builder.loss_elem_count = elem_cnt
    trainable = [b for n, b in builder.variables.items()
                 if builder.variable_specs[n].trainable and dtypes.is_floating(b.np_dtype)]
    # as OneFlow's autograd (MakePredicatorNeedBackwardOp), only Blobs that descend from a
    # trainable variable have diffs: watch_diff of a placeholder, or of a placeholder plus a
    # trainable=False variable, calls no handler (compiler._watch_outputs says so); OneFlow's
    # own tests add a trainable zero variable to a placeholder to watch its diff
    watched = [blob for blob, _, is_diff, _ in builder.watches
               if is_diff and blob.np_dtype != np.bool_]
    requires = _requires_grad(builder, trainable)
    # NOTE: 1/elem_cnt is folded into the seed where it can be: not where integer values
    # carry gradients (they hold OneFlow's unscaled diffs: 1/elem_cnt would truncate to 0)
    # nor for a dynamic loss (elem_cnt is known at run time only), nor where watch_diff
    # reads diffs (OneFlow's are unscaled: k/N * N is not always k in floating point); the
    # variable gradients are divided at the end instead.
    unfolded = loss_scale is None and (
        bool(watched) or
        any(l.is_dynamic or not dtypes.is_floating(l.np_dtype) for l in losses) or
        any(id(out) in requires and not dtypes.is_floating(out.np_dtype)
            for node in builder.nodes for out in node.outputs))
    if unfolded:
        loss_scale = 1.0
    builder.grad_seed_scale = _seed_scale(losses[0], elem_cnt, loss_scale)
    with builder.origin("backward"):
        return _backward(builder, losses, elem_cnt, loss_scale, requires, unfolded)


def gradients(builder, outputs, seeds, sources):
    """{id(source): gradient Blob or None} of sum(output * seed) over `outputs` for each
    Blob of `sources` (any Blobs of `builder`, intermediate ones included): the eager
    tensors' autograd (onnxjob/eager/autograd.py), with no 1/elem_cnt scale."""
    requires = _requires_grad(builder, sources)
    grads = {}
    for out, seed in zip(outputs, seeds):
        _accumulate(grads, out, seed)
    with builder.origin("backward"):
        _walk(builder, list(builder.nodes), grads, requires)
    return {id(s): grads.get(id(s)) for s in sources}


def _backward(builder, losses, elem_cnt, loss_scale, requires, unfolded):
    """backward()'s walk from the seeds to the variables' gradients."""
    grads = {}
    forward_nodes = list(builder.nodes)
    for loss in losses:
        _accumulate(grads, loss, _seed(builder, loss, elem_cnt, loss_scale))
    _walk(builder, forward_nodes, grads, requires)
    builder.gradients = grads
    if loss_scale is not None:
        builder.loss_elem_count = 1     # nothing for watch_diff to undo
    out = {name: grads[id(b)] for name, b in builder.variables.items() if id(b) in grads
           and builder.variable_specs[name].trainable}
    if unfolded or (loss_scale is not None and losses[0].is_dynamic):
        # (a dynamic loss's count is each device's, known in its own forward: a mirrored
        # step over several devices combines gradients divided by it, scaled or not)
        out = {name: _divide_by_elem_cnt(g, losses[0]) for name, g in out.items()}
    return out


def _walk(builder, forward_nodes, grads, requires):
    """Fill `grads` (id(Blob) -> gradient, the seeds in it) backwards through
    `forward_nodes` for the Blobs whose ids are in `requires`."""
    for node in reversed(forward_nodes):
        gys = [grads.get(id(o)) for o in node.outputs]
        if all(g is None for g in gys):
            continue
        need = [x is not None and id(x) in requires for x in node.inputs]
        if not any(need):
            continue
        prim = get_primitive(node.op_type)
        if prim.grad is None:
            raise MissingGradientError(
                f"{node.location}: onnxjob has no gradient rule for ONNX op {node.op_type} "
                "(needed because a trainable variable flows through it into the loss)")
        with builder.location(node.location + " (backward)"), \
                builder.origin("backward", node.op_type):
            if gys[0] is None:
                gys[0] = _zeros_like(node.outputs[0])
            try:
                gxs = prim.grad(node, gys, need)
            except NotImplementedError as e:
                raise MissingGradientError(f"{node.location}: {e}") from None
            for x, gx, needed in zip(node.inputs, gxs, need):
                if not needed or gx is None:
                    continue
                _accumulate(grads, x, unbroadcast(gx, x.shape))


def _accumulate(grads, blob, grad):
    """Add `grad` to the gradient of `blob` in `grads` (id(Blob) -> gradient): fan-in."""
    prev = grads.get(id(blob))
    grads[id(blob)] = grad if prev is None else op("Add", prev, grad)


def loss_instance_count(loss):
    """What OneFlow's autograd divides the variable gradients by: a static loss's element
    count (an int; ScaleModelDiffByConstantLossInstanceNum), a dynamic (mirrored) loss's
    rows along axis 0 at run time (an int64 0-d Blob; ScaleModelDiffByDynamicLossInstanceNum's
    shape_elem_cnt over axis 0, summed over the devices by the mirrored step). OneFlow
    0.5.0's pass counts 1 per device there instead (its include_axis_conf lost the axis with
    nn.Graph's training, c39d083): not reproduced, docs/oneflow-scripts.md."""
    if not loss.is_dynamic or not loss.shape:
        return int(np.prod(loss.shape))
    return reshape_to(op("Shape", loss, start=0, end=1), [])


def _divide_by_elem_cnt(grad, loss):
    """`grad` / loss_instance_count(loss)."""
    if loss.is_dynamic:
        count = _cast(loss_instance_count(loss), grad.np_dtype)
        return op("Div", grad, count)
    if int(np.prod(loss.shape)) == 1:
        return grad     # (a multiply by 1 copies the gradient unchanged: a pass for nothing)
    return op("Mul", grad, grad.builder.constant(
        np.asarray(1.0 / int(np.prod(loss.shape)), grad.np_dtype)))
