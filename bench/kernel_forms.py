"""Standard-ONNX formulations of the same arithmetic, timed side by side on one execution
provider: the questions the traffic model (graph/traffic.py) cannot answer without a GPU.

    python bench/kernel_forms.py [--device cuda] [--question axpby,row-dot,channel-dot]
        [--scale 1.0]

Each question builds one small model per form over the same inputs (on the device, bound
with IOBinding, outputs left there), checks that the forms agree, then times each form
in turns of at least 0.3 s (a block each, the order rotated every round) and prints the
median ms per run with the bytes the arithmetic needs at the least (its inputs read
once, its output written once) per second.

  axpby    y = a * x + b * z over a float32 tensor the size of BERT-base's largest weights
           (the optimizer's moments: m' = b1 * m + (1 - b1) * g), 7 passes of the tensor
           as Mul, Mul, Add; as one Gemm over an (n, 1) column with k = 1 (alpha * x @ [[1]]
           + beta * z: onnxruntime copies z into y, then one BLAS call: 5 passes).
           (On the CPU, elementwise ops on shapes ending in 1 take a slow broadcast path:
           the inputs here are flat; passes/align_broadcast_ranks.py exists for that.)
  row-dot  the per-row sums of a batch norm's backward, sum(dy * x) over each of the
           N * C rows of a half (N, C, H, W) activation (ResNet50's res2 at batch 64):
           Mul then LayerNormalization's row mean (what BatchNormRowStatistics emits:
           float32 means, a full-size Y written and dropped), Mul then ReduceSum with a
           float32 Cast first (float32 sums), and one batched MatMul (rows, 1, K) @
           (rows, K, 1) (no product written; a half sum, which can overflow past 65504).
  channel-dot  the float32 step's sum(dy * (x - mean)) per channel of (N, C, H, W) tensors
           (ResNet50's res2 at batch 64): Mul then ReduceSum over (N, H, W) (what it runs:
           4 passes of the tensor), and one batched MatMul (N, C, 1, HW) @ (N, C, HW, 1)
           then a sum over N (2 passes: no product written).
`--scale` multiplies the sizes (0.01 for a quick run on the CPU).
"""
import argparse
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(nodes, inputs, output, initializers=()):
    used = {name for node in nodes for name in node.input}
    graph = helper.make_graph(nodes, "form", inputs, [output],
                              initializer=[t for t in initializers if t.name in used])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8)


def axpby_forms(scale):
    """{form: model} for y = a * x + b * z, the inputs, and the least bytes moved."""
    n = max(1, int(768 * 3072 * 4 * scale))
    a, b = 0.9, 0.1
    x, z = (np.random.default_rng(i).standard_normal(n).astype(np.float32) for i in (0, 1))
    info = [helper.make_tensor_value_info(name, F32, [n]) for name in ("x", "z")]
    y = helper.make_tensor_value_info("y", F32, [n])
    consts = [helper.make_tensor("a", F32, [], [a]), helper.make_tensor("b", F32, [], [b]),
              helper.make_tensor("one", F32, [1, 1], [1.0]),
              helper.make_tensor("column", TensorProto.INT64, [2], [n, 1]),
              helper.make_tensor("flat", TensorProto.INT64, [1], [n])]
    forms = {
        "mul-mul-add": _model([helper.make_node("Mul", ["x", "a"], ["ax"]),
                               helper.make_node("Mul", ["z", "b"], ["bz"]),
                               helper.make_node("Add", ["ax", "bz"], ["y"])],
                              info, y, consts),
        # (Reshapes of a contiguous tensor: views, no copies)
        "gemm-k1": _model([helper.make_node("Reshape", ["x", "column"], ["xc"]),
                           helper.make_node("Reshape", ["z", "column"], ["zc"]),
                           helper.make_node("Gemm", ["xc", "one", "zc"], ["yc"], alpha=a,
                                            beta=b),
                           helper.make_node("Reshape", ["yc", "flat"], ["y"])],
                          info, y, consts),
    }
    return forms, {"x": x, "z": z}, 3 * x.nbytes


def row_dot_forms(scale):
    """{form: model} for the per-row sums of dy * x over (rows, K) half rows."""
    rows, k = max(1, int(64 * 256 * scale)), 56 * 56
    dy, x = (np.random.default_rng(i).standard_normal((rows, k)).astype(np.float16)
             for i in (2, 3))
    info = [helper.make_tensor_value_info(name, F16, [rows, k]) for name in ("dy", "x")]
    out = helper.make_tensor_value_info("s", F32, [rows, 1])
    consts = [numpy_helper.from_array(np.ones(k, np.float16), "ones"),
              numpy_helper.from_array(np.zeros(k, np.float16), "zeros"),
              helper.make_tensor("K", F32, [], [float(k)]),
              helper.make_tensor("axis", TensorProto.INT64, [1], [-1]),
              helper.make_tensor("r3", TensorProto.INT64, [3], [rows, 1, k]),
              helper.make_tensor("c3", TensorProto.INT64, [3], [rows, k, 1]),
              helper.make_tensor("r2", TensorProto.INT64, [2], [rows, 1])]
    forms = {
        "mul-layernorm": _model([
            helper.make_node("Mul", ["dy", "x"], ["p"]),
            helper.make_node("LayerNormalization", ["p", "ones", "zeros"], ["unused", "mean"],
                             axis=-1, epsilon=0.0),
            helper.make_node("Mul", ["mean", "K"], ["s"])], info, out, consts),
        "mul-cast-reducesum": _model([
            helper.make_node("Mul", ["dy", "x"], ["p"]),
            helper.make_node("Cast", ["p"], ["p32"], to=F32),
            helper.make_node("ReduceSum", ["p32", "axis"], ["s"], keepdims=1)],
            info, out, consts),
        "batched-matmul": _model([
            helper.make_node("Reshape", ["dy", "r3"], ["dy3"]),
            helper.make_node("Reshape", ["x", "c3"], ["x3"]),
            helper.make_node("MatMul", ["dy3", "x3"], ["s3"]),
            helper.make_node("Reshape", ["s3", "r2"], ["s16"]),
            helper.make_node("Cast", ["s16"], ["s"], to=F32)], info, out, consts),
    }
    return forms, {"dy": dy, "x": x}, dy.nbytes + x.nbytes


