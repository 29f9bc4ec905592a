"""`import oneflow_api` (OneFlow 0.4's extension module) in a worker process of a script
run by `python -m onnxjob run`: as import_root/oneflow/__init__.py does for `oneflow`."""
from onnxjob.compat.oneflow_alias import replace_with_alias

replace_with_alias(__name__)
