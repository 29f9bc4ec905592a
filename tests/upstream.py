"""OneFlow-Benchmark's programs (../shared/clients/oneflow-benchmark beside the repository),
imported unchanged through onnxjob's `oneflow` alias. Tests that need them skip with the
reason when the shared folder is absent."""
import os

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "clients",
                                    "oneflow-benchmark"))


def upstream_dir(*parts):
    """The upstream directory ROOT/parts (skipping the calling test when it is absent)."""
    directory = os.path.join(ROOT, *parts)
    if not os.path.isdir(directory):
        pytest.skip(f"OneFlow-Benchmark's files are not at {directory} (the shared folder must "
                    "sit beside the repository)")
    return directory


def import_upstream(module, *parts):
    """Upstream module `module` from ROOT/parts, with `import oneflow` resolving to onnxjob."""
    from onnxjob.compat import import_oneflow_module
    return import_oneflow_module(upstream_dir(*parts), module)
