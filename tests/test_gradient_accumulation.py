"""function_config.train.num_gradient_accumulation_steps(n), as OneFlow runs it
(runtime/micro_batches.py): each call's batch is n micro-batches, each forward and
backward runs on one of them (its own batch statistics), the gradients are added and
scaled by one over the loss's element count times n, one update is applied, and the
returned values are the micro-batches' concatenated."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.io import ofrecord

ROWS, FEATURES, UNITS, STEPS = 6, 3, 4, 2
RNG = np.random.default_rng(3)
W0 = RNG.normal(size=(FEATURES, UNITS)).astype(np.float32)
B0 = RNG.normal(size=UNITS).astype(np.float32)
GAMMA0 = RNG.uniform(0.5, 1.5, UNITS).astype(np.float32)
BETA0 = RNG.normal(size=UNITS).astype(np.float32)
BATCHES = [(RNG.normal(size=(ROWS, FEATURES)).astype(np.float32),
            RNG.normal(size=(ROWS, UNITS)).astype(np.float32)) for _ in range(3)]
LR, MOMENTUM, BN_MOMENTUM = 0.1, 0.9, 0.9


def accumulating_job(steps=STEPS, loss_scale_policy=None, amp=False, rows=ROWS,
                     mirrored=False):
    """Linear + BatchNorm1d with a per-row loss, accumulating over `steps` micro-batches
    of `rows` (tp.ListNumpy placeholders under the mirrored view with `mirrored`)."""
    config = flow.FunctionConfig()
    config.train.num_gradient_accumulation_steps(steps)
    config.enable_auto_mixed_precision(amp)
    kind = tp.ListNumpy if mirrored else tp.Numpy
    if mirrored:
        config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=config)
    def job(x: kind.Placeholder((rows, FEATURES)),
            t: kind.Placeholder((rows, UNITS))) -> kind:
        w = flow.get_variable("w", (FEATURES, UNITS), initializer=flow.zeros_initializer())
        b = flow.get_variable("b", (UNITS,), initializer=flow.zeros_initializer())
        y = flow.layers.batch_normalization(flow.matmul(x, w) + b, axis=1,
                                            momentum=BN_MOMENTUM, epsilon=1e-5, name="bn")
        loss = flow.math.reduce_sum(flow.math.square(y - t), axis=1)   # one per row
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [LR]),
                           momentum=MOMENTUM, loss_scale_policy=loss_scale_policy).minimize(loss)
        return loss

    flow.load_variables({"w": W0, "b": B0, "bn-gamma": GAMMA0, "bn-beta": BETA0})
    return job


def torch_accumulation(torch, batches, steps):
    """PyTorch's accumulation loop over the same model: each micro-batch's summed loss
    divided by the whole batch's row count, backward, then one SGD step per batch."""
    linear = torch.nn.Linear(FEATURES, UNITS)
    norm = torch.nn.BatchNorm1d(UNITS, momentum=1 - BN_MOMENTUM, eps=1e-5)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(W0.T))
        linear.bias.copy_(torch.from_numpy(B0))
        norm.weight.copy_(torch.from_numpy(GAMMA0))
        norm.bias.copy_(torch.from_numpy(BETA0))
    params = list(linear.parameters()) + list(norm.parameters())
    sgd = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    losses = []
    for x, t in batches:
        sgd.zero_grad()
        for xs, ts in zip(np.split(x, steps), np.split(t, steps)):
            y = norm(linear(torch.from_numpy(xs)))
            loss = ((y - torch.from_numpy(ts)) ** 2).sum(1)
            (loss.sum() / len(x)).backward()
            losses.append(loss.detach().numpy())
        sgd.step()
    return np.concatenate(losses), {
        "w": linear.weight.detach().numpy().T, "b": linear.bias.detach().numpy(),
        "bn-gamma": norm.weight.detach().numpy(), "bn-beta": norm.bias.detach().numpy(),
        "bn-moving_mean": norm.running_mean.numpy(),
        "bn-moving_variance": norm.running_var.numpy()}


