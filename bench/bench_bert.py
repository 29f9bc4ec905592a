"""onnxjob vs PyTorch eager on OneFlow-Benchmark's BERT pretraining (upstream files, unchanged).

    python bench/bench_bert.py [--layers 4 --hidden 256 --heads 4 --seq 128 --batch 8
                                --vocab 30522] [--threads 2] [--rounds 5] [--calls 2]
    python bench/bench_bert.py --embedding-grad [--threads 2]

The train step is upstream's: pretrain.PreTrain (dropout 0 on both sides, so both do the
same work) and util.CreateOptimizer's LAMB (clipping by global norm 1.0, weight decay
excluding biases and LayerNorm). PyTorch runs tests/bert_twin.py with the same weights: the
same graph and OneFlow 0.5's LAMB kernel written in torch eager ops. Both in this process,
same thread count, interleaved; medians and the ratio onnxjob/PyTorch (< 1: onnxjob faster).
Timed: the small BERT of tests/test_bert.py, then the config of the flags; for each, the
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
    p.add_argument("--embedding-grad", action="store_true",
                   help="only time the embedding-gradient formulations")
    return p.parse_args()


def flag_config(args):
    """PreTrain's keyword arguments for the flags (intermediate 4x hidden, as upstream)."""
    return {"num_hidden_layers": args.layers, "hidden_size": args.hidden,
            "num_attention_heads": args.heads, "intermediate_size": 4 * args.hidden,
            "seq_length": args.seq, "max_position_embeddings": args.seq,
            "vocab_size": args.vocab, "max_predictions_per_seq": 20}


def torch_side(torch, values, config, batch, opt_args):
    """The twin's train step (forward, backward, LAMB) on a copy of `values`, and its
    forward + backward alone (how much of the step the eager LAMB loop takes)."""
    from bert_twin import BertTwin, UpstreamOptimizerTwin, parameter_names
    weights = {k: torch.tensor(values[k], requires_grad=True)
               for k in parameter_names(**config)}
    twin, optimizer = BertTwin(weights, **config), UpstreamOptimizerTwin(opt_args)
    tensors = [torch.as_tensor(a) for a in batch]

    def train_step():
        total, _, _ = twin.pretrain(*tensors)
        total.backward()
        optimizer.step(weights)
        return total.item()

    def forward_backward():
        total, _, _ = twin.pretrain(*tensors)
        total.backward()
        for w in weights.values():
            w.grad = None
        return total.item()
    return train_step, forward_backward


def time_config(label, config, batch_size, args, torch):
    """(table row, first-call seconds, torch forward + backward seconds) for one config."""
    import onnxjob as flow
    from bert_models import SMALL, define_train_job, optimizer_args, synthetic_batch
    from common import interleaved
    flow.clear_default_session()
    flow.config.seed(0)
    config = dict(SMALL, **config)
    opt_args = optimizer_args("lamb", learning_rate=1e-4, iter_num=1000)
    train_job = define_train_job(batch_size, config, opt_args)
    batch = synthetic_batch(batch_size, config)
    start = time.perf_counter()
    train_job(*batch)
    first_call = time.perf_counter() - start
    values = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    torch_train, torch_forward_backward = torch_side(torch, values, config, batch, opt_args)
    medians = interleaved({"onnxjob": lambda: train_job(*batch), "torch": torch_train,
                           "torch fb": torch_forward_backward}, args.rounds, args.calls, warmup=1)
    return (label, medians["onnxjob"], medians["torch"]), first_call, medians["torch fb"]


def bert_tables(args):
    import torch
    torch.set_num_threads(args.threads)
    from common import print_table
    rows, notes = [], []
    flagged = f"L{args.layers} H{args.hidden} S{args.seq} B{args.batch} V{args.vocab}"
    for label, config, batch in [("small L2 H128 S32 B8 V1000", {}, 8),
                                 (flagged, flag_config(args), args.batch)]:
        row, first, forward_backward = time_config(label, config, batch, args, torch)
        rows.append(row)
        notes.append(f"{label}: first train call (trace + autodiff + passes + session + step) "
                     f"{first:.2f} s; torch forward + backward alone "
                     f"{forward_backward * 1e3:.1f} ms")
    print_table(rows, f"BERT pretraining train step (LAMB): onnxjob vs PyTorch "
                      f"{torch.__version__} eager, {args.threads} threads")
    print("\n".join(notes))


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
    if args.embedding_grad:
        embedding_grad(args)
    else:
        bert_tables(args)


if __name__ == "__main__":
    main()
