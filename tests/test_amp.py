"""Automatic mixed precision (onnxjob/passes/auto_mixed_precision.py).

The pass three ways (structure, `modified`, numbers from onnxruntime), the train graphs of
the doc LeNet and MLP and of OneFlow-Benchmark's ResNet50 under AMP (half Conv/MatMul/Gemm,
float32 softmax, losses, reductions and updates), LeNet and MLP trained 200 steps against
float32 and the MLP against a PyTorch `torch.autocast` twin, and the flags around it.
"""
import collections
import os
import warnings

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from models import BATCH, lenet, mlp
from onnxjob.errors import TraceError
from onnxjob.graph.compiler import IR_VERSION
from onnxjob.graph.tracer import ORIGIN, GraphBuilder, as_blob, op, tracing
from onnxjob.passes import AutoMixedPrecision, op_counts
from onnxjob.runtime import backend
from onnxjob.runtime.session import default_session

F32, F16, BF16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16


# -- the pass on small graphs ---------------------------------------------------------------

def _graph(fn, shapes, weights=()):
    """A model of `fn(*inputs, *weights)`: inputs x0.. and weight inputs w0.. (float32)."""
    builder = GraphBuilder("g")
    with tracing(builder):
        xs = [builder.add_input(f"x{i}", s, np.float32) for i, s in enumerate(shapes)]
        ws = [builder.add_input(f"w{i}", s, np.float32) for i, s in enumerate(weights)]
        y = fn(*xs, *ws)
        y.value.name = "y"
        builder.graph.outputs.append(y.value)
    return ir.Model(builder.graph, ir_version=IR_VERSION)


def _run(model, feeds):
    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _types(model):
    """{node name: (op type, its first output's element type)} of an onnx_ir model."""
    return {n.name: (n.op_type, n.outputs[0].type.dtype) for n in model.graph}


def _by_op(model):
    by_op = collections.defaultdict(set)
    for node in model.graph:
        by_op[node.op_type].add(node.outputs[0].type.dtype)
    return by_op


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    return {v.name: rng.standard_normal(tuple(v.shape)).astype(np.float32)
            for v in model.graph.inputs}


def test_matmul_bias_relu_in_half_softmax_in_float32():
    """Rules 1-3: MatMul half, the bias add and ReLU between two MatMuls follow it, Softmax
    stays float32."""
    model = _graph(lambda x, w, b, w2: op("Softmax", op("MatMul", op("Relu", op(
        "Add", op("MatMul", x, w), b)), w2)), [(4, 8)], [(8, 16), (16,), (16, 5)])
    feeds = _feeds(model)
    expected = _run(model, feeds)
    assert op_counts(model).get("Cast", 0) == 0
    result = AutoMixedPrecision()(model)
    assert result.modified
    by_op = _by_op(model)
    assert by_op["MatMul"] == {ir.DataType.FLOAT16}
    assert by_op["Add"] == {ir.DataType.FLOAT16} and by_op["Relu"] == {ir.DataType.FLOAT16}
    assert by_op["Softmax"] == {ir.DataType.FLOAT}
    # x, w, b, w2 to half, the last MatMul's result back to float32 for the softmax
    assert op_counts(model)["Cast"] == 5
    out = model.graph.outputs[0]
    assert out.name == "y" and out.type.dtype == ir.DataType.FLOAT
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=2e-2, atol=2e-3)


def test_what_follows_the_last_matmul_runs_in_float32():
    """As OneFlow's white set (gray ops between white ones only): the last layer's bias add
    and what a placeholder is subtracted from after it stay float32 (a target of 150000
    would be infinite in half); a ReLU (a clear op) right after the MatMul follows it."""
    model = _graph(lambda x, t, w, b: op("Sub", op("Add", op("Relu", op("MatMul", x, w)), b), t),
                   [(2, 2), (2, 1)], [(2, 1), (1,)])
    AutoMixedPrecision()(model)
    by_op = _by_op(model)
    assert by_op["MatMul"] == {ir.DataType.FLOAT16} and by_op["Relu"] == {ir.DataType.FLOAT16}
    assert by_op["Add"] == {ir.DataType.FLOAT} and by_op["Sub"] == {ir.DataType.FLOAT}
    feeds = {"x0": np.array([[1, 2], [3, 4]], np.float32),
             "x1": np.array([[1000.1], [150000.0]], np.float32),
             "w0": np.full((2, 1), 0.5, np.float32), "w1": np.full((1,), 0.3, np.float32)}
    from onnx.reference import ReferenceEvaluator     # (the CPU EP drops half casts)
    got = ReferenceEvaluator(ir.to_proto(model)).run(None, feeds)[0]
    np.testing.assert_allclose(got.ravel(), [1.8 - 1000.1, 3.8 - 150000.0], rtol=1e-6)


