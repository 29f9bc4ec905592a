"""bench/gpu_kernels.py's bookkeeping (the profiling itself needs a GPU): kernel family
names and the GPU's busy time as the union of kernel intervals."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))

import gpu_kernels  # noqa: E402


def test_family_names_drop_namespaces_templates_and_arguments():
    assert gpu_kernels.family(
        "void onnxruntime::cuda::_PadKernel<__half, 2>(unsigned long, "
        "onnxruntime::cuda::TArray<long, 8>)") == "_PadKernel"
    assert gpu_kernels.family("sm90_xmma_gemm_f16f16_f32f32_tn_n_tilesize128x128x64") == \
        "sm90_xmma_gemm_f16f16_f32f32_tn_n_tilesize128x128x64"
    assert gpu_kernels.family("void cudnn::bn_bw_1C11_kernel_new<__half, float, 512, "
                              "true, 1>(float, float)") == "bn_bw_1C11_kernel_new"


def test_busy_time_is_the_union_of_the_kernel_intervals():
    assert gpu_kernels.busy_time([]) == 0
    # overlapping (concurrent streams), nested, and apart
    assert gpu_kernels.busy_time([(0, 10), (5, 12), (6, 7), (20, 25)]) == 17
    assert gpu_kernels.busy_time([(20, 25), (0, 10)]) == 15


def test_summary_prints_each_kernel_per_step(capsys):
    one_step = [("void a::k1<float>(int)", 0, 10), ("void a::k1<__half>(int)", 10, 14),
                ("k2", 20, 26)]
    kernels = one_step + [(name, start + 100, end + 100) for name, start, end in one_step]
    gpu_kernels.summarize(kernels, steps=2, top=5, by_family=True)
    out = capsys.readouterr().out
    assert "kernels per step 3; kernel time per step 0.02 ms, GPU busy 0.02 ms" in out
    first = out.splitlines()[1].split()
    assert first[-1] == "k1" and first[-2] == "2x" and first[0] == "0.014"
