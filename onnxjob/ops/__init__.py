"""The user-facing ops, one module per OneFlow namespace or op family.

    math.py          flow.math            (elementwise math, reductions, top_k, ...)
    nn.py            flow.nn              (gathers activations, conv, normalization, losses)
      activations.py, conv.py, normalization.py, losses.py
    layers.py        flow.layers          (layers that own variables)
    the top-level flow.<name> ops, one module per family (each module's __all__,
    imported by name in onnxjob/__init__.py):
      shapes.py        reshape, flatten, squeeze, expand_dims, transpose, expand, elem_cnt, ...
      slicing.py       concat, stack, split, slice, slice_v2, reverse, slice_update, ...
      indexing.py      gather, gather_nd, dim_gather, scatter_nd, tensor_scatter_nd_*, one_hot
      selection.py     where, masked_fill, argwhere, nonzero (unique_with_counts)
      creation.py      constant, zeros, ones, *_like, range
      casts.py         cast, identity, identity_n, parallel_cast, ...
      linalg.py        matmul (also flow.linalg.matmul), diag
      padding.py       pad, pad_grad, *_pad2d, same_padding
      _array_common.py the axis and dtype helpers they share
    random.py        flow.random
    data.py          flow.data
    user_ops/        OneFlow's op types by registered name, for flow.user_op_builder

How an op is added:
1. The user function lives here, with OneFlow 0.5's name, signature, defaults and
   semantics (python/oneflow/compatible/single_client/ops/*.py in OneFlow's repository);
   where OneFlow <= 0.4 spelled it differently and the two can be told apart by type,
   both are accepted (see conv.conv2d). It goes in the module of its family; a new
   family gets a module of its own (and its rules their own primitives/<family>.py).
   A top-level flow.<name> goes in its module's __all__ and is imported by name in
   onnxjob/__init__.py.
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