def test_accumulated_steps_train_as_pytorch_s_accumulation_loop():
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    flow.clear_default_session()
    job = accumulating_job()
    losses = np.concatenate([job(x, t) for x, t in BATCHES])
    expected_losses, expected = torch_accumulation(torch, BATCHES, STEPS)
    # the returned losses are the micro-batches' packed: one per row of each call
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-4, atol=1e-5)
    variables = flow.get_all_variables()
    for name, value in expected.items():
        np.testing.assert_allclose(variables[name].numpy(), value, rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    # one update per call: the train step counted 3, not 6
    steps = [v.numpy() for k, v in variables.items() if "TrainStep" in k]
    assert steps and int(np.asarray(steps[0]).reshape(-1)[0]) == len(BATCHES)


def test_a_loss_scale_unscales_the_accumulated_gradients():
    """A dynamic loss scale (a power of two, no overflow here) scales each micro-batch's
    backward and unscales the sum: the same steps as without it (to rounding: the
    unscaling is folded into the update's other factors)."""
    def trained(policy):
        flow.clear_default_session()
        job = accumulating_job(loss_scale_policy=policy)
        losses = [job(x, t) for x, t in BATCHES]
        return losses, {k: v.numpy() for k, v in flow.get_all_variables().items()
                        if not k.startswith("System-")}
    plain_losses, plain = trained(None)
    scaled_losses, scaled = trained(flow.optimizer.loss_scale.dynamic_loss_scale(
        initial_loss_scale=2.0 ** 10, increment_period=2000))
    np.testing.assert_allclose(np.concatenate(scaled_losses), np.concatenate(plain_losses),
                               rtol=1e-6)
    assert sorted(scaled) == sorted(plain)
    for name, value in plain.items():
        np.testing.assert_allclose(scaled[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_mixed_precision_accumulates_as_float32_does():
    """Under mixed precision (half forward and backward, float32 gradients) the same
    accumulated steps, to half precision's rounding."""
    def trained(amp):
        flow.clear_default_session()
        job = accumulating_job(amp=amp, loss_scale_policy=(
            flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=2.0 ** 10)
            if amp else None))
        [job(x, t) for x, t in BATCHES]
        return {k: v.numpy() for k, v in flow.get_all_variables().items()
                if not k.startswith("System-")}
    half, full = trained(True), trained(False)
    for name, value in full.items():
        np.testing.assert_allclose(half[name], value, rtol=1e-3, atol=1e-4, err_msg=name)
    assert np.abs(full["w"] - W0).max() > 0.05      # (the steps moved w by more than that)


@pytest.mark.parametrize("amp", [False, True])
def test_the_device_path_accumulates_as_the_host_path(monkeypatch, amp):
    """One device's accumulation with its gradients and state kept on the device (on a
    GPU; here through the same IOBinding runs with CPU OrtValues): the same losses and
    weights as the host path, whose float64 sums it replaces by a float32 running mean."""
    from onnxjob.runtime import device_accumulation, mirrored_step

    def trained(on_device):
        monkeypatch.setattr(device_accumulation, "applies",
                            lambda device, ranks, elements: on_device)
        calls = []
        monkeypatch.setattr(mirrored_step.MirroredStep, "_accumulate_on_device",
                            _counted(mirrored_step.MirroredStep._accumulate_on_device, calls))
        flow.clear_default_session()
        job = accumulating_job(steps=3, amp=amp, loss_scale_policy=(
            flow.optimizer.loss_scale.dynamic_loss_scale(initial_loss_scale=2.0 ** 10)
            if amp else None))
        losses = np.concatenate([job(x, t) for x, t in BATCHES])
        assert len(calls) == (len(BATCHES) if on_device else 0)
        return losses, {k: v.numpy() for k, v in flow.get_all_variables().items()}
    device_losses, on_device = trained(True)
    host_losses, on_host = trained(False)
    np.testing.assert_allclose(device_losses, host_losses, rtol=1e-6, atol=1e-7)
    assert sorted(on_device) == sorted(on_host)
    for name, value in on_host.items():
        np.testing.assert_allclose(on_device[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    # (micro-batches of two rows: batch norm leaves small gradients, which moved w so)
    assert np.abs(on_host["w"] - W0).max() > 1e-3


def _counted(function, calls):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)
    return wrapped


def test_without_batch_coupled_ops_accumulation_is_the_whole_batch_s_step():
    """OneFlow scales the added gradients by 1 / (loss elements x steps): with no op
    coupling a batch's rows, two micro-batches step as one whole batch does."""
    def trained(steps):
        flow.clear_default_session()
        job = linear_job(steps, 4)
        outs = [job(x) for x in (np.arange(8, dtype=np.float32).reshape(4, 2) / 8,
                                 np.ones((4, 2), np.float32))]
        return outs, flow.get_all_variables()["w"].numpy()
    (accumulated, w2), (whole, w1) = trained(2), trained(1)
    np.testing.assert_allclose(w2, w1, rtol=1e-6)
    np.testing.assert_allclose(np.concatenate(accumulated), np.concatenate(whole), rtol=1e-6)
    assert np.abs(w1 - 1).max() > 0.1


def test_micro_batches_differ_from_one_whole_batch():
    """Each micro-batch normalizes by its own statistics: the accumulated step is not the
    whole batch's (what this test's twin would miss if it compared the wrong thing)."""
    torch = pytest.importorskip("torch", reason="PyTorch is the reference")
    _, accumulated = torch_accumulation(torch, BATCHES[:1], STEPS)
    _, whole = torch_accumulation(torch, BATCHES[:1], 1)
    assert np.abs(accumulated["w"] - whole["w"]).max() > 1e-3


def _mean_matmul_job(steps, rows, before=None):
    """A fresh session's train job accumulating over `steps` micro-batches: SGD (lr 0.5)
    of the mean of x @ w (w ones, (2, 1)) for x of (rows, 2); `before()` traced first."""
    config = flow.FunctionConfig()
    config.train.num_gradient_accumulation_steps(steps)
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((rows, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 1), initializer=flow.ones_initializer())
        if before is not None:
            before()
        loss = flow.math.reduce_mean(flow.matmul(x, w))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                           momentum=0).minimize(loss)
        return loss
    return job


def test_a_scalar_loss_comes_back_once_per_micro_batch():
    job = _mean_matmul_job(3, 6)
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    loss = job(x)
    # each micro-batch's mean, stacked (OneFlow's pack of a scalar)
    np.testing.assert_allclose(loss, [x[i:i + 2].sum(1).mean() for i in (0, 2, 4)])
    # the gradient: the micro-batches' mean gradients added, over 3 (the loss's count 1 x 3)
    w = flow.get_all_variables()["w"].numpy()
    np.testing.assert_allclose(w[:, 0], 1.0 - 0.5 * x.mean(0), rtol=1e-6)


def test_an_assign_in_an_accumulating_job_says_what_it_does():
    """onnxjob applies a flow.assign once per call, the first micro-batch's value; OneFlow's
    accumulation rewrite routes the assign's ref through a repeat op's copy, so its writes
    do not reach the variable: the difference is said, at the assign's line."""
    def count_calls():
        count = flow.get_variable("count", (1,), initializer=flow.zeros_initializer(),
                                  trainable=False)
        flow.assign(count, count + 1.0)

    job = _mean_matmul_job(2, 4, before=count_calls)

    with pytest.warns(UserWarning, match=r"flow.assign of 'count'.*2 micro-batches.*first "
                                         r"micro-batch") as caught:
        job(np.ones((4, 2), np.float32))
    assert caught[0].filename == __file__
    job(np.ones((4, 2), np.float32))
    np.testing.assert_array_equal(flow.get_all_variables()["count"].numpy(), [2.0])


def test_a_watch_sees_each_micro_batch_as_oneflow_s_watch_op_runs_per_micro_batch():
    """flow.watch and flow.watch_diff in an accumulating body: their handlers run once per
    micro-batch with that micro-batch's values (OneFlow packs only the returned blobs);
    the returned value is packed."""
    flow.clear_default_session()
    seen, diffs = [], []
    config = flow.FunctionConfig()
    config.train.num_gradient_accumulation_steps(3)

    @flow.global_function(type="train", function_config=config)
    def job(x: tp.Numpy.Placeholder((6, 2))) -> tp.Numpy:
        w = flow.get_variable("w", (2, 1), initializer=flow.ones_initializer())
        y = flow.matmul(x, w)
        flow.watch(y, lambda v: seen.append(v.numpy().copy()))
        flow.watch_diff(y, lambda v: diffs.append(v.numpy().copy()))
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.0])).minimize(y)
        return y

    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    returned = job(x)
    np.testing.assert_array_equal(returned, x.sum(1, keepdims=True))
    assert [v.shape for v in seen] == [(2, 1)] * 3
    np.testing.assert_array_equal(np.concatenate(seen), returned)
    # (the backward's own diff of each micro-batch's loss of 2 rows: ones, as OneFlow's)
    assert [v.shape for v in diffs] == [(2, 1)] * 3
    np.testing.assert_array_equal(np.concatenate(diffs), np.ones((6, 1), np.float32))


