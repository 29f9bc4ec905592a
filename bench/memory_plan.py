"""The memory a train step plans for (onnxjob/graph/memory_plan.py), beside PyTorch's.

    python bench/memory_plan.py [resnet50|bert] [--batch 8] [--amp] [--device cuda|cpu]
        [--top 10] [--no-torch] [--as-run] [--arena] [--json PATH] [--bert-layers 12
        --bert-hidden 768 --bert-heads 12 --bert-seq 128 --bert-vocab 30522]

Compiles the train job for `--device` (default cuda: the graph the CUDA EP runs, compiled
here without a GPU, as docs/gpu.md says) without running it, and prints its planned peak of
live intermediates in the order onnxjob's sessions run it and in onnxruntime's default
order, what is live at the peak (grouped by producer op and element type), how much the
forward keeps for the backward, and the variables, state and outputs held beside it.
`--as-run` also plans the graph as onnxruntime optimized and ran it: one step on the CPU EP
with the session options of `--device` (onnxjob/runtime/executed_plan.py; under AMP the CPU
EP's own casts make that differ from what the CUDA EP runs). `--arena` replays the
intermediates through onnxruntime's planner and BFC arena (onnxjob/graph/arena_model.py) and
prints what the arena would reserve, with onnxjob's growth and with onnxruntime's defaults.

Then the same model's PyTorch twin (tests/resnet_twin.py, tests/bert_twin.py: the twins of
bench_gpu.py's rows, from the same initial weights) takes a forward + backward on the CPU,
in float32 or under torch.autocast("cpu", float16) for --amp, and its measured peak of
allocated bytes during the step (torch.profiler's memory events: activations and
gradients; the weights were allocated before) and the bytes it saved for the backward
(saved_tensors_hooks) are printed beside. PyTorch's CPU and CUDA steps allocate the same
tensors, so this predicts the GPU's ratio without a GPU; bench_gpu.py's memory rows
measure the device itself.
"""
import argparse
import json
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

MIB = 2 ** 20


