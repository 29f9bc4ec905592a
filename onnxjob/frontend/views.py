"""OneFlow's logical views, `flow.scope.mirrored_view()` and `consistent_view()` (re-exported
by frontend/scope.py): the objects `function_config.default_logical_view` takes, and which
`with` block of them is open in this thread."""
import contextlib
import threading

_state = threading.local()


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


@contextlib.contextmanager
def only_view(view):
    """Run the block with `view` as the only open view (None: none, i.e. consistent), the
    caller's blocks restored after."""
    old = getattr(_state, "views", [])
    _state.views = [] if view is None else [view]
    try:
        yield
    finally:
        _state.views = old
