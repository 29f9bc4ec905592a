"""The user-facing ops, one module per OneFlow namespace or op family.

    math.py          flow.math            (elementwise math, reductions, top_k, ...)
    nn.py            flow.nn              (gathers activations, conv, normalization, losses)
      activations.py, conv.py, normalization.py, losses.py
    layers.py        flow.layers          (layers that own variables)
    array.py         flow.<name>          (reshape, concat, gather, pad, ...; its __all__)
    random.py        flow.random
    data.py          flow.data
    user_ops/        OneFlow's op types by registered name, for flow.user_op_builder

How an op is added:
1. The user function lives here, with OneFlow 0.5's name, signature, defaults and
   semantics (python/oneflow/compatible/single_client/ops/*.py in OneFlow's repository);
   where OneFlow <= 0.4 spelled it differently and the two can be told apart by type,
   both are accepted (see conv.conv2d).
2. It emits ONNX ops through `onnxjob.graph.tracer.op(op_type, *inputs, **attrs)`; each
   op type needs an entry in the primitive table (onnxjob/graph/primitives/<family>.py):
   a shape rule and, if differentiable, a gradient rule made of standard ONNX ops.
   An op whose OneFlow gradient differs from the autodiff of its parts is a composite
   (registry.register_composite); an ONNX op that onnxruntime cannot run for some
   input dtypes gets a `lower=` hook (another formulation) or refuses them with a
   TraceError that names the user's line.
3. Tests: forward values against NumPy or PyTorch, every gradient in a CASES table
   (tests/gradcheck.py: finite differences and PyTorch), and the dtypes OneFlow allows.
4. Unknown names of a namespace raise UnsupportedAPIError (errors.missing_api).
"""
