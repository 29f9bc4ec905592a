"""`import oneflow` in a child process of a script run by `python -m onnxjob run`.

multiprocessing's spawn and forkserver workers (and the libraries built on them: data
loaders, process pools) start a fresh interpreter with the parent's sys.path, and Python
programs the script runs as subprocesses inherit PYTHONPATH; the runner put this folder on
both (onnxjob/compat/oneflow_alias.py: alias_in_child_processes), but a child has no
import hook. This module installs the hook and hands out the alias in its own place, so
the child's `import oneflow...` resolves as the parent's did.
"""
import importlib.util
import os
import sys

if importlib.util.find_spec("onnxjob") is None:
    # a child started elsewhere than a checkout the parent imported onnxjob from
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))

from onnxjob.compat.oneflow_alias import replace_with_alias  # noqa: E402

replace_with_alias(__name__)
