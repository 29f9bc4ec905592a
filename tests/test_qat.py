"""Quantization-aware training (function_config.enable_qat, onnxjob/ops/qat.py) against
OneFlow 0.5's QuantAwareTraining pass: where fake quantization goes, its numbers (NumPy
versions of OneFlow's observer and fake-quantization kernels), training through the
straight-through gradient (a PyTorch twin), the moving statistics' stop and their
checkpoints."""
import math
import os
import warnings
from typing import Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.graph.tracer import GraphBuilder, tracing
from test_quantization import fake_quant

FQ = "onnxjob.FakeQuantization"
f32 = np.float32


def qat_config(symmetric=True, per_channel=False, backend="", stop=1000, momentum=None):
    config = flow.FunctionConfig()
    config.enable_qat(True)
    config.qat.symmetric(symmetric)
    config.qat.per_channel_weight_quantization(per_channel)
    config.qat.target_backend(backend)
    if stop is not None:
        config.qat.moving_min_max_stop_update_after_iters(stop)
    if momentum is not None:
        config.qat.moving_min_max_momentum(momentum)
    return config


def sgd(lr):
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0)


def traced(job):
    """The job traced (the graph before autodiff and the passes): its builder, whose
    `outputs` are the Blobs the job returns."""
    job = job.job   # the JobFunction behind the decorated function
    builder = GraphBuilder(job.name, is_train=job.is_train)
    with tracing(builder):
        builder.outputs = job.trace(builder)[1]
    return builder


def source(blob):
    """`blob` named by what it is made of: fq(...) for a fake quantization, through
    reshapes, pads and identities."""
    node = blob.producer
    if node is None:
        return blob.name
    if node.op_type == FQ:
        return f"fq({source(node.inputs[0])})"
    if node.op_type in ("Reshape", "Identity", "Transpose"):
        return source(node.inputs[0])
    if node.op_type == "Pad":
        return f"pad({source(node.inputs[0])})"
    return blob.name


def reads(builder, op_type, named=""):
    """[inputs of each `op_type` node (whose name has `named`), as `source` names them],
    in trace order."""
    return [[source(x) for x in n.inputs if x is not None and x.value.const_value is None]
            for n in builder.nodes if n.op_type == op_type and named in n.outputs[0].name]


def fake_quantized(builder):
    return sorted(source(n.inputs[0]) for n in builder.nodes if n.op_type == FQ)


# -- where fake quantization goes ----------------------------------------------------------

def conv_pair_job(config, use_bias=True, shape=(2, 3, 4, 5)):
    """OneFlow's test_quantization_aware_training net: conv1, then conv2 under the scope
    exclusion."""
    @flow.global_function(type="train", function_config=config)
    def Foo(x: tp.Numpy.Placeholder(shape)) -> Tuple[tp.Numpy, tp.Numpy]:
        init = flow.random_normal_initializer(stddev=0.5)
        y = flow.layers.conv2d(x, 4, 3, 1, "SAME", use_bias=use_bias, name="conv1",
                               kernel_initializer=init, bias_initializer=init)
        with flow.experimental.scope.config(quantization_aware_training=False):
            z = flow.layers.conv2d(y, 4, 3, 1, "SAME", use_bias=use_bias, name="conv2",
                                   kernel_initializer=init, bias_initializer=init)
        sgd(0.0).minimize(z)
        return y, z
    return Foo


def test_conv_chain_google_backend():
    b = traced(conv_pair_job(qat_config()))
    # conv1: its input (moving average) and weight (min-max); the chain's bias_add: its
    # bias; the chain's end: its output, for conv2 (excluded itself) and the job's output
    assert reads(b, "Conv") == [["fq(x)", "fq(conv1-weight)"],
                                ["fq(conv1-bias_add/out)", "conv2-weight"]]
    assert reads(b, "Add", "bias_add") == [["conv1/out", "fq(conv1-bias)"],
                                           ["conv2/out", "conv2-bias"]]
    assert fake_quantized(b) == ["conv1-bias", "conv1-bias_add/out", "conv1-weight", "x"]


def test_conv_chain_without_bias_and_job_outputs():
    b = traced(conv_pair_job(qat_config(), use_bias=False))
    assert reads(b, "Conv") == [["fq(x)", "fq(conv1-weight)"], ["fq(conv1/out)", "conv2-weight"]]
    # the job returns conv1's quantized output (OneFlow's return op reads it: one fake
    # quantization for both readers), conv2's as it is
    assert [source(y) for y in b.outputs] == ["fq(conv1/out)", "conv2/out"]
    assert fake_quantized(b) == ["conv1-weight", "conv1/out", "x"]


