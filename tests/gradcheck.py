"""Gradient checks shared by the op test files.

Build the VJP graph of one traced function and check it numerically.

`vjp(fn, inputs, diff)` traces `fn` on placeholders, seeds the backward pass with a
random cotangent `ct` through loss = sum(fn(x) * ct), and returns a runner that gives
(y, [dx for each differentiated input]) from onnxruntime.
"""
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from onnxjob.graph import autodiff
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import GraphBuilder, op, tracing
from onnxjob.frontend.variables import VariableSpec


def vjp(fn, inputs, diff, train=True, device=None):
    """(runner, y's shape) of fn's VJP graph, traced for `device` as compile_job traces a
    job for it (the graph runs on the CPU EP either way)."""
    builder = GraphBuilder("gradcheck", is_train=train)
    builder.device = device
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


def check_finite_differences(fn, inputs, diff, rng, eps=1e-6, rtol=1e-4, atol=1e-6,
                             device=None):
    """VJP along a random tangent equals the central finite difference of sum(f*ct)."""
    run, yshape = vjp(fn, inputs, diff, device=device)
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


# -- input makers: rng -> array -------------------------------------------------------

def pos(shape):
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def normal(shape):
    return lambda rng: rng.standard_normal(shape)


def labels(shape, depth):
    return lambda rng: rng.integers(0, depth, shape).astype(np.int32)


def sep(shape):
    """Values at least 0.05 apart, so max/relu kinks stay out of the FD stencil."""
    def make(rng):
        n = int(np.prod(shape))
        vals = (rng.permutation(n) - n / 2) * 0.05 + 0.013
        return vals.reshape(shape)
    return make


# -- one table row, checked two ways --------------------------------------------------

def _inputs(makers, rng, dtype):
    return [np.asarray(m(rng)).astype(dtype) if np.asarray(m(np.random.default_rng(0))).dtype.kind == "f"
            else np.asarray(m(rng)) for m in makers]


def check_case_finite_differences(case, device=None):
    """Case = (name, onnxjob fn, torch fn, input makers, differentiated inputs, float64
    kernels exist): the VJP (traced for `device`) against central finite differences
    (float64 where it can)."""
    name, fn, _, makers, diff, has_f64 = case
    rng = np.random.default_rng(1)
    dtype = np.float64 if has_f64 else np.float32
    xs = _inputs(makers, rng, dtype)
    if has_f64:
        check_finite_differences(fn, xs, diff, rng, device=device)
    else:  # float32-only kernels: larger step, looser tolerance
        check_finite_differences(fn, xs, diff, rng, eps=1e-2, rtol=2e-2, atol=1e-3,
                                 device=device)


def check_case_against_pytorch(case, device=None):
    """The same case's forward value and VJP (traced for `device`) against PyTorch
    autograd in float32."""
    import torch
    name, fn, torch_fn, makers, diff, _ = case
    rng = np.random.default_rng(2)
    xs = _inputs(makers, rng, np.float32)
    run, yshape = vjp(fn, xs, diff, device=device)
    ct = rng.standard_normal(yshape).astype(np.float32)
    y, grads = run(xs, ct)
    txs = [torch.tensor(x, requires_grad=bool(d) and x.dtype.kind == "f") for x, d in zip(xs, diff)]
    ty = torch_fn(*txs)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    ty.backward(torch.tensor(ct))
    gi = iter(grads)
    for x, d in zip(txs, diff):
        if d:
            np.testing.assert_allclose(next(gi), x.grad.numpy(), rtol=1e-5, atol=1e-5)


def gradient_tests(cases):
    """The two checks of a CASES table as parametrized tests, for a test module to bind:

        test_against_finite_differences, test_against_pytorch = gradient_tests(CASES)
    """
    ids = [c[0] for c in cases]

    @pytest.mark.parametrize("case", cases, ids=ids)
    def finite_differences(case):
        check_case_finite_differences(case)

    @pytest.mark.parametrize("case", cases, ids=ids)
    def pytorch(case):
        check_case_against_pytorch(case)

    return finite_differences, pytorch
