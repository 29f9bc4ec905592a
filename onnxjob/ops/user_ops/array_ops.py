"""Op types of OneFlow's shape, indexing, constant, padding, casting and identity ops
(reshape_op.cpp, transpose_ops.cpp, concat_op.cpp, split_like_op.cpp, slice_op.cpp,
gather_op.cpp, nd_index_slice_ops.cpp, constant_op.cpp, pad_op.cpp, padding_ops.cpp,
cast_op.cpp, where_op.cpp, ...), built from the top-level flow ops."""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.frontend.variables import assign
from onnxjob.ops.casts import cast, cast_to_static_shape, identity, identity_n
from onnxjob.ops import creation
from onnxjob.ops.creation import constant, ones_like, zeros, zeros_like
from onnxjob.ops.indexing import dim_gather, gather, gather_nd, one_hot, scatter_nd, tensor_scatter_nd_add, tensor_scatter_nd_update
from onnxjob.ops.linalg import diag
from onnxjob.ops.padding import constant_pad2d, pad, reflection_pad2d, replication_pad2d, same_padding
from onnxjob.ops.selection import argwhere_with_size, unique_with_counts, where
from onnxjob.ops.shapes import broadcast_like, expand, expand_dims, flatten, reshape, reshape_like, squeeze, transpose
from onnxjob.ops.slicing import concat, reverse, slice_update, slice_v2, split
from onnxjob.ops import conv, legacy, random
from onnxjob.ops.experimental import logical_slice_assign
from onnxjob.ops.parallel import hierarchical_parallel_cast
from onnxjob.ops.user_ops.spec import registrar

reg = registrar("array")


def _where(type_name):
    return f"flow.user_op_builder: op type {type_name!r}"


def _first_format(data_format):
    """OneFlow's "channels_first" / "channels_last" as the "NC..." / "N...C" strings of
    onnxjob's functions."""
    return "NCHW" if data_format == "channels_first" else "NHWC"


def _is_float(dtype):
    return dtypes.is_floating(dtypes.to_numpy(dtype))


# -- shapes -----------------------------------------------------------------------------------
reg("reshape", "in -> out | shape: shape", lambda x, a: reshape(x.one("in"), a["shape"]),
    flow="flow.reshape")
reg("reshape_like", "in, like -> out", lambda x, a: reshape_like(x.one("in"), x.one("like")),
    flow="flow.reshape_like")
reg("flatten", "in -> out | start_dim: int32 = 0, end_dim: int32 = -1",
    lambda x, a: flatten(x.one("in"), a["start_dim"], a["end_dim"]), flow="flow.flatten")
reg("squeeze", "in -> out | axes: list_int32",
    lambda x, a: squeeze(x.one("in"), axis=a["axes"]), flow="flow.squeeze")
reg("expand_dims", "in -> out | axis: int32",
    lambda x, a: expand_dims(x.one("in"), a["axis"]), flow="flow.expand_dims")
reg("transpose", "input -> output | perm: list_int32",
    lambda x, a: transpose(x.one("input"), perm=a["perm"]), flow="flow.transpose")
reg("expand", "in -> out | logical_in_shape: list_int32, logical_expand_shape: list_int32",
    lambda x, a: expand(x.one("in"), a["logical_expand_shape"]), flow="flow.expand")
reg("broadcast_like", "x, like -> y | broadcast_axes: list_int32",
    lambda x, a: broadcast_like(x.one("x"), x.one("like"), a["broadcast_axes"] or None),
    flow="flow.broadcast_like")
reg("flip", "x -> y | dims: list_int32", lambda x, a: reverse(x.one("x"), a["dims"]),
    flow="flow.reverse")
reg("cast_to_static_shape", "input -> output",
    lambda x, a: cast_to_static_shape(x.one("input")), flow="flow.cast_to_static_shape")


def _concat(x, a):
    ins = x["in"]
    out = concat(ins, axis=a["axis"], max_dim_size=a["max_dim_size"] or None)
    return out


reg("concat", "in*2 -> out | axis: int64, max_dim_size: int64", _concat, flow="flow.concat")


