"""bench/kernel_forms.py (formulations timed side by side; the timing that matters needs a
GPU): every form of each question is a valid model that computes the same values."""
import io
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))

import kernel_forms  # noqa: E402


def test_every_form_computes_the_same_values_and_is_timed():
    out = io.StringIO()
    axpby = kernel_forms.measure("axpby", scale=0.001, rounds=2, block_s=0.01, out=out)
    assert set(axpby) == {"mul-mul-add", "gemm-k1"}
    assert all(ms > 0 and gap < 1e-6 for ms, gap in axpby.values()), axpby
    rows = kernel_forms.measure("row-dot", scale=0.001, rounds=2, block_s=0.01, out=out)
    assert set(rows) == {"mul-layernorm", "mul-cast-reducesum", "batched-matmul"}
    # float32 sums agree closely; the batched MatMul's sum is rounded to half
    assert rows["mul-cast-reducesum"][1] < 1e-5 and rows["batched-matmul"][1] < 2e-3, rows
    channels = kernel_forms.measure("channel-dot", scale=0.001, rounds=2, block_s=0.01, out=out)
    assert set(channels) == {"mul-reducesum", "batched-matmul"}
    assert channels["batched-matmul"][1] < 1e-5, channels
    assert "gemm-k1" in out.getvalue() and "GB/s" in out.getvalue()
