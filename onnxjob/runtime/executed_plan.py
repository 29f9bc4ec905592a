"""The graph onnxruntime runs for a compiled job: its optimized form, in the order its
session ran the nodes, for graph/memory_plan.py to plan.

memory_plan.plan(compiled graph) is what onnxjob's passes aim at. onnxruntime then rewrites
the graph (fusions make new nodes, its CSE merges values) and orders the nodes itself, and
either can keep values alive much longer than planned (runtime/backend.py's notes on the
execution order and on CSE). `executed_graph(model, device)` makes the CPU session that
`device`'s sessions would be (backend.session_options and disabled_transformers: the
optimization level, the transformers left out and the execution order, which are what
shape the optimized graph and its order), lets it write its optimized model, runs one step
on synthetic feeds with onnxruntime's profiler on and returns the optimized graph with its
nodes in the order the profile says they ran (graph_order.reorder_like). Compiled for CUDA,
the graph differs from what the CUDA EP runs only by EP-specific rewrites (float16 kernels
the CPU lacks get float32 casts around them: compare float32 graphs).
"""
import json
import os
import tempfile

import numpy as np
import onnx
import onnx_ir as ir

from onnxjob.runtime import backend, graph_order
from onnxjob.runtime.cuda_graph import NUMPY_DTYPES

_KERNEL_SUFFIX = "_kernel_time"


def executed_graph(model, device="cpu", is_train=True):
    """An onnx_ir Model: `model` (an onnx_ir Model) as onnxruntime's optimizer rewrites it
    for a `device` session, its nodes in the order a CPU session with those options ran
    them (see the module docstring)."""
    with tempfile.TemporaryDirectory() as folder:
        opts = backend.session_options(is_train, device=device)
        opts.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(folder, "profile")
        session = backend.optimized_session(
            ir.to_proto(model).SerializeToString(), opts, [backend.CPU],
            backend.disabled_transformers(is_train, device), device, is_train)
        session.run(None, synthetic_feeds(session))
        with open(session.end_profiling()) as f:
            events = json.load(f)
        optimized = onnx.shape_inference.infer_shapes(onnx.load(opts.optimized_model_filepath))
    ran = [e["name"][:-len(_KERNEL_SUFFIX)] for e in events
           if e.get("cat") == "Node" and e.get("name", "").endswith(_KERNEL_SUFFIX)]
    # (a node the profile does not name, a function op onnxruntime expanded into nodes of
    # its own when it ran, goes just before the first node that ran and reads its output)
    graph_order.reorder_like(optimized.graph, ran)
    return ir.from_proto(optimized)


def synthetic_feeds(session):
    """Feeds for every input of `session`: small random floats, integer and bool zeros
    (valid indices and labels), dynamic dimensions 1."""
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        dtype = np.dtype(NUMPY_DTYPES[arg.type])
        if np.issubdtype(dtype, np.floating):
            feeds[arg.name] = (rng.random(shape) * 0.01).astype(dtype)
        else:
            feeds[arg.name] = np.zeros(shape, dtype)
    return feeds