def _split_like(x, a):
    """`in` cut at `axis` into the sizes of the `like` blobs there; each out_i has like_i's
    leading axes and in's trailing ones (split_like_op.cpp)."""
    v, likes, axis = x.one("in"), x["like"], a["axis"]
    rank = len(likes[0].shape)
    if rank > len(v.shape) or not 0 <= axis < rank or any(len(k.shape) != rank for k in likes):
        raise TraceError(f"{_where('split_like')}: the like blobs must share a rank <= "
                         f"in's {len(v.shape)} and have axis {axis}, got "
                         f"{[k.shape for k in likes]}")
    for k in likes:
        if any(k.shape[j] != v.shape[j] for j in range(rank) if j != axis):
            raise TraceError(f"{_where('split_like')}: like {k.shape} differs from in "
                             f"{v.shape} outside axis {axis}")
    sizes = [k.shape[axis] for k in likes]
    if sum(sizes) != v.shape[axis]:
        raise TraceError(f"{_where('split_like')}: the like blobs' sizes {sizes} at axis "
                         f"{axis} do not add up to in's {v.shape[axis]}")
    return {"out": split(v, sizes, axis=axis)}


reg("split_like", "in, like*2 -> out*2 | axis: int64", _split_like, flow="flow.split")


# -- slices -----------------------------------------------------------------------------------

def _tuples(a):
    return list(zip(a["start"], a["stop"], a["step"]))


_SLICE = "start: list_int64, stop: list_int64, step: list_int64"
reg("slice", "x -> y | " + _SLICE, lambda x, a: slice_v2(x.one("x"), _tuples(a)),
    flow="flow.slice_v2")
reg("logical_slice", "x -> y | " + _SLICE, lambda x, a: slice_v2(x.one("x"), _tuples(a)),
    flow="flow.experimental.logical_slice")
reg("slice_update", "x, update -> y | " + _SLICE,
    lambda x, a: slice_update(x.one("x"), x.one("update"), _tuples(a)),
    flow="flow.slice_update")
reg("logical_slice_assign", "ref, value -> | " + _SLICE,
    lambda x, a: logical_slice_assign(x.one("ref"), x.one("value"), _tuples(a)),
    flow="flow.experimental.logical_slice_assign")


def _narrow(x, a):
    v = x.one("in")
    tuples = [(None, None, None)] * len(v.shape)
    tuples[a["dim"]] = (a["start"], a["start"] + a["length"], 1)
    return slice_v2(v, tuples)


reg("narrow", "in -> out | dim: int64, start: int64, length: int64", _narrow)

# -- gathers and scatters -----------------------------------------------------------------------
reg("gather", "in, indices -> out | axis: int64",
    lambda x, a: gather(x.one("in"), x.one("indices"), axis=a["axis"]), flow="flow.gather")
reg("batch_gather", "in, indices -> out",
    lambda x, a: gather(x.one("in"), x.one("indices"),
                           batch_dims=len(x.one("indices").shape) - 1),
    flow="flow.gather")
reg("gather_nd", "params, indices -> out",
    lambda x, a: gather_nd(x.one("params"), x.one("indices")), flow="flow.gather_nd")
reg("dim_gather", "input, index -> output | dim: int32",
    lambda x, a: dim_gather(x.one("input"), a["dim"], x.one("index")), flow="flow.dim_gather")
reg("scatter_nd", "indices, updates -> out | shape: shape",
    lambda x, a: scatter_nd(x.one("indices"), x.one("updates"), a["shape"]),
    flow="flow.scatter_nd")
reg("scatter_nd_like", "like, indices, updates -> out",
    lambda x, a: scatter_nd(x.one("indices"), x.one("updates"), x.one("like").shape),
    flow="flow.scatter_nd")
reg("tensor_scatter_nd_update", "params, updates, indices -> out",
    lambda x, a: tensor_scatter_nd_update(x.one("params"), x.one("indices"),
                                             x.one("updates")),
    flow="flow.tensor_scatter_nd_update")
reg("tensor_scatter_nd_add", "params, updates, indices -> out",
    lambda x, a: tensor_scatter_nd_add(x.one("params"), x.one("indices"), x.one("updates")),
    flow="flow.tensor_scatter_nd_add")
reg("argwhere", "input -> output, output_size | dtype: dtype = int32",
    lambda x, a: argwhere_with_size(x.one("input"), a["dtype"]), flow="flow.argwhere")
reg("unique_with_counts", "x -> y, idx, count, num_unique | out_idx: dtype = int32",
    lambda x, a: tuple(unique_with_counts(x.one("x"), a["out_idx"])),
    flow="flow.experimental.unique_with_counts")

# -- identities and casts ---------------------------------------------------------------------
for _type in ("identity", "amp_white_identity"):
    reg(_type, "in -> out", lambda x, a: identity(x.one("in")), flow=f"flow.{_type}")
reg("tuple_identity", "in*1 -> out*1", lambda x, a: {"out": identity_n(x["in"])},
    flow="flow.identity_n")
