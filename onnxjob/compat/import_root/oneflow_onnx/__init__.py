"""`import oneflow_onnx` (OneFlow's standalone ONNX converter) in a child process of a
script run by `python -m onnxjob run`: as import_root/oneflow/__init__.py does for
`oneflow`."""
import oneflow  # noqa: F401  (the stand-in beside this one: onnxjob found, hook installed)
from onnxjob.compat.oneflow_alias import replace_with_alias

replace_with_alias(__name__)
