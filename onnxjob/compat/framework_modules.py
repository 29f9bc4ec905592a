"""OneFlow's internal Python modules that programs import, as onnxjob's stand-ins.

Programs copy code out of OneFlow itself: op wrappers annotated with its blob classes
(`x: remote_blob_util.BlobDef`, `x: oneflow._oneflow_internal.BlobDesc`), unique op names
(`id_util.UniqueStr`), and the optimizer's `GetVariablesForCurrentJob`, which lists the
variables of the job being built:

    sess = session_ctx.GetDefaultSession()
    job_name = oneflow_api.JobBuildAndInferCtx_GetCurrentJobName()
    names = list(sess.job_name2var_name2var_blob_[job_name].keys())

The modules, where OneFlow <= 0.4 (`oneflow/python/framework/`, the extension `oneflow_api`)
and 0.5 (`oneflow/compatible/single_client/framework/`, `oneflow._oneflow_internal`) keep
them, and what of them onnxjob provides:

    session_context   GetDefaultSession(): the default session as a job body reads it,
                      `job_name2var_name2var_blob_` ({the job being traced: {variable name:
                      blob}}, in the order the job created them)
    id_util           UniqueStr(prefix)
    remote_blob       BlobDef, RemoteBlob's classes: onnxjob's Blob (annotations, isinstance)
    distribute        flow.distribute
    c_api_util        JobBuildAndInferCtx_GetCurrentJobName()
    local_blob        LocalBlob (what `job(...).get()` returns)
    oneflow_api /     JobBuildAndInferCtx_GetCurrentJobName(), the blob classes (BlobDesc,
    _oneflow_internal ConsistentBlob, LazyConsistentBlob, ...), distribute, UniqueStr
    oneflow_export    (<= 0.4, oneflow.python.oneflow_export) its tagging decorators

Any other name of these modules raises UnsupportedAPIError naming it and the user's line
(the rest is OneFlow's C++ runtime, which onnxjob replaces); any other framework module
raises ModuleNotFoundError (compat/oneflow_alias.py).
"""
import types

from onnxjob.errors import UnsupportedAPIError, missing_api
from onnxjob.frontend import distribute
from onnxjob.frontend.extras import unique_str
from onnxjob.graph.tracer import Blob, current_builder, in_job
from onnxjob.source_info import user_location

_RUNTIME = ("it is OneFlow's C++ runtime (sessions, kernels, eager tensors), which onnxjob "
            "replaces with ONNX graphs run by onnxruntime")

# OneFlow's blob classes (0.4: remote_blob.py's, 0.5: the extension's); a traced job has
# one kind of blob, so each is onnxjob's Blob.
BLOB_CLASSES = ("BlobDef", "BlobDesc", "RemoteBlob", "ConsistentBlob", "LazyConsistentBlob",
                "MirroredBlob", "LazyMirroredBlob", "EagerBlobTrait", "EagerConsistentBlob",
                "EagerMirroredBlob")


def job_build_and_infer_ctx_get_current_job_name():
    """The name of the job whose body is being traced (OneFlow's
    `JobBuildAndInferCtx_GetCurrentJobName`)."""
    return current_builder("JobBuildAndInferCtx_GetCurrentJobName()").job_name


class DefaultSessionView:
    """What `session_context.GetDefaultSession()` gives a program: the session state a
    job body reads. Other attributes of OneFlow's Session raise UnsupportedAPIError."""

    def __getattr__(self, name):
        # `job_name2var_name2var_blob_` is looked up here, not as a property: its refusal
        # is an AttributeError, which would send a property's lookup here anyway.
        if name == "job_name2var_name2var_blob_":
            return self._variables_of_current_job()
        return missing_api("oneflow session", default=_RUNTIME)(name)

    @staticmethod
    def _variables_of_current_job():
        """{job name: {variable name: blob}} for the job being traced (OneFlow's dict holds
        every job built so far; onnxjob builds each job alone, so only the current one is
        known, and only while its body runs)."""
        if not in_job():
            raise UnsupportedAPIError(
                f"{user_location()}: session.job_name2var_name2var_blob_ is readable inside "
                "a job function body only (onnxjob builds each job alone when the session "
                "starts)")
        builder = current_builder()
        return {builder.job_name: dict(builder.variables)}


def _module(name, doc, **names):
    module = types.ModuleType(name, doc)
    module.__dict__.update(names)
    module.__getattr__ = missing_api(name, default=_RUNTIME)
    return module


def extension_module(name):
    """OneFlow's pybind11 extension, `oneflow._oneflow_internal` (0.5) or `oneflow_api`
    (0.4): scripts import it at the top; job code reaches its blob classes, the current
    job's name and `distribute`."""
    deprecated = _module(name + ".deprecated", "OneFlow's deprecated C++ helpers.",
                         GetProtoDtype4OfDtype=_proto_dtype)
    return _module(name, extension_module.__doc__, distribute=distribute,
                   JobBuildAndInferCtx_GetCurrentJobName=(
                       job_build_and_infer_ctx_get_current_job_name),
                   UniqueStr=unique_str, deprecated=deprecated,
                   INVALID_BATCH_AXIS=distribute.INVALID_BATCH_AXIS,
                   INVALID_SPLIT_AXIS=distribute.INVALID_SPLIT_AXIS,
                   **{cls: Blob for cls in BLOB_CLASSES})


def oneflow_export_module(name):
    """OneFlow <= 0.4's `oneflow.python.oneflow_export`: its decorators only tag a
    function or class with the API names it is exported under (OneFlow's build generates
    the `oneflow.*` modules from the tags), so a program's own use of them changes
    nothing; here they return what they decorate (oneflow_convert's older
    flow2onnx/onnx2flow import them)."""
    def oneflow_export(*api_names, **kwargs):
        def tag(func_or_class):
            func_or_class._ONEFLOW_API = list(api_names)
            return func_or_class
        return tag

    def stable_api(func_or_class):
        return func_or_class

    return _module(name, oneflow_export_module.__doc__, oneflow_export=oneflow_export,
                   oneflow_deprecate=oneflow_export, stable_api=stable_api,
                   experimental_api=stable_api)


def _proto_dtype(dtype):
    """OneFlow's DataType enum value (data_type.proto) of a flow dtype."""
    return dtype.oneflow_enum_value


def framework_module(package, name):
    """`<package>.<name>` for OneFlow's framework package `package` (0.4's
    `oneflow.python.framework`, 0.5's `oneflow.compatible.single_client.framework`), or
    None where onnxjob has no stand-in for it."""
    full = f"{package}.{name}"
    if name == "session_context":
        return _module(full, "OneFlow's default session, as a job body reads it.",
                       GetDefaultSession=DefaultSessionView)
    if name == "id_util":
        return _module(full, "Unique names.", UniqueStr=unique_str)
    if name == "remote_blob":
        return _module(full, "OneFlow's blob classes: onnxjob's Blob.",
                       **{cls: Blob for cls in BLOB_CLASSES})
    if name == "distribute":
        return distribute
    if name == "local_blob":      # (the class of what `job(...).get()` gives)
        from onnxjob.frontend.results import LocalBlob
        return _module(full, "The fetched blobs' class.", LocalBlob=LocalBlob)
    if name == "c_api_util":
        return _module(full, "The job-build context's queries.",
                       JobBuildAndInferCtx_GetCurrentJobName=(
                           job_build_and_infer_ctx_get_current_job_name))
    return None
