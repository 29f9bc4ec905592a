"""`flow.model` and `flow.Model`: OneFlow 0.5's training-loop wrapper over global functions.

A Model subclass defines `training_step(batch, optimizer_idx)` (returns the loss, or a
tuple starting with it), `configure_optimizers()` (a flow.optimizer.* or a list, one
train job each) and optionally `validation_step(batch)`. `fit()` clears the default
session, builds one train job per optimizer and a predict job from them, loads a
checkpoint if configured, then for each step runs every train job, the validation job
every `step_interval` steps, saves `<dirpath>-<step>` every `step_interval` steps, and
hands each job's outputs to the callbacks.

Data comes from a DataModule called inside the job (`forward(step_idx, optimizer_idx)`
returns blobs: a data reader, decode_random, ...) or from a NumpyDataModule called on the
host each step, whose arrays become the jobs' placeholders (shapes and dtypes from the
first batch). As in OneFlow's lazy mode, this is the function style:
`Model(is_deprecated_function_style=True)`; the default object style trains eager
nn.Modules with flow.optim optimizers, which onnxjob does not run.
"""
import inspect

import numpy as np

from onnxjob import dtypes
from onnxjob import typing as tp
from onnxjob.errors import UnsupportedAPIError, missing_api
from onnxjob.frontend.config import FunctionConfig as ExecutionConfig
from onnxjob.train.optimizer import Optimizer


class _Module:
    """Calling the object calls `forward` (OneFlow's nn.Module protocol, no parameters);
    `training` (True until `eval()`) as nn.Module keeps it, for a step that reads it."""

    training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def train(self, mode=True):
        """Set `training` to `mode`; returns the object (nn.Module.train)."""
        self.training = mode
        return self

    def eval(self):
        """`train(False)`."""
        return self.train(False)


class DataModule(_Module):
    """Data made inside a job: override `forward(step_idx=0, optimizer_idx=0)` to return
    the batch (blobs) for training_step / validation_step."""

    def __init__(self, *args, **kwargs):
        pass

    def forward(self, step_idx=0, optimizer_idx=0):
        pass

    def infer_oneflow_data_placeholder(self, batch=None, optimizer_idx=0):
        """None: the batch is made in the job, the job has no placeholders."""
        return None


class NumpyDataModule(DataModule):
    """Data made on the host: `forward(step_idx, optimizer_idx)` returns a tuple of NumPy
    arrays, fed to the jobs' placeholders each step."""

    def infer_oneflow_data_placeholder(self, batch=None, optimizer_idx=0):
        """One tp.Numpy.Placeholder per array of `batch` (its shape and dtype)."""
        assert isinstance(batch, tuple), "model.NumpyDataModule must return a tuple."
        out = []
        for item in batch:
            assert isinstance(item, np.ndarray), \
                "model.NumpyDataModule must return a tuple of numpy."
            out.append(tp.Numpy.Placeholder(shape=item.shape,
                                            dtype=dtypes.from_numpy(item.dtype)))
        return out


class TrainingConfig:
    """The train jobs' FunctionConfig (`config_execution`) and DataModule (`config_data`)."""

    def __init__(self):
        self.exe_cfg = ExecutionConfig()
        self.data = None
        self.error_msg = ""

    def config_execution(self, exe_cfg=None):
        self.exe_cfg = exe_cfg

    def config_data(self, data=None):
        self.data = data

    def check_valid(self):
        """Whether the config can train; the reasons it cannot are in `error_msg`."""
        self.error_msg = ""
        if not isinstance(self.exe_cfg, ExecutionConfig):
            self.error_msg += "model.TrainingConfig exe_cfg is not ExecutionConfig;"
        if self.data is None:
            self.error_msg += "model.TrainingConfig data is None;"
        if not isinstance(self.data, DataModule):
            self.error_msg += "model.TrainingConfig data is not DataModule;"
        return not self.error_msg


