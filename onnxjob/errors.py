"""Error classes for user mistakes. Each message says what was expected and where."""
from onnxjob.source_info import user_location


class OnnxJobError(Exception):
    """Base of onnxjob's own errors."""


class TraceError(OnnxJobError, ValueError):
    """An op got inputs it cannot take (shape, dtype, attribute), found while tracing."""

    def __init__(self, message, location=None):
        super().__init__(f"{location or user_location()}: {message}")


class ConcreteBlobError(OnnxJobError, TypeError):
    """A traced Blob was used where Python needs a concrete value (if, for, len, ...)."""


class MissingGradientError(OnnxJobError, NotImplementedError):
    """A train job needs the gradient of an op that has no gradient rule."""


class DeviceUnavailableError(OnnxJobError, RuntimeError):
    """The user asked for a GPU but onnxruntime cannot run on one."""


class DeviceMemoryError(OnnxJobError, MemoryError):
    """A step could not get the memory it needs: onnxruntime's arena reached its bound
    (flow.config.device_memory_limit_mbyte) or the device ran out. The job and its
    variables are as before the step, which can be retried."""


class JobArgumentError(AssertionError):
    """A job was called with an argument that does not fit its placeholder.

    An AssertionError, as in OneFlow, but with a message that says what was wrong.
    """


class UnsupportedAPIError(OnnxJobError, AttributeError):
    """A OneFlow name that onnxjob does not provide (an AttributeError, so `hasattr` and
    `getattr(obj, name, default)` keep working)."""


class OutsideJobError(TraceError, NotImplementedError):
    """A job-only API (an op, a loss, a variable) called outside a job function body:
    OneFlow's lazy API raises NotImplementedError there (no implementation is enabled in
    that mode); onnxjob's names the line; both kinds catch it."""


class UnknownFlagError(UnsupportedAPIError, AssertionError):
    """A function_config flag OneFlow does not define: OneFlow's FunctionConfig asserts
    there (an AssertionError), onnxjob's names the line; both kinds catch it."""


def unsupported_form(call, why):
    """UnsupportedAPIError for a OneFlow call onnxjob provides but cannot run in the form
    given (`call`, e.g. "flow.enable_eager_execution(True)"), naming the user's file:line
    and why."""
    return UnsupportedAPIError(
        f"{user_location()}: {call} is not supported by onnxjob: {why} "
        "(docs/oneflow-scripts.md in onnxjob's repository says what is supported)")


def missing_api(namespace, reasons=None, default=None):
    """A module-level `__getattr__` for the `flow.*` namespace `namespace` (PEP 562): an
    unknown name raises UnsupportedAPIError naming it and the user's file:line. `reasons`
    maps names that onnxjob leaves out on purpose to why (with those of
    frontend/refusals.py for `namespace`); `default` is the reason for any other name."""
    from onnxjob.frontend.refusals import reasons as refused
    reasons = {**refused(namespace), **(reasons or {})}

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        why = reasons.get(name, default or "onnxjob implements OneFlow's single-device "
                                           "legacy job-function API")
        raise UnsupportedAPIError(
            f"{user_location()}: {namespace}.{name} is not provided by onnxjob: {why} "
            "(docs/oneflow-scripts.md in onnxjob's repository says what is supported)")
    return __getattr__


class JobRunError(OnnxJobError, RuntimeError):
    """An op of a job's graph failed on one call's values (a run-time shape that does not
    fit, an index out of range): the message names the job, the op and the line of the
    job body that made it, then onnxruntime's own message."""


class CheckpointError(OnnxJobError, RuntimeError):
    """A checkpoint on disk is missing, malformed or does not fit the variables."""
