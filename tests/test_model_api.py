"""flow.Model / flow.model: OneFlow 0.5's training loop over global functions (the
function style), with in-job and NumPy data, several optimizers, validation, checkpoints
and callbacks; the eager object style is refused."""
import os

import numpy as np
import pytest

import onnxjob as flow
from onnxjob.errors import UnsupportedAPIError

W0 = np.array([[1.0], [-2.0], [0.5]], np.float32)
X = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
Y = X @ np.array([[0.3], [0.2], [-0.1]], np.float32)


def sgd(lr):
    return flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [lr]), momentum=0)


class Regression(flow.Model):
    """Least squares on (X, Y); training_step returns (loss, prediction)."""

    def __init__(self, lr=0.1):
        super().__init__(is_deprecated_function_style=True)
        self.lr = lr

    def forward(self, x):
        w = flow.get_variable("w", (3, 1), initializer=flow.constant_initializer(0.0))
        return flow.matmul(x, w)

    def training_step(self, batch, optimizer_idx=0):
        x, y = batch
        prediction = self(x)
        return flow.math.reduce_mean(flow.math.square(prediction - y)), prediction

    def validation_step(self, batch):
        return self(batch[0])

    def configure_optimizers(self):
        return sgd(self.lr)


class NumpyData(flow.model.NumpyDataModule):
    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, step_idx=0, optimizer_idx=0):
        self.calls.append((step_idx, optimizer_idx))
        return X, Y


class JobData(flow.model.DataModule):
    def forward(self, step_idx=0, optimizer_idx=0):
        return flow.constant(X, dtype=flow.float), flow.constant(Y, dtype=flow.float)


class Recorder(flow.model.Callback):
    def __init__(self):
        self.train, self.val = [], []

    def on_training_step_end(self, outputs, step_idx, optimizer_idx):
        self.train.append((step_idx, optimizer_idx, outputs[0].numpy().item(),
                           outputs[1].numpy()))

    def on_validation_step_end(self, outputs, step_idx):
        self.val.append((step_idx, outputs.numpy()))


def reference_sgd(steps, lr=0.1):
    """Losses and predictions of `steps` plain SGD steps from w = 0, in NumPy."""
    w, out = np.zeros((3, 1), np.float64), []
    for _ in range(steps):
        prediction = X @ w
        out.append((np.mean((prediction - Y) ** 2), prediction))
        w -= lr * 2 * X.T @ (prediction - Y) / len(X)
    return out, w


@pytest.mark.parametrize("data", [NumpyData, JobData])
def test_fit_trains_validates_and_reports(data):
    train, val = flow.model.TrainingConfig(), flow.model.ValidationConfig()
    train.config_data(data())
    val.config_data(data())
    val.config_step_interval(2)
    recorder = Recorder()
    Regression().fit(training_config=train, validation_config=val, callbacks=recorder,
                     max_steps=5)
    reference, w = reference_sgd(5)
    assert [s for s, *_ in recorder.train] == list(range(5))
    for (_, opt, loss, prediction), (ref_loss, ref_prediction) in zip(recorder.train, reference):
        assert opt == 0
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        np.testing.assert_allclose(prediction, ref_prediction, rtol=1e-5, atol=1e-7)
    assert [s for s, _ in recorder.val] == [1, 3]   # every step_interval steps
    # validation after step 3 sees the weights of 4 steps
    np.testing.assert_allclose(recorder.val[1][1], X @ reference_sgd(4)[1], rtol=1e-5)
    if data is NumpyData:
        assert train.data.calls[:2] == [(0, 0), (1, 0)]


def test_checkpoints_are_saved_and_loaded(tmp_path):
    train = flow.model.TrainingConfig()
    train.config_data(NumpyData())
    checkpoints = flow.model.CheckpointConfig()
    checkpoints.config_save(str(tmp_path / "model"), step_interval=2)
    Regression().fit(training_config=train, checkpoint_config=checkpoints, max_steps=4)
    assert sorted(os.listdir(tmp_path)) == ["model-1", "model-3"]
    saved = flow.checkpoint.get(str(tmp_path / "model-1"))["w"].numpy()
    np.testing.assert_allclose(saved, reference_sgd(2)[1], rtol=1e-5)

    load = flow.model.CheckpointConfig()
    load.config_load(str(tmp_path / "model-3"))
    recorder = Recorder()
    Regression().fit(training_config=train, checkpoint_config=load, callbacks=recorder,
                     max_steps=1)
    np.testing.assert_allclose(recorder.train[0][3], X @ reference_sgd(4)[1], rtol=1e-5)


class TwoOptimizers(Regression):
    def configure_optimizers(self):
        return [sgd(0.1), sgd(0.0)]


def test_one_train_job_per_optimizer():
    train = flow.model.TrainingConfig()
    train.config_data(NumpyData())
    recorder = Recorder()
    TwoOptimizers().fit(training_config=train, callbacks=[recorder], max_steps=2)
    assert [(s, o) for s, o, *_ in recorder.train] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    reference, _ = reference_sgd(3)
    losses = [loss for *_, loss, _ in recorder.train]
    # the second job's SGD has lr 0: it sees the first job's step and changes nothing
    np.testing.assert_allclose(losses, [reference[0][0], reference[1][0], reference[1][0],
                                        reference[2][0]], rtol=1e-5)


def test_invalid_configurations_do_nothing(capsys):
    class NoSteps(flow.Model):
        def __init__(self):
            super().__init__(is_deprecated_function_style=True)

    train = flow.model.TrainingConfig()
    train.config_data(NumpyData())
    NoSteps().fit(training_config=train, max_steps=3)
    out = capsys.readouterr().out
    assert "will not do training" in out and "will do nothing" in out
    empty = flow.model.TrainingConfig()
    assert not empty.check_valid() and "data is None" in empty.error_msg
    with pytest.raises(AssertionError, match="callbacks"):
        Regression().fit(training_config=train, callbacks=[object()], max_steps=1)


def test_object_style_is_refused():
    class Eager(flow.Model):
        def training_step(self, batch, **kwargs):
            return batch

    train = flow.model.TrainingConfig()
    train.config_data(NumpyData())
    with pytest.raises(UnsupportedAPIError, match="is_deprecated_function_style=True"):
        Eager().fit(training_config=train)


def test_a_step_reads_training_and_the_model_switches_it_as_nn_module_does():
    """OneFlow's Model and DataModule are nn.Modules: `training` is True until eval(),
    train(mode) sets it and returns the object."""
    seen = []

    class Switching(Regression):
        def training_step(self, batch, optimizer_idx=0):
            seen.append(self.training)
            return super().training_step(batch, optimizer_idx)

    model = Switching()
    assert model.training is True and model.eval() is model and model.training is False
    assert model.train() is model and model.training is True
    assert NumpyData().training is True
    config = flow.model.TrainingConfig()
    config.config_data(NumpyData())
    model.fit(training_config=config, max_steps=2)
    assert seen and all(seen)
