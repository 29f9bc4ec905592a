"""Every op type of onnxjob's table (onnxjob/ops/user_ops) built with flow.user_op_builder
and run: against NumPy (N) or the flow function it stands for (F), or, for random and
stateful ops, their properties. test_user_op_builder.py has the builder's own tests and
test_user_op_oneflow_test_ops.py OneFlow's test ops."""
import math

import numpy as np
import pytest
from test_user_op_builder import CASES, build, run_graph

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.ops import user_ops

R = np.random.default_rng(2)


def u(*shape, low=-2.0, high=2.0, dtype=np.float32):
    return R.uniform(low, high, shape).astype(dtype)


def ints(*shape, high=4, dtype=np.int32):
    return R.integers(0, high, shape).astype(dtype)


class N:
    """A NumPy reference: fn(arrays) with arrays {arg: first array, arg + "s": all}."""

    def __init__(self, fn):
        self.fn = fn


class F:
    """A reference made of flow functions: fn(blobs) with blobs {arg: [Blob]}."""

    def __init__(self, fn):
        self.fn = fn


def erf(x):
    return np.vectorize(math.erf)(x).astype(x.dtype)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def deconv(x, w, stride, pad, out_pad):
    """A transposed convolution of (N, C, *spatial) x with (C, O, *kernel) w, by hand."""
    spatial, kernel = x.shape[2:], w.shape[2:]
    full = np.zeros(x.shape[:1] + w.shape[1:2] + tuple(
        (n - 1) * stride + k for n, k in zip(spatial, kernel)), np.float64)
    for pos in np.ndindex(*spatial):
        window = tuple(slice(p * stride, p * stride + k) for p, k in zip(pos, kernel))
        full[(slice(None), slice(None)) + window] += np.einsum(
            "nc,co...->no...", x[(slice(None), slice(None)) + pos], w)
    full = np.pad(full, [(0, 0), (0, 0)] + [(0, out_pad)] * len(spatial))
    return full[(slice(None), slice(None)) + tuple(
        slice(pad, n - pad) for n in full.shape[2:])].astype(np.float32)


def _deconv_case(nd):
    attrs = {"filters": 3, "padding_before": [1] * nd, "data_format": "channels_first",
             "kernel_size": [3] * nd, "output_padding": [1] * nd, "strides": [2] * nd,
             "dilation_rate": [1] * nd}
    return ({"in": [u(1, 2, *[3] * nd)], "weight": [u(2, 3, *[3] * nd)]}, [("out", 1)], attrs,
            N(lambda a: [deconv(a["in"], a["weight"], 2, 1, 1)]))


X = {"x": [u(2, 3)]}
POS = {"x": [u(2, 3, low=0.5, high=2.0)]}
UNIT = {"x": [u(2, 3, low=-0.9, high=0.9)]}
XY = {"x": [u(2, 3)], "y": [u(2, 3, low=0.5)]}
BXY = {"x": [u(2, 3)], "y": [u(3, low=0.5)]}
IN = {"in": [u(2, 3)]}
OPERAND = dict(has_float_operand=True, float_operand=1.5)
UNARY_NP = {
    "abs": (X, np.abs), "acos": (UNIT, np.arccos), "acosh": ({"x": [u(4, low=1.1)]}, np.arccosh),
    "asin": (UNIT, np.arcsin), "asinh": (X, np.arcsinh), "atan": (X, np.arctan),
    "atanh": (UNIT, np.arctanh), "ceil": (X, np.ceil), "cos": (X, np.cos), "cosh": (X, np.cosh),
    "erf": (X, erf), "erfc": (X, lambda x: 1 - erf(x)), "exp": (X, np.exp),
    "expm1": (X, np.expm1), "floor": (X, np.floor),
    "lgamma": (POS, lambda x: np.vectorize(math.lgamma)(x).astype(x.dtype)),
    "log": (POS, np.log), "log1p": (POS, np.log1p),
    "log_sigmoid": (X, lambda x: np.log(sigmoid(x))), "negative": (X, np.negative),
    "reciprocal": (POS, np.reciprocal),
    "reciprocal_no_nan": ({"x": [np.array([0, 2, -4], np.float32)]},
                          lambda x: np.array([0, 0.5, -0.25], np.float32)),
    "rint": ({"x": [np.array([0.5, 1.5, -2.5, 2.4], np.float32)]}, np.rint),
    "round": ({"x": [np.array([0.5, 1.5, -2.5, 2.6], np.float32)]}, np.rint),
    "rsqrt": (POS, lambda x: 1 / np.sqrt(x)), "sigmoid_v2": (X, sigmoid), "sign": (X, np.sign),
    "sin": (X, np.sin), "sinh": (X, np.sinh), "softplus": (X, lambda x: np.log1p(np.exp(x))),
    "sqrt": (POS, np.sqrt), "square": (X, np.square), "tan": (UNIT, np.tan), "tanh": (X, np.tanh),
}

