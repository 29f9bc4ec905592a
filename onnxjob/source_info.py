"""Where in the user's code something happened.

Every traced node and every user-facing error names the first stack frame outside the
onnxjob package (as JAX's `source_info_util` does).
"""
import functools
import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_PREFIXES = (_PACKAGE_DIR + os.sep,)


@functools.lru_cache(maxsize=1024)     # called for every frame of every traced op
def _is_internal(filename):
    if filename.startswith("<frozen"):  # importlib, runpy: never the user's line
        return True
    return os.path.abspath(filename).startswith(_SKIP_PREFIXES)


def user_stack_frame():
    """The innermost caller frame outside onnxjob, or None."""
    frame = sys._getframe(1)
    while frame is not None and _is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_frame():
    """(filename, lineno) of the innermost caller frame outside onnxjob, or None."""
    frame = user_stack_frame()
    return None if frame is None else (frame.f_code.co_filename, frame.f_lineno)


def called_from_user(depth):
    """Whether the frame `depth` levels above the caller of this function (1: its caller's
    caller) is outside onnxjob."""
    return not _is_internal(sys._getframe(depth + 1).f_code.co_filename)


def user_location():
    """'file.py:12' of the user's innermost frame ('<unknown>' if none)."""
    where = user_frame()
    if where is None:
        return "<unknown>"
    return f"{where[0]}:{where[1]}"


def warn_at_user_line(message, category=UserWarning, location=None):
    """Warn `message` as raised at the user's innermost line (outside onnxjob), whatever
    number of onnxjob frames (API wrappers, setters) lie between: a `stacklevel` would
    count them and name onnxjob's own line when one more is added. `location`, a
    user_location() taken earlier ("file.py:12"), names that line instead."""
    if location is not None:
        filename, _, line = location.rpartition(":")
        where = (filename or location, int(line) if line.isdigit() else 0)
    else:
        where = user_frame() or ("<unknown>", 0)
    warnings.warn_explicit(message, category, *where)


def short_location():
    """Like user_location() but with the file's base name only (for node metadata)."""
    where = user_frame()
    if where is None:
        return "<unknown>"
    return f"{os.path.basename(where[0])}:{where[1]}"