def test_conv_chain_cambricon_backend():
    # "cambricon" quantizes the inputs of int8 ops only, never their outputs
    b = traced(conv_pair_job(qat_config(backend="cambricon")))
    assert reads(b, "Conv") == [["fq(x)", "fq(conv1-weight)"],
                                ["conv1-bias_add/out", "conv2-weight"]]
    assert fake_quantized(b) == ["conv1-bias", "conv1-weight", "x"]


def test_without_the_scope_exclusion_both_convs_quantize():
    @flow.global_function(type="predict", function_config=qat_config())
    def job(x: tp.Numpy.Placeholder((2, 3, 4, 5))) -> tp.Numpy:
        y = flow.layers.conv2d(x, 4, 3, 1, "SAME", use_bias=False, name="conv1")
        return flow.layers.conv2d(y, 4, 3, 1, "SAME", use_bias=False, name="conv2")

    b = traced(job)
    # conv2's input comes from a white op: it is conv1's quantized output, not a second one
    assert reads(b, "Conv") == [["fq(x)", "fq(conv1-weight)"],
                                ["fq(conv1/out)", "fq(conv2-weight)"]]
    assert fake_quantized(b) == ["conv1-weight", "conv1/out", "conv2-weight", "conv2/out", "x"]


def test_enable_qat_false_and_plain_jobs_have_no_fake_quantization():
    config = qat_config()
    config.enable_qat(False)
    assert fake_quantized(traced(conv_pair_job(config))) == []
    assert fake_quantized(traced(conv_pair_job(flow.FunctionConfig()))) == []


def dense_net(x):
    init = flow.random_normal_initializer(stddev=0.5)
    h = flow.layers.dense(x, 5, activation=flow.nn.relu, name="fc1",
                          kernel_initializer=init, bias_initializer=init)
    return flow.layers.dense(h, 3, name="fc2", kernel_initializer=init,
                             bias_initializer=init)