def _conv_batch_norm_relu(scale):
    """Conv, batch statistics, the inference-mode BatchNormalization of the CUDA path
    (graph/primitives/batch_norm.py), a ReLU and the next (1x1) Conv; `scale` multiplies
    the activations."""
    def fn(x, w, gamma, beta, w2):
        y = op("Mul", op("Conv", x, w, pads=[1, 1, 1, 1]), as_blob(np.float32(scale), like=x))
        mean = op("ReduceMean", y, axes=[0, 2, 3], keepdims=0)
        centered = op("Sub", y, op("Reshape", mean, x.builder.constant(
            np.array([1, 8, 1, 1], np.int64))))
        var = op("ReduceMean", op("Mul", centered, centered), axes=[0, 2, 3], keepdims=0)
        normed = op("BatchNormalization", y, gamma, beta, mean, var, epsilon=1e-3)
        return op("Conv", op("Relu", normed), w2)
    return _graph(fn, [(2, 3, 6, 6)], [(8, 3, 3, 3), (8,), (8,), (4, 8, 1, 1)])


@pytest.mark.parametrize("scale", [1.0, 3000.0], ids=["unit", "variance-over-65504"])
def test_batch_norm_of_half_activations_runs_in_half(scale):
    """Rule 3: the normalization follows its data (half), its statistics fold into a
    per-channel x * a + b in float32 first, so a variance past float16's range is fine."""
    model = _conv_batch_norm_relu(scale)
    feeds = _feeds(model)
    feeds["x0"] += 3.0      # a mean several deviations away from 0
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    by_op = _by_op(model)
    assert by_op["Conv"] == by_op["BatchNormalization"] == by_op["Relu"] == {ir.DataType.FLOAT16}
    assert by_op["ReduceMean"] == {ir.DataType.FLOAT}          # the statistics
    bn = next(n for n in model.graph if n.op_type == "BatchNormalization")
    assert all(v.const_value is not None for v in bn.inputs[3:])   # mean 0, variance 1 - eps
    got = _run(model, feeds)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=2e-2, atol=2e-2)


def test_batch_norm_with_constant_statistics_casts_them():
    """The backward's a * dy + c form (mean 0, variance 1 - eps): cast, not folded."""
    eps = np.float32(1e-5)
    model = _graph(lambda x, a, c: op("BatchNormalization", op("Relu", op("MatMul", x, x)),
                                      a, c, as_blob(np.zeros(4, np.float32), like=x),
                                      as_blob(np.ones(4, np.float32) - eps, like=x),
                                      epsilon=float(eps)),
                   [(4, 4)], [(4,), (4,)])
    feeds = _feeds(model)
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    assert _by_op(model)["BatchNormalization"] == {ir.DataType.FLOAT16}
    assert "Sqrt" not in op_counts(model)
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=2e-2, atol=2e-2)


def test_a_weight_read_twice_is_cast_once():
    """Rule 4: one Cast per value and type, however many half nodes read it."""
    model = _graph(lambda x, w: op("Add", op("MatMul", x, w), op("MatMul", op("Relu", x), w)),
                   [(4, 8)], [(8, 8)])
    feeds = _feeds(model)
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    casts_of = collections.Counter(n.inputs[0].name for n in model.graph if n.op_type == "Cast")
    assert casts_of["w0"] == 1 and casts_of["x0"] == 1
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=2e-2, atol=2e-2)


def test_half_graph_output_keeps_its_name_and_float32():
    """Rule 5: a half result that is a graph output is cast back under its own name."""
    model = _graph(lambda x, w: op("MatMul", x, w), [(2, 3)], [(3, 5)])
    feeds = _feeds(model)
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    out = model.graph.outputs[0]
    assert out.name == "y" and out.type.dtype == ir.DataType.FLOAT
    assert out.producer().op_type == "Cast"
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=1e-2, atol=1e-2)


def test_follow_ops_of_float32_values_stay_float32():
    """Nothing runs in half without an ALLOW op: a graph of FOLLOW/DENY ops is untouched."""
    model = _graph(lambda x, y: op("Exp", op("Relu", op("Add", x, y))), [(3, 4), (3, 4)])
    before = _types(model)
    assert not AutoMixedPrecision()(model).modified
    assert _types(model) == before


def test_float32_value_meeting_half_value_runs_in_float32():
    """A FOLLOW node with one half and one computed float32 input computes in float32."""
    model = _graph(lambda x, w: op("Add", op("MatMul", x, w), op("Exp", x)), [(3, 3)], [(3, 3)])
    feeds = _feeds(model)
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    assert _by_op(model)["Add"] == {ir.DataType.FLOAT}
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=1e-2, atol=1e-2)