# op type: (inputs, outputs, attrs, reference)
EXAMPLES = {t: (arrays, [("y", 1)], {}, N((lambda f: lambda a: [f(a["x"])])(f)))
            for t, (arrays, f) in UNARY_NP.items()}
EXAMPLES.update({
    "pow": (POS | {"y": [u(2, 3)]}, [("z", 1)], {}, N(lambda a: [a["x"] ** a["y"]])),
    "atan2": (XY, [("z", 1)], {}, N(lambda a: [np.arctan2(a["x"], a["y"])])),
    "floordiv": (XY, [("z", 1)], {}, N(lambda a: [np.floor(a["x"] / a["y"])])),
    "xdivy": ({"x": [np.array([0, 1, 2], np.float32)], "y": [np.array([0, 4, 8], np.float32)]},
              [("z", 1)], {}, N(lambda a: [np.array([0, 0.25, 0.25], np.float32)])),
    "xlogy": (XY, [("z", 1)], {}, N(lambda a: [a["x"] * np.log(a["y"])])),
    "multiply": (XY, [("out", 1)], {}, N(lambda a: [a["x"] * a["y"]])),
    "elementwise_maximum": (XY, [("z", 1)], {}, N(lambda a: [np.maximum(a["x"], a["y"])])),
    "elementwise_minimum": (XY, [("z", 1)], {}, N(lambda a: [np.minimum(a["x"], a["y"])])),
    "add_n": ({"in": [u(3), u(3)]}, [("out", 1)], {}, N(lambda a: [sum(a["ins"])])),
    "broadcast_add": (BXY, [("z", 1)], {}, N(lambda a: [a["x"] + a["y"]])),
    "broadcast_sub": (BXY, [("z", 1)], {}, N(lambda a: [a["x"] - a["y"]])),
    "broadcast_mul": (BXY, [("z", 1)], {}, N(lambda a: [a["x"] * a["y"]])),
    "broadcast_div": (BXY, [("z", 1)], {}, N(lambda a: [a["x"] / a["y"]])),
    "broadcast_minimum": (BXY, [("z", 1)], {}, N(lambda a: [np.minimum(a["x"], a["y"])])),
    "broadcast_maximum": (BXY, [("z", 1)], {}, N(lambda a: [np.maximum(a["x"], a["y"])])),
    "broadcast_floor_mod": (BXY, [("z", 1)], {}, N(lambda a: [np.mod(a["x"], a["y"])])),
    "broadcast_fmod": (BXY, [("z", 1)], {}, N(lambda a: [np.fmod(a["x"], a["y"])])),
    "broadcast_pow": ({"x": [u(2, 3, low=0.5)], "y": [u(3)]}, [("z", 1)], {},
                      N(lambda a: [a["x"] ** a["y"]])),
    "scalar_add": (IN, [("out", 1)], OPERAND, N(lambda a: [a["in"] + 1.5])),
    "scalar_mul": (IN, [("out", 1)], OPERAND, N(lambda a: [a["in"] * 1.5])),
    "scalar_pow": ({"in": [u(4, low=0.5)]}, [("out", 1)], OPERAND, N(lambda a: [a["in"] ** 1.5])),
    "scalar_floordiv": (IN, [("out", 1)], OPERAND, N(lambda a: [np.floor(a["in"] / 1.5)])),
    "clip_by_scalar_min": (X, [("y", 1)], {"floating_min": 0.5},
                           N(lambda a: [np.maximum(a["x"], 0.5)])),
    "clip_by_scalar_max": ({"x": [ints(5, high=9)]}, [("y", 1)], {"integral_max": 3},
                           N(lambda a: [np.minimum(a["x"], 3)])),
    "reduce_prod": ({"input_tensor": [u(2, 3)]}, [("output_tensor", 1)],
                    {"axis": [1], "keepdims": False},
                    N(lambda a: [a["input_tensor"].prod(1)])),
    "reduce_min": ({"input_tensor": [u(2, 3)]}, [("output_tensor", 1)],
                   {"axis": [0], "keepdims": True},
                   N(lambda a: [a["input_tensor"].min(0, keepdims=True)])),
    "reduce_any": ({"input_tensor": [np.array([[0, 1], [0, 0]], np.int8)]},
                   [("output_tensor", 1)], {"axis": [1]},
                   N(lambda a: [np.array([1, 0], np.int8)])),
    "reduce_all": ({"input_tensor": [np.array([[1, 1], [0, 1]], np.int8)]},
                   [("output_tensor", 1)], {"axis": [1]},
                   N(lambda a: [np.array([1, 0], np.int8)])),
    "relu_grad": ({"y": [np.array([0, 1, 2], np.float32)], "dy": [u(3)]}, [("dx", 1)], {},
                  N(lambda a: [np.where(a["y"] > 0, a["dy"], 0)])),
    "sigmoid": (IN, [("out", 1)], {}, N(lambda a: [sigmoid(a["in"])])),
    "sigmoid_grad": ({"y": [u(3, low=0)], "dy": [u(3)]}, [("dx", 1)], {},
                     N(lambda a: [a["dy"] * a["y"] * (1 - a["y"])])),
    "gelu": (IN, [("out", 1)], {}, N(lambda a: [a["in"] * (1 + erf(a["in"] / np.sqrt(2))) / 2])),
    "gelu_grad": ({"x": [u(3)], "dy": [u(3)]}, [("dx", 1)], {},
                  F(lambda b: [flow.math.gelu_grad(b["x"][0], b["dy"][0])])),
    "elu": (IN, [("out", 1)], {"alpha": 0.5},
            N(lambda a: [np.where(a["in"] > 0, a["in"], 0.5 * np.expm1(a["in"]))])),
    "hardsigmoid": (IN, [("out", 1)], {}, N(lambda a: [np.clip(a["in"] + 3, 0, 6) / 6])),
    "hardswish": (IN, [("out", 1)], {}, N(lambda a: [a["in"] * np.clip(a["in"] + 3, 0, 6) / 6])),
    "mish": (IN, [("out", 1)], {}, N(lambda a: [a["in"] * np.tanh(np.log1p(np.exp(a["in"])))])),
    "silu": (IN, [("out", 1)], {}, N(lambda a: [a["in"] * sigmoid(a["in"])])),
    "softmax_grad": ({"y": [softmax(u(2, 3))], "dy": [u(2, 3)]}, [("dx", 1)], {},
                     N(lambda a: [a["y"] * (a["dy"] - (a["dy"] * a["y"]).sum(-1, keepdims=True))])),
    "tf_prelu": ({"x": [u(2, 3)], "alpha": [u(3, low=0)]}, [("y", 1)], {},
                 N(lambda a: [np.where(a["x"] > 0, a["x"], a["x"] * a["alpha"])])),
    "sort": ({"in": [u(2, 5)]}, [("out", 1)], {"direction": "ASCENDING"},
             N(lambda a: [np.sort(a["in"], -1)])),
    "in_top_k": ({"targets": [ints(3, high=4)], "predictions": [u(3, 4)]}, [("out", 1)], {"k": 2},
                 F(lambda b: [flow.math.in_top_k(b["targets"][0], b["predictions"][0], 2)])),
    "l2_normalize": ({"x": [u(2, 3)]}, [("y", 1), ("square_x_sum", 1)],
                     {"axis": 1, "epsilon": 1e-12},
                     N(lambda a: [a["x"] / np.sqrt((a["x"] ** 2).sum(1, keepdims=True)),
                                  (a["x"] ** 2).sum(1, keepdims=True)])),
    "fused_scale_tril": ({"in": [u(3, 3)]}, [("out", 1)],
                         {"diagonal": 0, "floating_scale_value": 2.0,
                          "is_floating_scale_value": True},
                         N(lambda a: [np.tril(a["in"] * 2)])),
    "unsorted_segment_sum": ({"data": [u(4, 2)], "segment_ids": [np.array([0, 2, 0, 1], np.int32)]},
                             [("out", 1)], {"axis": 0, "num_segments": 3},
                             F(lambda b: [flow.math.unsorted_segment_sum(
                                 b["data"][0], b["segment_ids"][0], 3)])),
    "unsorted_segment_sum_like": (
        {"data": [u(4, 2)], "segment_ids": [np.array([0, 2, 0, 1], np.int32)], "like": [u(3, 2)]},
        [("out", 1)], {"axis": 0},
        F(lambda b: [flow.math.unsorted_segment_sum(b["data"][0], b["segment_ids"][0], 3)])),
    "unsorted_batch_segment_sum": (
        {"data": [u(2, 4)], "segment_ids": [np.array([[0, 1, 0, 1], [2, 2, 0, 0]], np.int32)]},
        [("out", 1)], {"num_segments": 3},
        F(lambda b: [flow.math.unsorted_batch_segment_sum(b["data"][0], b["segment_ids"][0], 3)])),
    "reshape_like": ({"in": [u(2, 3)], "like": [u(3, 2)]}, [("out", 1)], {},
                     N(lambda a: [a["in"].reshape(3, 2)])),
    "flatten": ({"in": [u(2, 3, 4)]}, [("out", 1)], {"start_dim": 1},
                N(lambda a: [a["in"].reshape(2, 12)])),
    "squeeze": ({"in": [u(2, 1, 3, 1)]}, [("out", 1)], {"axes": [1, 3]},
                N(lambda a: [a["in"].reshape(2, 3)])),
    "expand_dims": (IN, [("out", 1)], {"axis": -1}, N(lambda a: [a["in"][..., None]])),
    "broadcast_like": ({"x": [u(3)], "like": [u(2, 3)]}, [("y", 1)], {"broadcast_axes": [0]},
                       N(lambda a: [np.broadcast_to(a["x"], (2, 3))])),
    "flip": (X, [("y", 1)], {"dims": [1]}, N(lambda a: [a["x"][:, ::-1]])),
    "cast_to_static_shape": ({"input": [u(3)]}, [("output", 1)], {}, N(lambda a: [a["input"]])),
    "narrow": ({"in": [u(3, 5)]}, [("out", 1)], {"dim": 1, "start": 1, "length": 3},
               N(lambda a: [a["in"][:, 1:4]])),
    "logical_slice": ({"x": [u(4, 5)]}, [("y", 1)], {"start": [0, 1], "stop": [4, 5],
                                                    "step": [1, 3]},
                      N(lambda a: [a["x"][:, 1:5:3]])),
    "slice_update": ({"x": [u(4)], "update": [u(2)]}, [("y", 1)],
                     {"start": [1], "stop": [4], "step": [2]},
                     N(lambda a: [np.array([a["x"][0], a["update"][0], a["x"][2],
                                            a["update"][1]])])),
    "batch_gather": ({"in": [u(2, 4, 3)], "indices": [ints(2, 2)]}, [("out", 1)], {},
                     N(lambda a: [np.stack([a["in"][i][a["indices"][i]] for i in range(2)])])),
    "gather_nd": ({"params": [u(3, 4)], "indices": [ints(2, 2, high=3)]}, [("out", 1)], {},
                  N(lambda a: [a["params"][a["indices"][:, 0], a["indices"][:, 1]]])),
    "dim_gather": ({"input": [u(3, 4)], "index": [ints(3, 2)]}, [("output", 1)], {"dim": 1},
                   N(lambda a: [np.take_along_axis(a["input"], a["index"], 1)])),
    "scatter_nd": ({"indices": [np.array([[1], [3]], np.int32)], "updates": [u(2)]}, [("out", 1)],
                   {"shape": (5,)}, N(lambda a: [np.array([0, a["updates"][0], 0,
                                                           a["updates"][1], 0], np.float32)])),
    "scatter_nd_like": ({"like": [u(5)], "indices": [np.array([[4]], np.int32)],
                         "updates": [u(1)]}, [("out", 1)], {},
                        N(lambda a: [np.array([0, 0, 0, 0, a["updates"][0]], np.float32)])),
    "tensor_scatter_nd_update": ({"params": [u(4)], "updates": [u(1)],
                                  "indices": [np.array([[2]], np.int32)]}, [("out", 1)], {},
                                 N(lambda a: [np.concatenate([a["params"][:2], a["updates"],
                                                              a["params"][3:]])])),
    "tensor_scatter_nd_add": ({"params": [u(4)], "updates": [u(1)],
                               "indices": [np.array([[0]], np.int32)]}, [("out", 1)], {},
                              N(lambda a: [a["params"] + np.array([a["updates"][0], 0, 0, 0])])),
    "argwhere": ({"input": [np.array([[0, 3], [2, 0]], np.int32)]},
                 [("output", 1), ("output_size", 1)], {"dtype": flow.int64},
                 N(lambda a: [np.array([[0, 1], [1, 0], [0, 0], [0, 0]]), np.array([2])])),
    "unique_with_counts": ({"x": [np.array([3, 1, 3, 2], np.int32)]},
                           [("y", 1), ("idx", 1), ("count", 1), ("num_unique", 1)], {},
                           N(lambda a: [np.array([3, 1, 2, 0]), np.array([0, 1, 0, 2]),
                                        np.array([2, 1, 1, 0]), np.array([3])])),
    "amp_white_identity": (IN, [("out", 1)], {}, N(lambda a: [a["in"]])),
    "identity": (IN, [("out", 1)], {}, N(lambda a: [a["in"]])),
    "tuple_identity": ({"in": [u(2), u(3)]}, [("out", 2)], {}, N(lambda a: a["ins"])),
    "parallel_cast": (IN, [("out", 1)], {"sbp_parallel": "S(0)"}, N(lambda a: [a["in"]])),
    "hierarchical_parallel_cast": (IN, [("out", 1)], {"nd_sbp": ["B"]}, N(lambda a: [a["in"]])),
    "nvtx_start": (IN, [("out", 1)], {"mark_prefix": "m"}, N(lambda a: [a["in"]])),
    "nvtx_end": (IN, [("out", 1)], {"mark_prefix": "m"}, N(lambda a: [a["in"]])),
    "cast_like": ({"in": [u(3)], "dtype_like": [ints(2)]}, [("out", 1)], {},
                  N(lambda a: [a["in"].astype(np.int32)])),
    "where_scalar_x": ({"condition": [np.array([1, 0], np.int8)], "y": [u(2)]}, [("out", 1)],
                       OPERAND, N(lambda a: [np.array([1.5, a["y"][1]], np.float32)])),
    "where_scalar_y": ({"condition": [np.array([1, 0], np.int8)], "x": [u(2)]}, [("out", 1)],
                       OPERAND, N(lambda a: [np.array([a["x"][0], 1.5], np.float32)])),
    "constant": ({}, [("out", 1)], {"integer_value": 7, "dtype": flow.int64, "shape": (2,)},
                 N(lambda a: [np.array([7, 7])])),
    "empty": ({}, [("out", 1)], {"dtype": flow.int8, "shape": (2, 1)},
              N(lambda a: [np.zeros((2, 1), np.int8)])),
    "zero_like": ({"like": [u(2, 3)]}, [("out", 1)], {}, N(lambda a: [np.zeros_like(a["like"])])),
    "ones_like": ({"like": [u(2, 3)]}, [("out", 1)], {}, N(lambda a: [np.ones_like(a["like"])])),
    "range": ({}, [("out", 1)], {"float_start": 0.5, "float_limit": 2.0, "float_delta": 0.5,
                                 "dtype": flow.float},
              N(lambda a: [np.arange(0.5, 2.0, 0.5, np.float32)])),
    "diag": ({"in": [u(3)]}, [("out", 1)], {"diagonal": 1},
             N(lambda a: [np.diag(a["in"], 1)])),
    "constant_pad2d": ({"x": [u(1, 1, 2, 2)]}, [("y", 1)],
                       {"padding": [1, 0, 0, 2], "floating_value": 9.0},
                       N(lambda a: [np.pad(a["x"], [(0, 0), (0, 0), (0, 2), (1, 0)],
                                           constant_values=9)])),
    "reflection_pad2d": ({"x": [u(1, 1, 3, 3)]}, [("y", 1)], {"padding": [1, 1, 2, 0]},
                         N(lambda a: [np.pad(a["x"], [(0, 0), (0, 0), (2, 0), (1, 1)],
                                             mode="reflect")])),
    "replication_pad2d": ({"x": [u(1, 1, 2, 2)]}, [("y", 1)], {"padding": [1, 1, 1, 1]},
                          N(lambda a: [np.pad(a["x"], [(0, 0), (0, 0), (1, 1), (1, 1)],
                                              mode="edge")])),
    "same_padding": ({"x": [u(1, 1, 4, 4)]}, [("y", 1)],
                     {"padding": "same_upper", "data_format": "channels_first",
                      "kernel_size": [3, 3], "strides": [2, 2], "dilation_rate": [1, 1]},
                     N(lambda a: [np.pad(a["x"], [(0, 0), (0, 0), (0, 1), (0, 1)])])),
    "upsample": ({"x": [u(1, 2, 2, 2)]}, [("y", 1)],
                 {"height_scale": 2.0, "width_scale": 2.0, "data_format": "channels_first",
                  "interpolation": "nearest"},
                 N(lambda a: [a["x"].repeat(2, 2).repeat(2, 3)])),
    "upsample_nearest_2d": ({"x": [u(1, 2, 2, 2)]}, [("y", 1)],
                            {"height_scale": 2.0, "width_scale": 1.0,
                             "data_format": "channels_last"},
                            N(lambda a: [a["x"].repeat(2, 1)])),
    "upsample_bilinear_2d": ({"x": [u(1, 2, 3, 3)]}, [("y", 1)],
                             {"height_scale": 2.0, "width_scale": 2.0, "align_corners": True,
                              "data_format": "channels_first"},
                             F(lambda b: [flow.layers.upsample_2d(
                                 b["x"][0], 2, align_corners=True, interpolation="bilinear")])),
    "batch_matmul": ({"a": [u(2, 3, 4)], "b": [u(2, 3, 5)]}, [("out", 1)],
                     {"transpose_a": True}, N(lambda a: [a["a"].transpose(0, 2, 1) @ a["b"]])),
    "fused_bias_add_gelu": ({"a": [u(2, 3)], "b": [u(3)]}, [("out", 1)], {"axis": 1},
                            F(lambda b: [flow.nn.fused_bias_add_gelu(b["a"][0], b["b"][0])])),
    "fused_bias_add_mask_scale": ({"a": [u(2, 3)], "b": [u(3)], "mask": [ints(2, 3, high=2,
                                                                              dtype=np.int8)]},
                                  [("out", 1)], {"axis": 1, "scale": 2.0},
                                  N(lambda a: [(a["a"] + a["b"]) * a["mask"] * 2])),
    "dropout": ({"in": [u(2, 3)], "mask": [ints(2, 3, high=2, dtype=np.int8)],
                 "_add_to_output": [u(2, 3)]}, [("out", 1)], {"scale": 2.0},
                N(lambda a: [a["in"] * a["mask"] * 2 + a["_add_to_output"]])),
    "conv1d": ({"in": [u(1, 2, 6)], "weight": [u(3, 2, 3)], "bias": [u(3)]}, [("out", 1)],
               {"filters": 3, "padding_before": [1], "data_format": "channels_first",
                "kernel_size": [3], "strides": [1], "dilation_rate": [2]},
               F(lambda b: [flow.nn.bias_add(flow.nn.conv1d(
                   b["in"][0], b["weight"][0], 1, [[0, 0], [0, 0], [1, 1]], dilations=2),
                   b["bias"][0], "NCW")])),
    "conv3d": ({"in": [u(1, 2, 4, 4, 4)], "weight": [u(4, 2, 2, 2, 2)]}, [("out", 1)],
               {"filters": 4, "padding_before": [0, 0, 0], "data_format": "channels_first",
                "kernel_size": [2, 2, 2], "strides": [2, 2, 2], "dilation_rate": [1, 1, 1],
                "groups": 1},
               F(lambda b: [flow.nn.conv3d(b["in"][0], b["weight"][0], 2, "VALID")])),
    "deconv1d": _deconv_case(1), "deconv2d": _deconv_case(2), "deconv3d": _deconv_case(3),
    "ctc_greedy_decoder": ({"log_probs": [np.log(softmax(u(5, 2, 4)))],
                            "input_lengths": [np.array([5, 3], np.int64)]},
                           [("decoded", 1), ("neg_sum_logits", 1)], {"merge_repeated": True},
                           F(lambda b: list(flow.nn.ctc_greedy_decoder(
                               b["log_probs"][0], b["input_lengths"][0])))),
    "indexed_slices_reduce_sum": ({"x_indices": [np.array([2, 0, 2], np.int32)],
                                   "x_values": [u(3, 2)]},
                                  [("y_indices", 1), ("y_values", 1), ("num_unique", 1)], {},
                                  F(lambda b: list(flow.experimental.indexed_slices_reduce_sum(
                                      b["x_indices"][0], b["x_values"][0])))),
    # ("valid" keeps its size whatever ceil_mode says: OneFlow's GetWindowedOutputSize
    # counts ceil_mode with "customized" pads only)
    "max_pool_1d": ({"x": [u(1, 2, 8)]}, [("y", 1)],
                    {"padding": "valid", "data_format": "channels_first", "pool_size": [3],
                     "strides": [2], "ceil_mode": True},
                    N(lambda a: [np.stack([a["x"][..., i:i + 3].max(-1) for i in (0, 2, 4)],
                                          -1)])),
    "avg_pool_1d": ({"x": [u(1, 2, 6)]}, [("y", 1)],
                    {"padding": "valid", "data_format": "channels_first", "pool_size": [2],
                     "strides": [2]}, N(lambda a: [a["x"].reshape(1, 2, 3, 2).mean(-1)])),
    "max_pool_3d": ({"x": [u(1, 1, 4, 4, 4)]}, [("y", 1)],
                    {"padding": "valid", "data_format": "channels_first",
                     "pool_size": [2, 2, 2], "strides": [2, 2, 2]},
                    N(lambda a: [a["x"].reshape(1, 1, 2, 2, 2, 2, 2, 2).max((3, 5, 7))])),
    "avg_pool_3d": ({"x": [u(1, 2, 2, 2, 1)]}, [("y", 1)],
                    {"padding": "same_lower", "data_format": "channels_last",
                     "pool_size": [2, 2, 2], "strides": [2, 2, 2]},
                    N(lambda a: [a["x"].mean((1, 2, 3), keepdims=True)])),
    "layer_norm_grad": ({"dy": [u(2, 3)], "x": [u(2, 3)], "mean": [u(2)],
                         "inv_variance": [u(2, low=0.5)]}, [("dx", 1)], {"begin_norm_axis": 1},
                        F(lambda b: [flow.layers.layer_norm_grad(
                            b["dy"][0], b["x"][0], b["mean"][0], b["inv_variance"][0], 1)])),
    "layer_norm_param_grad": ({"dy": [u(2, 3)], "normalized": [u(2, 3)], "gamma": [u(3)]},
                              [("normalized_diff", 1), ("beta_diff", 1), ("gamma_diff", 1)],
                              {"begin_params_axis": 1},
                              N(lambda a: [a["dy"] * a["gamma"], a["dy"].sum(0),
                                           (a["dy"] * a["normalized"]).sum(0)])),
    "sparse_softmax_cross_entropy": (
        {"prediction": [u(3, 4)], "label": [ints(3)]}, [("prob", 1), ("out", 1)], {"depth": 4},
        N(lambda a: [softmax(a["prediction"]),
                     -np.log(softmax(a["prediction"])[np.arange(3), a["label"]])])),
    "softmax_cross_entropy": (
        {"prediction": [u(3, 4)], "label": [softmax(u(3, 4))]}, [("prob", 1), ("out", 1)], {},
        N(lambda a: [softmax(a["prediction"]),
                     -(a["label"] * np.log(softmax(a["prediction"]))).sum(-1)])),
    "sparse_cross_entropy": (
        {"prediction": [softmax(u(3, 4))], "label": [ints(3)]}, [("out", 1)], {"depth": 4},
        N(lambda a: [-np.log(a["prediction"][np.arange(3), a["label"]])])),
    "sigmoid_cross_entropy": (
        {"prediction": [u(5)], "label": [ints(5, high=2).astype(np.float32)]}, [("loss", 1)], {},
        N(lambda a: [-(a["label"] * np.log(sigmoid(a["prediction"])) +
                       (1 - a["label"]) * np.log(1 - sigmoid(a["prediction"])))])),
    "smooth_l1_loss": ({"prediction": [u(5)], "label": [u(5)]}, [("loss", 1)], {"beta": 1.0},
                       F(lambda b: [flow.smooth_l1_loss(b["prediction"][0], b["label"][0])])),
    "fused_self_attention_query_mul_key_and_value": (
        {"hidden_states": [u(3, 2, 12)]}, [("query_mul_key", 1), ("value", 1)],
        {"head_size": 2, "alpha": 0.5},
        F(lambda b: list(flow.nn.fused_self_attention_query_mul_key_and_value(
            b["hidden_states"][0], 2, 0.5)))),
    "fused_tril_scale_softmax_mask_scale": (
        {"x": [u(2, 3, 3)], "mask": [ints(2, 3, 3, high=2, dtype=np.int8)]},
        [("y", 1), ("softmax_y", 1)], {"diagonal": 0, "tril_scale_value": 2.0,
                                       "mask_scale_value": 3.0},
        N(lambda a: [softmax(np.where(np.tril(np.ones((3, 3))) > 0, a["x"] * 2, 0)) *
                     a["mask"] * 3,
                     softmax(np.where(np.tril(np.ones((3, 3))) > 0, a["x"] * 2, 0))])),
    "fake_quantization": ({"in": [u(2, 3)], "scale": [np.array([0.05], np.float32)],
                           "zero_point": [np.zeros(1, np.float32)]}, [("out", 1)], {},
                          F(lambda b: [flow.quantization.fake_quantization(
                              b["in"][0], b["scale"][0], b["zero_point"][0])])),
    "min_max_observer": ({"in": [u(2, 3)]}, [("scale", 1), ("zero_point", 1)], {},
                         F(lambda b: list(flow.quantization.min_max_observer(b["in"][0])))),
    "square_sum": (X, [("y", 1)], {}, N(lambda a: [np.array([(a["x"] ** 2).sum()])])),
    "count_not_finite": ({"x": [np.array([1, np.inf, np.nan], np.float32)]}, [("y", 1)], {},
                         N(lambda a: [np.array([2])])),
    "multi_count_not_finite": ({"x": [np.array([np.inf], np.float32), u(3)]}, [("y", 1)], {},
                               N(lambda a: [np.array([1])])),
    "l1_l2_regularize_gradient": ({"model": [u(4)], "model_diff": [u(4)]}, [("out", 1)],
                                  {"l1": 0.5, "l2": 0.25},
                                  N(lambda a: [a["model_diff"] + 0.5 * np.sign(a["model"]) +
                                               0.25 * a["model"]])),
})
_COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "greater_equal": np.greater_equal,
            "less": np.less, "less_equal": np.less_equal}