def test_dense_layers_quantize_matmul_inputs_and_outputs():
    @flow.global_function(type="predict", function_config=qat_config())
    def job(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
        return dense_net(x)

    b = traced(job)
    # OneFlow's dense is matmul + bias_add: the matmul's output is quantized before the
    # bias; the relu after it is no conv chain, so fc2 quantizes its input again
    assert reads(b, "MatMul") == [["fq(x)", "fq(fc1-weight)"],
                                  ["fq(fc1-activation/out)", "fq(fc2-weight)"]]
    assert reads(b, "Add", "bias_add") == [["fq(fc1-matmul/out)", "fc1-bias"],
                                           ["fq(fc2-matmul/out)", "fc2-bias"]]


def test_conv_bn_relu_chain_pool_add_and_reshape():
    @flow.global_function(type="predict", function_config=qat_config())
    def job(x: tp.Numpy.Placeholder((2, 4, 6, 6))) -> tp.Numpy:
        y = flow.layers.conv2d(x, 4, 3, 1, "SAME", use_bias=False, name="conv")
        y = flow.layers.batch_normalization(y, axis=1, name="bn")
        y = flow.nn.relu(y, name="relu")
        y = y + x                       # an add_n: both inputs quantized
        y = flow.nn.max_pool2d(y, 2, 2, "VALID", name="pool")
        y = flow.reshape(y, (2, -1))    # transparent: the dense reads the pool's output
        return flow.layers.dense(y, 3, use_bias=False, name="fc")

    b = traced(job)
    # the chain conv -> bn -> relu is quantized once, after the relu
    assert reads(b, "Conv") == [["fq(x)", "fq(conv-weight)"]]
    (add,) = [n for n in b.nodes if n.op_type == "Add" and source(n.inputs[0]) == "fq(relu/out)"]
    assert source(add.inputs[1]) == "fq(x)"
    # the pool reads the add_n's quantized output, the dense the pool's (through the
    # reshape, not quantized again)
    assert reads(b, "MaxPool") == [[f"fq({add.outputs[0].name})"]]
    assert reads(b, "MatMul") == [["fq(pool/out)", "fq(fc-weight)"]]
    assert not any(name.startswith(("conv/", "bn")) for name in fake_quantized(b))


def test_tensorrt_backend_quantizes_conv_and_matmul_only():
    @flow.global_function(type="predict", function_config=qat_config(backend="tensorrt"))
    def job(x: tp.Numpy.Placeholder((2, 4, 6, 6))) -> tp.Numpy:
        y = flow.nn.max_pool2d(x, 2, 2, "VALID", name="pool")
        return flow.layers.conv2d(y, 4, 3, 1, "SAME", use_bias=False, name="conv")

    b = traced(job)
    assert reads(b, "MaxPool") == [["x"]]
    assert reads(b, "Conv") == [["fq(pool/out)", "fq(conv-weight)"]]


@pytest.mark.parametrize("backend", ["tensorrt", "tensorrt7"])
def test_tensorrt7_backend_of_oneflow_04_quantizes_conv_only(backend):
    """OneFlow 0.4 named its TensorRT backend "tensorrt7", with conv2d its only int8 op
    (0.5 renamed it "tensorrt" and added matmul); reshapes stay transparent and int8
    outputs are quantized, as for "tensorrt"."""
    @flow.global_function(type="predict", function_config=qat_config(backend=backend))
    def job(x: tp.Numpy.Placeholder((2, 4, 6, 6))) -> tp.Numpy:
        y = flow.layers.conv2d(x, 4, 3, 1, "SAME", use_bias=False, name="conv")
        y = flow.reshape(y, (2, -1))
        return flow.layers.dense(y, 3, use_bias=False, name="fc")

    b = traced(job)
    assert reads(b, "Conv") == [["fq(x)", "fq(conv-weight)"]]
    if backend == "tensorrt":
        assert reads(b, "MatMul") == [["fq(conv/out)", "fq(fc-weight)"]]
    else:   # the dense layer's matmul is no int8 op: its inputs stay as they are, but the
        # conv's quantized output reaches it through the transparent reshape
        assert reads(b, "MatMul") == [["fq(conv/out)", "fc-weight"]]


def test_asymmetric_padding_is_a_pad_op_whose_output_is_observed():
    # kernel 2, SAME: pads (1, 0), which cuDNN cannot take: OneFlow pads first
    @flow.global_function(type="predict", function_config=qat_config())
    def job(x: tp.Numpy.Placeholder((1, 2, 5, 5))) -> tp.Numpy:
        return flow.layers.conv2d(x, 3, 2, 1, "SAME", use_bias=False, name="conv")

    assert reads(traced(job), "Conv") == [["fq(pad(x))", "fq(conv-weight)"]]


def test_internal_adds_are_not_add_n():
    # batch normalization's moving statistics are sums of equal shapes inside onnxjob;
    # they must stay unquantized (OneFlow's kernel adds them inside)
    @flow.global_function(type="train", function_config=qat_config())
    def job(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        y = flow.layers.batch_normalization(x, axis=1, name="bn")
        loss = flow.math.reduce_mean(y * y)
        sgd(0.1).minimize(loss)
        return loss

    assert fake_quantized(traced(job)) == []


# -- numbers ---------------------------------------------------------------------------------

def params(high, low, scheme, formula, moving=False):
    """OneFlow's scale and zero point from a max and min (float32)."""
    high, low = f32(high), f32(low)
    if formula == "cambricon":
        return f32(math.floor(math.log2(max(abs(high), abs(low)))) - 6), f32(0)
    if scheme == "symmetric":
        return f32(max(abs(high), abs(low)) / f32(127)), f32(0)
    scale = f32((high - low) / f32(255))
    ratio = low / scale
    # min_max_observer: std::nearbyint; the moving one: std::round
    point = -(np.sign(ratio) * np.floor(abs(ratio) + 0.5) if moving else np.rint(ratio))
    return scale, f32(point)


def quantize(x, scale, point, scheme, formula):
    return fake_quant(x, scale, point, 8, scheme, formula).astype(f32)


def weight_fq(w, scheme, formula, per_channel):
    """min_max_observer + fake_quantization of a weight: (values, scale (C,) or (1,))."""
    rows = w.reshape(w.shape[0], -1) if per_channel else w.reshape(1, -1)
    ps = [params(r.max(), r.min(), scheme, formula) for r in rows]
    if not per_channel:
        return quantize(w, *ps[0], scheme, formula), np.array([ps[0][0]])
    out = np.stack([quantize(w[c], *ps[c], scheme, formula) for c in range(w.shape[0])])
    return out, np.array([p[0] for p in ps])


def activation_fq(x, scheme, formula):
    """The first run's moving-average observer (it takes the batch's max and min) and
    fake quantization: (values, scale)."""
    high, low = x.max(), x.min()
    if scheme == "symmetric" or formula == "cambricon":
        high = low = max(abs(high), abs(low))
    scale, point = params(high, low, scheme, formula, moving=True)
    return quantize(x, scale, point, scheme, formula), scale


def conv(x, w, b=None):
    y = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    return y if b is None else y + b.reshape(1, -1, 1, 1)


@pytest.mark.parametrize("symmetric,per_channel,backend", [
    (True, False, ""), (False, False, ""), (True, True, ""), (False, True, ""),
    (True, False, "cambricon")])
def test_conv_forward_matches_numpy(symmetric, per_channel, backend):
    scheme = "symmetric" if symmetric else "affine"
    formula = "cambricon" if backend == "cambricon" else "google"
    job = conv_pair_job(qat_config(symmetric, per_channel, backend), shape=(2, 3, 6, 6))
    x = np.random.default_rng(0).normal(size=(2, 3, 6, 6)).astype(f32)
    y_job, z_job = job(x)     # lr 0: the variables read back are the ones the run used
    v = {k: t.numpy() for k, t in flow.get_all_variables().items()}
    xq, sx = activation_fq(x, scheme, formula)
    wq, sw = weight_fq(v["conv1-weight"], scheme, formula, per_channel)
    bias_scale = (sx * sw).astype(f32)
    if per_channel:
        bq = np.array([quantize(b, s, f32(0), scheme, formula)
                       for b, s in zip(v["conv1-bias"], bias_scale)], f32)
    else:
        bq = quantize(v["conv1-bias"], bias_scale[0], f32(0), scheme, formula)
    y = conv(xq, wq, bq)
    if backend == "cambricon":     # no output quantization; conv2 is excluded
        np.testing.assert_allclose(y_job, y, rtol=1e-5, atol=1e-5)
    else:
        yq, sy = activation_fq(y, scheme, formula)
        # at most a rare value on a rounding edge may differ, by one step
        diff = np.abs(y_job - yq)
        assert diff.max() <= sy * 1.001 and (diff > 1e-5).mean() < 0.02, diff.max()
        assert len(np.unique(np.round(y_job / sy))) <= 256
    # conv2 is excluded: it computes in floating point on what it got
    np.testing.assert_allclose(z_job, conv(y_job, v["conv2-weight"], v["conv2-bias"]),
                               rtol=1e-4, atol=1e-5)


def test_forward_without_qat_differs():
    # the reference above must be able to fail: without QAT the numbers differ
    job = conv_pair_job(flow.FunctionConfig(), shape=(2, 3, 6, 6))
    x = np.random.default_rng(0).normal(size=(2, 3, 6, 6)).astype(f32)
    y_job, _ = job(x)
    v = {k: t.numpy() for k, t in flow.get_all_variables().items()}
    xq, _ = activation_fq(x, "symmetric", "google")
    wq, _ = weight_fq(v["conv1-weight"], "symmetric", "google", False)
    assert np.abs(y_job - conv(xq, wq, v["conv1-bias"])).max() > 1e-3


# -- training --------------------------------------------------------------------------------

def small_net(x):
    init = flow.random_normal_initializer(stddev=0.3)
    h = flow.layers.conv2d(x, 4, 3, 1, "SAME", activation=flow.nn.relu, name="conv",
                           kernel_initializer=init, bias_initializer=init)
    h = flow.reshape(h, (h.shape[0], -1))
    return flow.layers.dense(h, 2, name="fc", kernel_initializer=init, bias_initializer=init)


def small_train_job(config, lr=0.05):
    @flow.global_function(type="train", function_config=config)
    def train(x: tp.Numpy.Placeholder((4, 2, 5, 5)),
              t: tp.Numpy.Placeholder((4, 2))) -> tp.Numpy:
        out = small_net(x)
        loss = flow.math.reduce_mean(flow.math.square(out - t))
        sgd(lr).minimize(loss)
        return loss
    return train


def ste(fq, x):
    """A straight-through fake quantization in PyTorch: fq's values, x's gradient."""
    return x + (torch.from_numpy(fq(x.detach().numpy())) - x).detach()


@pytest.mark.parametrize("symmetric", [True, False])
def test_train_step_matches_a_pytorch_twin(symmetric):
    scheme = "symmetric" if symmetric else "affine"
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 2, 5, 5)).astype(f32)
    t = rng.normal(size=(4, 2)).astype(f32)
    # (seeded: with initial weights drawn from whatever state earlier tests left, a value
    # can land within an ulp of a rounding tie of a fake quantization, where onnxruntime's
    # and PyTorch's convolutions, a last bit apart, round to neighbouring levels)
    flow.config.seed(11)
    train = small_train_job(qat_config(symmetric), lr=0.05)
    before = {k: t_.numpy().copy() for k, t_ in flow.get_all_variables().items()}
    loss = train(x, t)
    after = {k: t_.numpy() for k, t_ in flow.get_all_variables().items()}

    g = "google"
    w = {k: torch.tensor(before[k], requires_grad=True)
         for k in ("conv-weight", "conv-bias", "fc-weight", "fc-bias")}
    xq, sx = activation_fq(x, scheme, g)
    _, sw = weight_fq(before["conv-weight"], scheme, g, False)
    wq = ste(lambda a: weight_fq(a, scheme, g, False)[0], w["conv-weight"])
    bq = ste(lambda a: quantize(a, f32(sx * sw[0]), f32(0), scheme, g), w["conv-bias"])
    h = F.relu(F.conv2d(torch.from_numpy(xq), wq, padding=1) + bq.reshape(1, -1, 1, 1))
    hq = ste(lambda a: activation_fq(a, scheme, g)[0], h)      # the chain's end: the relu
    flat = hq.reshape(4, -1)                                    # transparent reshape
    fwq = ste(lambda a: weight_fq(a, scheme, g, False)[0], w["fc-weight"])
    m = ste(lambda a: activation_fq(a, scheme, g)[0], flat @ fwq.T)   # the matmul's output
    out = m + w["fc-bias"]
    ref_loss = ((out - torch.from_numpy(t)) ** 2).mean()
    ref_loss.backward()
    np.testing.assert_allclose(loss, ref_loss.item(), rtol=1e-4)
    for k, p in w.items():
        np.testing.assert_allclose(after[k], (p - 0.05 * p.grad).detach().numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=k)
    # the gradients are not zero where fake quantization's own derivative would be
    assert all(float(p.grad.abs().sum()) > 0 for p in w.values())