def test_fed_data_moved_to_a_matmul_moves_its_half_copy():
    """Rule 2's exception: x (fed data) is cast to half for one MatMul; its transpose read
    by another MatMul only moves that half copy (no float32 Transpose and cast); a
    transpose read by a float32 op moves x itself, and a variable's (w: the update reads
    it) casts its own copy rather than keep the forward's."""
    def fn(x, w):
        first = op("MatMul", x, w)
        second = op("MatMul", op("Transpose", x, perm=[1, 0]), first)
        kept = op("Softmax", op("Transpose", x, perm=[1, 0]))
        third = op("MatMul", first, op("Transpose", w, perm=[1, 0]))
        with x.builder.origin("update"):
            op("Mul", w, as_blob(np.float32(0.5)))
        return op("Add", op("Add", op("ReduceSum", second, keepdims=0),
                            op("ReduceSum", kept, keepdims=0)),
                  op("ReduceSum", third, keepdims=0))
    model = _graph(fn, [(4, 8)], [(8, 4)])
    feeds = _feeds(model)
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    x, w = model.graph.inputs
    moved, kept, weight = [n for n in model.graph if n.op_type == "Transpose"]
    assert moved.outputs[0].type.dtype == ir.DataType.FLOAT16
    assert moved.inputs[0].producer().op_type == "Cast" and \
        moved.inputs[0].producer().inputs[0] is x
    assert kept.inputs[0] is x and kept.outputs[0].type.dtype == ir.DataType.FLOAT
    assert weight.inputs[0] is w and weight.outputs[0].type.dtype == ir.DataType.FLOAT
    assert len([u for u in x.uses() if u.node.op_type == "Cast"]) == 1
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=2e-2, atol=5e-2)


def test_exp_of_a_value_never_positive_follows_its_half_input():
    """Rule 3: exp(-m^2 / 2) of a half m (GELU's derivative) runs in half, its result in
    [0, 1]; an Exp of anything else stays float32."""
    def fn(x, w, w2):
        m = op("MatMul", x, w)
        square = op("Mul", m, m)
        bounded = op("Exp", op("Mul", square, as_blob(np.float32(-0.5))))
        negated = op("Exp", op("Neg", square))
        growing = op("Exp", op("Mul", square, as_blob(np.float32(0.5))))
        total = op("Add", op("Add", bounded, negated), op("Exp", op("Add", m, growing)))
        return op("MatMul", total, w2)     # (between two MatMuls: rule 2)
    model = _graph(lambda x, w, w2: fn(x, w, w2), [(4, 8)], [(8, 16), (16, 3)])
    feeds = _feeds(model)
    feeds["w0"] *= 0.3
    expected = _run(model, feeds)
    assert AutoMixedPrecision()(model).modified
    exps = [n for n in model.graph if n.op_type == "Exp"]
    half = [n.outputs[0].type.dtype == ir.DataType.FLOAT16 for n in exps]
    assert half == [True, True, False, False], half
    np.testing.assert_allclose(_run(model, feeds), expected, rtol=2e-2, atol=2e-2)


def test_bfloat16_only_where_the_opset_allows_it():
    """bfloat16 Conv needs opset 22: at onnxjob's opset 17 a Conv stays float32, a MatMul
    goes to bfloat16."""
    model = _graph(lambda x, w, v: op("MatMul", op("Reshape", op("Conv", x, w),
                                                   x.builder.constant(np.array([2, -1]))), v),
                   [(2, 1, 4, 4)], [(2, 1, 3, 3), (8, 3)])
    assert AutoMixedPrecision(ir.DataType.BFLOAT16)(model).modified
    by_op = _by_op(model)
    assert by_op["Conv"] == {ir.DataType.FLOAT} and by_op["MatMul"] == {ir.DataType.BFLOAT16}
    onnx.checker.check_model(ir.to_proto(model), full_check=True)


# -- whole jobs -------------------------------------------------------------------------------

def _amp_config(half=None):
    config = flow.function_config()
    config.enable_auto_mixed_precision(True)
    if half is not None:
        config.mixed_precision_data_type(half)
    return config


def _jobs(net, amp, lr=0.1, momentum=0.0):
    config = _amp_config() if amp else flow.function_config()

    @flow.global_function(type="train", function_config=config)
    def train_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((BATCH,), dtype=flow.int32)) -> tp.Numpy:
        logits = net(images)
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits, name="loss")
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]),
                           momentum=momentum).minimize(loss)
        return loss

    predict_config = _amp_config() if amp else flow.function_config()

    @flow.global_function(type="predict", function_config=predict_config)
    def predict_job(images: tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)
                    ) -> tp.Numpy:
        return net(images)

    return train_job, predict_job


def _job_graph(name):
    """The job's graph as onnxruntime loads it: {op type: set of output element types},
    the model, its value types and its variables' input names."""
    model = onnx.load_from_string(default_session().runtimes[name].model_bytes)
    model = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(model.graph.value_info) + list(model.graph.output)
             + list(model.graph.input)}
    by_op = collections.defaultdict(set)
    for node in model.graph.node:
        by_op[node.op_type].add(types.get(node.output[0]))
    variables = default_session().runtimes[name].compiled.variable_inputs.values()
    return by_op, model, types, variables


def _origin(node):
    return {p.key: p.value for p in node.metadata_props}.get(ORIGIN, "forward")


