"""The name-space stack of `flow.scope.namespace`: prefixes for variable and node names."""
import contextlib
import threading

_state = threading.local()


def _stack():
    if not hasattr(_state, "names"):
        _state.names = []
    return _state.names


@contextlib.contextmanager
def namespace(name):
    """Prefix `name-` to the names of variables and ops created inside (nests)."""
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


@contextlib.contextmanager
def empty_stack():
    """Run the block with no name space open, the caller's restored after (a job body
    starts from its own scope, not from the blocks open where it was first called)."""
    old = _stack()
    _state.names = []
    try:
        yield
    finally:
        _state.names = old
