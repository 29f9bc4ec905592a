"""The traffic model of a step (onnxjob/graph/traffic.py): bytes read and written per node,
grouped by what made the node."""
import os
import tempfile

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph import traffic
from onnxjob.graph.compiler import compile_job
from onnxjob.runtime import backend
from onnxjob.runtime.session import default_session

F32 = ir.DataType.FLOAT


def _node(op_type, inputs, shape, dtype=F32):
    node = ir.node(op_type, inputs)
    node.outputs[0].type, node.outputs[0].shape = ir.TensorType(dtype), ir.Shape(shape)
    return node


def test_each_input_is_read_once_and_each_output_written_once():
    x = ir.Value(name="x", type=ir.TensorType(F32), shape=ir.Shape([10]))
    half = ir.Value(name="h", type=ir.TensorType(ir.DataType.FLOAT16), shape=ir.Shape([10]))
    assert traffic.node_traffic(_node("Mul", [x, x], [10])) == (40, 40)
    assert traffic.node_traffic(_node("Add", [x, half], [10])) == (60, 40)
    assert traffic.node_traffic(_node("Cast", [x], [10], ir.DataType.FLOAT16)) == (40, 20)
    shape = ir.Value(name="s", const_value=ir.tensor(np.array([2, 5], np.int64)))
    assert traffic.node_traffic(_node("Reshape", [x, shape], [2, 5])) == (0, 0)   # a view
    # a Gather reads the distinct rows it copies (and its indices), at most its whole data
    table = ir.Value(name="t", type=ir.TensorType(F32), shape=ir.Shape([1000, 8]))
    rows = ir.Value(name="i", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([4]))
    assert traffic.node_traffic(_node("Gather", [table, rows], [4, 8])) == (4 * 32 + 32, 128)
    many = ir.Value(name="j", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([3000]))
    assert traffic.node_traffic(_node("Gather", [table, many], [3000, 8])) == (
        32000 + 24000, 96000)
    windows = ir.Value(name="w", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape([2, 3]),
                       const_value=ir.tensor(np.array([[0, 1, 2], [1, 2, 3]])))
    assert traffic.node_traffic(_node("Gather", [table, windows], [2, 3, 8])) == (
        4 * 32 + 48, 6 * 32)      # rows 0-3 once each, though rows 1 and 2 go out twice


