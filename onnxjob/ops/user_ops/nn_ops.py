"""Op types of OneFlow's matmuls, bias adds, convolutions, pools, normalizations, losses,
dropout and quantization (matmul_op.cpp, bias_add_op.cpp, conv_op.cpp, pool_op.cpp,
normalization_op.cpp, layer_norm_op.cpp, the loss ops, dropout_op.cpp, ...), built from
flow.nn and the helpers behind it."""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.frontend.variables import assign
from onnxjob.graph.tracer import as_blob, current_builder, op
from onnxjob.ops import activations as act
from onnxjob.ops.casts import cast
from onnxjob.ops.linalg import matmul
from onnxjob.ops.shapes import reshape
from onnxjob.ops import conv, layer_norm_grads, legacy, losses, quantization
from onnxjob.ops import math as fm
from onnxjob.ops.layers import _batch_norm_inference, rank_local_statistics
from onnxjob.ops.normalization import layer_norm
from onnxjob.ops.user_ops.spec import registrar

reg = registrar("nn")


def _where(type_name):
    return f"flow.user_op_builder: op type {type_name!r}"


def _add_to_output(y, x):
    """OneFlow's optional `_add_to_output` input: added to the result."""
    extra = x.opt("_add_to_output")
    return y if extra is None else fm.add(y, extra)


# -- matmuls (matmul_op.cpp) --------------------------------------------------------------------
_MATMUL = "a, b, _add_to_output? -> out | transpose_a: bool = False, " \
          "transpose_b: bool = False, alpha: double = 1.0"


def _matmul(type_name, check):
    def impl(x, a):
        lhs, rhs = x.one("a"), x.one("b")
        if not check(len(lhs.shape), len(rhs.shape)):
            raise TraceError(f"{_where(type_name)} cannot take a {lhs.shape} and b "
                             f"{rhs.shape}")
        out = matmul(lhs, rhs, a["transpose_a"], a["transpose_b"], alpha=a["alpha"])
        return _add_to_output(out, x)
    return impl


reg("matmul", _MATMUL, _matmul("matmul", lambda ra, rb: ra == rb == 2), flow="flow.matmul")
reg("batch_matmul", _MATMUL, _matmul("batch_matmul", lambda ra, rb: ra == rb and ra > 2),
    flow="flow.matmul")
reg("broadcast_matmul", _MATMUL, _matmul("broadcast_matmul", lambda ra, rb: ra > 2 and rb == 2),
    flow="flow.matmul")


# -- bias adds ----------------------------------------------------------------------------------

def _bias_add(a_, b_, axis, type_name):
    """a + b along `axis` (bias_add_op.cpp: b is 1-D, of a's size there)."""
    axis = axis % len(a_.shape) if a_.shape else 0
    if len(b_.shape) != 1 or not a_.shape or b_.shape[0] != a_.shape[axis]:
        raise TraceError(f"{_where(type_name)}: b must be 1-D of a's size at axis {axis}, "
                         f"got a {a_.shape} and b {b_.shape}")
    shape = [1] * len(a_.shape)
    shape[axis] = b_.shape[0]
    return fm.add(a_, reshape(b_, shape))


reg("bias_add", "a, b -> out | axis: int32",
    lambda x, a: _bias_add(x.one("a"), x.one("b"), a["axis"], "bias_add"), flow="flow.nn.bias_add")
reg("fused_bias_add_gelu", "a, b -> out | axis: int32",
    lambda x, a: fm.gelu(_bias_add(x.one("a"), x.one("b"), a["axis"], "fused_bias_add_gelu")),
    flow="flow.nn.fused_bias_add_gelu")


def _masked_scaled(y, mask, scale):
    return fm.multiply(fm.multiply(y, cast(mask, y.dtype)), as_blob(scale, like=y))


reg("fused_bias_add_mask_scale", "a, b, mask, _add_to_output? -> out | axis: int32, "
    "scale: float",
    lambda x, a: _add_to_output(_masked_scaled(
        _bias_add(x.one("a"), x.one("b"), a["axis"], "fused_bias_add_mask_scale"),
        x.one("mask"), a["scale"]), x),
    flow="flow.nn.fused_bias_add_dropout")
# dropout_op.cpp: the mask (random_mask_like's) is an input; out = in * mask * scale
reg("dropout", "in, mask, _add_to_output? -> out | scale: float",
    lambda x, a: _add_to_output(_masked_scaled(x.one("in"), x.one("mask"), a["scale"]), x),
    flow="flow.nn.dropout")


# -- convolutions (conv_op.cpp): symmetric padding_before, OneFlow's layouts --------------------

