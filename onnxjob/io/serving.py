"""`flow.serving`: OneFlow's InferenceSession over onnxjob's saved models
(io/saved_model.py), run by onnxruntime.

    sess = flow.serving.InferenceSession()
    sess.load_saved_model("models")            # the latest version; or model_version=1
    sess.launch()
    outputs = sess.run("predict_job", x=batch)  # the signature's outputs, in order
    sess.close()

A graph is loaded with a signature (the graph's default unless named): run takes the
signature's input names and returns its outputs in the order they were added; without a
signature, the job's own input names and every output. OneFlow's lower-level path that
compiles its own op lists (`open` + `compile`) has no onnxjob counterpart and raises.
"""
import enum
import json
import os

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import JobArgumentError, missing_api, unsupported_form
from onnxjob.io.saved_model import META_FILE
from onnxjob.typing import as_fed_dtype


class ModelVersionPolicy(enum.Enum):
    """Which version of a saved model load_saved_model loads."""
    LATEST = 1


class SessionOption:
    """device_tag "gpu" runs on onnxruntime's CUDA provider when it is installed (else the
    CPU); device_num and is_mirrored_view are accepted (one device runs each job)."""

    def __init__(self):
        self.device_tag = "gpu"
        self.device_num = 1
        self.is_mirrored_view = False


def _latest_version(saved_model_dir):
    versions = [int(d) for d in os.listdir(saved_model_dir) if d.isdigit()]
    if not versions:
        raise ValueError(f"{saved_model_dir} holds no model version folder")
    return max(versions)


