"""Mirrored-view train jobs over several devices in one process (runtime/mirrored_step.py):
each device list element runs the forward and backward on its own rows, one update applies
the gradients summed over the devices and scaled by the total loss size (spec §5.6)."""
import warnings

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp

INIT = flow.random_normal_initializer(stddev=0.3)


def _mlp(images, labels):
    hidden = flow.layers.dense(images, 5, activation=flow.nn.relu, kernel_initializer=INIT,
                               name="hidden")
    logits = flow.layers.dense(hidden, 3, kernel_initializer=INIT, name="out")
    return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def _conv_bn(images, labels):
    conv = flow.layers.conv2d(images, 4, 3, padding="SAME", kernel_initializer=INIT,
                              use_bias=False, name="conv")
    normed = flow.layers.batch_normalization(conv, axis=1, momentum=0.5, name="bn")
    flat = flow.reshape(flow.nn.relu(normed), (-1, 4 * 4 * 4))
    logits = flow.layers.dense(flat, 3, kernel_initializer=INIT, name="out")
    return flow.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def _train(net, shape, devices, mirrored, cpus=False, loss_scale=None):
    """A fresh session's train job: mirrored over `devices` list elements (GPUs, or CPUs:
    `cpus`), or consistent."""
    flow.clear_default_session()
    flow.config.seed(7)         # the same initial values in every session
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # n > 1 devices in one process say so
        if cpus:
            flow.config.cpu_device_num(devices)
        else:
            flow.config.gpu_device_num(devices)
    config = flow.FunctionConfig()
    kind = tp.ListNumpy if mirrored else tp.Numpy
    if mirrored:
        config.default_logical_view(flow.scope.mirrored_view())

    @flow.global_function(type="train", function_config=config)
    def job(images: kind.Placeholder(shape),
            labels: kind.Placeholder(shape[:1], dtype=flow.int32)) -> kind:
        loss = net(images, labels)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.5]),
                           momentum=0.9, loss_scale_factor=loss_scale).minimize(loss)
        return loss
    return job


def _variables():
    return {k: v.numpy() for k, v in flow.get_all_variables().items()}


def _data(rows, shape, step):
    rng = np.random.default_rng(step)
    return (rng.standard_normal((rows,) + shape[1:]).astype(np.float32),
            rng.integers(0, 3, rows).astype(np.int32))


def test_a_mirrored_step_equals_one_device_on_the_concatenated_rows():
    """Without batch statistics, OneFlow's mirrored update is the whole batch's: the loss
    is normalized by all devices' rows (here 6 + 4, the second list element shorter)."""
    shape = (6, 4)
    mirrored = _train(_mlp, shape, 2, mirrored=True)
    losses = []
    for step in range(3):
        x, y = _data(10, shape, step)
        out = mirrored([x[:6], x[6:]], [y[:6], y[6:]])
        assert [o.shape for o in out] == [(6,), (4,)]
        losses.append(np.concatenate(out))
    got = _variables()
    whole = _train(_mlp, (10, 4), 1, mirrored=False)
    for step in range(3):
        x, y = _data(10, shape, step)
        np.testing.assert_allclose(losses[step], whole(x, y), rtol=1e-5, atol=1e-6)
    for name, value in _variables().items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def _per_element_loss(images, labels):
    logits = flow.layers.dense(images, 3, kernel_initializer=INIT, name="out")
    return flow.math.square(logits - 1.0)                   # (rows, 3)


def _per_row_loss(images, labels):
    return flow.math.reduce_sum(_per_element_loss(images, labels), axis=1)    # (rows,)


