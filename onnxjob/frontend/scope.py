"""`flow.scope`: name spaces, placement (advisory) and logical views."""
import threading

from onnxjob.graph.name_scope import full_name, namespace, namespace_prefix  # noqa: F401

_state = threading.local()


class _Placement:
    """Placement scope. Advisory: onnxjob runs a whole job on one execution provider."""

    def __init__(self, device_tag, machine_device_ids=None):
        if device_tag not in ("cpu", "gpu", "cuda"):
            raise ValueError(f"device tag must be 'cpu' or 'gpu', got {device_tag!r}")
        self.device_tag = device_tag
        self.machine_device_ids = machine_device_ids

    def __enter__(self):
        if not hasattr(_state, "placements"):
            _state.placements = []
        _state.placements.append(self)
        return self

    def __exit__(self, *exc):
        _state.placements.pop()
        return False


def placement(device_tag, machine_device_ids="0:0"):
    return _Placement(device_tag, machine_device_ids)


def current_placement():
    stack = getattr(_state, "placements", None)
    return stack[-1] if stack else None


class _View:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        if not hasattr(_state, "views"):
            _state.views = []
        _state.views.append(self)
        return self

    def __exit__(self, *exc):
        _state.views.pop()
        return False

    def __repr__(self):
        return f"flow.scope.{self.name}()"


_MIRRORED, _CONSISTENT = _View("mirrored_view"), _View("consistent_view")


def mirrored_view():
    return _MIRRORED


def consistent_view():
    return _CONSISTENT


def is_view(obj):
    return obj is _MIRRORED or obj is _CONSISTENT


def mirrored_view_enabled():
    """Whether the innermost open `with flow.scope.*_view():` block is the mirrored one
    (False outside any block: the consistent view is OneFlow's default)."""
    views = getattr(_state, "views", None)
    return bool(views) and views[-1] is _MIRRORED


def consistent_view_enabled():
    """The opposite of `mirrored_view_enabled()`."""
    return not mirrored_view_enabled()