def test_data_readers_read_one_batch_per_micro_batch(tmp_path):
    records = [{"value": np.float32([i])} for i in range(8)]
    ofrecord.write_dataset(str(tmp_path), records, part_name_suffix_length=-1)
    config = flow.FunctionConfig()
    config.train.num_gradient_accumulation_steps(2)
    flow.clear_default_session()

    @flow.global_function(type="train", function_config=config)
    def job() -> tp.Numpy:
        rows = flow.data.ofrecord_reader(str(tmp_path), batch_size=2, data_part_num=1)
        value = flow.data.ofrecord_raw_decoder(rows, "value", shape=(1,), dtype=flow.float)
        w = flow.get_variable("w", (1,), initializer=flow.ones_initializer())
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0).minimize(value * w)
        return value

    # the reader's batch_size is a micro-batch's: each call reads 2 of them
    np.testing.assert_array_equal(job()[:, 0], [0, 1, 2, 3])
    np.testing.assert_array_equal(job()[:, 0], [4, 5, 6, 7])
    # the gradient of mean(value * w) over both calls' rows: 1.5, then 5.5
    np.testing.assert_allclose(flow.get_all_variables()["w"].numpy(), [1 - 0.1 * 7.0],
                               rtol=1e-6)


def linear_job(steps, rows, mirrored=False):
    """A train job of x @ w (w of ones) accumulating over `steps` micro-batches of a
    (rows, 2) placeholder (tp.ListNumpy under the mirrored view with `mirrored`)."""
    config = flow.FunctionConfig()
    config.train.num_gradient_accumulation_steps(steps)
    kind = tp.ListNumpy if mirrored else tp.Numpy
    if mirrored:
        config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=config)
    def job(x: kind.Placeholder((rows, 2))) -> kind:
        w = flow.get_variable("w", (2, 1), initializer=flow.ones_initializer())
        loss = flow.matmul(x, w)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5])).minimize(loss)
        return loss
    return job


