"""Tracing job bodies into ONNX graphs.

`tracer` (Blob, GraphBuilder, `op`), `registry` + `primitives/` (each ONNX op's shape
rule beside its gradient rule), `autodiff` (the reverse-mode pass) and `compiler`
(trace -> backward -> updates -> passes -> onnx_ir model). Nothing here knows about
sessions or onnxruntime.
"""
from onnxjob.graph import primitives  # noqa: F401  (fills the primitive table)
