"""onnxjob vs PyTorch eager on OneFlow-Benchmark's BERT pretraining (upstream files, unchanged).

    python bench/bench_bert.py [--layers 4 --hidden 256 --heads 4 --seq 128 --batch 8
                                --vocab 30522] [--threads 2] [--rounds 5] [--calls 2]
    python bench/bench_bert.py --amp [--device cuda] [the flags above]
    python bench/bench_bert.py --embedding-grad [--threads 2]

The train step is upstream's: pretrain.PreTrain (dropout 0 on both sides, so both do the
same work) and util.CreateOptimizer's LAMB (clipping by global norm 1.0, weight decay
excluding biases and LayerNorm). PyTorch runs tests/bert_twin.py with the same weights: the
same graph and OneFlow 0.5's LAMB kernel written in torch eager ops. Both in this process,
same thread count, interleaved; medians and the ratio onnxjob/PyTorch (< 1: onnxjob faster).
--amp runs both under mixed precision: onnxjob with upstream's --use_fp16 settings
(util.GetFunctionConfig: enable_auto_mixed_precision; util.CreateOptimizer: LAMB with
dynamic_loss_scale(increment_period=2000), initial scale 2**30) and the twin under
torch.autocast (float16 on CUDA, bfloat16 on the CPU) with a torch.amp.GradScaler of the same
schedule; the final loss scale of each side is printed. --device cuda puts both on the GPU
(onnxruntime-gpu). Timed: the small BERT of tests/test_bert.py, then the config of the flags; for each, the
first call of the train job (trace, autodiff, passes, onnxruntime session, first step).

--embedding-grad times the gradient of the embedding lookup (flow.gather on the word table)
alone at BERT-base sizes, in onnxruntime: onnxjob's formulation (ScatterND with
reduction="add" into a zero table) against a one-hot MatMul (OneHot(ids)^T @ dy).
Needs ../shared/clients/oneflow-benchmark beside the repository.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)


def parse():
    from common import add_timing_args
    p = add_timing_args(argparse.ArgumentParser(), rounds=5, calls=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--amp", action="store_true",
                   help="the train step under automatic mixed precision on both sides: "
                   "upstream's --use_fp16 settings (AMP + the dynamic loss scale) against "
                   "torch.autocast + GradScaler (float16 on CUDA, bfloat16 on the CPU)")
    p.add_argument("--device", default=os.environ.get("ONNXJOB_DEVICE", "cpu"),
                   help="cuda: both sides on the GPU (onnxruntime-gpu, PyTorch CUDA)")
    p.add_argument("--embedding-grad", action="store_true",
                   help="only time the embedding-gradient formulations")
    return p.parse_args()


def flag_config(args):
    """PreTrain's keyword arguments for the flags (intermediate 4x hidden, as upstream)."""
    return {"num_hidden_layers": args.layers, "hidden_size": args.hidden,
            "num_attention_heads": args.heads, "intermediate_size": 4 * args.hidden,
            "seq_length": args.seq, "max_position_embeddings": args.seq,
            "vocab_size": args.vocab, "max_predictions_per_seq": 20}


def amp_optimizer_args(learning_rate=1e-4, iter_num=1000):
    """run_pretraining.py's args with --use_fp16: util.CreateOptimizer adds
    dynamic_loss_scale(increment_period=2000) (the default initial scale, 2**30) and
    util.GetFunctionConfig enables auto mixed precision."""
    from bert_models import optimizer_args
    opt_args = optimizer_args("lamb", learning_rate=learning_rate, iter_num=iter_num)
    opt_args.use_fp16 = True
    return opt_args


def define_amp_train_job(batch, config, opt_args):
    """tests/bert_models.define_train_job under upstream's util.GetFunctionConfig(args) with
    --use_fp16 (enable_auto_mixed_precision(True)), PreTrain(use_fp16=True) and
    util.CreateOptimizer(args) (LAMB with the dynamic loss scale)."""
    import argparse
    from bert_models import bert_modules, define_train_job
    util = bert_modules()[2]
    function_config = util.GetFunctionConfig(argparse.Namespace(
        use_fp16=True, num_accumulation_steps=1, use_xla=False))
    return define_train_job(batch, dict(config or {}, use_fp16=True), opt_args,
                            function_config=function_config)


def loss_scale_of(flow):
    """The current dynamic loss scale of the default session's train job (None if none)."""
    for name, value in flow.get_all_variables().items():
        if "DynamicLossScale" in name and name.endswith("-LossScale"):
            return float(value.numpy().reshape(-1)[0])
    return None


