"""`import oneflow` in a worker process of a script run by `python -m onnxjob run`.

multiprocessing's spawn and forkserver workers (and the libraries built on them: data
loaders, process pools) start a fresh interpreter with the parent's sys.path, where the
runner put this folder, but without the parent's import hook. This module installs the
hook (onnxjob/compat/oneflow_alias.py) and hands out the alias in its own place, so the
worker's `import oneflow...` resolves as the parent's did.
"""
from onnxjob.compat.oneflow_alias import replace_with_alias

replace_with_alias(__name__)
