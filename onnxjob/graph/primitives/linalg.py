"""MatMul and Gemm: shape rules and gradient rules."""
from onnxjob.graph.tracer import op
from onnxjob.graph.registry import broadcast_shape, register


def _matmul_infer(inputs, attrs, num_outputs):
    a, b = inputs
    if a.np_dtype != b.np_dtype:
        raise ValueError(f"dtypes differ: {a.np_dtype} and {b.np_dtype}")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ValueError("flow.matmul needs operands of rank >= 2")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"inner dimensions differ: {a.shape} @ {b.shape}")
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    return [(batch + (a.shape[-2], b.shape[-1]), a.np_dtype)]


def _swap_last(x):
    perm = list(range(len(x.shape)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return op("Transpose", x, perm=perm)


def _matmul_grad(n, g, need):
    a, b = n.inputs
    return [op("MatMul", g[0], _swap_last(b)) if need[0] else None,
            op("MatMul", _swap_last(a), g[0]) if need[1] else None]


register("MatMul", _matmul_infer, _matmul_grad)


def _gemm_infer(inputs, attrs, num_outputs):
    a, b = inputs[:2]
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ValueError("Gemm takes 2-D operands")
    m, k = a.shape[::-1] if attrs.get("transA") else a.shape
    k2, n = b.shape[::-1] if attrs.get("transB") else b.shape
    if k != k2:
        raise ValueError(f"inner dimensions differ: {k} vs {k2}")
    if len(inputs) > 2 and inputs[2] is not None:
        broadcast_shape(inputs[2].shape, (m, n))
    return [((m, n), a.np_dtype)]


def _gemm_grad(n, g, need):
    """Y = op(A) @ op(B) + C with alpha = beta = 1 (the only form onnxjob emits)."""
    a, b = n.inputs[:2]
    ta, tb = n.attrs.get("transA", 0), n.attrs.get("transB", 0)
    if n.attrs.get("alpha", 1.0) != 1.0 or n.attrs.get("beta", 1.0) != 1.0:
        raise NotImplementedError("gradient of Gemm with alpha/beta != 1")
    gy = g[0]
    ga = gb = None
    if need[0]:  # dA = gy @ op(B)^T, transposed back if A was
        ga = (op("Gemm", b, gy, transA=tb, transB=1) if ta
              else op("Gemm", gy, b, transB=0 if tb else 1))
    if need[1]:  # dB = op(A)^T @ gy, transposed back if B was
        gb = (op("Gemm", gy, a, transA=1, transB=ta) if tb
              else op("Gemm", a, gy, transA=0 if ta else 1))
    grads = [ga, gb]
    if len(n.inputs) > 2:
        grads.append(gy if need[2] else None)  # engine reduces the broadcast of C
    return grads


register("Gemm", _gemm_infer, _gemm_grad)