def _conv(ndims):
    def impl(x, a):
        v, w, bias = x.one("in"), x.one("weight"), x.opt("bias")
        channels_last = a["data_format"] == "channels_last"
        kernel = list(w.shape[1:-1] if channels_last else w.shape[2:])
        if a["filters"] != w.shape[0] or a["kernel_size"] not in ([], kernel):
            raise TraceError(f"{_where(f'conv{ndims}d')}: filters {a['filters']} and "
                             f"kernel_size {a['kernel_size']} do not fit weight {w.shape}")
        pads = [[p, p] for p in a["padding_before"]] or [[0, 0]] * ndims
        return conv.convolution(v, w, a["strides"], pads, a["data_format"],
                                a["dilation_rate"] or None, a["groups"], bias, None, ndims)
    return impl


_CONV = "in, weight, bias?, bias_multiplier? -> out | filters: int32, " \
        "padding_before: list_int32, data_format: string, kernel_size: list_int32, " \
        "strides: list_int32, dilation_rate: list_int32, groups: int32 = 1"
for _n in (1, 2, 3):
    reg(f"conv{_n}d", _CONV, _conv(_n), flow=f"flow.nn.conv{_n}d")


def _deconv(ndims):
    """A transposed convolution (deconv_op.cpp): output size (in - 1) * stride - 2 * pad +
    output_padding + (kernel - 1) * dilation + 1; the weight is (in, out, *kernel), or
    (in, *kernel, out) for channels_last."""
    def impl(x, a):
        v, w = x.one("in"), x.one("weight")
        channels_last = a["data_format"] == "channels_last"
        if a["groups"] != 1:
            raise TraceError(f"{_where(f'deconv{ndims}d')}: onnxjob builds groups=1 only, got "
                             f"{a['groups']}")
        v, w = conv.to_channels_first(v, channels_last), conv.to_channels_first(w, channels_last)
        if a["filters"] != w.shape[1] or len(v.shape) != ndims + 2:
            raise TraceError(f"{_where(f'deconv{ndims}d')}: filters {a['filters']} and input "
                             f"{x.one('in').shape} do not fit weight {x.one('weight').shape}")
        pads = list(a["padding_before"] or [0] * ndims)
        y = conv.conv_transpose(v, w, a["strides"] or [1] * ndims, pads + pads,
                                a["output_padding"] or [0] * ndims,
                                a["dilation_rate"] or [1] * ndims, None)
        return conv.from_channels_first(y, channels_last)
    return impl


_DECONV = "in, weight -> out | filters: int32, padding_before: list_int32, " \
          "data_format: string, kernel_size: list_int32, output_padding: list_int32, " \
          "strides: list_int32, dilation_rate: list_int32, groups: int32 = 1"
for _n in (1, 2, 3):
    reg(f"deconv{_n}d", _DECONV, _deconv(_n), flow="flow.nn.conv2d_transpose")


# -- pools (pool_op.cpp): padding "valid", "same_lower", "same_upper" or "customized" -----------

def _pool(onnx_op, ndims):
    def impl(x, a):
        padding = a["padding"].upper()
        if padding == "CUSTOMIZED":
            padding = [list(p) for p in zip(a["padding_before"], a["padding_after"])]
        elif padding not in ("VALID", "SAME_LOWER", "SAME_UPPER"):
            raise TraceError(f"{_where(onnx_op)}: padding must be valid, same_lower, "
                             f"same_upper or customized, got {a['padding']!r}")
        return conv.pooling(onnx_op, x.one("x"), a["pool_size"], a["strides"], padding,
                            a["data_format"], a["ceil_mode"], None, ndims)
    return impl


_POOL = "x -> y | padding: string, padding_before: list_int32, padding_after: list_int32, " \
        "data_format: string, pool_size: list_int32, strides: list_int32, ceil_mode: bool"
for _n in (1, 2, 3):
    reg(f"max_pool_{_n}d", _POOL, _pool("MaxPool", _n), flow=f"flow.nn.max_pool{_n}d")
    reg(f"avg_pool_{_n}d", _POOL, _pool("AveragePool", _n), flow=f"flow.nn.avg_pool{_n}d")


# -- normalization (normalization_op.cpp) ------------------------------------------------------

def _variable_name(builder, blob):
    return next((n for n, b in builder.variables.items() if b is blob), None)