def test_small_net_trains_under_qat():
    flow.config.seed(0)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(4, 2, 5, 5)).astype(f32)
    t = rng.normal(size=(4, 2)).astype(f32)
    train = small_train_job(qat_config(symmetric=False, per_channel=True), lr=0.03)
    losses = [float(train(x, t)) for _ in range(40)]
    assert losses[-1] < 0.1 * losses[0], losses[::8]


# -- moving statistics: stop, predict jobs, checkpoints --------------------------------------

def dense_jobs(config, momentum_config=None):
    @flow.global_function(type="train", function_config=config)
    def train(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
        out = dense_net(x)
        sgd(0.0).minimize(flow.math.reduce_mean(out))
        return out

    @flow.global_function(type="predict", function_config=config)
    def predict(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
        return dense_net(x)
    return train, predict


MAX = "x-fake-quant-observer-fake-quant-moving-max"


def test_moving_min_max_stops_after_the_configured_iters():
    momentum, stop = 0.8, 2
    train, _ = dense_jobs(qat_config(stop=stop, momentum=momentum))
    rng = np.random.default_rng(5)
    moving, seen = f32(0), []
    for step in range(6):
        x = (rng.normal(size=(8, 6)) * (step + 1)).astype(f32)
        train(x)
        high = f32(np.abs(x).max())
        if step <= stop:   # OneFlow's train step is 0 in the first run
            moving = high if moving == 0 else f32(moving * f32(momentum)
                                                  + high * (f32(1) - f32(momentum)))
        seen.append(flow.get_all_variables()[MAX].numpy()[0])
        np.testing.assert_allclose(seen[-1], moving, rtol=1e-6, err_msg=f"step {step}")
    assert seen[2] == seen[3] == seen[5] and seen[1] != seen[2]
    step = flow.get_all_variables()["System-Train-TrainStep-train"].numpy()
    assert step.tolist() == [6]


def test_predict_job_reads_the_train_jobs_statistics_and_changes_nothing():
    train, predict = dense_jobs(qat_config(stop=1))
    x = np.random.default_rng(6).normal(size=(8, 6)).astype(f32)
    for _ in range(3):
        out = train(x)
    stats = {k: v.numpy().copy() for k, v in flow.get_all_variables().items()
             if "fake-quant-moving" in k}
    assert sorted(stats) == sorted(f"{b}-fake-quant-observer-fake-quant-moving-{m}"
                                   for b in ("x", "fc1-matmul-out", "fc1-activation-out",
                                             "fc2-matmul-out") for m in ("max", "min"))
    np.testing.assert_allclose(predict(x), out, rtol=1e-6)      # same statistics, lr 0
    # no update: a larger input is clipped to the stored range
    assert np.abs(predict(x * 3) - 3 * out).max() > 0.1
    for k, v in stats.items():
        np.testing.assert_array_equal(flow.get_all_variables()[k].numpy(), v)
    # OneFlow gives each of a predict job's observers a step variable of its own
    steps = [k for k in flow.get_all_variables() if k.endswith("-fake-train-step")]
    assert len(steps) == 4


def test_checkpoint_saves_and_restores_observer_state(tmp_path):
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(8, 6)).astype(f32) * (i + 1) for i in range(5)]
    train, _ = dense_jobs(qat_config(stop=100))
    for x in xs[:3]:
        train(x)
    path = str(tmp_path / "ckpt")
    flow.checkpoint.save(path)
    assert os.path.isfile(os.path.join(path, MAX, "out"))
    saved = np.fromfile(os.path.join(path, MAX, "out"), dtype="<f4")
    np.testing.assert_array_equal(saved, flow.get_all_variables()[MAX].numpy())
    continued = [train(x) for x in xs[3:]]
    flow.clear_default_session()
    train, _ = dense_jobs(qat_config(stop=100))
    flow.load_variables(flow.checkpoint.get(path))
    resumed = [train(x) for x in xs[3:]]
    for a, b in zip(continued, resumed):
        np.testing.assert_array_equal(a, b)
    flow.clear_default_session()
    train, _ = dense_jobs(qat_config(stop=100))     # without the checkpoint: other numbers
    assert not np.array_equal(train(xs[3]), continued[0])