def parse(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="resnet50", choices=["resnet50", "bert"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--amp", action="store_true", help="under enable_auto_mixed_precision")
    p.add_argument("--device", default="cuda", help="the device the job is compiled for")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--no-torch", dest="torch", action="store_false")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the numbers to this file (JSON)")
    p.add_argument("--as-run", action="store_true",
                   help="also plan the graph as onnxruntime optimized and ran it (one step on "
                        "the CPU EP with the device's session options, profiled)")
    p.add_argument("--arena", action="store_true",
                   help="also replay the intermediates through onnxruntime's arena "
                        "(graph/arena_model.py): the bytes it would reserve")
    p.add_argument("--bert-layers", type=int, default=12)
    p.add_argument("--bert-hidden", type=int, default=768)
    p.add_argument("--bert-heads", type=int, default=12)
    p.add_argument("--bert-seq", type=int, default=128)
    p.add_argument("--bert-vocab", type=int, default=30522)
    return p.parse_args(argv)


def bert_config(args):
    from bert_models import SMALL
    return dict(SMALL, num_hidden_layers=args.bert_layers, hidden_size=args.bert_hidden,
                num_attention_heads=args.bert_heads, intermediate_size=4 * args.bert_hidden,
                seq_length=args.bert_seq, max_position_embeddings=args.bert_seq,
                vocab_size=args.bert_vocab, max_predictions_per_seq=20)


def define_job(args):
    """(train job, its feeds) of the model in the default session."""
    import onnxjob as flow
    if args.model == "resnet50":
        from bench_gpu import resnet_train_job
        from common import resnet_batch
        return (resnet_train_job(flow, flow.function_config(), args.batch, amp=args.amp),
                resnet_batch(args.batch))
    from bench_bert import amp_optimizer_args, define_amp_train_job
    from bert_models import define_train_job, optimizer_args, synthetic_batch
    config = bert_config(args)
    flow.config.seed(0)
    job = (define_amp_train_job(args.batch, config, amp_optimizer_args()) if args.amp
           else define_train_job(args.batch, config, optimizer_args()))
    return job, synthetic_batch(args.batch, config)


def compile_for(job, device):
    """The CompiledGraph of `job` compiled for `device` without running it."""
    from onnxjob.graph.compiler import compile_job
    from onnxjob.runtime.session import default_session
    session = default_session()
    session.device = device
    compiled = compile_job(session.jobs[job.job.name], session, 0)
    session.device = None       # (the session starts on this machine's device later)
    return compiled


def plans_of(compiled):
    """{order: MemoryPlan} of a compiled train job (its loss, its in-place state)."""
    from onnxjob.graph import memory_plan
    return {order: _plan(compiled, compiled.model.graph, order) for order in memory_plan.ORDERS}


def executed_plan(compiled, device):
    """The MemoryPlan of `compiled` as onnxruntime optimizes it for a `device` session, in
    the order a CPU session with those options ran it (runtime/executed_plan.py)."""
    from onnxjob.runtime.executed_plan import executed_graph
    return _plan(compiled, executed_graph(compiled.model, device).graph, "model")


def _plan(compiled, graph, order):
    from onnxjob.graph import memory_plan
    outputs = {v.name: v for v in graph.outputs}
    loss = [outputs[name] for name in compiled.output_names if name in outputs]
    in_place = [compiled.state_outputs[v] for v in compiled.in_place]
    return memory_plan.plan(graph, order, loss, in_place)


def compiled_model(argv=None):
    """(args, CompiledGraph) of the command line's model, compiled for --device."""
    args = parse(argv)
    os.environ.setdefault("ONNXJOB_NUM_THREADS", str(args.threads))
    job, _ = define_job(args)
    return args, compile_for(job, args.device)


def torch_step_memory(args, values):
    """(peak bytes allocated during a forward + backward of the PyTorch twin on the CPU,
    bytes of the tensors it saved for the backward)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.set_num_threads(args.threads)
    step = twin_step(torch, args, values)
    step()      # a first step allocates what later steps reuse (as the plan's steady state)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    return peak, sum(saved.values())


def twin_step(torch, args, values):
    """A forward + backward of the twin (gradients dropped first) as a function."""
    autocast = torch.autocast("cpu", dtype=torch.float16, enabled=args.amp)
    if args.model == "resnet50":
        from common import resnet_batch
        from resnet_twin import ResNet50Twin, smoothed_softmax_ce
        weights = {k: torch.from_numpy(v).requires_grad_(k.rsplit("-", 1)[1] in (
            "weight", "bias", "gamma", "beta")) for k, v in values.items()
            if k.startswith("Resnet-")}
        twin = ResNet50Twin(weights)
        x, y = (torch.tensor(a) for a in resnet_batch(args.batch))

        def loss():
            return smoothed_softmax_ce(twin.forward(x, training=True), y)
    else:
        from bert_models import synthetic_batch
        from bert_twin import BertTwin, parameter_names
        config = bert_config(args)
        weights = {k: torch.tensor(values[k], requires_grad=True)
                   for k in parameter_names(**config)}
        twin = BertTwin(weights, **config)
        tensors = [torch.as_tensor(a) for a in synthetic_batch(args.batch, config)]

        def loss():
            return twin.pretrain(*tensors)[0]

    def step():
        for w in weights.values():
            w.grad = None
        with autocast:
            total = loss()
        total.backward()
    return step


def print_arena(plan):
    """Print (and return as {variant: bytes}) what onnxruntime's arena would reserve for
    `plan`'s intermediates (graph/arena_model.py), each variant beside the plan's peak."""
    from onnxjob.graph import arena_model
    variants = {"kSameAsRequested (onnxjob's)": dict(strategy="kSameAsRequested"),
                "kNextPowerOfTwo (onnxruntime's default)": dict(strategy="kNextPowerOfTwo"),
                "kSameAsRequested, no planner reuse": dict(strategy="kSameAsRequested",
                                                           planner_reuse=False),
                "kSameAsRequested, max_dead_bytes_per_chunk 0": dict(
                    strategy="kSameAsRequested", max_dead_bytes=0)}
    print("  onnxruntime's arena for these intermediates (graph/arena_model.py):")
    reserved = {}
    for label, options in variants.items():
        run = arena_model.replay(plan, **options)
        reserved[label] = run.reserved_bytes
        print(f"    {label:45s} reserves {run.reserved_bytes / MIB:8.1f} MiB "
              f"({run.reserved_bytes / max(plan.peak_bytes, 1):.2f}x the plan's peak) in "
              f"{run.regions} regions; chunks in use at most {run.peak_in_use_bytes / MIB:.1f} "
              f"MiB; {run.planner_reused} outputs reuse a buffer")
    return reserved


def main(argv=None):
    import onnxjob as flow
    from onnxjob.graph import memory_plan
    args, compiled = compiled_model(argv)
    plans = plans_of(compiled)
    if args.as_run:
        plans["as run"] = executed_plan(compiled, args.device)
    title = (f"{args.model} train step, batch {args.batch}, {'AMP' if args.amp else 'float32'}, "
             f"compiled for {args.device}")
    print(title)
    for order, plan in plans.items():
        print(f"  {order:20s} peak of intermediates {plan.peak_bytes / MIB:8.1f} MiB at node "
              f"{plan.peak_index}/{len(plan.order)} ({plan.peak_node.op_type}); saved for "
              f"the backward {plan.saved_bytes / MIB:.1f} MiB, {plan.at_peak_saved_bytes() / MIB:.1f} "
              "of them live at the peak")
    order = memory_plan.session_order(args.device)
    plan = plans[order]
    print(f"  held: inputs (variables, state, feeds) {plan.held_bytes / MIB:.1f} MiB, outputs "
          f"(next state not written in place, results) {plan.output_bytes / MIB:.1f} MiB; "
          f"step total "
          f"{plan.step_bytes / MIB:.1f} MiB" + (f"; {len(plan.unsized)} values of unknown size"
                                                 if plan.unsized else ""))
    print(f"  live at the peak ({order} order), by producer:")
    for (op, dtype), count, nbytes in plan.breakdown(args.top):
        print(f"    {op:22s} {dtype:9s} {count:5d} values {nbytes / MIB:9.1f} MiB")
    result = {order: {"peak": p.peak_bytes, "held": p.held_bytes, "outputs": p.output_bytes,
                      "saved": p.saved_bytes} for order, p in plans.items()}
    if args.arena:
        result["arena"] = print_arena(plan)
    if args.torch:
        # the session starts (on this machine's device) and draws the weights the twin takes
        values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
        peak, saved = torch_step_memory(args, values)
        print(f"PyTorch twin on the CPU ({'autocast float16' if args.amp else 'float32'}): peak "
              f"allocated during forward + backward {peak / MIB:.1f} MiB (activations and "
              f"gradients), saved for the backward {saved / MIB:.1f} MiB")
        print(f"ratio, onnxjob's planned peak / PyTorch's measured peak: "
              f"{plan.peak_bytes / peak:.2f}")
        result["torch"] = {"peak": peak, "saved": saved}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
