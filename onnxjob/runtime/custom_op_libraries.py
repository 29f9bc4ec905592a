"""The custom-op libraries every onnxruntime session of this process registers: those of
the ops a program defined (onnxruntime-extensions' for Python kernels,
ops/python_kernels.py). None by default, so a session is plain onnxruntime's."""

_paths = []


def add(path):
    """Register the library at `path` in the sessions made from now on."""
    if path not in _paths:
        _paths.append(path)


def register_in(options):
    """Register the libraries in onnxruntime SessionOptions `options`."""
    for path in _paths:
        options.register_custom_ops_library(path)