def _assert_amp_graph(by_op, model, types, variable_inputs):
    compute = [op for op in ("Conv", "ConvTranspose", "MatMul", "Gemm") if op in by_op]
    assert compute, "no Conv/MatMul/Gemm in the graph"
    # the products run in half but the optimizer update's own (its finiteness count's
    # matrix-vector sums of the float32 gradients)
    for node in model.graph.node:
        if node.op_type in compute:
            in_update = _origin(node).startswith("update")
            assert types.get(node.output[0]) == (F32 if in_update else F16), \
                (node.name, _origin(node), types.get(node.output[0]))
    for op_type in ("Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "ReduceSum",
                    "ReduceMean", "Log"):
        assert by_op.get(op_type, {F32}) <= {F32, onnx.TensorProto.INT64}, \
            (op_type, by_op[op_type])
    # an Exp in half is GELU's derivative's exp(-x^2 / 2), in [0, 1] (AMP rule 3)
    for node in model.graph.node:
        if node.op_type == "Exp" and types.get(node.output[0]) == F16:
            assert _origin(node) == "backward:onnxjob.Gelu", (node.name, _origin(node))
    for out in model.graph.output:   # results, watches and every updated variable
        assert out.type.tensor_type.elem_type != F16, out.name
    outputs = {out.name for out in model.graph.output}
    for node in model.graph.node:    # no Cast to a value's own type is left (a copy)
        if node.op_type == "Cast" and node.output[0] not in outputs:
            to = next(a.i for a in node.attribute if a.name == "to")
            assert types.get(node.input[0]) != to, node.name
    # each variable (a graph input the update reads) is cast to half at most once per step;
    # fed data may be cast again after the memory peak (passes/recompute_cheap_values.py)
    casts = collections.Counter(n.input[0] for n in model.graph.node
                                if n.op_type == "Cast" and types.get(n.output[0]) == F16)
    variables = set(variable_inputs)
    assert variables
    assert max((c for name, c in casts.items() if name in variables), default=1) == 1


@pytest.mark.parametrize("net", [lenet, mlp], ids=["lenet", "mlp"])
def test_doc_models_train_graph_under_amp(net):
    train_job, predict_job = _jobs(net, amp=True)
    rng = np.random.default_rng(0)
    images = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, BATCH).astype(np.int32)
    loss = train_job(images, labels)
    assert loss.dtype == np.float32 and np.isfinite(loss).all()
    _assert_amp_graph(*_job_graph("train_job"))
    logits = predict_job(images)
    assert logits.dtype == np.float32 and logits.shape == (BATCH, 10)
    _assert_amp_graph(*_job_graph("predict_job"))


def _resnet50_amp_train_job(batch):
    from zoo import model_args, model_builder, smoothed_labels
    build, args = model_builder("resnet50"), model_args(False)

    @flow.global_function(type="train", function_config=_amp_config())
    def train_job(images: tp.Numpy.Placeholder((batch, 3, 224, 224), dtype=flow.float),
                  labels: tp.Numpy.Placeholder((batch,), dtype=flow.int32)) -> tp.Numpy:
        logits = build(images, args)
        loss = flow.nn.softmax_cross_entropy_with_logits(smoothed_labels(labels, logits), logits)
        loss = flow.math.reduce_mean(loss)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.01]),
                           momentum=0.875).minimize(loss)
        return loss
    return train_job


def test_resnet50_train_graph_under_amp():
    train_job = _resnet50_amp_train_job(2)
    rng = np.random.default_rng(0)
    loss = train_job(rng.random((2, 3, 224, 224), dtype=np.float32),
                     rng.integers(0, 1000, 2).astype(np.int32))
    assert np.isfinite(loss).all()
    by_op, model, types, variables = _job_graph("train_job")
    _assert_amp_graph(by_op, model, types, variables)
    assert sum(1 for n in model.graph.node if n.op_type == "Conv"
               and types[n.output[0]] == F16) >= 53   # every forward convolution


def test_resnet50_amp_graph_for_cuda_keeps_activations_half():
    """The graph compiled for the CUDA EP (compiled here without running it): the
    normalizations (forward, and the backward's a * dy + c and b * (x - mean)) and the
    ReLUs run in half, so activations do not go to float32 and back between two
    convolutions; only the batch statistics read float32 copies."""
    from onnxjob.graph.compiler import compile_job
    _resnet50_amp_train_job(2)
    session = default_session()
    session.device = "cuda"
    graph = compile_job(session.jobs["train_job"], session, 0).model.graph
    half = collections.Counter(n.op_type for n in graph
                               if n.outputs[0].type.dtype == ir.DataType.FLOAT16)
    assert half["Relu"] == 49 and half["BatchNormalization"] >= 53 + 2 * 52, half
    to_half = [n for n in graph if n.op_type == "Cast" and n.inputs[0].producer() is not None
               and n.outputs[0].type.dtype == ir.DataType.FLOAT16     # not the weights
               and np.prod(list(n.inputs[0].shape)) >= 2 * 64 * 7 * 7]   # activations
    # 250 with the normalizations in float32 (88 now): every activation came back to half
    assert len(to_half) < 100, len(to_half)