class ValidationConfig(TrainingConfig):
    """As TrainingConfig, plus how often to validate (`config_step_interval`, default 10)."""

    def __init__(self):
        super().__init__()
        self.step_interval = 10

    def config_step_interval(self, step_interval=1):
        self.step_interval = step_interval

    def check_valid(self):
        self.error_msg = ""
        if self.data is None:
            self.error_msg += "model.ValidationConfig data is None;"
        if not isinstance(self.data, DataModule):
            self.error_msg += "model.ValidationConfig data is not DataModule;"
        if not isinstance(self.step_interval, int) or self.step_interval <= 0:
            self.error_msg += "model.ValidationConfig step_interval is <= 0 or is not int;"
        return not self.error_msg


class CheckpointConfig:
    """Load a checkpoint before training (`config_load`) and save one every
    `step_interval` steps to `<dirpath>-<step index>` (`config_save`)."""

    def __init__(self):
        self.need_load = False
        self.load_dirpath = None
        self.need_save = False
        self.save_dirpath = None
        self.save_step_interval = 1
        self.error_msg = ""

    def config_load(self, dirpath=None):
        assert dirpath is not None, "dirpath should not be None"
        self.need_load, self.load_dirpath = True, dirpath

    def config_save(self, dirpath=None, step_interval=1):
        assert dirpath is not None, "dirpath should not be None"
        assert isinstance(step_interval, int), "step_interval should be int"
        assert step_interval > 0, "step_interval should not <= 0"
        self.need_save, self.save_dirpath, self.save_step_interval = True, dirpath, step_interval

    def check_valid(self):
        return True


class Callback:
    """Override `on_training_step_end(outputs, step_idx, optimizer_idx)` and
    `on_validation_step_end(outputs, step_idx)` to see each job's outputs."""

    def on_training_step_end(self, outputs, step_idx=0, optimizer_idx=0):
        pass

    def on_validation_step_end(self, outputs, step_idx=0):
        pass


class Model(_Module):
    """The training loop of OneFlow 0.5 (module docstring); subclass it."""

    def __init__(self, *args, **kwargs):
        self._is_deprecated_function_style = kwargs.get("is_deprecated_function_style", False)

    def forward(self, *args, **kwargs):
        """The prediction computation (optional)."""
        raise NotImplementedError

    def training_step(self, *args, **kwargs):
        """The loss of one training batch (or a tuple whose first entry is the loss)."""
        raise NotImplementedError()

    def validation_step(self, *args, **kwargs):
        """The outputs of one validation batch."""
        raise NotImplementedError()

    def configure_optimizers(self):
        """A flow.optimizer.* (or a list: one train job per optimizer)."""
        raise NotImplementedError()

    def method_overrided(self, method_name=None):
        return getattr(type(self), method_name) is not getattr(Model, method_name)

    def fit(self, training_config=None, validation_config=None, checkpoint_config=None,
            callbacks=None, max_steps=100):
        """Run `max_steps` steps of training and validation (module docstring)."""
        from onnxjob.runtime.session import clear_default_session
        if not self._is_deprecated_function_style:
            raise UnsupportedAPIError(
                f"{type(self).__name__}.fit(): the object style of flow.Model trains eager "
                "nn.Modules with flow.optim, which onnxjob does not run (lazy job functions "
                "only); build the model with super().__init__(is_deprecated_function_style="
                "True), the style whose training_step runs in a global function")
        callbacks = _callbacks(callbacks)
        clear_default_session()
        steps = []
        train = _TrainJobs(self, training_config) if self.method_overrided(
            "training_step") and training_config is not None else None
        if train is not None and train.valid:
            steps.append(lambda i: train.step(i, callbacks))
        elif training_config is not None:
            print(getattr(train, "error_msg", "model.training_step() is empty;"),
                  f"{type(self).__name__}'s fit() will not do training.")
        val = _ValidationJob(self, validation_config) if self.method_overrided(
            "validation_step") and validation_config is not None else None
        if val is not None and val.valid:
            steps.append(lambda i: val.step(i, callbacks))
        elif validation_config is not None:
            print(getattr(val, "error_msg", "model.validation_step() is empty;"),
                  f"{type(self).__name__}'s fit() will not do validation.")
        if not steps:
            print(f"{type(self).__name__}'s fit() will do nothing because there has no "
                  "valid configuration.")
            return
        if checkpoint_config is not None:
            steps.append(lambda i: _save(checkpoint_config, i))
            if checkpoint_config.need_load:
                from onnxjob.io.checkpoint import get, load_variables
                load_variables(get(checkpoint_config.load_dirpath))
        for step_idx in range(max_steps):
            for step in steps:
                step(step_idx)


