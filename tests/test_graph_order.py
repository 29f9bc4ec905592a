"""What onnxruntime runs for a CUDA-form train step: the optimized graph in the graph's own
order (runtime/graph_order.py), checked on the CPU EP with CUDA's session options, profiled
(runtime/executed_plan.py), against the step's memory plan (graph/memory_plan.py)."""
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxjob.runtime import backend, graph_order

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))


def _chain_graph():
    """x -> a (Relu) -> b (Neg) -> c (Exp) -> d (Abs); e = Add(x, x) read by nothing until
    f = Add(d, e): written in the order a, e, b, c, d, f."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Add", ["x", "x"], ["e"], name="e"),
             helper.make_node("Neg", ["a"], ["b"], name="b"),
             helper.make_node("Exp", ["b"], ["c"], name="c"),
             helper.make_node("Abs", ["c"], ["d"], name="d"),
             helper.make_node("Add", ["d", "e"], ["f"], name="f")]
    value = helper.make_tensor_value_info
    return helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [4])],
                             [value("f", TensorProto.FLOAT, [4])])


def test_nodes_follow_the_names_of_the_graph_they_came_from():
    graph = _chain_graph()
    graph_order.reorder_like(graph, ["a", "b", "c", "d", "e", "f"])
    assert [n.name for n in graph.node] == ["a", "b", "c", "d", "e", "f"]


def test_a_node_onnxruntime_made_takes_the_place_of_the_node_it_is_named_after():
    """A fused node named '<original>/Fusion/' goes where <original> was; an unnamed one
    just before its first reader; the file's own order does not matter."""
    graph = _chain_graph()
    fused = helper.make_node("Sigmoid", ["c"], ["d"], name="d/SomeFusion/")
    cast = helper.make_node("Identity", ["x"], ["x2"], name="InsertedCast_7")
    nodes = [n for n in graph.node if n.name != "d"]
    for node in nodes:
        if node.name == "e":
            node.input[:] = ["x2", "x2"]
    del graph.node[:]
    graph.node.extend([cast] + list(reversed(nodes)) + [fused])
    graph_order.reorder_like(graph, ["a", "b", "c", "d", "e", "f"])
    assert [n.name for n in graph.node] == ["a", "b", "c", "d/SomeFusion/", "InsertedCast_7",
                                           "e", "f"]


def test_an_unloadable_reordered_model_falls_back_to_the_optimizing_session(capsys):
    graph = _chain_graph()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    def refuse(model_bytes, opts):
        raise RuntimeError("cannot load it\nsecond line")
    opts = backend.session_options(True, device="cuda")
    sess = graph_order.session_in_graph_order(
        model.SerializeToString(), opts, [backend.CPU], [], make=refuse)
    assert sess.fallback_reason == "cannot load it"
    x = np.arange(4, dtype=np.float32) - 2
    (f,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(f, np.abs(np.exp(-np.maximum(x, 0))) + 2 * x, rtol=1e-6)
    backend._say_order_fallback(sess.fallback_reason)
    assert "default order" in capsys.readouterr().err


def test_the_reordered_session_gives_the_optimizing_session_s_results():
    graph = _chain_graph()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opts = backend.session_options(True, device="cuda")
    sess = graph_order.session_in_graph_order(model.SerializeToString(), opts,
                                              [backend.CPU], [])
    assert not getattr(sess, "fallback_reason", None)
    assert opts.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0],
                               np.abs(np.exp(-np.maximum(x, 0))) + 2 * x, rtol=1e-6)


def _compiled(argv):
    import onnxjob as flow
    from memory_plan import compile_for, define_job, parse   # bench/memory_plan.py
    flow.clear_default_session()
    job, _ = define_job(parse(argv))
    compiled = compile_for(job, "cuda")
    flow.clear_default_session()
    return compiled


TINY_BERT = ["bert", "--batch", "4", "--bert-layers", "2", "--bert-hidden", "128",
             "--bert-heads", "2", "--bert-seq", "32", "--bert-vocab", "1000"]


@pytest.mark.parametrize("argv", [["resnet50", "--batch", "2"], TINY_BERT],
                         ids=["resnet50", "bert"])
def test_a_cuda_train_step_runs_in_its_planned_order_and_memory(argv):
    """As a CUDA train session runs it (the CPU EP, CUDA's options, one profiled step):
    the nodes of onnxjob's graph run in the graph's order although onnxruntime fused some
    (its priority-based order alone ran ResNet50's update in the forward: 554 MiB at
    batch 2), and the step's peak is the plan's (onnxruntime's CSE had merged the values
    made again after the peak with the forward's: BERT's peak 4.4 instead of 3.5 MiB)."""
    from memory_plan import executed_plan, plans_of     # bench/memory_plan.py
    from onnxjob.graph import memory_plan
    from onnxjob.runtime.executed_plan import executed_graph
    compiled = _compiled(argv)
    ours = [n.name for n in compiled.model.graph]
    ran = [n.name for n in executed_graph(compiled.model, "cuda").graph]
    assert set(ran) - set(ours), "onnxruntime made no node: nothing is checked"
    position = {name: i for i, name in enumerate(ours)}
    kept = [position[name] for name in ran if name in position]
    assert kept == sorted(kept)
    planned = plans_of(compiled)[memory_plan.session_order("cuda")]
    assert executed_plan(compiled, "cuda").peak_bytes <= 1.02 * planned.peak_bytes


def test_an_optimized_graph_can_be_planned_after_it_ran():
    """executed_graph's result has the optimized graph's shapes: every value sized."""
    from onnxjob.graph import memory_plan
    from onnxjob.runtime.executed_plan import executed_graph
    compiled = _compiled(TINY_BERT)
    plan = memory_plan.plan(executed_graph(compiled.model, "cpu").graph)
    assert plan.peak_bytes > 0
    assert len(plan.unsized) <= 5, [v.name for v in plan.unsized]


def test_a_reordered_train_step_computes_what_onnxruntime_s_own_order_does():
    """ResNet50's CUDA-form train step at batch 2, one step on the CPU EP: the session in
    the graph's order (CUDA train sessions) and a session in onnxruntime's own order give
    the same loss, next variables and optimizer state."""
    import onnx_ir as ir

    from onnxjob.runtime.executed_plan import synthetic_feeds
    compiled = _compiled(["resnet50", "--batch", "2"])
    model_bytes = ir.to_proto(compiled.model).SerializeToString()
    disabled = backend.disabled_transformers(True, "cuda")
    own = ort.InferenceSession(model_bytes, backend.session_options(True, device="cuda"),
                               providers=[backend.CPU], disabled_optimizers=disabled)
    ordered = backend.optimized_session(
        model_bytes, backend.session_options(True, device="cuda"), [backend.CPU], disabled,
        "cuda", True)
    assert not getattr(ordered, "fallback_reason", None)
    feeds = synthetic_feeds(own)
    names = [o.name for o in own.get_outputs()]
    for name, a, b in zip(names, own.run(names, feeds), ordered.run(names, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=name)