_LOGICAL = {"logical_and": np.logical_and, "logical_xor": np.logical_xor}
_INT_XY = {"x": [ints(2, 3, high=3)], "y": [ints(3, high=3)]}
EXAMPLES.update({f"broadcast_{k}": (_INT_XY, [("z", 1)], {}, N(
    (lambda f: lambda a: [f(a["x"], a["y"]).astype(np.int8)])(f)))
    for k, f in (_COMPARE | _LOGICAL).items()})
_BY_TENSOR = {"add": np.add, "sub": np.subtract, "div": np.divide}
EXAMPLES.update({f"scalar_{k}_by_tensor": ({"x": [u(2, 3)], "scalar": [u(1, low=0.5)]},
                                           [("y", 1)], {}, N(
    (lambda f: lambda a: [f(a["x"], a["scalar"])])(f))) for k, f in _BY_TENSOR.items()})

# ops whose values are random or that act on variables: tested one by one below
BY_HAND = {"random_mask_like", "generate_random_batch_permutation_indices", "bernoulli",
           "repeat", "acc", "pack", "unpack", "assign", "assign_if", "assign_if_not",
           "logical_slice_assign", "normalization"}
# test_user_op_builder.py's CASES and tests, test_user_op_oneflow_test_ops.py
OTHER_FILES = {c[0] for c in CASES} | set(user_ops.op_type_names("oneflow_tests")) | {
    "broadcast_fmod", "broadcast_logical_or", "split_like", "reduce_sum_like",
    "fused_cast_scale", "layer_norm", "relu", "dynamic_loss_scale_schedule"}


