"""The doc LeNet and MLP: predict outputs and train-step gradients against PyTorch;
export to a checked .onnx file that plain onnxruntime runs with the same outputs."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
from models import define_jobs, lenet, mlp, random_batch, torch_lenet, torch_mlp

torch = pytest.importorskip("torch", reason="PyTorch is the reference")

NETS = {"lenet": (lenet, torch_lenet, {"train": False}), "mlp": (mlp, torch_mlp, {})}


def _weights():
    return {k: torch.tensor(v.numpy(), requires_grad=True)
            for k, v in flow.get_all_variables().items() if "System-Train" not in k}


@pytest.mark.parametrize("name", NETS)
def test_predict_matches_pytorch(name):
    net, torch_net, kwargs = NETS[name]
    _, eval_job = define_jobs(net, kwargs)
    images, _ = random_batch()
    out = eval_job(images)
    ref = torch_net(torch, _weights())(torch.tensor(images)).detach().numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NETS)
def test_train_step_gradients_match_pytorch(name):
    """One SGD step (lr 0.1, no dropout) moves every weight by -0.1 * torch's gradient."""
    net, torch_net, kwargs = NETS[name]
    flow.config.seed(7)
    train_job, _ = define_jobs(net, kwargs)
    images, labels = random_batch(1)
    before = _weights()
    loss = train_job(images, labels)
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    ref_loss = torch.nn.functional.cross_entropy(
        torch_net(torch, before)(torch.tensor(images)), torch.tensor(labels).long(), reduction="none")
    np.testing.assert_allclose(loss, ref_loss.detach().numpy(), rtol=1e-5, atol=1e-5)
    ref_loss.mean().backward()
    for k, w in before.items():
        grad = (w.detach().numpy() - after[k]) / 0.1
        ref = w.grad.numpy()
        # The gradient is recovered as (w_before - w_after) / lr from float32 weights, which
        # loses ~eps * |w| / (lr * |g|) of it: the bound is 1e-5 relative, widened by that.
        rel = np.linalg.norm(grad - ref) / np.linalg.norm(ref)
        assert rel <= 1e-5 * max(1.0, np.abs(w.detach().numpy()).max() / np.abs(ref).max()), (k, rel)
        np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max(), err_msg=k)
    assert after["System-Train-TrainStep-train_job"][0] == 1


def test_export_lenet_checks_and_runs_in_plain_onnxruntime(tmp_path):
    _, eval_job = define_jobs(lenet, {"train": False})
    images, _ = random_batch(2)
    expected = eval_job(images)
    path = str(tmp_path / "lenet.onnx")
    flow.export(eval_job, path)
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["images"]
    assert all(any(p.key == "source" and "models.py:" in p.value for p in n.metadata_props)
               for n in model.graph.node if n.op_type == "Conv")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"images": images})[0], expected, rtol=1e-4, atol=2e-5)


def test_predict_job_sees_weights_updated_by_train_job():
    train_job, eval_job = define_jobs(mlp)
    images, labels = random_batch(3)
    first = eval_job(images)
    train_job(images, labels)
    assert not np.allclose(eval_job(images), first)


def test_dropout_drops_in_train_jobs_only():
    import onnxjob.typing as tp

    @flow.global_function(type="train")
    def t(x: tp.Numpy.Placeholder((1000,))) -> tp.Numpy:
        w = flow.get_variable("w", (1000,), initializer=flow.ones_initializer())
        y = flow.nn.dropout(x * w, rate=0.5)
        flow.optimizer.SGD(0.0, momentum=0).minimize(flow.math.reduce_sum(y))
        return y

    @flow.global_function()
    def p(x: tp.Numpy.Placeholder((1000,))) -> tp.Numpy:
        w = flow.get_variable("w", (1000,), initializer=flow.ones_initializer())
        return flow.nn.dropout(x * w, rate=0.5)

    x = np.ones(1000, np.float32)
    y = t(x)
    assert 0.4 < (y == 0).mean() < 0.6 and set(np.unique(y)) == {0.0, 2.0}
    assert np.array_equal(p(x), x)


def test_dropout_noise_shape_is_refused_where_oneflow_refuses_it():
    """OneFlow's dropout returns its input in predict jobs, then its random_mask_like
    asserts on noise_shape: accepted there, refused in a train job (not ignored)."""
    import onnxjob.typing as tp
    from onnxjob.errors import TraceError
    flow.clear_default_session()

    @flow.global_function()
    def p(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        return flow.nn.dropout(x, rate=0.5, noise_shape=[4, 1])

    x = np.ones((4, 3), np.float32)
    assert np.array_equal(p(x), x)
    flow.clear_default_session()

    @flow.global_function(type="train")
    def t(x: tp.Numpy.Placeholder((4, 3))) -> tp.Numpy:
        w = flow.get_variable("w", (3,), initializer=flow.ones_initializer())
        y = flow.nn.dropout(x * w, rate=0.5, noise_shape=[4, 1])
        flow.optimizer.SGD(0.0, momentum=0).minimize(flow.math.reduce_sum(y))
        return y

    with pytest.raises(TraceError, match="noise_shape is not supported"):
        t(x)


def test_export_train_job_checks_and_computes_the_same_step(tmp_path):
    train_job, _ = define_jobs(mlp)
    images, labels = random_batch(5)
    path = str(tmp_path / "train.onnx")
    flow.export(train_job, path)
    before = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    loss = train_job(images, labels)
    after = {k: v.numpy() for k, v in flow.get_all_variables().items()}
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    # the state goes in as inputs, from the initial values exported beside them
    initial = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    state = {k: initial[f"{k}/initial"] for k in before}
    outs = dict(zip(names, sess.run(None, {"images": images, "labels": labels, **state})))
    np.testing.assert_allclose(outs["output_0"], loss, rtol=1e-5, atol=1e-6)
    for k in before:
        np.testing.assert_allclose(outs[f"{k}/next"], after[k], rtol=1e-5, atol=1e-6, err_msg=k)
