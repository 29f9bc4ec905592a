"""Batch normalization's backward coefficients computed for every layer together
(onnxjob/graph/batch_norm_coefficients.py): the values the per-layer ones give, in fewer
kernels, and the passes that read them still find them."""
import numpy as np
import onnx_ir as ir
import onnxruntime as ort

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph import batch_norm_coefficients, traffic
from onnxjob.graph.compiler import compile_job
from onnxjob.runtime.session import default_session

SHAPE = (4, 3, 6, 6)
X = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)


def _per_layer(monkeypatch):
    """Leave each layer's coefficients as its gradient rule made them."""
    monkeypatch.setattr(batch_norm_coefficients, "flush",
                        lambda builder: setattr(builder, "batch_norm_coefficients", []))


def _define(amp=False):
    """A train job with batch norms of 3, 64, 64 and 128 channels, two epsilons, between
    convolutions."""
    config = flow.FunctionConfig()
    config.enable_auto_mixed_precision(amp)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder(SHAPE)) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.3)
        h = flow.layers.batch_normalization(x, axis=1, name="bn0")
        h = flow.layers.conv2d(h, 64, 3, padding="SAME", kernel_initializer=init, name="c0")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, epsilon=1e-3, name="bn1"))
        h = flow.layers.conv2d(h, 64, 3, padding="SAME", kernel_initializer=init, name="c1")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn2"))
        h = flow.layers.conv2d(h, 128, 1, kernel_initializer=init, name="c2")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn3"))
        # (a last convolution: under mixed precision what follows the forward's last one
        # is float32, as OneFlow's white set leaves it)
        h = flow.layers.conv2d(h, 8, 1, kernel_initializer=init, name="c3")
        loss = flow.math.reduce_mean(flow.math.square(h - 0.5))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss
    return job


def _trained(monkeypatch, together):
    if not together:
        _per_layer(monkeypatch)
    flow.clear_default_session()
    flow.config.seed(3)
    job = _define()
    losses = [float(job(X * (step + 1))) for step in range(3)]
    return losses, {k: v.numpy().copy() for k, v in flow.get_all_variables().items()}


def test_together_the_steps_are_those_of_per_layer_coefficients(monkeypatch):
    """Three steps (gradients, momentum, moving averages) give bit for bit the variables
    and losses of the same step with each layer's coefficients made on their own: the
    same float32 operations on the same values."""
    losses, together = _trained(monkeypatch, True)
    with monkeypatch.context() as m:
        per_losses, per_layer = _trained(m, False)
    assert losses == per_losses
    assert set(together) == set(per_layer) and "bn1-gamma" in together
    for name, value in per_layer.items():
        np.testing.assert_array_equal(together[name], value, err_msg=name)
    assert not np.allclose(together["bn2-gamma"], 1.0), "the scales were trained"


def _cuda_graph(monkeypatch, together, amp=False):
    """The step's graph compiled for the CUDA EP (no GPU needed)."""
    if not together:
        _per_layer(monkeypatch)
    flow.clear_default_session()
    _define(amp)
    session = default_session()
    session.device = "cuda"
    compiled = compile_job(session.jobs["job"], session, 0)
    flow.clear_default_session()
    return compiled


def _backward_ops(graph, op_type):
    return [n for n in graph if n.op_type == op_type and
            traffic.origin(n) == ("backward", "onnxjob.BatchNormTrain")]


def test_the_backward_makes_one_inverse_std_for_every_layer(monkeypatch):
    """Compiled for CUDA: one Sqrt and one Reciprocal in the backward of the batch norms of
    64 and 128 channels instead of one per layer (the 3 channels of bn0 are another width
    class, shape_ops.concat_flat: alone, its own), and at least five kernels fewer for each
    of those three layers; the compiled
    step's numbers on the CPU EP are those of the per-layer graph."""
    compiled = _cuda_graph(monkeypatch, True)
    with monkeypatch.context() as m:
        per_layer = _cuda_graph(m, False)
    graph, before = compiled.model.graph, per_layer.model.graph
    for op_type in ("Sqrt", "Reciprocal"):
        assert len(_backward_ops(graph, op_type)) == 2
        assert len(_backward_ops(before, op_type)) == 4
    # per layer: d_gamma, b and c (six before)
    assert _channel_products(graph) == [64, 64, 64, 64, 64, 64, 128, 128, 128]
    assert _channel_products(before) == [64] * 12 + [128] * 6
    kernels, _ = traffic.traffic(graph).kernels()
    kernels_before, _ = traffic.traffic(before).kernels()
    assert kernels < kernels_before, (kernels, kernels_before)
    results = [_run_on_cpu(c) for c in (compiled, per_layer)]
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _channel_products(graph):
    """The channels of the backward's products of per-channel vectors of 64 or more."""
    return sorted(n.outputs[0].shape[0] for n in _backward_ops(graph, "Mul")
                  if len(n.outputs[0].shape) == 1 and n.outputs[0].shape[0] >= 64)


def _run_on_cpu(compiled):
    rng = np.random.default_rng(1)
    inputs = {v.name: v for v in compiled.model.graph.inputs}
    feeds = {compiled.placeholder_names[0]: X}
    for variable, name in compiled.variable_inputs.items():
        shape, dtype = inputs[name].shape.numpy(), inputs[name].type.dtype.numpy()
        drawn = rng.standard_normal(shape) * 0.3 + (1 if "gamma" in variable else 0)
        feeds[name] = (drawn if dtype.kind == "f" else np.zeros(shape)).astype(dtype)
    names = [compiled.output_names[0]] + sorted(compiled.state_outputs.values())
    sess = ort.InferenceSession(compiled.serialized(), providers=["CPUExecutionProvider"])
    return sess.run(names, feeds)


def test_under_mixed_precision_the_row_statistics_still_take_every_gradient_sum(
        monkeypatch):
    """Under mixed precision, passes/batch_norm_row_statistics.py still finds each
    layer's d_gamma (its sum times the shared 1 / std piece) and takes it from per-row
    statistics of half tensors, as with per-layer coefficients: the same LayerNormalization
    nodes, and no float32 activation-sized product left in the backward but bn0's, whose
    input is the float32 x."""
    graph = _cuda_graph(monkeypatch, True, amp=True).model.graph
    with monkeypatch.context() as m:
        before = _cuda_graph(m, False, amp=True).model.graph

    def layer_norms(g):
        return sorted(tuple(n.inputs[0].shape) for n in g if n.op_type == "LayerNormalization")
    assert layer_norms(graph) == layer_norms(before) and len(layer_norms(graph)) >= 9
    for g in (graph, before):
        assert not [n for n in _backward_ops(g, "Mul")
                    if n.outputs[0].shape is not None and len(n.outputs[0].shape) == 4 and
                    n.outputs[0].shape[1] != 3 and n.outputs[0].type.dtype == ir.DataType.FLOAT]

