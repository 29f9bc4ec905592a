"""Programs written for OneFlow <= 0.4 (`import oneflow as flow`) against programs written
for 0.5 (`import oneflow.compatible.single_client as flow`): where the two releases
computed or returned differently, each program gets its own release's behaviour
(compat/generations.py, compat/zero_d_results.py)."""
import runpy

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.compat import install_oneflow_alias, uninstall_oneflow_alias

PROGRAM = '''
from typing import Tuple

import numpy as np
import {module} as flow
import {module}.typing as tp

W0 = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


@flow.global_function(type="train")
def train(mask: tp.Numpy.Placeholder((4,))) -> tp.Numpy:
    w = flow.get_variable("w", (4,), initializer=flow.constant_initializer(0.0))
    loss = flow.math.reduce_mean(w * mask)
    flow.optimizer.AdamW(flow.optimizer.PiecewiseConstantScheduler([], [0.5]), beta1=0.9,
                         beta2=0.99, epsilon=1e-3, weight_decay=0.9,
                         do_bias_correction=True).minimize(loss)
    return loss


@flow.global_function()
def argmax(x: tp.Numpy.Placeholder((5,))) -> tp.Numpy:
    return flow.math.argmax(x)


@flow.global_function()
def stacked(x: tp.Numpy.Placeholder((2, 3))) -> tp.Numpy:
    return flow.stack([flow.math.reduce_mean(x), flow.math.reduce_max(x)], axis=0)


@flow.global_function()
def expanded(x: tp.Numpy.Placeholder((2, 3))) -> Tuple[tp.Numpy, tp.Numpy]:
    best = flow.math.argmax(flow.math.reduce_sum(x, axis=0))
    return (flow.expand_dims(flow.math.reduce_mean(x), 0),
            flow.one_hot(flow.cast(best, flow.int32), depth=3))


flow.load_variables({{"w": W0}})
MASKS = [np.random.default_rng(i).uniform(size=4).astype(np.float32) for i in range(4)]
LOSSES = [train(m) for m in MASKS]
W = flow.get_all_variables()["w"].numpy()
ARGMAX = argmax(np.array([0.0, 3.0, 1.0, -2.0, 0.5], np.float32))
STACKED = stacked(np.arange(6, dtype=np.float32).reshape(2, 3))
EXPANDED = expanded(np.arange(6, dtype=np.float32).reshape(2, 3))
'''


def run_program(tmp_path, module):
    path = tmp_path / "program.py"
    path.write_text(PROGRAM.format(module=module))
    flow.clear_default_session()
    install_oneflow_alias()
    try:
        return runpy.run_path(str(path))
    finally:
        uninstall_oneflow_alias()
        flow.clear_default_session()


def adamw_reference(masks, w, generation):
    """w after AdamW steps on mean(w * mask) (gradient mask / 4), in float64, with the
    update of OneFlow <= 0.4 (adam_bias_correction_learning_rate, then
    w - lr_t * (m / (sqrt(v) + eps) + wd * w)) or of 0.5's adam_update."""
    lr, b1, b2, eps, wd = 0.5, 0.9, 0.99, 1e-3, 0.9
    w, m, v = w.astype(np.float64), 0.0, 0.0
    for t, mask in enumerate(masks):
        g = mask / 4
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        bc1, bc2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
        if generation == "0.4":
            w = w - lr * np.sqrt(bc2) / bc1 * (m / (np.sqrt(v) + eps) + wd * w)
        else:
            w = w - lr / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + eps) - lr * wd * w
    return w


@pytest.mark.parametrize("module,generation", [("oneflow", "0.4"),
                                               ("oneflow.compatible.single_client", "0.5")])
def test_each_program_gets_its_release_s_adam_with_bias_correction(tmp_path, module,
                                                                    generation):
    """OneFlow <= 0.4 scaled the learning rate by sqrt(bc2) / bc1 and the weight decay with
    it; 0.5 divides the step by bc1 and v by bc2 and decays by lr alone."""
    ns = run_program(tmp_path, module)
    expected = adamw_reference(ns["MASKS"], ns["W0"], generation)
    other = adamw_reference(ns["MASKS"], ns["W0"], "0.5" if generation == "0.4" else "0.4")
    assert np.abs(expected - other).max() > 0.1     # the releases differ here
    np.testing.assert_allclose(ns["W"], expected, rtol=1e-5, atol=1e-6)


