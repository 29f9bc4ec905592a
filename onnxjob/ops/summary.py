"""flow.summary: OneFlow's TensorBoard summary ops, accepted and ignored.

OneFlow writes TensorBoard event files from these ops. onnxjob writes nothing: the first
use warns once (SummaryIgnoredWarning) and every call returns None. Summaries only
record values; they change no result of a job, so ignoring them keeps the numbers.
"""
from onnxjob.errors import missing_api
from onnxjob.source_info import warn_at_user_line

__all__ = [
    "Graph",
    "HParam",
    "IntegerRange",
    "Metric",
    "Projector",
    "RealRange",
    "ValueSet",
    "create_summary_writer",
    "flush_summary_writer",
    "histogram",
    "hparams",
    "image",
    "pb",
    "scalar",
    "text",
]


class SummaryIgnoredWarning(UserWarning):
    """flow.summary was used: onnxjob writes no TensorBoard events."""


_warned = False


def _ignore(api):
    global _warned
    if not _warned:
        _warned = True
        warn_at_user_line(f"{api}: onnxjob does not write TensorBoard summaries; "
                          "flow.summary calls are accepted and ignored (they change no "
                          "result)", SummaryIgnoredWarning)


def create_summary_writer(logdir, name=None):
    """Ignored (OneFlow opens an event file in `logdir`)."""
    _ignore("flow.summary.create_summary_writer")


def flush_summary_writer(name=None):
    """Ignored."""
    _ignore("flow.summary.flush_summary_writer")


def scalar(value, step, tag, name=None):
    """Ignored (OneFlow records a scalar Blob under `tag` at `step`)."""
    _ignore("flow.summary.scalar")


def histogram(value, step, tag, name=None):
    """Ignored."""
    _ignore("flow.summary.histogram")


def image(value, step=None, tag=None, name=None):
    """Ignored."""
    _ignore("flow.summary.image")


def pb(value, step=None, name=None):
    """Ignored."""
    _ignore("flow.summary.pb")


def text(text, tag=None):
    """Ignored."""
    _ignore("flow.summary.text")


def hparams(hparams):
    """Ignored."""
    _ignore("flow.summary.hparams")


class _Ignored:
    """A OneFlow summary helper object: built and called freely, does nothing."""

    def __init__(self, *args, **kwargs):
        _ignore(f"flow.summary.{type(self).__name__}")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class Graph(_Ignored):
    """Ignored (OneFlow writes the job graph for TensorBoard)."""


class Projector(_Ignored):
    """Ignored (OneFlow writes embedding projections)."""


class HParam(_Ignored):
    """Ignored."""


Hparam = HParam   # OneFlow <= 0.4's exported name


class IntegerRange(_Ignored):
    """Ignored."""


class RealRange(_Ignored):
    """Ignored."""


class ValueSet(_Ignored):
    """Ignored."""


class Metric(_Ignored):
    """Ignored."""


__getattr__ = missing_api("flow.summary")
