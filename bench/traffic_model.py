"""Bytes a train step moves through device memory (onnxjob/graph/traffic.py), beside an
estimate of PyTorch's passes for the same layers.

    python bench/traffic_model.py [resnet50|bert] [--batch 64] [--amp] [--device cuda]
        [--top 10] [--json PATH] [--bert-* flags as bench/memory_plan.py]

Compiles the train job for `--device` (default cuda, compiled here without a GPU) and prints
its bytes per step by group (what made the nodes: the batch norm's forward and backward,
the ReLUs, the residual adds, the convolutions' weight-gradient windows, casts, the
optimizer; the convolutions and matmuls apart, as they run at compute speed), then the
total of the memory-bound groups beside an estimate of what PyTorch's CUDA step moves for
the same layers (REFERENCE_PASSES: cuDNN's batch norm reads x twice and writes y in the
forward and reads x and dy twice and writes dx in the backward; an in-place ReLU reads
and writes its tensor once and its backward reads y and dy and writes dx; a residual add
reads two tensors and writes one, its backward passes dy on; a max pool writes int64
indices beside its output; a fused SGD/Adam/LAMB step reads each variable, gradient and
state tensor and writes the variable and state; autocast casts each convolution and matmul
weight to half once a step). At a GPU's bandwidth (an H200: ~4.8 TB/s) the bytes of the
memory-bound groups are that part of the step's time.
"""
import collections
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

GIB = 2 ** 30


def reference_bytes(compiled):
    """{group: bytes} PyTorch's CUDA step is estimated to move in the memory-bound groups
    for the layers of `compiled` (a CompiledGraph; the module docstring says how)."""
    from onnxjob.graph.memory_plan import value_bytes
    from onnxjob.graph.traffic import origin
    from onnxjob.passes.auto_mixed_precision import MARKER
    graph = compiled.model.graph
    estimate = collections.Counter()
    for node in graph:
        phase, op = origin(node)
        if phase != "forward" or not node.inputs or node.inputs[0] is None:
            continue
        x, y = value_bytes(node.inputs[0]) or 0, value_bytes(node.outputs[0]) or 0
        if op == "onnxjob.BatchNormTrain" and node.op_type == "BatchNormalization":
            estimate["batch norm"] += 3 * x + 5 * x
        elif op is None and node.op_type == "Relu":
            estimate["ReLU"] += 2 * x + 3 * x
        elif op is None and node.op_type == "Add" and len(node.inputs) == 2 and all(
                v is not None and v.producer() is not None and value_bytes(v) == y
                for v in node.inputs):
            estimate["residual add"] += 3 * y
        elif op is None and node.op_type == "MaxPool":
            indices = y * 8 // max(1, node.outputs[0].type.dtype.itemsize)
            estimate["max pool"] += (x + y + indices) + (y + indices + 2 * x)
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name: v for v in graph.outputs}
    variables = {name: inputs[i] for name, i in compiled.variable_inputs.items()}
    state = sum(value_bytes(outputs[o]) or 0 for o in compiled.state_outputs.values())
    # the model's parameters: the updated variables the forward reads (not the optimizer's
    # slots, which the update alone reads)
    trainable = [variables[name] for name in compiled.state_outputs if name in variables and
                 variables[name].type.dtype.is_floating_point() and
                 any(origin(u.node)[0] == "forward" for u in variables[name].uses())]
    params = sum(value_bytes(v) or 0 for v in trainable)
    # a fused update reads each variable, its state and its gradient, writes them back
    estimate["optimizer"] += 2 * state + params
    if MARKER in compiled.model.metadata_props:     # (autocast casts the weights)
        estimate["casts (weights to half)"] += sum(3 * (value_bytes(v) or 0) // 2
                                                   for v in trainable)
    return estimate


def main(argv=None):
    from memory_plan import compiled_model
    from onnxjob.graph.traffic import traffic
    args, compiled = compiled_model(argv)
    graph = compiled.model.graph
    step = traffic(graph)
    print(f"{args.model} train step, batch {args.batch}, {'AMP' if args.amp else 'float32'}, "
          f"compiled for {args.device}: bytes moved per step, by group")
    print(f"  {'group':52s} {'nodes':>6s} {'GiB':>8s}")
    for group, (count, moved) in step.by_group().items():
        if moved >= 1e-3 * GIB:
            print(f"  {group:52s} {count:6d} {moved / GIB:8.2f}")
    memory_bound = step.memory_bound_bytes()
    reference = reference_bytes(compiled)
    print(f"  memory-bound total {memory_bound / GIB:.2f} GiB "
          f"(convolutions and matmuls: {step.compute_bytes() / GIB:.2f} GiB)")
    kernels, small = step.kernels()
    print(f"  kernels per step {kernels}, of which {small} move at most 256 KiB (their time "
          "is mostly launch and drain)")
    print(f"  the {args.top} most launched (group, op): kernels, small ones")
    for (group, op_type), (count, few) in list(step.kernels_by_op().items())[:args.top]:
        print(f"    {group + ' ' + op_type:60s} {count:6d} {few:6d}")
    tables = step.host_table_bytes()
    print(f"  index tables copied from the host by Concat and Split nodes {tables / 1e6:.2f} MB")
    print("PyTorch's passes for the same layers (estimate, see the docstring):")
    for group, moved in reference.most_common():
        print(f"  {group:52s} {'':6s} {moved / GIB:8.2f}")
    total = sum(reference.values())
    print(f"  memory-bound total {total / GIB:.2f} GiB; onnxjob / PyTorch "
          f"{memory_bound / total:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"groups": {g: b for g, (_, b) in step.by_group().items()},
                       "kernels": kernels, "small_kernels": small, "host_tables": tables,
                       "kernels_by_op": {f"{g} / {o}": list(v) for (g, o), v in
                                         step.kernels_by_op().items()},
                       "memory_bound": memory_bound, "compute": step.compute_bytes(),
                       "reference": dict(reference)}, f, indent=2)


if __name__ == "__main__":
    main()
