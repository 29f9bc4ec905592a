"""`flow.distribute`: distribution schemes of variables and blobs, and the deprecated
strategy names (OneFlow's framework/distribute.py).

onnxjob runs a job on one device, so a scheme changes no number: `split(axis)`,
`broadcast()` and `auto()` are values that `flow.get_variable(distribute=...)`,
`layers.dense(model_distribute=...)` and `parallel_cast` accept.
`mirrored_strategy()` / `consistent_strategy()` are the deprecated spellings of
`flow.scope.mirrored_view()` / `consistent_view()` and return those objects.
"""
import traceback

from onnxjob.errors import missing_api
from onnxjob.frontend import scope


class Distribute:
    """A distribution scheme (OneFlow's `oneflow._oneflow_internal.distribute.Distribute`)."""

    def __eq__(self, other):
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self):
        return hash((type(self).__name__, tuple(sorted(vars(self).items()))))


class SplitDistribute(Distribute):
    """Split along `axis`."""

    def __init__(self, axis):
        self.axis = axis

    def __repr__(self):
        return f"flow.distribute.split({self.axis})"


class BroadcastDistribute(Distribute):
    """Every device holds the whole value."""

    def __repr__(self):
        return "flow.distribute.broadcast()"


class AutoDistribute(Distribute):
    """The compiler chooses."""

    def __repr__(self):
        return "flow.distribute.auto()"


def split(axis):
    """The scheme that splits a blob or variable at `axis` (an int, as OneFlow asserts)."""
    assert type(axis) is int
    return SplitDistribute(axis)


def broadcast():
    """The broadcast scheme."""
    return BroadcastDistribute()


def auto():
    """The automatic scheme."""
    return AutoDistribute()


def assert_is_valid_distribute(distribute):
    """OneFlow's check that `distribute` is one of the three schemes."""
    assert isinstance(distribute, Distribute), (
        "not a valid distribute policy.\n           expected: 1) "
        "oneflow.compatible.single_client.distribute.split(axis); 2) "
        "oneflow.compatible.single_client.distribute.broadcast(); 3) "
        "oneflow.compatible.single_client.distribute.auto()")


def _deprecated(name, replacement):
    print("WARNING:", f"oneflow.compatible.single_client.distribute.{name}",
          "will be removed in the future, use {} instead.".format(
              f"oneflow.compatible.single_client.scope.{replacement}"))
    print(traceback.format_stack()[-3])


def mirrored_strategy():
    """Deprecated `flow.scope.mirrored_view()` (prints OneFlow's warning)."""
    _deprecated("mirrored_strategy", "mirrored_view")
    return scope.mirrored_view()


def consistent_strategy():
    """Deprecated `flow.scope.consistent_view()` (prints OneFlow's warning)."""
    _deprecated("consistent_strategy", "consistent_view")
    return scope.consistent_view()


def mirrored_strategy_enabled():
    """Deprecated: whether a `with flow.scope.mirrored_view():` block is open here."""
    _deprecated("mirrored_strategy_enabled", "mirrored_view_enabled")
    return scope.mirrored_view_enabled()


def consistent_strategy_enabled():
    """Deprecated: the opposite of `mirrored_strategy_enabled()`."""
    _deprecated("consistent_strategy_enabled", "consistent_view_enabled")
    return not scope.mirrored_view_enabled()


__getattr__ = missing_api("flow.distribute")