def channel_dot_forms(scale):
    """{form: model} for a float32 batch norm backward's sum(dy * (x - mean)) over every
    axis but the channels of (N, C, H, W) tensors (ResNet50's res2 at batch 64)."""
    n, c, hw = max(1, int(64 * scale)), 256, 56 * 56
    dy, xc = (np.random.default_rng(i).standard_normal((n, c, 56, 56)).astype(np.float32)
              for i in (6, 7))
    info = [helper.make_tensor_value_info(name, F32, [n, c, 56, 56]) for name in ("dy", "xc")]
    out = helper.make_tensor_value_info("s", F32, [c])
    consts = [helper.make_tensor("nhw", TensorProto.INT64, [3], [0, 2, 3]),
              helper.make_tensor("batch", TensorProto.INT64, [1], [0]),
              helper.make_tensor("row", TensorProto.INT64, [4], [n, c, 1, hw]),
              helper.make_tensor("column", TensorProto.INT64, [4], [n, c, hw, 1]),
              helper.make_tensor("flat", TensorProto.INT64, [2], [n, c])]
    forms = {
        # what the float32 CUDA form runs (graph/primitives/batch_norm.py's d_gamma)
        "mul-reducesum": _model([
            helper.make_node("Mul", ["dy", "xc"], ["p"]),
            helper.make_node("ReduceSum", ["p", "nhw"], ["s"], keepdims=0)], info, out, consts),
        # one dot product per (image, channel) row, no product written, then the batch's sum
        "batched-matmul": _model([
            helper.make_node("Reshape", ["dy", "row"], ["dy4"]),
            helper.make_node("Reshape", ["xc", "column"], ["xc4"]),
            helper.make_node("MatMul", ["dy4", "xc4"], ["d4"]),
            helper.make_node("Reshape", ["d4", "flat"], ["d2"]),
            helper.make_node("ReduceSum", ["d2", "batch"], ["s"], keepdims=0)],
            info, out, consts),
    }
    return forms, {"dy": dy, "xc": xc}, dy.nbytes + xc.nbytes


QUESTIONS = {"axpby": axpby_forms, "row-dot": row_dot_forms, "channel-dot": channel_dot_forms}


def _session(model, device):
    import onnxruntime as ort
    providers = (["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda"
                 else ["CPUExecutionProvider"])
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=providers)


def _runner(session, feeds, device):
    """A function that runs `session` once on `feeds` kept on `device`, and its output."""
    import onnxruntime as ort
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, device, 0))
    output = session.get_outputs()[0].name
    binding.bind_output(output, device)

    def run():
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
    run()
    return run, lambda: binding.copy_outputs_to_cpu()[0]


def measure(question, device="cpu", scale=1.0, rounds=5, block_s=0.3, out=sys.stdout):
    """Time each form of `question`; returns {form: (median ms per run, largest difference
    from the first form's result, relative to that result's largest value)}."""
    forms, feeds, least_bytes = QUESTIONS[question](scale)
    runners, results = {}, {}
    for name, model in forms.items():
        runners[name], fetch = _runner(_session(model, device), feeds, device)
        results[name] = np.asarray(fetch(), np.float64)
    first = next(iter(results.values()))
    gaps = {}
    for name, value in results.items():
        gaps[name] = float(np.max(np.abs(value - first)) / (np.max(np.abs(first)) or 1.0))
        print(f"{question} {name}: largest difference from the first form {gaps[name]:.2e} "
              "(relative to its largest value)", file=out)
    times = {name: [] for name in forms}
    names = list(forms)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < block_s:
                runners[name]()
                count += 1
            times[name].append((time.perf_counter() - start) * 1e3 / count)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{question} {name:20s} {ms:9.3f} ms  {least_bytes / ms / 1e6:8.1f} GB/s of the "
              f"least bytes ({least_bytes / 2**20:.1f} MiB)", file=out)
    return {name: (ms, gaps[name]) for name, ms in medians.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--question", default="axpby,row-dot,channel-dot")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    for question in args.question.split(","):
        measure(question, args.device, args.scale, args.rounds)


if __name__ == "__main__":
    main()
