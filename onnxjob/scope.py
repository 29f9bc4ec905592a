"""`flow.scope`: name spaces, placement (advisory) and logical views."""
import contextlib
import threading

_state = threading.local()


def _stack():
    if not hasattr(_state, "names"):
        _state.names = []
    return _state.names


@contextlib.contextmanager
def namespace(name):
    """Prefix `name-` to the names of variables created inside (nests)."""
    _stack().append(str(name))
    try:
        yield
    finally:
        _stack().pop()


def namespace_prefix():
    names = _stack()
    return "-".join(names) + "-" if names else ""


def full_name(name):
    return namespace_prefix() + name


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
        return self

    def __exit__(self, *exc):
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