def torch_side(torch, values, config, batch, opt_args, device="cpu", amp=False,
               init_scale=2.0 ** 30):
    """The twin's train step (forward, backward, LAMB) on a copy of `values` on `device`,
    and its forward + backward alone (how much of the step the eager LAMB loop takes).

    amp: the forward and losses under torch.autocast (float16 on CUDA, bfloat16 on the
    CPU) and a torch.amp.GradScaler (init_scale, x2 every 2000 good steps, /2 on an
    overflow: OneFlow's dynamic_loss_scale) that unscales the gradients, skips the LAMB step
    of a step with an inf/NaN and updates the scale; train_step.scaler is the scaler."""
    from bench_resnet import autocast_dtype
    from bert_twin import BertTwin, UpstreamOptimizerTwin, parameter_names
    weights = {k: torch.tensor(values[k], device=device, requires_grad=True)
               for k in parameter_names(**config)}
    twin, optimizer = BertTwin(weights, **config), UpstreamOptimizerTwin(opt_args)
    tensors = [torch.as_tensor(a).to(device) for a in batch]
    device_type = torch.device(device).type

    class TwinOptimizer(torch.optim.Optimizer):
        """The twin's LAMB behind torch.optim.Optimizer's interface, for GradScaler."""

        def __init__(self):
            super().__init__(list(weights.values()), {})

        def step(self, closure=None):
            optimizer.step(weights)

    scaler = (torch.amp.GradScaler(device_type, init_scale=init_scale, growth_factor=2.0,
                                   backoff_factor=0.5, growth_interval=2000) if amp else None)
    scaled_optimizer = TwinOptimizer() if amp else None

    def forward():
        if not amp:
            return twin.pretrain(*tensors)[0]
        with torch.autocast(device_type, dtype=autocast_dtype(torch, device)):
            return twin.pretrain(*tensors)[0]

    def train_step():
        total = forward()
        if not amp:
            total.backward()
            optimizer.step(weights)
            return total.item()
        for w in weights.values():   # a skipped step leaves its gradients behind
            w.grad = None
        scaler.scale(total).backward()
        scaler.step(scaled_optimizer)
        scaler.update()
        return total.item()
    train_step.scaler = scaler

    def forward_backward():
        total = forward()
        (scaler.scale(total) if amp else total).backward()
        for w in weights.values():
            w.grad = None
        return total.item()
    return train_step, forward_backward


def time_config(label, config, batch_size, args, torch, amp=False, device="cpu"):
    """(table row, first-call seconds, torch forward + backward seconds, notes) for one
    config; amp: onnxjob's job under upstream's --use_fp16 settings against the twin under
    autocast + GradScaler (notes: both final loss scales)."""
    import onnxjob as flow
    from bert_models import SMALL, define_train_job, optimizer_args, synthetic_batch
    from common import interleaved
    flow.clear_default_session()
    flow.config.seed(0)
    config = dict(SMALL, **config)
    if amp:
        opt_args = amp_optimizer_args(learning_rate=1e-4, iter_num=1000)
        train_job = define_amp_train_job(batch_size, config, opt_args)
        init_scale = flow.optimizer.loss_scale.dynamic_loss_scale().initial_loss_scale
    else:
        opt_args = optimizer_args("lamb", learning_rate=1e-4, iter_num=1000)
        train_job = define_train_job(batch_size, config, opt_args)
        init_scale = None
    batch = synthetic_batch(batch_size, config)
    start = time.perf_counter()
    train_job(*batch)
    first_call = time.perf_counter() - start
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    torch_train, torch_forward_backward = torch_side(
        torch, values, config, batch, opt_args, device=device, amp=amp,
        init_scale=init_scale or 2.0 ** 30)
    medians = interleaved({"onnxjob": lambda: train_job(*batch), "torch": torch_train,
                           "torch fb": torch_forward_backward}, args.rounds, args.calls, warmup=1)
    notes = {}
    if amp:
        notes = {"onnxjob loss scale": loss_scale_of(flow),
                 "torch loss scale": float(torch_train.scaler.get_scale())}
    return (label, medians["onnxjob"], medians["torch"]), first_call, medians["torch fb"], notes


