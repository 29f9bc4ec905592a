"""OneFlow 0.5's model-update kernels as graph nodes (model_update_kernel_util.h/.cpp).

Each rule takes Blobs (model `w`, gradient `g`, state, float learning rate `lr` in the
model's dtype) and returns the new values, with OneFlow's formula and evaluation order
(LAMB's scalar bias corrections regrouped, see `lamb`). Hyperparameters are OneFlow op
attributes, i.e. float32: they are rounded to float32 before use, as OneFlow does. The
gradient-side passes (l1/l2 regularization, clipping by global norm, loss-scale
unscaling, the not-finite check and scale schedule of dynamic loss scaling) and the row
mask of the "indexed slices" (sparse) updates are here too.

Every pass over a variable-sized tensor is a pass over all the model's bytes (a step's
optimizer traffic, graph/traffic.py), so the scalar factors of the gradient side (1 /
elem_cnt, 1 / loss scale, the clipping factor) are multiplied together and applied to each
gradient once (`unscale_factors`, `clip_by_global_norm`, `scaled`), and Adam and LAMB skip
a dynamic loss scale's non-finite step through their scalar coefficients (`keep`) instead
of a select over each new value: BERT-base's AMP step (LAMB, clipping) moved 23.3 GiB in
its update before, 17.2 GiB with both (bench/traffic_model.py bert --amp).
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.graph.primitives.shape_ops import (concat_flat, flat, reshape_to, split_flat,
                                                width_class)
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op
from onnxjob.ops.indexing import rows_looked_up
from onnxjob.train import flat_groups

_INT64 = dtypes.int64.ir_dtype.value
_FLOAT32 = dtypes.float32.ir_dtype.value


def attr(like, value):
    """`value` as a OneFlow float attribute (rounded to float32) in the dtype of `like`."""
    return as_blob(np.asarray(np.float32(value), dtype=like.np_dtype), like=like)


def one_minus(like, beta):
    """(1 - beta) as the kernels compute it from the float attribute beta."""
    return as_blob(np.asarray(np.float32(1) - np.float32(beta), dtype=like.np_dtype), like=like)


def cast_like(x, like):
    """`x` in the dtype of `like` (no node when it already is)."""
    if x.np_dtype == like.np_dtype:
        return x
    return op("Cast", x, to=dtypes.from_numpy(like.np_dtype).ir_dtype.value)


def _sum_sq(x):
    return op("ReduceSum", x * x, int64_constant(x, list(range(len(x.shape)))), keepdims=0)


def _norm(x):
    return op("Sqrt", _sum_sq(x))


# -- gradient passes ---------------------------------------------------------------------
def regularize(w, g, regularizer, cpu_kernel=False):
    """l1_l2_regularize_gradient: g + l1 * ((w >= 0) - (w <= 0)) + l2 * w, as its CUDA
    kernel and the update kernels FuseUpdateOpsPass folds it into compute it
    (model_update_kernel_util.h), 0 at w = 0; `cpu_kernel`: its CPU kernel's
    l1 * (w >= 0 ? 1 : -1), +l1 at 0 (l1_l2_regularize_gradient_kernel_util.cpp/.cu)."""
    if regularizer.l1 and not cpu_kernel:
        g = g + attr(w, regularizer.l1) * op("Sign", w)
    elif regularizer.l1:
        g = g + op("Where", op("GreaterOrEqual", w, attr(w, 0.0)), attr(w, regularizer.l1),
                   attr(w, -regularizer.l1))
    if regularizer.l2:
        g = g + attr(w, regularizer.l2) * w
    return g


def scaled(g, factor):
    """`g` times its pending scalar `factor` (one pass), or `g` when there is none."""
    return g if factor is None else g * cast_like(factor, g)


def clip_by_global_norm(grads, clip_norm, factors=None, unscale_computed=True):
    """OneFlow 0.5's ClipGradientByGlobalNorm: every g times min(rsqrt(sum of all g^2),
    1 / clip_norm), i.e. g / max(global_norm, clip_norm); no epsilon.

    `factors` ({name: scalar or None}) are the scalars each g is still to be multiplied
    by (`unscale_factors`): the sums of squares are taken of the unmultiplied g, times the
    factor's square, and the clipping factor is returned multiplied into them ({name:
    scalar}), for `scaled` to apply once; a factor computed at run time (a dynamic loss
    scale's) is applied before squaring where `unscale_computed`."""
    factors = factors or {}
    first = next(iter(grads.values()))
    # the sums of squares of the gradients sharing a pending factor meet in one vector,
    # summed once and multiplied by the factor's square once (a chain of a scalar add and
    # multiply per variable was ~400 kernel launches a step for BERT-base's ~200)
    groups = {}     # id(factor) -> (factor, [sum of squares])
    for name, g in grads.items():
        factor = factors.get(name)
        if unscale_computed and _computed(factor):
            # a dynamic loss scale's reciprocal: its g is unscaled before squaring, as
            # OneFlow unscales it first (a scale on float32 gradients that grew to 2^63
            # squared g to inf, the clip factor to 0, and froze training while every step
            # counted as good)
            g, factor = scaled(g, factor), None
        groups.setdefault(id(factor), (factor, []))[1].append(cast_like(_sum_sq(g), first))
    total = None
    for factor, sums in groups.values():
        part = sums[0] if len(sums) == 1 else op(
            "ReduceSum", concat_flat(sums), int64_constant(sums[0], [0]), keepdims=0)
        if factor is not None:
            factor = cast_like(factor, part)
            part = part * (factor * factor)
        total = part if total is None else total + part
    inv_clip = as_blob(np.asarray(1.0 / float(np.float32(clip_norm)), total.np_dtype), like=total)
    scale = op("Min", op("Reciprocal", op("Sqrt", total)), inv_clip)
    made = {}       # (one product per pending factor: a shared factor stays one value)
    out = {}
    for n in grads:
        factor = factors.get(n)
        if factor is None:
            out[n] = scale
        else:
            if id(factor) not in made:
                made[id(factor)] = cast_like(factor, scale) * scale
            out[n] = made[id(factor)]
    return out


def _computed(factor):
    """Whether a pending factor is computed at run time (a Blob that is no constant)."""
    return isinstance(factor, Blob) and factor.value.const_value is None


def unscale_factors(grads, loss_scale, elem_cnt):
    """{name: scalar} each gradient of a scaled seed (autodiff.backward's `loss_scale`) is
    to be multiplied by, as OneFlow's optimizer pass treats them
    (oneflow/core/job_rewriter/autograd.cpp): 1.0f / elem_cnt
    (ScaleModelDiffByConstantLossInstanceNum) times 1/scale (ScaleModelDiffByLossScale),
    the reciprocal taken in float32 (a static factor's `1.0f / factor`, a dynamic scale's
    `reciprocal` node), in the gradient's dtype. `loss_scale` is a float or a float32
    one-element Blob. OneFlow multiplies each gradient by the two in turn; one product of
    the scalars rounds once where that rounds twice (the same bits for powers of two)."""
    first = next(iter(grads.values()))
    if isinstance(loss_scale, Blob):
        inverse = op("Reciprocal", reshape_to(loss_scale, ()))
    else:
        inverse = as_blob(np.float32(1) / np.float32(loss_scale), like=first, dtype=np.float32)
    out, per_dtype = {}, {}     # (one factor per dtype: the gradients share it)
    for name, g in grads.items():
        key = np.dtype(g.np_dtype).str
        if key not in per_dtype:
            factor = cast_like(inverse, g)
            if elem_cnt != 1:
                factor = as_blob(np.float32(1) / np.float32(elem_cnt), like=factor) * factor
            per_dtype[key] = factor
        out[name] = per_dtype[key]
    return out


def dynamic_loss_scale_schedule(finite, loss_scale, counter, increment_period, multiplier):
    """(new scale, new good-step counter) as OneFlow's dynamic_loss_scale_schedule kernel
    (oneflow/user/kernels/dynamic_loss_scale_schedule_kernel.cpp, v0.5.0 and master):
    finite: counter + 1, and once it reaches increment_period the scale becomes
    min(scale * multiplier, FLT_MAX) and the counter 0; not finite: the counter 0 and the
    scale max(scale / multiplier, 1).

    The kernel computes in double and rounds to float32; float32 nodes give the same bits
    (a product or quotient of two floats rounded via double is the correctly rounded
    float, and min/max against FLT_MAX and 1 commute with that rounding; an overflow to
    inf is clamped to FLT_MAX by Min)."""
    mult = attr(loss_scale, multiplier)
    step = counter + int64_constant(counter, [1])
    grow = op("GreaterOrEqual", step, int64_constant(counter, [int(increment_period)]))
    grown = op("Min", loss_scale * mult, attr(loss_scale, np.finfo(np.float32).max))
    shrunk = op("Max", loss_scale / mult, attr(loss_scale, 1.0))
    zero = int64_constant(counter, [0])
    new_scale = op("Where", finite, op("Where", grow, grown, loss_scale), shrunk)
    new_counter = op("Where", finite, op("Where", grow, zero, step), zero)
    return new_scale, new_counter


def all_finite(grads):
    """A bool scalar: every element of every gradient is finite (count_not_finite == 0).

    `grads`: [(gradient, scalar factor or None)], the factor what the gradient is still to
    be multiplied by (unscaling, clipping). One pass over each gradient: the sum of
    gradient x factor is inf or NaN where an element is (inf - inf is NaN), and sum * 0 is
    then NaN. With a factor the gradient's rows meet a column of factors in one
    matrix-vector product (float32 accumulation), so no scaled copy is made and the sum is
    of the unscaled gradient: a loss-scaled gradient near float32's largest value sums
    without overflowing. NOTE: finite elements whose unscaled sum overflows float32 count
    as not finite, where OneFlow counts elements. The sums meet in one vector, times 0
    and summed once: a step's check is a few kernels beyond one sum per gradient, not a
    chain of scalar adds (ResNet50: 161 gradients)."""
    sums = []
    for g, factor in _small_ones_together(grads):
        if factor is None or not g.shape:
            s = g if factor is None else g * cast_like(factor, g)
            s = op("ReduceSum", s, int64_constant(s, list(range(len(s.shape)))), keepdims=0)
        else:
            last = g.shape[-1]
            column = as_blob(np.ones((last, 1), g.np_dtype), like=g) * cast_like(factor, g)
            s = op("MatMul", reshape_to(g, [-1, last]), column)
            s = op("ReduceSum", s, int64_constant(s, [0, 1]), keepdims=0)
        sums.append(reshape_to(op("Cast", s, to=_FLOAT32), [1]))
    together = sums[0] if len(sums) == 1 else op("Concat", *sums, axis=0)
    total = op("ReduceSum", together * attr(together, 0.0), int64_constant(together, [0]),
               keepdims=0)
    return op("Not", op("IsNaN", total))


def _small_ones_together(grads):
    """`grads` [(gradient, factor)] with the small gradients of one dtype and factor
    concatenated into one (flat_groups.is_small): their check is one sum, not one (or a
    product and a sum) each. A finite element's value only changes which sum it is in; a
    non-finite one still makes the total NaN."""
    groups, out = {}, []
    for g, factor in grads:
        if flat_groups.is_small(g):
            key = (np.dtype(g.np_dtype).str, width_class(g), id(factor))
            groups.setdefault(key, []).append((g, factor))
        else:
            out.append((g, factor))
    for members in groups.values():
        out.append((concat_flat([g for g, _ in members]), members[0][1]))
    return out


def gated(keep, value, skipped):
    """`value` where `keep` (a dynamic loss scale's bool "every gradient is finite"), else
    `skipped`: the scalar coefficients of an update that leaves every value as it was on
    a skipped step. No node when `keep` is None."""
    return value if keep is None else op("Where", keep, value, skipped)


def adam_bias_correction(step, beta):
    """1 - beta**(step + 1) as OneFlow's adam_bias_correction_factor kernel computes it:
    float32 `Fastpow` (square-and-multiply over the bits of step + 1), a float32 scalar.

    beta**(2**i) are float32 constants made by repeated squaring; the factors of the set
    bits are multiplied in increasing bit order, as Fastpow does, so the rounding is the
    same. Squaring stops at a fixed point (0 or 1): higher bits multiply by that value.
    """
    powers = [np.float32(beta)]
    while len(powers) < 62 and powers[-1] * powers[-1] != powers[-1]:
        powers.append(np.float32(powers[-1] * powers[-1]))
    k = len(powers) - 1  # powers[k] is the fixed point (or bit 61)
    if k == 0:
        return as_blob(np.float32(1) - powers[0], like=step, dtype=np.float32)
    n = reshape_to(step, (1,)) + int64_constant(step, [1])
    bits = op("Mod", op("Div", n, int64_constant(n, [2 ** i for i in range(k)])),
              int64_constant(n, [2]))
    ones = as_blob(np.ones(k, np.float32), like=n, dtype=np.float32)
    factors = op("Where", op("Equal", bits, int64_constant(n, [1])),
                 as_blob(np.array(powers[:k], np.float32), like=n, dtype=np.float32), ones)
    parts = op("Split", factors, axis=0, num_outputs=k) if k > 1 else [factors]
    ans = parts[0]
    for p in parts[1:]:
        ans = ans * p
    high = op("GreaterOrEqual", n, int64_constant(n, [2 ** k]))
    ans = op("Where", high, ans * as_blob(np.array([powers[k]], np.float32), like=ans), ans)
    return reshape_to(as_blob(np.ones(1, np.float32), like=ans) - ans, ())


# -- update kernels ----------------------------------------------------------------------
def sgd(w, g, lr, weight_decay, factor=None):
    """sgd_update: w - lr * (G + weight_decay * w) for G = g * factor (a scalar or None;
    without weight decay lr * factor is one scalar, no pass over g)."""
    if weight_decay:
        g = scaled(g, factor) + attr(w, weight_decay) * w
    elif factor is not None:
        lr = lr * cast_like(factor, lr)
    return w - lr * g


def momentum(w, g, m, lr, beta, weight_decay, factor=None):
    """momentum_update: m' = beta*m - lr*G; w' = w + m' - lr*weight_decay*w, for G = g *
    factor (a scalar or None: lr * factor is one scalar, no pass over g)."""
    step = lr if factor is None else lr * cast_like(factor, lr)
    m_new = attr(m, beta) * m - step * g
    w_new = w + m_new
    if weight_decay:
        w_new = w_new - lr * attr(w, weight_decay) * w
    return w_new, m_new


def _moments(g, m, v, beta1, beta2, keep, factor=None):
    """m' = b1*m + (1-b1)*G and v' = b2*v + (1-b2)*G*G for G = g * factor (a scalar or
    None) without a scaled copy of g: (1-b1)*factor is one scalar, and (1-b2)*G*G is t*t
    for t = g * (sqrt(1-b2)*factor) (g*g or factor^2 alone could overflow or underflow
    where g is a loss-scaled gradient; a power-of-two factor, a dynamic loss scale's,
    gives the bits of the unscaled gradient's step); with `keep` false (a skipped step, g
    made 0 by the caller) b1 = b2 = 1 and 1-b1 = 1-b2 = 0: m and v unchanged."""
    b1 = gated(keep, attr(m, beta1), attr(m, 1.0))
    b2 = gated(keep, attr(v, beta2), attr(v, 1.0))
    c1 = gated(keep, one_minus(g, beta1), attr(g, 0.0))
    c2 = gated(keep, one_minus(g, beta2), attr(g, 0.0))
    root_c2 = op("Sqrt", c2)
    if factor is None:
        t = g * root_c2
        return b1 * m + c1 * g, b2 * v + t * t, b1
    # (on a skipped step the factor itself may be NaN: a clipping norm of inf gradients)
    factor = gated(keep, cast_like(factor, g), attr(g, 0.0))
    t = g * (root_c2 * factor)
    return b1 * m + (c1 * factor) * g, b2 * v + t * t, b1


def adam(w, g, m, v, lr, beta1, beta2, epsilon, weight_decay, corrections=None, keep=None,
         factor=None):
    """adam_update: m' = b1*m + (1-b1)*g; v' = b2*v + (1-b2)*g*g;
    w' = w - lr/bc1 * m' / (sqrt(v')/sqrt(bc2) + eps) - lr*weight_decay*w.

    `corrections` is (bc1, bc2) as scalars in w's dtype, or None (do_bias_correction off:
    bc1 = bc2 = 1). `keep` (a bool scalar, or None) false makes the step leave w, m and v
    as they were (`gated`; g must then be finite: the caller makes it 0). `factor`: a
    scalar g is still to be multiplied by (`_moments`)."""
    m_new, v_new, _ = _moments(g, m, v, beta1, beta2, keep, factor)
    lr = gated(keep, lr, attr(lr, 0.0))
    denom = op("Sqrt", v_new)
    step_size = lr
    if corrections is not None:
        bc1, bc2 = corrections
        denom = denom / op("Sqrt", bc2)
        step_size = lr / bc1
    w_new = w - step_size * (m_new / (denom + attr(v, epsilon)))
    if weight_decay:
        w_new = w_new - lr * attr(w, weight_decay) * w
    return w_new, m_new, v_new


def adam_0_4(w, g, m, v, lr, beta1, beta2, epsilon, weight_decay, step=None, keep=None,
             factor=None):
    """OneFlow <= 0.4's adam_update (compat/generations.py): the moments as `adam`;
    w' = w - lr_t * (m' / (sqrt(v') + eps) + weight_decay * w), with lr_t = lr when `step`
    is None (no bias correction), else as 0.4's adam_bias_correction_learning_rate kernel:
    lr * sqrt(1 - beta2**(step+1)) / (1 - beta1**(step+1)), the powers taken in double and
    rounded to float32. `factor` as in `adam`."""
    m_new, v_new, _ = _moments(g, m, v, beta1, beta2, keep, factor)
    if step is not None:
        exponent = op("Cast", reshape_to(step, ()) + int64_constant(step, 1),
                      to=dtypes.float64.ir_dtype.value)
        one = as_blob(np.float32(1), like=lr, dtype=np.float32)
        powers = [op("Cast", op("Pow", as_blob(np.float64(np.float32(b)), like=exponent,
                                             dtype=np.float64), exponent), to=_FLOAT32)
                  for b in (beta1, beta2)]
        lr = lr * cast_like(op("Sqrt", one - powers[1]) / (one - powers[0]), lr)
    lr = gated(keep, lr, attr(lr, 0.0))
    step_dir = m_new / (op("Sqrt", v_new) + attr(v, epsilon))
    if weight_decay:
        step_dir = step_dir + attr(w, weight_decay) * w
    return w - lr * step_dir, m_new, v_new


def lamb(w, g, m, v, beta1_t, beta2_t, lr, beta1, beta2, epsilon, weight_decay, keep=None,
         factor=None):
    """lamb_update: beta_t *= beta (state starting at beta, so step t uses beta**(t+1));
    adam_diff = (m'/(1-b1_t)) / (sqrt(v'/(1-b2_t)) + eps);
    ratio = ||w|| / ||adam_diff|| (1 unless both > 0); w' = w - lr*ratio*(adam_diff + wd*w).
    Returns (w', m', v', beta1_t', beta2_t'). `keep` and `factor` as in `adam` (beta_t
    unchanged too).

    The bias corrections are scalars, so they are taken out of the passes over the
    tensors: with s = sqrt(1-b2_t) / (1-b1_t), adam_diff = s * q for
    q = m' / (sqrt(v') + eps*sqrt(1-b2_t)), and lr*ratio*(adam_diff + wd*w) =
    lr*(||w|| / ||q||)*(q + (wd/s)*w): three passes fewer than OneFlow's order, which
    rounds differently in the last bits."""
    m_new, v_new, b1 = _moments(g, m, v, beta1, beta2, keep, factor)
    b2 = gated(keep, attr(beta2_t, beta2), attr(beta2_t, 1.0))
    b1t, b2t = beta1_t * cast_like(b1, beta1_t), beta2_t * b2
    one = attr(b1t, 1.0)
    c1, root_c2 = one - b1t, op("Sqrt", one - b2t)
    q = m_new / (op("Sqrt", v_new) + cast_like(reshape_to(root_c2 * attr(root_c2, epsilon),
                                                          ()), v))
    w_norm, q_norm = _norm(w), _norm(q)
    zero = attr(w_norm, 0.0)
    ratio = op("Where", op("And", op("Greater", w_norm, zero), op("Greater", q_norm, zero)),
               w_norm / q_norm, cast_like(reshape_to(root_c2 / c1, ()), w_norm))
    if weight_decay:
        q = q + cast_like(reshape_to(attr(c1, weight_decay) * c1 / root_c2, ()), w) * w
    lr = gated(keep, lr, attr(lr, 0.0))
    return w - (lr * ratio) * q, m_new, v_new, b1t, b2t


def lamb_group(items, lr, beta1, beta2, epsilon, keep=None):
    """`lamb` for several float32 variables at once: `items` [(w, g, m, v, beta1_t,
    beta2_t, weight_decay, factor)] -> [(w', m', v', beta1_t', beta2_t')] (g not yet made 0
    for a skipped step: here, a stack's at once), each the values
    `lamb` gives it (the same float32 operations on each element). The per-variable
    scalars (bias corrections, the two norms, the trust ratio, the weight decay's factor)
    are computed as vectors over the variables, one kernel each for all of them, where
    `lamb` takes ~20 scalar kernels per variable (BERT-base: ~200 variables). Small
    variables of one shape and gradient factor (BERT-base: ~115 biases and layer norms of
    768 values) are updated as the rows of one matrix (`_lamb_stacks`): one kernel per
    operation for all of them instead of ~13 each, their norms row sums."""
    order, stacks = _lamb_stacks(items)
    items = [items[i] for i in order]
    sizes = [len(stack) for stack in stacks] + [1] * (len(items) - sum(map(len, stacks)))
    groups, at = [], 0      # [(items of the stack or the single variable, stacked w, g)]
    for size in sizes:
        members = items[at:at + size]
        at += size
        if size == 1:
            groups.append((members, *members[0][:4]))
        else:
            groups.append((members, *(_stacked([item[j] for item in members])
                                      for j in range(4))))
    moments = [_moments(gated(keep, g, attr(g, 0.0)), m, v, beta1, beta2, keep, members[0][7])
               for members, _, g, m, v in groups]
    first_b1t, first_b2t = items[0][4], items[0][5]
    b1 = cast_like(moments[0][2], first_b1t)
    b2 = gated(keep, attr(first_b2t, beta2), attr(first_b2t, 1.0))
    b1t = concat_flat([item[4] for item in items]) * b1
    b2t = concat_flat([item[5] for item in items]) * b2
    one = attr(b1t, 1.0)
    c1, root_c2 = one - b1t, op("Sqrt", one - b2t)
    eps = _per_group(root_c2 * attr(root_c2, epsilon), sizes)
    qs = [m_new / (op("Sqrt", v_new) + cast_like(e, v_new))
          for (m_new, v_new, _), e in zip(moments, eps)]
    w_norm = op("Sqrt", concat_flat([_row_sum_sq(w, len(members) > 1)
                                     for (members, w, *_) in groups]))
    q_norm = op("Sqrt", concat_flat([_row_sum_sq(q, len(members) > 1)
                                     for (members, *_), q in zip(groups, qs)]))
    zero = attr(w_norm, 0.0)
    ratio = op("Where", op("And", op("Greater", w_norm, zero), op("Greater", q_norm, zero)),
               w_norm / q_norm, root_c2 / c1)
    decays = np.array([item[6] for item in items], np.float32)
    decay_terms = _per_group(as_blob(decays, like=c1) * c1 / root_c2, sizes) \
        if decays.any() else None
    lr = gated(keep, lr, attr(lr, 0.0))
    steps = _per_group(reshape_to(lr, [1]) * ratio, sizes)
    new_b1t, new_b2t = _unstacked(b1t), _unstacked(b2t)
    updated = []
    for k, ((members, w, *_), (m_new, v_new, _), q) in enumerate(zip(groups, moments, qs)):
        if any(item[6] for item in members):
            q = q + decay_terms[k] * w
        w_new = w - steps[k] * q
        if len(members) == 1:
            updated.append((w_new, m_new, v_new))
            continue
        shapes = [tuple(item[0].shape) for item in members]
        updated.extend(zip(*(split_flat(value, shapes) for value in (w_new, m_new, v_new))))
    updated = [(*new, b1t_k, b2t_k) for new, b1t_k, b2t_k in zip(updated, new_b1t, new_b2t)]
    back = [None] * len(order)
    for position, index in enumerate(order):
        back[index] = updated[position]
    return back


def _lamb_stacks(items):
    """(an order of `items` with each stack's members together, first; [[indices]] of the
    stacks): the small variables (flat_groups.is_small) of one shape and gradient factor,
    two or more."""
    stacks = {}
    for i, item in enumerate(items):
        if flat_groups.is_small(item[0]):
            stacks.setdefault((tuple(item[0].shape), id(item[7])), []).append(i)
    stacks = [indices for indices in stacks.values() if len(indices) > 1]
    stacked = {i for indices in stacks for i in indices}
    order = [i for indices in stacks for i in indices] + \
        [i for i in range(len(items)) if i not in stacked]
    return order, stacks


def _stacked(blobs):
    """Values of one shape as the rows of one matrix (one Concat)."""
    size = int(np.prod(blobs[0].shape))
    return op("Concat", *[reshape_to(b, [1, size]) for b in blobs], axis=0)


def _row_sum_sq(x, stacked):
    """The sum of squares of each row of a stack, or of a variable's values as a (1,)."""
    if not stacked:
        return reshape_to(_sum_sq(x), [1])
    return op("ReduceSum", x * x, int64_constant(x, [1]), keepdims=0)


def _per_group(vector, sizes):
    """A vector over the variables cut into one part per group: a (k, 1) column for a stack
    of k rows, a scalar for a single variable (one Split)."""
    parts = split_flat(vector, [(size,) for size in sizes])
    return [reshape_to(part, [size, 1] if size > 1 else []) for part, size in zip(parts, sizes)]


def _unstacked(vector):
    """An (n,) vector -> its n (1,) parts (one Split)."""
    return split_flat(vector, [(1,)] * vector.shape[0])


def lars(w, g, m, lr, momentum_beta, epsilon, lars_coefficient, weight_decay):
    """lars_update: lars = coeff*||w|| / (eps + ||g|| + wd*||w||) (1 unless both norms
    > 0); m' = beta*m - lr*lars*g; w' = w + m' - lr*lars*wd*w."""
    w_norm, g_norm = _norm(w), _norm(g)
    zero = attr(w_norm, 0.0)
    trust = attr(w_norm, lars_coefficient) * w_norm / (
        attr(w_norm, epsilon) + g_norm + attr(w_norm, weight_decay) * w_norm)
    trust = op("Where", op("And", op("Greater", w_norm, zero), op("Greater", g_norm, zero)),
               trust, attr(w_norm, 1.0))
    local_lr = lr * trust
    m_new = m * attr(m, momentum_beta) - local_lr * g
    w_new = w + m_new
    if weight_decay:
        w_new = w_new - local_lr * attr(w, weight_decay) * w
    return w_new, m_new


def rmsprop(w, g, mean_square, lr, decay_rate, epsilon, mean_gradient=None):
    """rmsprop_update: ms' = (1-d)*g*g + d*ms; centered: mg' = (1-d)*g + d*mg and
    denom = ms' - mg'^2, else denom = ms'; w' = w - lr*g*rsqrt(denom + eps).
    Returns (w', ms', mg' or None)."""
    ms_new = one_minus(g, decay_rate) * g * g + attr(mean_square, decay_rate) * mean_square
    denom = ms_new
    mg_new = None
    if mean_gradient is not None:
        mg_new = one_minus(g, decay_rate) * g + attr(mean_gradient, decay_rate) * mean_gradient
        denom = ms_new - mg_new * mg_new
    rsqrt = op("Reciprocal", op("Sqrt", denom + attr(w, epsilon)))
    return w - lr * g * rsqrt, ms_new, mg_new


def find_blob(builder, lbn):
    """The Blob of `builder`'s job whose logical blob name is `lbn` (a variable, a node's
    output or a placeholder), or None."""
    for name, blob in builder.variables.items():
        if lbn in (name, f"{name}/out", blob.name):
            return blob
    for node in builder.nodes:
        for blob in node.outputs:
            if blob.name == lbn:
                return blob
    for value in builder.graph.inputs:
        if value.name == lbn:
            return Blob(builder, value, tuple(value.shape), value.dtype.numpy())
    return None


# -- indexed slices ------------------------------------------------------------------------
def _is_scalar_constant(blob):
    return blob.value.const_value is not None and int(np.prod(blob.shape)) == 1


def lookup_indices(builder, variable):
    """The indices Blob of the one Gather (axis 0) that gives `variable` its gradient, or
    None: OneFlow's IndexedSlicesOptimizerRewritePass rewrites an update only when the
    model's gradient is a single gather's unsorted_segment_sum, reached through nothing
    but multiplications by a scalar constant (`table * 0.5`)."""
    blob = variable
    while True:
        users = [n for n in builder.nodes if any(x is blob for x in n.inputs)
                 and any(id(o) in builder.gradients for o in n.outputs)]
        if len(users) != 1:
            return None
        node = users[0]
        if node.op_type == "Gather" and node.inputs[0] is blob \
                and node.attrs.get("axis", 0) % len(blob.shape) == 0:
            return node.inputs[1]
        if node.op_type != "Mul" or not any(_is_scalar_constant(x) for x in node.inputs
                                            if x is not blob):
            return None
        blob = node.outputs[0]


def picked_rows(indices):
    """The rows (axis 0) that `indices` picks, as one int64 vector (a row picked twice is
    in it twice; for a gather of OneFlow's zeros outside the table, ops/indexing.py
    rows_looked_up)."""
    indices = rows_looked_up(indices)
    if indices.np_dtype != np.int64:
        indices = op("Cast", indices, to=_INT64)
    return flat(indices)


def rows_of(t, rows):
    """`t`'s rows `rows` (picked_rows)."""
    return op("Gather", t, rows, axis=0)


def with_rows(t, rows, new_rows):
    """`t` with its rows `rows` replaced by `new_rows` and the others unchanged, bit for
    bit. A row picked twice is written twice with the same value: each copy was computed
    from the same row, and its gradient row already sums every lookup."""
    return op("ScatterND", t, op("Unsqueeze", rows, int64_constant(rows, [1])), new_rows)