class InferenceSession:
    """Loads saved models' graphs and runs them (module docstring)."""

    class SessionStatus(enum.Enum):
        OPEN = 1
        RUNNING = 2
        CLOSED = 3

    def __init__(self, option=None):
        assert option is None or isinstance(option, SessionOption)
        self.option_ = option or SessionOption()
        self.jobs_ = {}     # job name -> {"model", "session", "inputs", "outputs"}
        self.status_ = self.SessionStatus.OPEN

    def _check_status(self, *status):
        if self.status_ not in status:
            raise ValueError(f"the session is {self.status_.name}; this needs "
                             f"{' or '.join(s.name for s in status)}")

    def load_saved_model(self, saved_model_dir, model_version=ModelVersionPolicy.LATEST,
                         saved_model_meta_file_basename="saved_model", graph_name=None,
                         signature_name=None):
        """Load graph `graph_name` (the model's default) of a saved model version."""
        self._check_status(self.SessionStatus.OPEN)
        if not os.path.isdir(saved_model_dir):
            raise ValueError(f"{saved_model_dir} is not a valid directory")
        if model_version == ModelVersionPolicy.LATEST:
            model_version = _latest_version(saved_model_dir)
        elif not isinstance(model_version, int):
            raise NotImplementedError(f"model_version {model_version!r}")
        path = os.path.join(saved_model_dir, str(model_version))
        if not os.path.isdir(path):
            raise ValueError(f"version {model_version} of saved model in dir {saved_model_dir} "
                             "do not exist")
        meta_path = os.path.join(path, f"{saved_model_meta_file_basename}.json")
        if not os.path.isfile(meta_path):
            raise ValueError(f"saved model meta file {saved_model_meta_file_basename} do not "
                             f"exist in {path} (onnxjob writes {META_FILE}; OneFlow's "
                             "saved_model.pb holds its own op lists, which onnxjob cannot run)")
        with open(meta_path) as f:
            meta = json.load(f)
        graph_name = graph_name or meta["default_graph_name"]
        if graph_name not in meta["graphs"]:
            raise ValueError(f"graph {graph_name} do not exist")
        graph = meta["graphs"][graph_name]
        signature_name = signature_name or graph.get("default_signature_name")
        signature = None
        if signature_name is not None:
            if signature_name not in graph["signatures"]:
                raise ValueError(f"signature {signature_name} do not exist")
            signature = graph["signatures"][signature_name]
        self.jobs_[graph_name] = {"file": os.path.join(path, graph["file"]),
                                  "signature": signature}

    def launch(self):
        """Create an onnxruntime session per loaded graph."""
        import onnxruntime as ort
        self._check_status(self.SessionStatus.OPEN)
        from onnxjob.runtime import backend, cuda_libraries
        providers = ["CPUExecutionProvider"]
        if self.option_.device_tag == "gpu" and \
                "CUDAExecutionProvider" in ort.get_available_providers():
            cuda_libraries.preload()
            # onnxjob's CUDA options (ONNXJOB_CUDA_TF32 among them): the served model
            # computes what its job computed
            providers.insert(0, ("CUDAExecutionProvider", backend.cuda_provider_options({})))
        for job in self.jobs_.values():
            session = ort.InferenceSession(job["file"], providers=providers)
            onnx_inputs = {i.name: i for i in session.get_inputs()}
            onnx_outputs = [o.name for o in session.get_outputs()]
            signature = job["signature"]
            job["session"] = session
            job["inputs"] = dict(signature["inputs"]) if signature else {n: n for n in onnx_inputs}
            job["outputs"] = (list(signature["outputs"].items()) if signature
                              else [(n, n) for n in onnx_outputs])
            job["info"] = onnx_inputs
        self.status_ = self.SessionStatus.RUNNING

    def list_jobs(self):
        """The names of the loaded graphs (jobs)."""
        self._check_status(self.SessionStatus.RUNNING)
        return list(self.jobs_)

    def list_inputs(self):
        """The input names run takes (the signatures')."""
        self._check_status(self.SessionStatus.RUNNING)
        return tuple(n for job in self.jobs_.values() for n in job["inputs"])

    def list_outputs(self):
        """The output names, in the order run returns them."""
        self._check_status(self.SessionStatus.RUNNING)
        return tuple(n for job in self.jobs_.values() for n, _ in job["outputs"])

    def _job(self, job_name):
        if job_name is None and len(self.jobs_) == 1:
            job_name = next(iter(self.jobs_))
        if job_name not in self.jobs_:
            raise ValueError(f"no job {job_name!r} is loaded (loaded: {list(self.jobs_)})")
        return self.jobs_[job_name]

    def input_info(self, input_name, job_name=None):
        """{"shape", "dtype"} of an input (its flow dtype)."""
        job = self._job(job_name)
        value = job["info"][job["inputs"][input_name]]
        return {"shape": tuple(value.shape), "dtype": dtypes.from_numpy(_np_type(value.type))}

    def output_info(self, output_name, job_name=None):
        """{"shape", "dtype"} of an output."""
        job = self._job(job_name)
        name = dict(job["outputs"])[output_name]
        value = next(o for o in job["session"].get_outputs() if o.name == name)
        return {"shape": tuple(value.shape), "dtype": dtypes.from_numpy(_np_type(value.type))}

    def run(self, job_name, **kwargs):
        """The outputs of one run of `job_name` on the named inputs (a list)."""
        self._check_status(self.SessionStatus.RUNNING)
        job = self._job(job_name)
        missing = sorted(set(job["inputs"]) - set(kwargs))
        unknown = sorted(set(kwargs) - set(job["inputs"]))
        if missing or unknown:
            raise ValueError(f"job {job_name}: missing inputs {missing}, unknown inputs "
                             f"{unknown} (it takes {sorted(job['inputs'])})")
        feeds = {job["inputs"][n]: self._checked_input(job_name, job, n, v)
                 for n, v in kwargs.items()}
        names = [onnx_name for _, onnx_name in job["outputs"]]
        return job["session"].run(names, feeds)

    @staticmethod
    def _checked_input(job_name, job, name, value):
        """`value` for input `name` in the saved signature's dtype, or JobArgumentError
        naming the job, the input and what it takes (OneFlow checks a fed value's shape
        against the saved model's too; onnxruntime's own message names neither)."""
        info = job["info"][job["inputs"][name]]
        where = f"job {job_name!r}, input {name!r}"
        value = np.asarray(value)
        want = tuple(d if isinstance(d, int) else None for d in info.shape)
        if len(want) != value.ndim or any(w is not None and w != d
                                          for w, d in zip(want, value.shape)):
            shown = tuple("?" if w is None else w for w in want)
            raise JobArgumentError(f"{where}: got shape {value.shape}, the saved model takes "
                                   f"{shown} (its batch size is part of the saved job)")
        return as_fed_dtype(value, _np_type(info.type), where, "the saved model's input")

    def open(self, job_name, signature=None, batch_size=None):
        raise unsupported_form(
            "flow.serving.InferenceSession.open/compile",
            "they build a job from OneFlow's op lists, which onnxjob cannot run: load an "
            "onnxjob saved model with load_saved_model")

    compile = open

    def close(self):
        """Release the onnxruntime sessions."""
        self.jobs_.clear()
        self.status_ = self.SessionStatus.CLOSED


def _np_type(onnx_type):
    """The NumPy dtype of onnxruntime's type string ("tensor(float)")."""
    name = onnx_type[len("tensor("):-1]
    return np.dtype({"float": "float32", "double": "float64", "float16": "float16"}.get(
        name, name))


__getattr__ = missing_api("flow.serving")