def test_a_0_4_program_gets_0_d_results_as_one_element_vectors(tmp_path):
    """OneFlow <= 0.4 returned a full reduction and a vector's argmax with shape (1,);
    programs concatenate and compare them as such."""
    ns = run_program(tmp_path, "oneflow")
    assert all(loss.shape == (1,) for loss in ns["LOSSES"])
    assert np.concatenate(ns["LOSSES"]).shape == (4,)
    assert np.array_equal(ns["ARGMAX"], np.array([1]))
    assert ns["ARGMAX"].tolist() == [1]
    assert ns["ARGMAX"].dtype == np.int32       # (0.4's argmax_op.cpp; 0.5's is int64)
    # two (1,) reductions stacked: (2, 1), as 0.4's expand_dims + concat made them
    np.testing.assert_array_equal(ns["STACKED"], [[2.5], [5.0]])
    # and expand_dims / one_hot of them: (1, 1), (1, depth)
    np.testing.assert_array_equal(ns["EXPANDED"][0], [[2.5]])
    np.testing.assert_array_equal(ns["EXPANDED"][1], [[0, 0, 1]])
    # and to a number, as NumPy 1.x converted any one-element array
    loss = ns["LOSSES"][0]
    assert float(loss) == loss[0] and int(ns["ARGMAX"]) == 1 and "%.3f" % loss
    # as do the one-element arrays computed from them (an epoch's mean loss, formatted)
    total = 0
    for value in ns["LOSSES"]:
        total += value
    mean = total / len(ns["LOSSES"])
    assert "%.4f" % mean == "%.4f" % np.mean(np.concatenate(ns["LOSSES"]))
    plain = np.array([loss[0]], np.float32)          # what OneFlow 0.4 returned
    assert float(np.sqrt(loss) * 2 - 1) == (np.sqrt(plain) * 2 - 1)[0]
    assert type(loss * np.ones(3)) is np.ndarray and type(loss.mean()) is not type(loss)
    assert type(np.concatenate([loss, loss])) is np.ndarray


def test_a_0_5_program_gets_0_d_results(tmp_path):
    ns = run_program(tmp_path, "oneflow.compatible.single_client")
    assert all(loss.shape == () for loss in ns["LOSSES"])
    assert f"{ns['LOSSES'][0]:.3f}" and ns["ARGMAX"].shape == () and int(ns["ARGMAX"]) == 1
    assert ns["ARGMAX"].dtype == np.int64
    np.testing.assert_array_equal(ns["STACKED"], [2.5, 5.0])
    np.testing.assert_array_equal(ns["EXPANDED"][0], [2.5])
    np.testing.assert_array_equal(ns["EXPANDED"][1], [0, 0, 1])


def test_a_job_only_api_outside_a_job_raises_oneflow_s_not_implemented_error():
    """OneFlow's lazy API raises NotImplementedError where no implementation is enabled
    (its own test_oneflow_export calls flow.losses.add_loss outside a job); onnxjob's
    error names the line and is a TraceError too."""
    from onnxjob.errors import TraceError
    for call in (lambda: flow.losses.add_loss(None), lambda: flow.get_variable("v", (1,))):
        with pytest.raises(NotImplementedError, match="inside a job function body") as info:
            call()
        assert isinstance(info.value, TraceError) and "test_generations.py" in str(info.value)


def test_0_4_s_path_of_the_permutation_helpers_imports():
    install_oneflow_alias()
    try:
        from oneflow.python.ops.transpose_util import (  # noqa: F401
            get_inversed_perm, get_perm_when_transpose_axis_to_last_dim)
        assert list(get_inversed_perm([2, 0, 1])) == [1, 2, 0]
    finally:
        uninstall_oneflow_alias()


def test_transpose_keeps_the_batch_axis_where_asked():
    """OneFlow <= 0.3's blob.batch_axis moves with a transpose unless
    batch_axis_non_change=True keeps the input's."""
    import onnxjob.typing as tp
    seen = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((3, 4))) -> tp.Numpy:
        moved = flow.transpose(x, perm=[1, 0])
        kept = flow.transpose(x, perm=[1, 0], batch_axis_non_change=True)
        seen.update(x=x.batch_axis, moved=moved.batch_axis, kept=kept.batch_axis)
        return kept

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(job(x), x.T)
    assert seen == {"x": 0, "moved": 1, "kept": 0}
    flow.clear_default_session()


def test_a_placeholder_s_batch_axis_is_the_one_it_was_given():
    """OneFlow <= 0.3's input_blob_def: Placeholder(batch_axis=1) (and FixedTensorDef's)
    is the blob's batch_axis, a negative one counted from the end; None is none, which
    0.2 tested with `is None` and 0.3 against flow.INVALID_BATCH_AXIS."""
    import onnxjob.typing as tp
    seen = {}

    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((2, 5), batch_axis=1),
            y: tp.Numpy.Placeholder((2, 5), batch_axis=-1),
            z: tp.Numpy.Placeholder((2, 5), batch_axis=None),
            m: tp.ListNumpy.Placeholder((2, 5))) -> tp.Numpy:
        seen.update(x=x.batch_axis, y=y.batch_axis, z=z.batch_axis, m=m.batch_axis,
                    z_invalid=z.batch_axis == flow.INVALID_BATCH_AXIS)
        return x

    ones = np.ones((2, 5), np.float32)
    job(ones, ones, ones, [ones])
    assert seen == {"x": 1, "y": 1, "z": None, "m": 0, "z_invalid": True}
    flow.clear_default_session()