reg("parallel_cast", "in -> out | sbp_parallel: string = '', grad_sbp_parallel: string = ''",
    lambda x, a: identity(x.one("in")), flow="flow.parallel_cast")
reg("hierarchical_parallel_cast", "in -> out | nd_sbp: list_string, grad_mode: string, "
    "grad_nd_sbp: list_string",
    lambda x, a: hierarchical_parallel_cast(x.one("in"), a["nd_sbp"], a["grad_mode"] or None,
                                            a["grad_nd_sbp"]),
    flow="flow.hierarchical_parallel_cast")
for _type in ("nvtx_start", "nvtx_end"):
    reg(_type, "in -> out | mark_prefix: string", lambda x, a: identity(x.one("in")),
        flow=f"flow.profiler.{_type}")
reg("cast", "in -> out | dtype: dtype", lambda x, a: cast(x.one("in"), a["dtype"]),
    flow="flow.cast")
reg("cast_like", "in, dtype_like -> out",
    lambda x, a: cast(x.one("in"), x.one("dtype_like").dtype), flow="flow.cast")

# -- selection ------------------------------------------------------------------------------
_OPERAND = ("has_int_operand: bool, has_float_operand: bool, int_operand: int64, "
            "float_operand: double")


def _operand(a, type_name):
    if a["has_int_operand"] or a["has_float_operand"]:
        return a["int_operand"] if a["has_int_operand"] else a["float_operand"]
    raise TraceError(f"{_where(type_name)} needs has_int_operand or has_float_operand set")


reg("where", "condition, x, y -> out",
    lambda x, a: where(x.one("condition"), x.one("x"), x.one("y")), flow="flow.where")
reg("where_scalar_x", "condition, y -> out | " + _OPERAND,
    lambda x, a: where(x.one("condition"), _operand(a, "where_scalar_x"), x.one("y")),
    flow="flow.where")
reg("where_scalar_y", "condition, x -> out | " + _OPERAND,
    lambda x, a: where(x.one("condition"), x.one("x"), _operand(a, "where_scalar_y")),
    flow="flow.where")


def _one_hot(x, a):
    floating = _is_float(a["dtype"])
    on = a["floating_on_value"] if floating else a["integer_on_value"]
    off = a["floating_off_value"] if floating else a["integer_off_value"]
    return one_hot(x.one("indices"), a["depth"], on, off, dtype=a["dtype"])


reg("one_hot", "indices -> out | depth: int64, floating_on_value: double, "
    "integer_on_value: int64, floating_off_value: double, integer_off_value: int64, "
    "dtype: dtype", _one_hot, flow="flow.one_hot")

# -- constants --------------------------------------------------------------------------------
reg("constant", "-> out | floating_value: double, integer_value: int64, "
    "is_floating_value: bool, dtype: dtype, shape: shape, nd_sbp: list_string",
    lambda x, a: constant(a["floating_value"] if a["is_floating_value"] else
                             a["integer_value"], dtype=a["dtype"], shape=a["shape"]),
    flow="flow.constant")
# OneFlow's empty leaves its buffer unwritten; onnxjob's holds zeros
reg("empty", "-> out | dtype: dtype, shape: shape, nd_sbp: list_string",
    lambda x, a: zeros(a["shape"], dtype=a["dtype"]), flow="flow.zeros")
reg("zero_like", "like -> out", lambda x, a: zeros_like(x.one("like")),
    flow="flow.zeros_like")
reg("ones_like", "like -> out", lambda x, a: ones_like(x.one("like")), flow="flow.ones_like")


def _range(x, a):
    kind = "float" if _is_float(a["dtype"]) else "integer"
    return creation.range(a[f"{kind}_start"], a[f"{kind}_limit"], a[f"{kind}_delta"],
                    dtype=a["dtype"])


reg("range", "-> out | integer_start: int64, integer_delta: int64, integer_limit: int64, "
    "float_start: double, float_delta: double, float_limit: double, dtype: dtype, "
    "nd_sbp: list_string", _range, flow="flow.range")
reg("diag", "in -> out | diagonal: int32 = 0",
    lambda x, a: diag(x.one("in"), a["diagonal"]), flow="flow.diag")

# -- padding ----------------------------------------------------------------------------------


def _pad(x, a):
    v = x.one("x")
    value = (a["floating_constant_value"] if dtypes.is_floating(v.np_dtype)
             else a["integral_constant_value"])
    return pad(v, list(zip(a["padding_before"], a["padding_after"])), value)