def test_a_train_step_s_nodes_are_grouped_by_what_made_them():
    """A conv / batch norm / ReLU step: each group holds the nodes its phase and op made,
    and a ReLU's bytes are those of its activation."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 8, 8))) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.1)
        h = flow.layers.conv2d(x, 6, 3, padding="SAME", kernel_initializer=init, name="c")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn"))
        loss = flow.math.reduce_mean(h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"     # the graph the CUDA EP would run, compiled without a GPU
    graph = compile_job(session.jobs["job"], session, 0).model.graph
    step = traffic.traffic(graph)
    groups = step.by_group()
    for expected in ("forward batch norm", "backward batch norm", "forward ReLU",
                     "backward ReLU", "optimizer", "convolutions and matmuls (compute)"):
        assert expected in groups, sorted(groups)
    (relu,) = [t for t in step.nodes if t.node.op_type == "Relu"]
    assert relu.group == "forward ReLU" and relu.read == relu.written == 4 * 6 * 8 * 8 * 4
    (momentum,) = [t for t in step.nodes if t.node.outputs[0].name == "c-weight-momentum/next"]
    assert momentum.group == "optimizer"
    assert sum(b for _, b in groups.values()) == sum(t.moved for t in step.nodes)
    assert step.memory_bound_bytes() + step.compute_bytes() == sum(t.moved for t in step.nodes)
    flow.clear_default_session()


_STEP_WEIGHTS = ("c-weight", "bn-gamma", "bn-beta", "c2-weight")


def _cuda_form_conv_bn_step(monkeypatch, skip, amp=False):
    """(compiled graph, [loss, then the weights' updates] on the CPU EP) of a conv / batch
    norm / ReLU train step compiled for the CUDA EP, with `skip` passes left out, under
    mixed precision with `amp`."""
    import onnxruntime as ort
    monkeypatch.setenv("ONNXJOB_SKIP_PASSES", skip)
    flow.clear_default_session()
    config = flow.FunctionConfig()
    config.enable_auto_mixed_precision(amp)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((4, 3, 8, 8))) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.3)
        h = flow.layers.conv2d(x, 6, 3, padding="SAME", kernel_initializer=init, name="c")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn"))
        h = flow.layers.conv2d(h, 4, 3, padding="SAME", kernel_initializer=init, name="c2")
        loss = flow.math.reduce_mean(flow.math.square(h))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"
    compiled = compile_job(session.jobs["job"], session, 0)
    rng = np.random.default_rng(0)
    inputs = {v.name: v for v in compiled.model.graph.inputs}
    feeds = {compiled.placeholder_names[0]: rng.standard_normal((4, 3, 8, 8)).astype(np.float32)}
    for variable, name in compiled.variable_inputs.items():
        shape, dtype = inputs[name].shape.numpy(), inputs[name].type.dtype.numpy()
        drawn = rng.standard_normal(shape) * 0.3 + (1 if "gamma" in variable else 0)
        feeds[name] = (drawn if dtype.kind == "f" else np.zeros(shape)).astype(dtype)
    names = [compiled.output_names[0]] + [compiled.state_outputs[v] for v in _STEP_WEIGHTS]
    sess = ort.InferenceSession(compiled.serialized(), providers=["CPUExecutionProvider"])
    loss, *weights = sess.run(names, feeds)
    flow.clear_default_session()
    return compiled.model.graph, [loss] + [
        new - feeds[compiled.variable_inputs[v]] for v, new in zip(_STEP_WEIGHTS, weights)]


def test_the_batch_norm_backward_reads_the_forward_s_centering(monkeypatch):
    """Compiled for CUDA in float32, the batch norm's backward makes no x - mean of its own
    (passes/share_batch_norm_centering.py): its group moves two activations' passes less,
    nothing in the backward reads the convolution's output, and the step's numbers are
    those of the graph without the pass."""
    graph, results = _cuda_form_conv_bn_step(monkeypatch, "")
    before, expected = _cuda_form_conv_bn_step(monkeypatch, "ShareBatchNormCentering")
    norm = "backward batch norm"
    subs = [t for t in traffic.traffic(graph).nodes
            if t.group == norm and t.node.op_type == "Sub"]
    assert subs == []
    activation = 4 * 6 * 8 * 8 * 4
    saved = traffic.traffic(before).by_group()[norm][1] - \
        traffic.traffic(graph).by_group()[norm][1]
    assert 2 * activation <= saved < 2 * activation + 1024   # (and the Sub's mean vector)
    # (x: what the forward normalizes, the convolution's output plus its bias)
    (forward,) = [n for n in graph if n.op_type == "BatchNormalization" and
                  traffic.origin(n) == ("forward", "onnxjob.BatchNormTrain")]
    assert all(traffic.origin(u.node)[0] == "forward" for u in forward.inputs[0].uses())
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_batch_norm_under_mixed_precision_reads_half_tensors_only(monkeypatch):
    """Under mixed precision the batch norm's statistics and gradient sums come from
    per-row statistics of the half tensors (passes/batch_norm_row_statistics.py): no
    activation-sized tensor is cast to float32 for them, the batch norm's groups (and those
    casts) move under 0.6x the bytes they did, and the step's loss and updates are as close to
    float32's as without the pass."""
    # (BatchBackwardCasts left out of both: on the CPU EP, which has no half batch norm and
    # runs one in float32, a parameter cast to half just before it is not rounded, one
    # that comes out of the batched cast is; on a GPU both are)
    graph, results = _cuda_form_conv_bn_step(monkeypatch, "BatchBackwardCasts", amp=True)
    before, parts = _cuda_form_conv_bn_step(
        monkeypatch, "BatchNormRowStatistics,BatchBackwardCasts", amp=True)
    _, exact = _cuda_form_conv_bn_step(monkeypatch, "", amp=False)
    norm = ("forward batch norm", "backward batch norm")
    for g in (graph, before):
        assert any(n.op_type == "Conv" and n.outputs[0].type.dtype == ir.DataType.FLOAT16
                   for n in g)
    assert {n.inputs[0].type.dtype for n in graph if n.op_type == "LayerNormalization"} == \
        {ir.DataType.FLOAT16}

    def moved(g):   # the batch norm's own nodes and the activation casts made for them
        return sum(t.moved for t in traffic.traffic(g).nodes if t.group in norm or (
            t.node.op_type == "Cast" and t.node.outputs[0] in casts_of(g)))

    def casts_of(g):
        return {n.outputs[0] for n in g if n.op_type == "Cast" and n.outputs[0].shape is not
                None and n.outputs[0].shape.numpy() == (4, 6, 8, 8)}
    assert {v.type.dtype for v in casts_of(before)} == {ir.DataType.FLOAT}
    assert {v.type.dtype for v in casts_of(graph)} <= {ir.DataType.FLOAT16}
    assert moved(graph) < 0.6 * moved(before), (moved(graph), moved(before))
    for got, without, want in zip(results, parts, exact):
        error = np.abs(got - want).max()
        assert error <= 2 * np.abs(without - want).max() + 2e-6 * np.abs(want).max(), \
            (error, np.abs(without - want).max())


def _update_passes(make_optimizer, amp=False):
    """The optimizer's bytes in a train step of one (256, 512) variable under a dynamic
    loss scale and clipping by global norm, compiled for CUDA (under float16 mixed
    precision with `amp`), in passes over the variable."""
    flow.clear_default_session()
    config = flow.function_config()
    config.enable_auto_mixed_precision(amp)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((8, 256))) -> tp.Numpy:
        w = flow.get_variable("w", (256, 512), initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_mean(flow.matmul(x, w))
        make_optimizer(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                       flow.optimizer.loss_scale.dynamic_loss_scale(),
                       flow.optimizer.grad_clipping.by_global_norm(1.0)).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"
    graph = compile_job(session.jobs["job"], session, 0).model.graph
    flow.clear_default_session()
    return traffic.traffic(graph).by_group()["optimizer"][1] / (256 * 512 * 4)


# the updates _update_passes measures: (learning rate, loss scale, clipping) -> optimizer
_OPTIMIZERS = {
    "lamb": lambda lr, scale, clip: flow.optimizer.LAMB(
        lr, loss_scale_policy=scale, grad_clipping=clip, weight_decay=0.01),
    "adam": lambda lr, scale, clip: flow.optimizer.Adam(
        lr, loss_scale_policy=scale, grad_clipping=clip, do_bias_correction=True),
    "sgd": lambda lr, scale, clip: flow.optimizer.SGD(
        lr, loss_scale_policy=scale, grad_clipping=clip)}


def test_the_gradient_s_scalar_factors_and_a_skipped_step_cost_no_extra_passes():
    """The loss scale's and the clipping's factors reach each gradient as one multiply,
    the non-finite check reads it once, and Adam and LAMB skip a non-finite step through
    their coefficients (update_rules.py), not a select over each new value: LAMB moved 57
    passes over its variable, Adam 48, momentum SGD 24 (a select per new value, three
    multiplies of the gradient) before. On float32 gradients the clipping's norm takes
    the unscaled gradient's squares (one more multiply: a dynamic scale there grows until
    the scaled squares overflow, update_rules.clip_by_global_norm); under float16 mixed
    precision on CUDA, where half gradients bound the scale, it does not."""
    bounds = {"lamb": 41.5, "adam": 36.5, "sgd": 20.5}
    fp32 = {name: _update_passes(make) for name, make in _OPTIMIZERS.items()}
    assert all(fp32[name] < bounds[name] + 2 for name in bounds), fp32
    half = {name: _update_passes(make, amp=True) for name, make in _OPTIMIZERS.items()}
    assert all(half[name] < bounds[name] for name in bounds), half


def test_under_mixed_precision_the_updates_take_the_gradient_s_factor_as_a_scalar():
    """Under float16 AMP the loss scale's and the clipping's factor goes into each update's
    own scalar coefficients (optimizer._folds_factors): no pass multiplies the gradient by
    it, two passes fewer for Adam, LAMB and momentum SGD than in float32."""
    for name, make in _OPTIMIZERS.items():
        full, half = _update_passes(make), _update_passes(make, amp=True)
        assert half <= full - 1.9, (name, full, half)


def test_a_matrix_vector_product_runs_at_memory_speed():
    """A MatMul with one row of results (HalfColumnSums' bias gradients) reads its matrix
    once at memory speed: counted in the memory-bound bytes, a full MatMul at compute
    speed."""
    from onnxjob.graph.tracer import GraphBuilder, op, tracing
    builder = GraphBuilder("g")
    with tracing(builder):
        m = builder.add_input("m", (512, 64), np.float32)
        row = builder.add_input("row", (1, 512), np.float32)
        square = builder.add_input("sq", (64, 512), np.float32)
        outs = [op("MatMul", row, m), op("MatMul", square, m)]
    step = traffic.traffic(builder.graph)
    vector, full = (next(t for t in step.nodes if t.node.outputs[0] is o.value) for o in outs)
    assert not traffic.at_compute_speed(vector.node) and traffic.at_compute_speed(full.node)
    assert step.memory_bound_bytes() == vector.moved and step.compute_bytes() == full.moved
    assert vector.group != "convolutions and matmuls (compute)"


def test_the_exact_gelu_counts_as_the_one_kernel_onnxruntime_fuses_it_into():
    """flow.math.gelu's forward (graph/primitives/elementwise.py) is the chain onnxruntime's
    GeluFusion makes one Gelu kernel of, in a train step compiled for CUDA and run with
    CUDA's session options (here on the CPU EP), and the traffic model counts it as that
    kernel: x read once, y written once."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((16, 64))) -> tp.Numpy:
        w = flow.get_variable("w", (64, 64), initializer=flow.random_normal_initializer())
        loss = flow.math.reduce_mean(flow.math.gelu(flow.matmul(x, w)))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"
    model = compile_job(session.jobs["job"], session, 0).model
    graph = model.graph
    flow.clear_default_session()
    step = traffic.traffic(graph)
    forward = [t for t in step.nodes if t.group == "forward GELU"]
    assert {t.node.op_type for t in forward} == {"Div", "Erf", "Add", "Mul"}
    assert sum(t.moved for t in forward) == 2 * 16 * 64 * 4
    assert traffic.fused_chains(graph)

    ops = [n.op_type for n in _optimized_for_cuda(model)]
    assert ops.count("Gelu") == 1 and ops.count("Erf") == 1    # the backward's own erf


def test_a_transposed_matmul_operand_costs_what_onnxruntime_fuses_it_into():
    """A Transpose of the last two axes read by one MatMul alone moves nothing: onnxruntime
    folds it into the product (FusedMatMul) with CUDA's session options, here on the CPU EP:
    every Transpose the model counts as fused is gone from the optimized graph."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 16, 32))) -> tp.Numpy:
        w = flow.get_variable("w", (4, 24, 32), initializer=flow.random_normal_initializer())
        y = flow.matmul(x, w, transpose_b=True)
        loss = flow.math.reduce_mean(y * y)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"
    model = compile_job(session.jobs["job"], session, 0).model
    flow.clear_default_session()
    step = traffic.traffic(model.graph)
    fused = [t.node.name for t in step.nodes if t.node.op_type == "Transpose" and not t.moved]
    assert fused
    assert not {n.name for n in _optimized_for_cuda(model)} & set(fused)


def _optimized_for_cuda(model):
    """The nodes of `model` (onnx_ir) as onnxruntime's optimizer writes them for a CUDA
    train session (its options and transformers, on the CPU EP here)."""
    opts = backend.session_options(True, device="cuda")
    with tempfile.TemporaryDirectory() as folder:
        opts.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
        ort.InferenceSession(ir.to_proto(model).SerializeToString(), opts,
                             providers=[backend.CPU],
                             disabled_optimizers=backend.disabled_transformers(True, "cuda"))
        return list(onnx.load(opts.optimized_model_filepath).graph.node)


def test_kernels_count_every_launch_but_views_and_fused_nodes():
    """A step's kernels: a view launches none, a GELU chain one (its fused inner nodes
    none), and the small ones (at most SMALL_KERNEL_BYTES moved) are counted apart."""
    x = ir.Value(name="x", type=ir.TensorType(F32), shape=ir.Shape([4, 8]))
    big = ir.Value(name="big", type=ir.TensorType(F32), shape=ir.Shape([512, 256]))
    shape = ir.Value(name="s", const_value=ir.tensor(np.array([32], np.int64)))
    view = _node("Reshape", [x, shape], [32])
    small = _node("Add", [view.outputs[0], view.outputs[0]], [32])
    large = _node("Mul", [big, big], [512, 256])
    root2 = ir.Value(name="r", const_value=ir.tensor(np.array(2 ** 0.5, np.float32)))
    one = ir.Value(name="one", const_value=ir.tensor(np.array(1.0, np.float32)))
    half = ir.Value(name="half", const_value=ir.tensor(np.array(0.5, np.float32)))
    div = _node("Div", [big, root2], [512, 256])
    erf = _node("Erf", [div.outputs[0]], [512, 256])
    add = _node("Add", [erf.outputs[0], one], [512, 256])
    mul = _node("Mul", [big, add.outputs[0]], [512, 256])
    gelu = _node("Mul", [mul.outputs[0], half], [512, 256])
    scale = ir.Value(name="scale", type=ir.TensorType(F32), shape=ir.Shape([512, 256]),
                     const_value=ir.tensor(np.ones((512, 256), np.float32)))
    folded = _node("Cast", [scale], [512, 256], ir.DataType.FLOAT16)    # a constant's cast
    nodes = [view, small, large, div, erf, add, mul, gelu, folded]
    graph = ir.Graph([x, big], [small.outputs[0], large.outputs[0], gelu.outputs[0],
                                folded.outputs[0]], nodes=nodes)
    graph.register_initializer(scale)
    step = traffic.traffic(graph)
    assert sum(t.fused_away for t in step.nodes) == 5      # the chain's inner nodes, the cast
    assert [t.moved for t in step.nodes if t.node is folded] == [0]
    assert step.kernels() == (3, 1)                          # Add (small), Mul, Gelu
    assert step.kernels(small=1 << 30) == (3, 3)
    by_op = step.kernels_by_op()
    assert sum(k for k, _ in by_op.values()) == 3 and sum(s for _, s in by_op.values()) == 1
    assert by_op[("forward add", "Add")] == (1, 1) and by_op[("forward Mul", "Mul")] == (2, 0)


def _pieces(op_type, whole_shape, piece_shapes, axis):
    whole = ir.Value(name="w", type=ir.TensorType(F32), shape=ir.Shape(whole_shape))
    pieces = [ir.Value(name=f"p{i}", type=ir.TensorType(F32), shape=ir.Shape(s))
              for i, s in enumerate(piece_shapes)]
    if op_type == "Concat":
        node = ir.node("Concat", pieces, attributes={"axis": axis})
        node.outputs[0].type, node.outputs[0].shape = ir.TensorType(F32), whole.shape
        return node
    node = ir.node("Split", [whole], attributes={"axis": axis}, num_outputs=len(pieces))
    for out, s in zip(node.outputs, piece_shapes):
        out.type, out.shape = ir.TensorType(F32), ir.Shape(s)
    return node


def test_concat_and_split_of_unequal_pieces_copy_an_index_table_from_the_host():
    """The CUDA EP's Concat and Split of unequal pieces, or of more than 32, fill a table of
    every index along the axis on the host each run (8 bytes an index); equal pieces none."""
    unequal = _pieces("Split", [1000], [[600], [400]], 0)
    assert traffic.host_table_bytes(unequal) == 8000
    as_rows = _pieces("Concat", [125, 8], [[75, 8], [50, 8]], 0)    # the same values as rows
    assert traffic.host_table_bytes(as_rows) == 1000
    assert traffic.host_table_bytes(_pieces("Split", [64, 800], [[64, 400]] * 2, 1)) == 0
    assert traffic.host_table_bytes(_pieces("Concat", [33], [[1]] * 33, 0)) == 264
    assert traffic.host_table_bytes(_node("Add", [], [4])) == 0


def test_a_half_batch_norm_counts_the_casts_of_its_parameters():
    """onnxruntime's CUDA BatchNormalization on half data casts its four parameters to
    float32 in kernels of their own before cuDNN's: five launches, four of them small."""
    def bn(dtype):
        x = ir.Value(name="x", type=ir.TensorType(dtype), shape=ir.Shape([64, 256, 56, 56]))
        params = [ir.Value(name=f"p{i}", type=ir.TensorType(dtype), shape=ir.Shape([256]))
                  for i in range(4)]
        node = _node("BatchNormalization", [x] + params, [64, 256, 56, 56], dtype)
        return traffic.traffic(ir.Graph([x] + params, [node.outputs[0]], nodes=[node]))
    assert bn(ir.DataType.FLOAT16).kernels() == (5, 4)
    assert bn(F32).kernels() == (1, 0)