def _normalization(x, a):
    """Batch norm over every axis but `axis`. training: the batch's statistics (mean and
    inv_variance are outputs) and, given moving_mean / moving_variance variables, their
    update moving = momentum * moving + (1 - momentum) * batch (the variance unbiased), as
    OneFlow's kernel; else the moving statistics."""
    v, gamma, beta = x.one("x"), x.one("gamma"), x.one("beta")
    moving = (x.opt("moving_mean"), x.opt("moving_variance"))
    axis, eps = a["axis"] % len(v.shape), a["epsilon"]
    builder = current_builder("flow.user_op_builder")
    if not a["training"]:
        if any(m is None for m in moving):
            raise TraceError(f"{_where('normalization')}: training=False needs moving_mean "
                             "and moving_variance")
        return {"y": _add_to_output(_batch_norm_inference(v, axis, eps, gamma, beta, *moving),
                                    x)}
    # a data-parallel step normalizes as flow.layers.batch_normalization does
    ranks = builder.data_parallel_ranks
    local = rank_local_statistics(builder)
    y, mean, var = op("onnxjob.BatchNormTrain", v, gamma, beta, axis=axis, epsilon=float(eps),
                      ranks=ranks,
                      local_statistics=1 if local else None, num_outputs=3)
    if moving[0] is not None or moving[1] is not None:
        if any(m is None or _variable_name(builder, m) is None for m in moving):
            raise TraceError(f"{_where('normalization')}: moving_mean and moving_variance "
                             "must both be variables of this job (updated in place)")
        count = int(np.prod(v.shape)) // v.shape[axis] // (ranks if local else 1)
        m = a["momentum"]
        assign(moving[0], fm.add(fm.multiply(moving[0], m), fm.multiply(mean, 1.0 - m)))
        assign(moving[1], fm.add(fm.multiply(moving[1], m),
                                 fm.multiply(var, (1.0 - m) * count / max(count - 1, 1))))
    inv_variance = fm.rsqrt(fm.add(var, as_blob(eps, like=var)))
    return {"y": _add_to_output(y, x), "mean": mean, "inv_variance": inv_variance}


reg("normalization", "x, moving_mean?, moving_variance?, gamma, beta, _add_to_output? -> y, "
    "mean?, inv_variance? | axis: int32, epsilon: float, training: bool, momentum: float",
    _normalization, flow="flow.layers.batch_normalization")


def _layer_norm(x, a):
    """y and the statistics over the axes from begin_norm_axis on (mean and inv_variance of
    shape x.shape[:begin_norm_axis]); normalized = (x - mean) * inv_variance."""
    v = x.one("x")
    rank = len(v.shape)
    norm_axis = a["begin_norm_axis"] % rank
    gamma = x.opt("gamma") if a["scale"] else None
    beta = x.opt("beta") if a["center"] else None
    y = layer_norm(v, gamma, beta, norm_axis, a["begin_params_axis"], a["epsilon"])
    axes = list(range(norm_axis, rank))
    mean = fm.reduce_mean(v, axis=axes, keepdims=True)
    variance = fm.reduce_mean(fm.square(fm.subtract(v, mean)), axis=axes, keepdims=True)
    inv_variance = fm.rsqrt(fm.add(variance, as_blob(a["epsilon"], like=variance)))
    normalized = fm.multiply(fm.subtract(v, mean), inv_variance)
    stats = v.shape[:norm_axis]
    return {"y": y, "mean": reshape(mean, stats), "inv_variance": reshape(inv_variance,
                                                                                  stats),
            "normalized": normalized}


reg("layer_norm", "x, beta?, gamma? -> y, mean, inv_variance, normalized? | center: bool, "
    "scale: bool, begin_norm_axis: int64, begin_params_axis: int64, epsilon: double",
    _layer_norm, flow="flow.nn.layer_norm")
reg("layer_norm_grad", "dy, x, mean, inv_variance, _add_to_output? -> dx | "
    "begin_norm_axis: int64, epsilon: double",
    lambda x, a: _add_to_output(layer_norm_grads.layer_norm_grad(
        x.one("dy"), x.one("x"), x.one("mean"), x.one("inv_variance"), a["begin_norm_axis"]),
        x),
    flow="flow.layers.layer_norm_grad")


def _layer_norm_param_grad(x, a):
    """normalized_diff = dy * gamma, beta_diff = sum(dy), gamma_diff = sum(dy * normalized)
    over the leading axes (gamma_diff only given normalized)."""
    normalized = x.opt("normalized")
    normalized_diff, beta_diff, gamma_diff = layer_norm_grads.layer_norm_param_grad(
        x.one("dy"), x.one("dy") if normalized is None else normalized, x.opt("gamma"),
        a["begin_params_axis"])
    out = {"normalized_diff": normalized_diff, "beta_diff": beta_diff}
    if normalized is not None:
        out["gamma_diff"] = gamma_diff
    return out