def _cuda_form_step(amp, x, labels, values):
    """(loss, {variable: gradient-updated value}) of one train step of a conv / batch-norm /
    max-pool net compiled for the CUDA EP (here, without a GPU) and run on the CPU EP."""
    from onnxjob.graph.compiler import compile_job
    flow.clear_default_session()
    config = _amp_config() if amp else flow.function_config()

    @flow.global_function(type="train", function_config=config)
    def job(images: tp.Numpy.Placeholder(x.shape), y: tp.Numpy.Placeholder(
            labels.shape, dtype=flow.int32)) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.3)
        h = flow.layers.conv2d(images, 8, 3, padding="SAME", kernel_initializer=init, name="c1")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn1"))
        h = flow.nn.max_pool2d(h, 3, 2, "SAME")
        h = flow.layers.conv2d(h, 8, 3, padding="SAME", kernel_initializer=init, name="c2")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn2"))
        logits = flow.layers.dense(flow.reshape(h, (x.shape[0], -1)), 5,
                                   kernel_initializer=init, name="out")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1])).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"
    compiled = compile_job(session.jobs["job"], session, 0)
    feeds = dict(zip(compiled.placeholder_names, (x, labels)))
    inputs = {v.name: v for v in compiled.model.graph.inputs}
    for variable, name in compiled.variable_inputs.items():
        shape, dtype = inputs[name].shape.numpy(), inputs[name].type.dtype.numpy()
        if variable not in values:
            drawn = np.random.default_rng(len(values)).standard_normal(shape) * 0.3
            values[variable] = (drawn if dtype.kind == "f" else np.zeros(shape)).astype(dtype)
        feeds[name] = values[variable]
    half_norms = [n for n in compiled.model.graph if n.op_type == "BatchNormalization"
                  and n.outputs[0].type.dtype == ir.DataType.FLOAT16]
    # 2 forward, 2 x 2 backward (x-hat for the gradient sums, passes/
    # batch_norm_row_statistics.py, and b * (x - mean) + c beside a half Mul a * dy,
    # passes/half_affine_pairs.py): bn1's dy comes from the max-pool gradient, a
    # scatter-add in float32 whose result is cast to half
    assert len(half_norms) == (6 if amp else 0)
    # x-hat's folded statistics (scale ones): its scale is 1 / std, no Mul by ones
    ones_products = [n for n in compiled.model.graph if n.op_type == "Mul" and any(
        v is not None and v.const_value is not None and v.const_value.numpy().size > 1 and
        np.all(v.const_value.numpy() == 1) for v in n.inputs)]
    assert not ones_products, [n.name for n in ones_products]
    sess = ort.InferenceSession(compiled.serialized(), providers=["CPUExecutionProvider"])
    names = [compiled.output_names[0]] + [compiled.state_outputs[v] for v in
                                          ("c1-weight", "c2-weight", "out-weight")]
    loss, *weights = sess.run(names, feeds)
    return loss, weights


def test_cuda_form_amp_step_agrees_with_float32():
    """The AMP graph compiled for CUDA (half batch norms, folded statistics, KeepOnCuda's
    rewrites), run in onnxruntime's true float16 kernels where the CPU has them and its
    casts elsewhere, takes the same step as the float32 graph to half precision."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((4, 3, 12, 12)) + 2.0).astype(np.float32)
    labels = rng.integers(0, 5, 4).astype(np.int32)
    values = {}
    loss32, weights32 = _cuda_form_step(False, x, labels, values)
    loss16, weights16 = _cuda_form_step(True, x, labels, values)
    np.testing.assert_allclose(loss16, loss32, rtol=2e-2, atol=2e-2)
    for w16, w32 in zip(weights16, weights32):
        np.testing.assert_allclose(w16, w32, rtol=2e-2, atol=1e-2)


def _gelu_step(amp, x, w):
    """(compiled graph, updated w) of one SGD step of mean(gelu(x @ w)^2), compiled for
    CUDA and run on the CPU EP."""
    from onnxjob.graph.compiler import compile_job
    flow.clear_default_session()

    @flow.global_function(type="train",
                          function_config=_amp_config() if amp else flow.function_config())
    def job(images: tp.Numpy.Placeholder(x.shape)) -> tp.Numpy:
        weight = flow.get_variable("w", w.shape, initializer=flow.zeros_initializer())
        # (between two MatMuls, as in a transformer: after the last one GELU is float32)
        h = flow.matmul(flow.math.gelu(flow.matmul(images, weight)),
                        flow.constant(0.1, shape=(w.shape[1], 8)))
        loss = flow.math.reduce_mean(h * h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [1.0])).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"
    compiled = compile_job(session.jobs["job"], session, 0)
    inputs = {v.name: v for v in compiled.model.graph.inputs}
    feeds = {compiled.placeholder_names[0]: x}
    for variable, name in compiled.variable_inputs.items():     # w, and zero state
        feeds[name] = w if variable == "w" else np.zeros(
            inputs[name].shape.numpy(), inputs[name].type.dtype.numpy())
    sess = ort.InferenceSession(compiled.serialized(), providers=["CPUExecutionProvider"])
    (updated,) = sess.run([compiled.state_outputs["w"]], feeds)
    flow.clear_default_session()
    return compiled.model.graph, updated


def test_gelu_gradient_runs_in_half_under_amp():
    """GELU's derivative (Phi(x) + x phi(x), phi by exp(-x^2 / 2)) runs in half after a
    half MatMul: no GELU node of the backward computes in float32 (the Erf is the
    forward's), and the step agrees
    with float32's to half precision."""
    from onnxjob.graph.traffic import origin
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32)).astype(np.float32)
    w = (rng.standard_normal((32, 64)) * 0.3).astype(np.float32)
    graph, half = _gelu_step(True, x, w)
    _, exact = _gelu_step(False, x, w)
    backward = [n for n in graph if origin(n) == ("backward", "onnxjob.Gelu")]
    assert {n.op_type for n in backward} >= {"Exp", "Mul", "Add"}
    assert {n.outputs[0].type.dtype for n in backward} == {ir.DataType.FLOAT16}
    update, exact_update = half - w, exact - w
    np.testing.assert_allclose(update, exact_update, rtol=2e-2,
                               atol=1e-2 * np.abs(exact_update).max())