def _callbacks(callbacks):
    if callbacks is None:
        return []
    callbacks = [callbacks] if isinstance(callbacks, Callback) else callbacks
    assert isinstance(callbacks, list) and all(isinstance(c, Callback) for c in callbacks), \
        "model callbacks' type must be model.Callback or List[model.Callback]."
    return callbacks


def _save(config, step_idx):
    from onnxjob.io.checkpoint import save
    if config.need_save and (step_idx + 1) % config.save_step_interval == 0:
        save(f"{config.save_dirpath}-{step_idx}")


def _job(model, config, body, kind, job_name, optimizer_idx):
    """A global function of `kind` running `body(batch)`: the batch made in the job by a
    DataModule, or fed from a NumpyDataModule (returns (job, first batch or None))."""
    from onnxjob.frontend.job_function import global_function
    data = config.data
    if isinstance(data, NumpyDataModule):
        first = data(0, optimizer_idx)
        placeholders = data.infer_oneflow_data_placeholder(first, optimizer_idx)

        def job(*batch):
            return body(batch)
        job.__signature__ = inspect.Signature([
            inspect.Parameter(f"{type(data).__name__}_opt_{optimizer_idx}_para_{i}",
                              inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=p)
            for i, p in enumerate(placeholders)])
    else:
        first = None

        def job():
            return body(data(0, optimizer_idx))
    job.__name__ = f"{type(model).__name__}_Model_{job_name}"
    return global_function(kind, config.exe_cfg)(job), first


def _run(job, first, data, step_idx, optimizer_idx):
    if first is None and not isinstance(data, NumpyDataModule):
        return job().get()
    batch = first if step_idx == 0 else data(step_idx, optimizer_idx)
    return job(*batch).get()


class _TrainJobs:
    def __init__(self, model, config):
        self.valid, self.error_msg = False, f"{type(model).__name__} training error message: "
        if config is None or not config.check_valid():
            self.error_msg += "config is None;" if config is None else config.error_msg
            return
        if not model.method_overrided("configure_optimizers"):
            self.error_msg += "model.configure_optimizers() is empty;"
            return
        opts = model.configure_optimizers()
        opts = [opts] if isinstance(opts, Optimizer) else opts
        assert isinstance(opts, (list, tuple)) and all(isinstance(o, Optimizer) for o in opts), \
            "model.configure_optimizers() must return Optimizer or List[Optimizer, ...] or " \
            "Tuple[Optimizer, ...] (flow.optimizer.*)"
        self.config, self.jobs = config, []
        for i, opt in enumerate(opts):
            def body(batch, i=i, opt=opt):
                outputs = model.training_step(batch=batch, optimizer_idx=i)
                loss = outputs[0] if isinstance(outputs, tuple) and outputs else outputs
                opt.minimize(loss)
                return outputs
            numpy = "numpy_" if isinstance(config.data, NumpyDataModule) else ""
            self.jobs.append(_job(model, config, body, "train", f"train_{numpy}job_{i}", i))
        self.valid = True

    def step(self, step_idx, callbacks):
        for i, (job, first) in enumerate(self.jobs):
            outputs = _run(job, first, self.config.data, step_idx, i)
            for cb in callbacks:
                cb.on_training_step_end(outputs=outputs, step_idx=step_idx, optimizer_idx=i)


class _ValidationJob:
    def __init__(self, model, config):
        self.valid, self.error_msg = False, f"{type(model).__name__} validation error message: "
        if not config.check_valid():
            self.error_msg += config.error_msg
            return
        self.config = config
        numpy = "numpy_" if isinstance(config.data, NumpyDataModule) else ""
        self.job, self.first = _job(model, config, lambda b: model.validation_step(b),
                                    "predict", f"eval_{numpy}job", 0)
        self.valid = True

    def step(self, step_idx, callbacks):
        if (step_idx + 1) % self.config.step_interval == 0:
            outputs = _run(self.job, self.first, self.config.data, step_idx, 0)
            for cb in callbacks:
                cb.on_validation_step_end(step_idx=step_idx, outputs=outputs)


__getattr__ = missing_api("flow.model")