def test_a_batch_that_does_not_divide_into_micro_batches_names_the_steps():
    job = linear_job(4, 6)
    with pytest.raises(TraceError, match=r"shape \(6, 2\).*num_gradient_accumulation_steps"
                                         r"\(4\).*must divide by 4"):
        job(np.zeros((6, 2), np.float32))


@pytest.mark.parametrize("steps", [0, 2.0])
def test_a_number_of_steps_that_is_not_a_whole_number_is_refused(steps):
    job = linear_job(steps, 2)
    with pytest.raises(TraceError, match="takes a whole number >= 1"):
        job(np.zeros((2, 2), np.float32))


def test_accumulation_over_mirrored_devices_weights_every_micro_batch_of_every_device():
    """A mirrored view over two devices, two micro-batches each: four forward and backward
    passes, each with its own batch statistics, and one update on their gradients, as one
    device accumulating over the same four micro-batches; each device's losses are its
    micro-batches' packed, and the moving statistics those of the first device's
    micro-batches in turn (the replica OneFlow's checkpoints save)."""
    import warnings
    (x0, t0), (x1, t1) = BATCHES[:2]

    def trained(job, *args):
        out = job(*args)
        return out, {k: v.numpy() for k, v in flow.get_all_variables().items()
                     if not k.startswith("System-")}
    flow.clear_default_session()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # gpu_device_num(n > 1) on one device says so
        flow.config.gpu_device_num(2)
    losses, mirrored = trained(accumulating_job(mirrored=True), [x0, x1], [t0, t1])
    flow.clear_default_session()
    flow.config.gpu_device_num(1)   # (the reference: one device, whole micro-batches)
    whole_losses, one_device = trained(accumulating_job(steps=2 * STEPS, rows=2 * ROWS),
                                       np.concatenate([x0, x1]), np.concatenate([t0, t1]))
    assert [np.shape(v) for v in losses] == [(ROWS,), (ROWS,)]
    np.testing.assert_allclose(np.concatenate(losses), whole_losses, rtol=1e-5)
    moving = {"bn-moving_mean", "bn-moving_variance"}
    for name, value in one_device.items():
        if name not in moving:
            np.testing.assert_allclose(mirrored[name], value, rtol=1e-5, atol=1e-6,
                                       err_msg=name)
    flow.clear_default_session()
    _, first_device = trained(accumulating_job(), x0, t0)
    for name in moving:
        np.testing.assert_allclose(mirrored[name], first_device[name], rtol=1e-6, err_msg=name)
        assert np.abs(mirrored[name] - one_device[name]).max() > 1e-4


def test_a_mirrored_input_whose_rows_do_not_divide_names_the_input():
    """A tp.ListNumpy placeholder takes fewer rows than its shape; they too must divide
    into the micro-batches."""
    job = linear_job(2, 4, mirrored=True)
    np.testing.assert_array_equal(job([np.ones((2, 2), np.float32)])[0], [[2], [2]])
    with pytest.raises(ValueError, match=r"input 'x' of shape \(3, 2\).*must divide by 2"):
        job([np.ones((3, 2), np.float32)])
