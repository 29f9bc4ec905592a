"""OneFlow's registered op types, as `flow.user_op_builder(name).Op(type)` builds them.

OneFlow's Python ops are written as op builders naming a C++ op type; onnxjob has no
OneFlow kernels, so each op type it knows is built from its own ops (spec.py describes
an entry). The table, by family module:

    math_ops.py          elementwise math, broadcast_*, scalar_*, activations, reductions,
                         sort / top_k, tril, segment sums
    array_ops.py         reshape, transpose, concat, split_like, slice, gather, scatter,
                         constant, range, pad, cast, where, identity, assign, random masks
    nn_ops.py            matmuls, bias_add, conv, pools, normalization, layer_norm,
                         losses, dropout, fused attention, quantization
    training_ops.py      reduce_sum_like, multi_square_sum, count_not_finite,
                         dynamic_loss_scale_schedule, fused_cast_scale
    oneflow_test_ops.py  the ops OneFlow's library registers for its own tests (ccrelu,
                         TestSource, TestMultiInput, ...)

`op_type_names()` lists them.
"""
from onnxjob.ops.user_ops import (array_ops, math_ops, nn_ops, oneflow_test_ops,  # noqa: F401
                                  training_ops)
from onnxjob.ops.user_ops.spec import (FLOW_ONLY, Args, OpType, lookup,  # noqa: F401
                                       near_matches, op_type_names, sections)