reg("pad", "x -> y | padding_before: list_int64, padding_after: list_int64, "
    "floating_constant_value: double, integral_constant_value: int64", _pad, flow="flow.pad")


def _constant_pad2d(x, a):
    v = x.one("x")
    value = a["floating_value"] if dtypes.is_floating(v.np_dtype) else a["integral_value"]
    return constant_pad2d(v, a["padding"], value)


reg("constant_pad2d", "x -> y | padding: list_int64, floating_value: double, "
    "integral_value: int64", _constant_pad2d, flow="flow.constant_pad2d")
reg("reflection_pad2d", "x -> y | padding: list_int64",
    lambda x, a: reflection_pad2d(x.one("x"), a["padding"]), flow="flow.reflection_pad2d")
reg("replication_pad2d", "x -> y | padding: list_int64",
    lambda x, a: replication_pad2d(x.one("x"), a["padding"]), flow="flow.replication_pad2d")
reg("same_padding", "x -> y | padding: string, data_format: string, kernel_size: list_int32, "
    "strides: list_int32, dilation_rate: list_int32",
    lambda x, a: same_padding(x.one("x"), a["padding"], _first_format(a["data_format"]),
                                 a["kernel_size"], a["strides"], a["dilation_rate"]),
    flow="flow.same_padding")


def _upsample(interpolation=None):
    def impl(x, a):
        mode = interpolation or a["interpolation"]
        return conv.upsample(x.one("x"), (a["height_scale"], a["width_scale"]),
                             a.get("align_corners", False), _first_format(a["data_format"]),
                             mode)
    return impl


reg("upsample", "x -> y | height_scale: float, width_scale: float, align_corners: bool, "
    "data_format: string, interpolation: string", _upsample(), flow="flow.layers.upsample_2d")
reg("upsample_nearest_2d", "x -> y | height_scale: float, width_scale: float, "
    "data_format: string", _upsample("nearest"), flow="flow.layers.upsample_2d")
reg("upsample_bilinear_2d", "x -> y | height_scale: float, width_scale: float, "
    "align_corners: bool, data_format: string", _upsample("bilinear"),
    flow="flow.layers.upsample_2d")

# -- random -------------------------------------------------------------------------------------
reg("random_mask_like", "like -> out | rate: float, seed: int64",
    lambda x, a: random.random_mask_like(x.one("like"), a["rate"], a["seed"]),
    flow="flow.random.random_mask_like")
reg("generate_random_batch_permutation_indices", "x -> y | seed: int64",
    lambda x, a: random.generate_random_batch_permutation_indices(x.one("x"), a["seed"]),
    flow="flow.random.generate_random_batch_permutation_indices")
reg("bernoulli", "in -> out | seed: int64 = -1, has_seed: bool = False, dtype: dtype",
    lambda x, a: random.bernoulli(x.one("in"), a["seed"] if a["has_seed"] else None,
                                  a["dtype"]),
    flow="flow.random.bernoulli")

# -- time shape (repeat_op.cpp, acc_op.cpp, pack_op.cpp, unpack_op.cpp) -------------------------
reg("repeat", "in -> out | repeat_num: int32",
    lambda x, a: legacy.repeat(x.one("in"), a["repeat_num"]), flow="flow.repeat")
reg("acc", "in -> out | max_acc_num: int32",
    lambda x, a: legacy.acc(x.one("in"), a["max_acc_num"]), flow="flow.acc")
reg("pack", "in -> out | pack_num: int32",
    lambda x, a: legacy.pack(x.one("in"), a["pack_num"]), flow="flow.pack")
reg("unpack", "in -> out | unpack_num: int32",
    lambda x, a: legacy.unpack(x.one("in"), a["unpack_num"]), flow="flow.unpack")

# -- variables (assign_op.cpp): the new value is the variable's after the run ----------------
reg("assign", "ref, value ->", lambda x, a: assign(x.one("ref"), x.one("value")),
    flow="flow.assign")


def _assign_if(negate):
    def impl(x, a):
        ref, value, cond = x.one("ref"), x.one("value"), x.one("condition")
        if int(np.prod(cond.shape)) != 1:
            raise TraceError(f"{_where('assign_if')}: condition must hold one value, got "
                             f"{cond.shape}")
        keep = reshape(cond, [1] * max(len(ref.shape), 1))
        new, old = (ref, value) if negate else (value, ref)
        assign(ref, where(keep, new, old))
    return impl


reg("assign_if", "ref, value, condition ->", _assign_if(False), flow="flow.assign")
reg("assign_if_not", "ref, value, condition ->", _assign_if(True), flow="flow.assign")
