"""Build the VJP graph of one traced function and check it numerically.

`vjp(fn, inputs, diff)` traces `fn` on placeholders, seeds the backward pass with a
random cotangent `ct` through loss = sum(fn(x) * ct), and returns a runner that gives
(y, [dx for each differentiated input]) from onnxruntime.
"""
import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from onnxjob.graph import autodiff
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from onnxjob.frontend.variables import VariableSpec


def vjp(fn, inputs, diff, train=True):
    builder = GraphBuilder("gradcheck", is_train=train)
    with tracing(builder):
        blobs = []
        for i, x in enumerate(inputs):
            b = builder.add_input(f"x{i}", x.shape, x.dtype)
            if diff[i]:
                builder.variables[b.name] = b
                builder.variable_specs[b.name] = VariableSpec(b.name, x.shape, x.dtype, None)
            blobs.append(b)
        y = fn(*blobs)
        ct = builder.add_input("ct", y.shape, y.np_dtype)
        prod = op("Mul", y, ct)
        loss = op("ReduceSum", prod, builder.constant(np.arange(len(y.shape), dtype=np.int64)),
                  keepdims=0)
        grads = autodiff.backward(builder, [loss])
    outs = [y] + [grads[f"x{i}"] for i in range(len(inputs)) if diff[i]]
    for i, b in enumerate(outs):
        if b.value in builder.graph.outputs or b.value in builder.graph.inputs:
            b = op("Identity", b)
        b.value.name = f"out{i}"
        builder.graph.outputs.append(b.value)
    model = ir.Model(builder.graph, ir_version=IR_VERSION)
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(),
                                providers=["CPUExecutionProvider"],
                                disabled_optimizers=["EliminateDropout"])

    # variables the traced fn created itself (e.g. batch-norm gamma) get their initial values
    rng = np.random.default_rng(0)
    own = {n: spec.initializer.sample(spec.shape, spec.np_dtype, rng)
           for n, spec in builder.variable_specs.items() if spec.initializer is not None}

    def run(xs, cot):
        feeds = dict(own)
        feeds.update({f"x{i}": x for i, x in enumerate(xs)})
        feeds["ct"] = cot
        res = sess.run(None, feeds)
        return res[0], res[1:]
    return run, y.shape


def check_finite_differences(fn, inputs, diff, rng, eps=1e-6, rtol=1e-4, atol=1e-6):
    """VJP along a random tangent equals the central finite difference of sum(f*ct)."""
    run, yshape = vjp(fn, inputs, diff)
    y0, _ = run(inputs, np.zeros(yshape, _float_dtype(inputs)))
    ct = rng.standard_normal(yshape).astype(y0.dtype)
    _, grads = run(inputs, ct)
    gi = iter(grads)
    for i, x in enumerate(inputs):
        if not diff[i]:
            continue
        g = next(gi)
        v = rng.standard_normal(x.shape).astype(x.dtype)
        plus = list(inputs)
        minus = list(inputs)
        plus[i] = x + eps * v
        minus[i] = x - eps * v
        fp = float(np.sum(run(plus, ct)[0] * ct))
        fm = float(np.sum(run(minus, ct)[0] * ct))
        numeric = (fp - fm) / (2 * eps)
        analytic = float(np.sum(g * v))
        assert abs(numeric - analytic) <= atol + rtol * max(abs(numeric), abs(analytic)), (
            f"input {i}: finite difference {numeric} vs VJP {analytic}")


def _float_dtype(inputs):
    return next(x.dtype for x in inputs if x.dtype.kind == "f")
