"""The primitive table: for each ONNX op onnxjob emits, its shape rule and gradient rule.

A primitive is registered once, in the module of its family, with

* `infer(inputs, attrs, num_outputs) -> [(shape, np_dtype), ...]` — run when the node is
  traced; raising ValueError/AssertionError there becomes a TraceError naming the user's
  line;
* `grad(node, gys, needs) -> [gx or None per input]` — emits standard ONNX ops only;
  `gys` has one cotangent (or None) per output, `needs[i]` says whether input i needs a
  gradient. The autodiff engine sums fan-in and reduces broadcast axes, so rules stay
  small. `grad=None` means "not differentiable" (integer/boolean results, indices).
"""
from onnxjob.graph.registry import get_primitive, register, registered_ops  # noqa: F401
from onnxjob.graph.primitives import (  # noqa: F401  (registration)
    batch_norm, collectives, conv, conv_weight_grad, elementwise, legacy, linalg, losses,
    normalization, pooling, random, reductions, resize, shape_ops, windows)