def _mnist_batches(path, steps):
    data = np.load(path)
    x = (data["x_train"][:BATCH * steps].astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    y = data["y_train"][:BATCH * steps].astype(np.int32)
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(steps)]


def _train_losses(net, amp, batches, seed=1):
    flow.clear_default_session()
    flow.config.seed(seed)
    train_job, _ = _jobs(net, amp)
    return np.array([float(np.mean(train_job(x, y))) for x, y in batches])


@pytest.mark.parametrize("net", [lenet, mlp], ids=["lenet", "mlp"])
def test_doc_models_train_under_amp_as_in_float32(net, mnist_path):
    """100 steps on MNIST: the AMP loss curve stays within 10% + 0.03 of float32's (means
    over windows of 20 steps; the steepest part of the curve differs most: LeNet's worst
    window uses a third of the tolerance, the same over 200 steps), and it learns."""
    batches = _mnist_batches(mnist_path, 100)
    full = _train_losses(net, False, batches)
    half = _train_losses(net, True, batches)
    assert np.isfinite(half).all()
    assert half[-20:].mean() < 0.3 * half[:5].mean(), half[::20]
    windows = lambda a: a.reshape(5, 20).mean(axis=1)  # noqa: E731
    np.testing.assert_allclose(windows(half), windows(full), rtol=0.1, atol=0.03)


def test_mlp_under_amp_agrees_with_torch_autocast(mnist_path):
    """The MLP trained 200 steps under AMP and its PyTorch twin under torch.autocast
    (bfloat16: PyTorch's CPU autocast type), from the same weights on the same batches:
    the loss curves agree within 0.05 per window of 20 steps."""
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    batches = _mnist_batches(mnist_path, 200)
    flow.clear_default_session()
    flow.config.seed(1)
    train_job, _ = _jobs(mlp, amp=True)
    ours = [float(np.mean(train_job(*batches[0])))]
    flow.clear_default_session()
    flow.config.seed(1)
    train_job, _ = _jobs(mlp, amp=True)
    initial = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    ours = np.array([float(np.mean(train_job(x, y))) for x, y in batches])

    params = {k: torch.tensor(v, requires_grad=True) for k, v in initial.items()
              if k.startswith(("hidden-", "output-"))}
    theirs = []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = torch.relu(torch.nn.functional.linear(torch.from_numpy(x).reshape(BATCH, -1),
                                                      params["hidden-weight"],
                                                      params["hidden-bias"]))
            logits = torch.nn.functional.linear(h, params["output-weight"], params["output-bias"])
        loss = torch.nn.functional.cross_entropy(logits.float(), torch.from_numpy(y).long())
        for p in params.values():
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params.values():
                p -= 0.1 * p.grad
        theirs.append(float(loss.detach()))
    windows = lambda a: np.asarray(a).reshape(10, 20).mean(axis=1)  # noqa: E731
    np.testing.assert_allclose(windows(ours), windows(theirs), atol=0.05)


def test_amp_predict_matches_float32_predict():
    rng = np.random.default_rng(0)
    images = rng.random((BATCH, 1, 28, 28), dtype=np.float32)
    flow.config.seed(2)
    _, predict_full = _jobs(lenet, amp=False)
    full = predict_full(images)
    flow.clear_default_session()
    flow.config.seed(2)
    _, predict_half = _jobs(lenet, amp=True)
    half = predict_half(images)
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, full, rtol=0, atol=1e-2 * np.abs(full).max())


# -- flags ------------------------------------------------------------------------------------