reg("layer_norm_param_grad", "dy, normalized?, gamma? -> normalized_diff?, beta_diff?, "
    "gamma_diff?, reduce_buf? | begin_params_axis: int64", _layer_norm_param_grad,
    flow="flow.layers.layer_norm_param_grad")


# -- losses ---------------------------------------------------------------------------------------

def _depth(x, a, type_name):
    prediction = x.one("prediction")
    if a["depth"] != prediction.shape[-1]:
        raise TraceError(f"{_where(type_name)}: depth {a['depth']} must be prediction's last "
                         f"dim {prediction.shape[-1]}")
    return prediction


reg("sparse_softmax_cross_entropy", "prediction, label -> prob, out | depth: int64",
    lambda x, a: (act.softmax(_depth(x, a, "sparse_softmax_cross_entropy")),
                  losses.sparse_softmax_cross_entropy_with_logits(x.one("label"),
                                                                  x.one("prediction"))),
    flow="flow.nn.sparse_softmax_cross_entropy_with_logits")
reg("softmax_cross_entropy", "prediction, label -> prob, out",
    lambda x, a: (act.softmax(x.one("prediction")),
                  losses.softmax_cross_entropy_with_logits(x.one("label"), x.one("prediction"))),
    flow="flow.nn.softmax_cross_entropy_with_logits")
reg("sparse_cross_entropy", "prediction, label -> out | depth: int64",
    lambda x, a: losses.sparse_cross_entropy(x.one("label"),
                                             _depth(x, a, "sparse_cross_entropy")),
    flow="flow.nn.sparse_cross_entropy")
reg("sigmoid_cross_entropy", "prediction, label -> loss",
    lambda x, a: losses.sigmoid_cross_entropy_with_logits(x.one("label"), x.one("prediction")),
    flow="flow.nn.sigmoid_cross_entropy_with_logits")
reg("smooth_l1_loss", "prediction, label -> loss | beta: float",
    lambda x, a: losses.smooth_l1_loss(x.one("prediction"), x.one("label"), a["beta"]),
    flow="flow.smooth_l1_loss")

reg("ctc_greedy_decoder", "log_probs, input_lengths -> decoded, neg_sum_logits | "
    "merge_repeated: bool",
    lambda x, a: losses.ctc_greedy_decoder(x.one("log_probs"), x.one("input_lengths"),
                                           a["merge_repeated"]),
    flow="flow.nn.ctc_greedy_decoder")

# -- fused attention ops ----------------------------------------------------------------------
reg("fused_self_attention_query_mul_key_and_value", "hidden_states -> query_mul_key, value | "
    "head_size: int64, alpha: float",
    lambda x, a: legacy.fused_self_attention_query_mul_key_and_value(
        x.one("hidden_states"), a["head_size"], a["alpha"]),
    flow="flow.nn.fused_self_attention_query_mul_key_and_value")


def _tril_softmax_mask(x, a):
    """softmax_y = softmax(tril(x * tril_scale_value, diagonal, tril_fill_value)) over the
    last axis; y = softmax_y * mask * mask_scale_value."""
    v = x.one("x")
    softmax_y = act.softmax(fm.fused_scale_tril(v, a["diagonal"], a["tril_fill_value"],
                                                a["tril_scale_value"]))
    return _masked_scaled(softmax_y, x.one("mask"), a["mask_scale_value"]), softmax_y


reg("fused_tril_scale_softmax_mask_scale", "x, mask -> y, softmax_y | diagonal: int64, "
    "tril_fill_value: float = 0.0, tril_scale_value: float = 1.0, "
    "mask_scale_value: float = 1.0", _tril_softmax_mask,
    flow="flow.nn.fused_scale_tril_softmax_dropout")

# -- quantization (fake_quantization_op.cpp, min_max_observer_op.cpp) ----------------------------
_QUANT = "quantization_formula: string = 'google', quantization_bit: int32 = 8, " \
         "quantization_scheme: string = 'symmetric'"
reg("fake_quantization", "in, scale, zero_point -> out | " + _QUANT,
    lambda x, a: quantization.fake_quantization(
        x.one("in"), x.one("scale"), x.one("zero_point"), a["quantization_bit"],
        a["quantization_scheme"], a["quantization_formula"]),
    flow="flow.quantization.fake_quantization")
reg("min_max_observer", "in -> scale, zero_point | " + _QUANT +
    ", per_layer_quantization: bool = True",
    lambda x, a: quantization.min_max_observer(
        x.one("in"), a["quantization_bit"], a["quantization_scheme"],
        a["quantization_formula"], a["per_layer_quantization"]),
    flow="flow.quantization.min_max_observer")
