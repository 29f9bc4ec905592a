"""The custom-op libraries every onnxruntime session of this process registers: those of
the ops a program defined (onnxruntime-extensions' for Python kernels,
ops/python_kernels.py). None by default, so a session is plain onnxruntime's."""

_paths = []
# Every SessionOptions that registered a library, kept for the process's life: the custom
# op definitions a registration makes belong to that SessionOptions, and a session's
# kernels call them until the session goes. A session freed in a garbage collection after
# its options (Python frees a cycle's objects in no set order) crashed the process.
_registered_options = []


def add(path):
    """Register the library at `path` in the sessions made from now on."""
    if path not in _paths:
        _paths.append(path)


def register_in(options):
    """Register the libraries in onnxruntime SessionOptions `options` (kept alive)."""
    if _paths:
        for path in _paths:
            options.register_custom_ops_library(path)
        _registered_options.append(options)