def test_every_op_type_is_tested_somewhere():
    missing = set(user_ops.op_type_names()) - set(EXAMPLES) - BY_HAND - OTHER_FILES
    assert not missing, sorted(missing)


@pytest.mark.parametrize("type_name", sorted(EXAMPLES))
def test_op_type(type_name):
    arrays, outputs, attrs, reference = EXAMPLES[type_name]
    got = run_graph(lambda b: build(type_name, b, outputs, **attrs), arrays)
    if isinstance(reference, F):
        want = run_graph(reference.fn, arrays)
    else:
        first = {k: v[0] for k, v in arrays.items()}
        want = reference.fn(first | {k + "s": v for k, v in arrays.items()})
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-5,
                                   atol=2e-6)


def test_random_ops():
    like = u(200)
    mask, perm, coins = run_graph(lambda b: [
        build("random_mask_like", {"like": b["x"]}, [("out", 1)], rate=0.25, seed=3)[0],
        build("generate_random_batch_permutation_indices", {"x": b["x"]}, [("y", 1)],
              seed=4)[0],
        build("bernoulli", {"in": [flow.constant(0.5, shape=(200,))]}, [("out", 1)],
              dtype=flow.int32)[0]], {"x": [like]})
    assert mask.dtype == np.int8 and set(np.unique(mask)) == {0, 1}
    assert 100 < mask.sum() < 190
    np.testing.assert_array_equal(np.sort(perm), np.arange(200))
    assert coins.dtype == np.int32 and set(np.unique(coins)) == {0, 1}