def bert_tables(args):
    import torch
    torch.set_num_threads(args.threads)
    from common import print_table
    rows, notes = [], []
    flagged = f"L{args.layers} H{args.hidden} S{args.seq} B{args.batch} V{args.vocab}"
    amp = " AMP" if args.amp else ""
    for label, config, batch in [(f"small L2 H128 S32 B8 V1000{amp}", {}, 8),
                                 (flagged + amp, flag_config(args), args.batch)]:
        row, first, forward_backward, scales = time_config(label, config, batch, args, torch,
                                                           amp=args.amp, device=args.device)
        rows.append(row)
        notes.append(f"{label}: first train call (trace + autodiff + passes + session + step) "
                     f"{first:.2f} s; torch forward + backward alone "
                     f"{forward_backward * 1e3:.1f} ms"
                     + "".join(f"; {k} {v:g}" for k, v in scales.items()))
    kind = (f"autocast {bench_resnet_autocast_name(torch, args.device)} + GradScaler"
            if args.amp else "eager")
    print_table(rows, f"BERT pretraining train step (LAMB{amp}): onnxjob vs PyTorch "
                      f"{torch.__version__} {kind} on {args.device}, {args.threads} threads")
    print("\n".join(notes))


def bench_resnet_autocast_name(torch, device):
    from bench_resnet import autocast_dtype
    return str(autocast_dtype(torch, device)).replace("torch.", "")


def embedding_grad_models(vocab, hidden, tokens):
    """Two ONNX graphs (ids int32 (tokens,), dy float (tokens, hidden)) -> (vocab, hidden)."""
    from onnx import TensorProto, helper
    from onnxjob.graph.compiler import IR_VERSION
    from onnxjob.graph.tracer import OPSET
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [tokens])
    dy = helper.make_tensor_value_info("dy", TensorProto.FLOAT, [tokens, hidden])
    out = helper.make_tensor_value_info("dw", TensorProto.FLOAT, [vocab, hidden])

    def const(name, values, dtype=TensorProto.INT64):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            name + "_v", dtype, [len(values)], values))

    cast = helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64)
    scatter = [cast, const("axes", [-1]), helper.make_node("Unsqueeze", ["ids64", "axes"], ["idx"]),
               const("shape", [vocab, hidden]),
               helper.make_node("ConstantOfShape", ["shape"], ["zeros"],
                                value=helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0])),
               helper.make_node("ScatterND", ["zeros", "idx", "dy"], ["dw"], reduction="add")]
    one_hot = [cast, const("depth", [vocab]), const("values", [0.0, 1.0], TensorProto.FLOAT),
               helper.make_node("OneHot", ["ids64", "depth", "values"], ["hot"], axis=-1),
               helper.make_node("Gemm", ["hot", "dy"], ["dw"], transA=1)]
    models = {}
    for name, nodes in (("ScatterND add", scatter), ("one-hot MatMul", one_hot)):
        graph = helper.make_graph(nodes, name.replace(" ", "_"), [ids, dy], [out])
        models[name] = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                         ir_version=IR_VERSION)
    return models


def embedding_grad(args, vocab=30522, hidden=768, tokens=8 * 128):
    import onnxruntime as ort
    from common import interleaved
    rng = np.random.default_rng(0)
    feeds = {"ids": rng.integers(0, vocab, tokens).astype(np.int32),
             "dy": rng.standard_normal((tokens, hidden), dtype=np.float32)}
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    sessions = {name: ort.InferenceSession(model.SerializeToString(), opts,
                                           providers=["CPUExecutionProvider"])
                for name, model in embedding_grad_models(vocab, hidden, tokens).items()}
    results = [s.run(None, feeds)[0] for s in sessions.values()]
    assert np.abs(results[0] - results[1]).max() < 1e-4, "the formulations disagree"
    medians = interleaved({name: (lambda s=s: s.run(None, feeds))
                           for name, s in sessions.items()}, args.rounds, args.calls)
    print(f"\nembedding gradient, vocab {vocab}, hidden {hidden}, {tokens} tokens, "
          f"{args.threads} threads (onnxruntime, the (vocab, hidden) result fetched)")
    for name, seconds in medians.items():
        print(f"{name:16s} {seconds * 1e3:9.2f} ms")


def main():
    args = parse()
    os.environ["ONNXJOB_NUM_THREADS"] = str(args.threads)
    os.environ["ONNXJOB_DEVICE"] = args.device
    if args.embedding_grad:
        embedding_grad(args)
    else:
        bert_tables(args)


if __name__ == "__main__":
    main()
