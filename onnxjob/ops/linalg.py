"""Matrix ops: flow.matmul (also flow.linalg.matmul) and flow.diag.

Rules of MatMul: onnxjob/graph/primitives/linalg.py; diag is a Gather
(onnxjob/graph/primitives/shape_ops.py).
"""
import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import as_blob, int64_constant, op
from onnxjob.ops import qat
from onnxjob.ops.shapes import reshape
from onnxjob.ops.slicing import concat

__all__ = ["diag", "matmul"]


@two_generations(("a", "b", "transpose_a", "transpose_b", "name"), positional_is(4, str))
def matmul(a, b, transpose_a=False, transpose_b=False, alpha=1.0, name=None):
    """alpha * a @ b, optionally with the last two axes of a or b swapped (OneFlow <= 0.4's
    order without alpha is accepted too: a string fifth argument is the name)."""
    for what, x in (("a", a), ("b", b)):
        if len(x.shape) < 2:
            raise TraceError(f"matmul: {what} must have rank >= 2 (a matrix or a batch of "
                             f"them), got shape {x.shape}")

    def compute(a, b):
        if transpose_a:
            a = _swap_last(a)
        if transpose_b:
            b = _swap_last(b)
        out = op("MatMul", a, b, name=name)
        return out if alpha == 1.0 else out * alpha
    # OneFlow's op types (quantization-aware training quantizes the first two)
    kind = "broadcast_matmul" if len(a.shape) != len(b.shape) else \
        "matmul" if len(a.shape) == 2 else "batch_matmul"
    return qat.int8_op(kind, compute, a, b)


def _swap_last(x):
    perm = list(range(len(x.shape)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return op("Transpose", x, perm=perm)


def diag(input, diagonal=0, name=None):
    """A vector's square diagonal matrix, or a matrix's diagonal; `diagonal` > 0 is above
    the main diagonal, < 0 below."""
    k = int(diagonal)
    if len(input.shape) == 1:
        n = input.shape[0]
        m = n + abs(k)
        table = np.full((m, m), n, dtype=np.int64)  # n: the appended zero
        table[np.arange(n) + max(-k, 0), np.arange(n) + max(k, 0)] = np.arange(n)
        padded = concat([input, as_blob(np.zeros(1, input.np_dtype), like=input)], axis=0)
        return op("Gather", padded, int64_constant(input, table), axis=0, name=name)
    if len(input.shape) != 2:
        raise TraceError(f"diag takes a 1-D or 2-D Blob, got shape {input.shape}")
    rows, cols = input.shape
    size = min(rows, cols - k) if k >= 0 else min(rows + k, cols)
    if size <= 0:
        raise TraceError(f"diag: diagonal {k} is outside a {rows}x{cols} matrix")
    flat = (np.arange(size) + max(-k, 0)) * cols + np.arange(size) + max(k, 0)
    return op("Gather", reshape(input, [rows * cols]), int64_constant(input, flat), axis=0,
              name=name)