def test_time_shape_ops():
    x = u(4, 3)
    acc, packed = run_graph(lambda b: [
        build("acc", {"in": build("repeat", {"in": b["x"]}, [("out", 1)], repeat_num=3)},
              [("out", 1)], max_acc_num=3)[0],
        build("pack", {"in": build("unpack", {"in": b["x"]}, [("out", 1)], unpack_num=2)},
              [("out", 1)], pack_num=2)[0]], {"x": [x]})
    np.testing.assert_allclose(acc, 3 * x, rtol=1e-6)
    np.testing.assert_array_equal(packed, x)


def test_variable_ops():
    @flow.global_function()
    def update(v: tp.Numpy.Placeholder((4,)), c: tp.Numpy.Placeholder((1,), dtype=flow.int8)
               ) -> tp.Numpy:
        a, b_, s = (flow.get_variable(n, (4,), initializer=flow.zeros_initializer())
                    for n in ("a", "b", "s"))
        build("assign", {"ref": [a], "value": [v]}, [])
        build("assign_if", {"ref": [b_], "value": [v], "condition": [c]}, [])
        build("logical_slice_assign", {"ref": [s], "value": [flow.slice_v2(v, [(0, 2, 1)])]},
              [], start=[2], stop=[4], step=[1])
        return v

    @flow.global_function()
    def fetch() -> tp.Numpy:
        return flow.concat([flow.get_variable(n, (4,), initializer=flow.zeros_initializer())
                            for n in ("a", "b", "s")], axis=0)

    v = np.arange(1, 5, dtype=np.float32)
    update(v, np.zeros(1, np.int8))
    np.testing.assert_array_equal(fetch(), np.concatenate([v, np.zeros(4), [0, 0, 1, 2]]))
    update(v, np.ones(1, np.int8))
    np.testing.assert_array_equal(fetch()[4:8], v)