def test_bfloat16_on_the_cpu_is_refused_at_the_job(monkeypatch):
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")
    config = _amp_config(flow.bfloat16)

    @flow.global_function(type="predict", function_config=config)
    def job(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
        return flow.matmul(x, flow.get_variable("w", (3, 3), initializer=flow.ones_initializer()))

    with pytest.raises(TraceError, match="bfloat16.*CUDA") as info:
        job(np.ones((2, 3), np.float32))
    assert os.path.basename(__file__) in str(info.value)


def test_mixed_precision_data_type_takes_only_half_types():
    config = flow.function_config()
    config.mixed_precision_data_type(flow.float16)
    config.mixed_precision_data_type("bfloat16")
    assert config.get("mixed_precision_data_type") == "bfloat16"
    with pytest.raises(ValueError, match="float16 or flow.bfloat16"):
        config.mixed_precision_data_type(flow.float32)


def test_unsupported_flags_that_change_numbers_warn_once_by_name():
    from onnxjob.frontend import config as config_module
    config_module._warned_flags.clear()
    config = flow.function_config()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config.enable_true_half_config_when_conv(True)
        config.enable_true_half_config_when_conv(True)
        config.use_xla_jit(False)          # OneFlow's default: nothing to say
        config.enable_keep_header_only(True)
        config.enable_qat(True)                  # implemented (ops/qat.py): quiet
        config.enable_fuse_add_to_output(True)   # tuning only: quiet
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "enable_true_half_config_when_conv" in messages[0]
    assert "enable_keep_header_only" in messages[1]
    assert all(w.filename == __file__ for w in caught)


def test_of_cnn_train_val_use_fp16_builds_an_amp_graph(tmp_path):
    """OneFlow-Benchmark's unchanged training script with --use_fp16: its train job's graph
    (dumped after the passes) computes its convolutions in float16 and trains."""
    import subprocess
    import sys
    from zoo import cnns_dir
    script = os.path.join(cnns_dir(), "of_cnn_train_val.py")
    dump = tmp_path / "dump"
    env = dict(os.environ, ONNXJOB_DUMP_PASSES=str(dump))
    done = subprocess.run(
        [sys.executable, "-m", "onnxjob", "run", script, "--model=resnet50", "--use_fp16",
         "--batch_size_per_device=2", "--num_examples=4", "--num_epochs=1",
         "--loss_print_every_n_iter=1"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    losses = [float(line.split("loss: ")[1].split(",")[0]) for line in done.stdout.splitlines()
              if line.startswith("train: epoch 1")]
    assert len(losses) == 2 and all(np.isfinite(losses)), done.stdout[-2000:]
    train_graphs = [p for p in dump.glob("*.after.onnx") if "Train" in p.name or
                    "train" in p.name]
    assert train_graphs, sorted(p.name for p in dump.iterdir())
    model = onnx.shape_inference.infer_shapes(onnx.load(str(train_graphs[0])))
    assert model.metadata_props and any(p.key == "onnxjob.mixed_precision" and
                                        p.value == "float16" for p in model.metadata_props)
    types = {v.name: v.type.tensor_type.elem_type
             for v in list(model.graph.value_info) + list(model.graph.output)}
    convs = [types.get(n.output[0]) for n in model.graph.node if n.op_type == "Conv"]
    assert convs and all(t == F16 for t in convs), collections.Counter(convs)


# -- loss scaling in true half arithmetic ------------------------------------------------------
# onnxruntime's CPU EP runs a float16 graph through float32 kernels and drops the
# float->half->float cast pairs it inserts, so there a half value never overflows. onnx's
# reference evaluator computes each node in its declared type (NumPy float16): it shows what
# the graph does on a device that computes in half.

def _reference_steps(job_name, feeds, values, steps):
    """Run the train job's graph `steps` times in onnx.reference, feeding its state outputs
    back; yields (its loss, the variables before the step, after it)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.ops.op_one_hot import OneHot as ReferenceOneHot

    class OneHot(ReferenceOneHot):   # the reference takes depth only as a scalar
        def _run(self, indices, depth, values, axis=None):
            return super()._run(indices, np.asarray(depth).reshape(()), values, axis=axis)

    runtime = default_session().runtimes[job_name]
    compiled, model = runtime.compiled, onnx.load_from_string(runtime.model_bytes)
    evaluator = ReferenceEvaluator(model, new_ops=[OneHot])
    names = [o.name for o in model.graph.output]
    for _ in range(steps):
        inputs = dict(zip(compiled.placeholder_names, feeds))
        inputs.update({name: values[v] for v, name in compiled.variable_inputs.items()})
        with np.errstate(over="ignore", invalid="ignore"):
            outputs = dict(zip(names, evaluator.run(None, inputs)))
        after = dict(values, **{v: outputs[o] for v, o in compiled.state_outputs.items()})
        yield float(np.mean(outputs[compiled.output_names[0]])), values, after
        values = after


def test_dynamic_loss_scale_skips_the_steps_that_overflow_in_half():
    """A dynamic scale of 2**24 under AMP: in float16 arithmetic the scaled gradients
    overflow, the step changes no weight, slot or step counter and the scale halves, until it
    is small enough; then the net trains and the scale grows after `increment_period` good
    steps, exactly by OneFlow's rule."""
    flow.config.seed(0)
    policy = flow.optimizer.loss_scale.dynamic_loss_scale(
        initial_loss_scale=2.0 ** 24, increment_period=2, multiplier=2.0)

    @flow.global_function(type="train", function_config=_amp_config())
    def train_job(x: tp.Numpy.Placeholder((8, 16)),
                  y: tp.Numpy.Placeholder((8,), dtype=flow.int32)) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.5)
        h = flow.layers.dense(x, 32, activation=flow.nn.relu, kernel_initializer=init, name="h")
        logits = flow.layers.dense(h, 4, kernel_initializer=init, name="o")
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(y, logits)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]), momentum=0.9,
                           loss_scale_policy=policy).minimize(loss)
        return loss

    rng = np.random.default_rng(0)
    feeds = (rng.standard_normal((8, 16)).astype(np.float32),
             rng.integers(0, 4, 8).astype(np.int32))
    values = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}
    prefix = "System-Train-DynamicLossScale-train_job-"
    scale, counter = prefix + "LossScale", prefix + "GoodStepCounter"
    rest = [k for k in values if k not in (scale, counter)]   # weights, momenta, train step
    assert any(k.endswith("-momentum") for k in rest) and any("TrainStep" in k for k in rest)

    expected_scale, expected_counter, skipped, losses = 2.0 ** 24, 0, [], []
    for loss, before, after in _reference_steps("train_job", feeds, values, 14):
        unchanged = [k for k in rest if np.array_equal(before[k], after[k])]
        finite = not unchanged
        assert finite or len(unchanged) == len(rest), "a step changed only some variables"
        skipped.append(not finite)
        # OneFlow's dynamic_loss_scale_schedule kernel
        if finite:
            expected_counter += 1
            if expected_counter == 2:
                expected_scale, expected_counter = expected_scale * 2, 0
            losses.append(loss)
        else:
            expected_scale, expected_counter = max(expected_scale / 2, 1.0), 0
        assert after[scale].item() == expected_scale and after[counter].item() == expected_counter
    assert skipped[:3] == [True, True, True], skipped          # 2**24 overflows float16
    assert not all(skipped[-5:]), skipped                       # then it trains...
    assert losses[-1] < losses[0], losses                       # ...and learns

    loss = train_job(*feeds)
    after = flow.get_all_variables()
    if backend.cuda_usable():
        # the CUDA EP computes it in float16 as the reference did: the step is skipped
        assert after[scale].numpy().item() == 2.0 ** 23
        np.testing.assert_array_equal(after["h-weight"].numpy(), values["h-weight"])
    else:
        # onnxruntime's CPU EP computes the same graph in float32: nothing overflows at 2**24
        assert np.isfinite(loss).all()
        assert after[scale].numpy().item() == 2.0 ** 24
        assert not np.array_equal(after["h-weight"].numpy(), values["h-weight"])