@pytest.mark.parametrize("loss_scale", [None, 8.0])
def test_a_mirrored_loss_of_several_columns_is_averaged_over_its_rows(loss_scale):
    """OneFlow divides the gradients of a dynamic (mirrored) loss by its rows along axis 0,
    summed over the devices (autograd.cpp ScaleModelDiffByDynamicLossInstanceNum:
    shape_elem_cnt over axis 0), not by its element count: a (rows, 3) loss trains as the
    whole batch's per-row sums; under a loss scale too (its seed was not scaled, then
    unscaled)."""
    shape = (6, 4)
    mirrored = _train(_per_element_loss, shape, 2, mirrored=True, loss_scale=loss_scale)
    for step in range(3):
        x, y = _data(10, shape, step)
        mirrored([x[:6], x[6:]], [y[:6], y[6:]])
    got = _variables()
    whole = _train(_per_row_loss, (10, 4), 1, mirrored=False)
    for step in range(3):
        whole(*_data(10, shape, step))
    for name, value in _variables().items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_mirrored_batch_norm_normalizes_each_devices_rows_with_their_own_statistics():
    """Two devices given the same rows: each computes the statistics of those rows, so
    the step equals one device on them (the moving statistics are the first device's);
    the concatenation of two different halves does not."""
    shape = (4, 1, 4, 4)
    mirrored = _train(_conv_bn, shape, 2, mirrored=True)
    for step in range(2):
        x, y = _data(4, shape, step)
        a, b = mirrored([x, x], [y, y])
        np.testing.assert_array_equal(a, b)
    got = _variables()
    single = _train(_conv_bn, shape, 1, mirrored=False)
    for step in range(2):
        single(*_data(4, shape, step))
    for name, value in _variables().items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_each_device_of_a_mirrored_step_sees_only_its_rows_statistics():
    """Different rows per device: the first step's losses are what one device gives for
    each list element alone (the statistics of the concatenation would give others)."""
    shape = (4, 1, 4, 4)
    x, y = _data(8, (8,) + shape[1:], 5)
    first, second = _train(_conv_bn, shape, 2, mirrored=True)([x[:4], x[4:]], [y[:4], y[4:]])
    alone = [_train(_conv_bn, shape, 1, mirrored=False)(x[i:i + 4], y[i:i + 4]) for i in (0, 4)]
    np.testing.assert_allclose(first, alone[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(second, alone[1], rtol=1e-5, atol=1e-6)
    whole = _train(_conv_bn, (8,) + shape[1:], 1, mirrored=False)(x, y)
    assert not np.allclose(np.concatenate([first, second]), whole, rtol=1e-3)


def test_a_cpu_only_program_s_mirrored_lists_have_one_element_per_cpu_device():
    """cpu_device_num(2) and no GPUs asked (a program for OneFlow's CPU-only build, whose
    jobs are placed on its CPU devices): two elements, the step as over two GPUs."""
    shape = (6, 4)
    x, y = _data(10, shape, 0)
    two_cpus = _train(_mlp, shape, 2, mirrored=True, cpus=True)([x[:6], x[6:]], [y[:6], y[6:]])
    got = _variables()
    from onnxjob.frontend.config import process_config
    process_config.reset()
    two_gpus = _train(_mlp, shape, 2, mirrored=True)([x[:6], x[6:]], [y[:6], y[6:]])
    for a, b in zip(two_cpus, two_gpus):
        np.testing.assert_array_equal(a, b)
    for name, value in _variables().items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("cpus", [1, 2])
def test_a_program_without_gpus_passes_one_element_per_cpu_device(cpus):
    """gpu_device_num(0): OneFlow places the jobs on cpu_device_num CPUs (1 by default);
    a mirrored argument has one element per CPU and parallel_num counts them."""
    flow.clear_default_session()
    flow.config.gpu_device_num(0)
    if cpus > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")     # n > 1 devices in one process say so
            flow.config.cpu_device_num(cpus)
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    seen = {}

    @flow.global_function(function_config=config)
    def job(x: tp.ListNumpy.Placeholder((4, 2))) -> tp.ListNumpy:
        seen["n"] = flow.current_scope().device_parallel_desc_symbol.parallel_num
        return x * 2

    out = job([np.full((3, 2), i, np.float32) for i in range(cpus)])
    assert seen["n"] == cpus and len(out) == cpus
    for i, o in enumerate(out):
        np.testing.assert_array_equal(o, np.full((3, 2), 2 * i))


def test_mirrored_inputs_must_have_one_element_per_device():
    job = _train(_mlp, (6, 4), 2, mirrored=True)
    x, y = _data(6, (6, 4), 0)
    with pytest.raises(Exception, match="list of 2"):
        job([x], [y])


def test_a_mirrored_step_s_sessions_get_the_job_s_cuda_options(monkeypatch):
    """The two sessions of a mirrored step get the CUDA options the job's other sessions
    get (TF32 as the session chose it): without them the GPU ran TF32 matmuls there and
    missed the one-device step by ~1e-3."""
    from onnxjob.runtime import backend
    real, options = backend.create_session, []

    def recording(model, device, is_train, cuda_options=None, **kwargs):
        options.append(cuda_options)
        return real(model, device, is_train, cuda_options, **kwargs)
    monkeypatch.setattr(backend, "create_session", recording)
    shape = (6, 4)
    mirrored = _train(_mlp, shape, 2, mirrored=True)
    x, y = _data(10, shape, 0)
    mirrored([x[:6], x[6:]], [y[:6], y[6:]])
    assert len(options) >= 2 and all(o == backend.cuda_provider_options({}, None)
                                     for o in options), options