# -- configuration ----------------------------------------------------------------------------

def test_config_flags_defaults_and_checks():
    config = flow.FunctionConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.enable_qat(True)
    config.enable_quantization_aware_training(False)
    assert config.function_desc.enable_qat is False
    config.qat.symmetric(False)
    config.qat.moving_min_max_momentum(0.9)
    assert config.get("qat.symmetric") is False
    assert config.get("qat.moving_min_max_momentum") == float(f32(0.9))
    assert config.clone().get("qat.symmetric") is False
    with pytest.raises(UnsupportedAPIError, match="function_config.qat.bits is not a OneFlow"):
        config.qat.bits(8)
    with pytest.raises(ValueError, match="target_backend"):
        config.qat.target_backend("tflite")
    with pytest.raises(TypeError, match="int"):
        config.qat.moving_min_max_stop_update_after_iters(2.5)
    with pytest.raises(TypeError, match="bool"):
        config.qat.per_channel_weight_quantization("yes")


def test_moving_observer_needs_stop_update_after_iters():
    @flow.global_function(type="predict", function_config=qat_config(stop=None))
    def job(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
        return dense_net(x)

    with pytest.raises(TraceError, match=r"test_qat\.py:\d+: .*moving_min_max_stop_update"):
        job(np.zeros((8, 6), f32))


def test_refused_combinations_name_the_job():
    config = qat_config(per_channel=True, backend="cambricon")

    @flow.global_function(type="predict", function_config=config)
    def job(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
        return dense_net(x)

    with pytest.raises(TraceError, match=r"test_qat\.py:\d+: job 'job'.*cambricon"):
        job(np.zeros((8, 6), f32))
    flow.clear_default_session()
    config = qat_config()
    config.enable_auto_mixed_precision(True)

    @flow.global_function(type="predict", function_config=config)
    def amp(x: tp.Numpy.Placeholder((8, 6))) -> tp.Numpy:
        return dense_net(x)

    with pytest.raises(TraceError, match="enable_auto_mixed_precision"):
        amp(np.zeros((8, 6), f32))