def test_bert_pretraining_under_amp_as_upstream_use_fp16():
    """OneFlow-Benchmark's BERT pretraining with its --use_fp16 settings (AMP and upstream's
    dynamic loss scale from 2**30, LAMB, clipping): attention and dense MatMuls in half,
    softmax, layer norm and losses in float32. The first steps overflow in float16 and are
    skipped (the train step and so the learning-rate schedule do not advance), the scale
    halving each time, as in OneFlow; from the first good step on, the losses follow the
    float32 run's within 1%."""
    from bert_models import define_train_job, optimizer_args, synthetic_batch
    batch = synthetic_batch(4)
    scale_name = "System-Train-DynamicLossScale-train_job-LossScale"

    def run(amp, steps):
        flow.clear_default_session()
        flow.config.seed(0)
        args = optimizer_args()
        args.use_fp16 = amp
        train_job = define_train_job(4, opt_args=args,
                                     function_config=_amp_config() if amp else None)
        losses, scales = [], []
        for _ in range(steps):
            losses.append(float(train_job(*batch)["total_loss"].mean()))
            if amp:
                scales.append(flow.get_all_variables()[scale_name].numpy().item())
        return losses, scales

    full, _ = run(False, 6)
    half, scales = run(True, 30)
    by_op, model, types, variables = _job_graph("train_job")
    _assert_amp_graph(by_op, model, types, variables)
    assert F16 in by_op["MatMul"] or F16 in by_op.get("Gemm", set())
    assert by_op["Softmax"] == {F32}
    skipped = next(i for i, s in enumerate(scales) if s != 2.0 ** 30 / 2 ** (i + 1))
    assert 1 <= skipped <= 20, scales
    assert len(set(half[:skipped + 1])) == 1, half[:skipped + 1]   # no variable changed
    np.testing.assert_allclose(half[skipped:skipped + 6], full, rtol=1e-2)