DEPRECATED_NAMES = '''
import {module} as flow
flow.optimizer.PolynomialSchduler(0.1, 10)
flow.distribute.mirrored_strategy()
'''


@pytest.mark.parametrize("module, root", [
    ("oneflow", "oneflow."),
    ("oneflow.compatible.single_client", "oneflow.compatible.single_client.")])
def test_deprecated_names_warn_in_the_program_s_own_spelling(tmp_path, capsys, module, root):
    # OneFlow printed the deprecated and the new path under the module it ran from, then
    # the calling line (ops/optimizer.py's PolynomialSchduler, framework/distribute.py)
    path = tmp_path / "program.py"
    path.write_text(DEPRECATED_NAMES.format(module=module))
    install_oneflow_alias()
    try:
        runpy.run_path(str(path))
    finally:
        uninstall_oneflow_alias()
    out = capsys.readouterr().out
    assert (f"WARNING: {root}optimizer.PolynomialSchduler will be removed in the future, use "
            f"{root}optimizer.PolynomialScheduler instead.") in out
    assert (f"WARNING: {root}distribute.mirrored_strategy will be removed in the future, use "
            f"{root}scope.mirrored_view instead.") in out
    assert f'File "{path}", line 3' in out and f'File "{path}", line 4' in out
    assert "onnxjob" not in out


def test_a_one_element_result_converts_to_a_number_as_with_numpy_1():
    """A batch-1 prediction (shape (1,)) in `"%d" % pred` and int(pred), as programs of
    OneFlow's time did under NumPy 1.x (NumPy 2 refuses arrays of rank > 0 there); what
    NumPy computes from it stays plain NumPy."""
    flow.clear_default_session()

    @flow.global_function()
    def predict(x: tp.Numpy.Placeholder((1, 4))) -> tp.Numpy:
        return flow.math.argmax(flow.nn.softmax(x))

    for step in range(3):     # (from the second call on, the job's fast path answers)
        pred = predict(np.array([[0, 3, 1, 2]], np.float32))
        assert pred.shape == (1,) and "class %d" % pred == "class 1" and int(pred) == 1
        assert float(pred) == 1.0 and type(pred * 2) in (np.ndarray, type(pred))


OLD_API_ADAM = '''
import numpy as np
import {module} as flow

cfg = flow.function_config()
cfg.train.primary_lr(0.01)
cfg.train.model_update_conf(dict(adam_conf=dict(beta1=0.9, beta2=0.999, epsilon=1e-8)))


@flow.global_function(cfg)
def train(x=flow.FixedTensorDef((1,), dtype=flow.float)):
    w = flow.get_variable("w", shape=(1,), initializer=flow.zeros_initializer())
    flow.losses.add_loss(w * x)
    return w


STEPS = [float(train(np.ones(1, np.float32)).get().numpy()[0]) for _ in range(2)]
'''


@pytest.mark.parametrize("module,bias_correction", [("oneflow", False),
                                                    ("oneflow.compatible.single_client", True)])
def test_the_old_api_s_adam_conf_defaults_to_its_release_s_bias_correction(tmp_path, module,
                                                                           bias_correction):
    """model_update_conf(dict(adam_conf=...)) without do_bias_correction: false in OneFlow
    0.1-0.4's proto (job_conf.proto, op_conf.proto), true in 0.5's; the first step is
    lr * m / sqrt(v) = 0.0316 without, lr = 0.01 with."""
    path = tmp_path / "old_api_adam.py"
    path.write_text(OLD_API_ADAM.format(module=module))
    flow.clear_default_session()
    install_oneflow_alias()
    try:
        steps = runpy.run_path(str(path))["STEPS"]
    finally:
        uninstall_oneflow_alias()
        flow.clear_default_session()
    first = steps[0] - steps[1]
    expected = 0.01 if bias_correction else 0.01 * 0.1 / np.sqrt(0.001)
    assert first == pytest.approx(expected, rel=1e-4)


def test_fixed_tensor_def_takes_oneflow_0_1_0_s_split_axis():
    flow.clear_default_session()

    @flow.global_function(flow.function_config())
    def job(x=flow.FixedTensorDef((2, 3), dtype=flow.float, batch_axis=0, split_axis=0)):
        return x * 2.0

    np.testing.assert_array_equal(job(np.ones((2, 3), np.float32)).get().numpy(),
                                  np.full((2, 3), 2.0))