def test_normalization_in_training_updates_its_moving_statistics():
    x = u(8, 3, 2)

    @flow.global_function()
    def train(x: tp.Numpy.Placeholder((8, 3, 2))) -> tp.Numpy:
        mean, var = (flow.get_variable(n, (3,), initializer=init)
                     for n, init in (("mm", flow.zeros_initializer()),
                                     ("mv", flow.ones_initializer())))
        gamma = flow.constant(2.0, shape=(3,))
        beta = flow.constant(0.5, shape=(3,))
        y, m, inv = build("normalization", {"x": [x], "moving_mean": [mean],
                                            "moving_variance": [var], "gamma": [gamma],
                                            "beta": [beta]},
                          [("y", 1), ("mean", 1), ("inv_variance", 1)], axis=1, epsilon=1e-5,
                          training=True, momentum=0.9)
        y2 = build("normalization", {"x": [x], "moving_mean": [mean], "moving_variance": [var],
                                     "gamma": [gamma], "beta": [beta]}, [("y", 1)], axis=1,
                   epsilon=1e-5, training=False)[0]
        return flow.concat([flow.reshape(y, (-1,)), m, inv, flow.reshape(y2, (-1,))], axis=0)

    out = train(x)
    mu, var = x.mean((0, 2)), x.var((0, 2))
    y = (x - mu[:, None]) / np.sqrt(var[:, None] + 1e-5) * 2 + 0.5
    np.testing.assert_allclose(out[:48], y.reshape(-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[48:51], mu, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[51:54], 1 / np.sqrt(var + 1e-5), rtol=1e-4)
    # the inference op used the moving statistics before this run's update (0 and 1)
    np.testing.assert_allclose(out[54:], (x / np.sqrt(1 + 1e-5) * 2 + 0.5).reshape(-1),
                               rtol=1e-5)
    out = train(x)   # now with moving = 0.9 * old + 0.1 * batch (the variance unbiased)
    moving_var = 0.9 + 0.1 * var * 16 / 15
    want = (x - 0.1 * mu[:, None]) / np.sqrt(moving_var[:, None] + 1e-5) * 2 + 0.5
    np.testing.assert_allclose(out[54:], want.reshape(-1), rtol=1e-4, atol=1e-5)
