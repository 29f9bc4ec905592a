"""Ops whose positional parameters moved between OneFlow releases.

OneFlow 0.5 (`oneflow.compatible.single_client`, onnxjob's signatures) inserted a
parameter into the middle of some signatures of OneFlow <= 0.4 (`oneflow/python/ops`),
so a legal <= 0.4 positional call binds its later arguments to the wrong names:

    op                      OneFlow <= 0.4                           0.5 inserts
    flow.nn.conv2d          (input, filters, strides, padding,       bias (5th)
                             data_format, dilations, groups, name)
    flow.matmul,            (a, b, transpose_a, transpose_b, name)   alpha (5th)
      flow.linalg.matmul
    flow.transpose          (a, perm, conjugate, name)               batch_axis_non_change (4th)
    flow.math.argmax        (input, name)                            axis (2nd)
    flow.math.top_k         (input, k, sorted, name)                 axis (2nd)
    flow.sort, argsort      (input, direction, name)                 axis (2nd)
    flow.math.tril          (x, diagonal, name)                      fill_value (3rd)
    flow.layers.upsample_2d (x, size, data_format, interpolation,    align_corners (3rd)
                             name)
    flow.data.OFRecordRawDecoder (input_blob, blob_name, shape,      truncate (6th)
                             dtype, dim1_varying_length,
                             auto_zero_padding, name)
    flow.get_variable       (..., random_seed, distribute, reuse)    nd_sbp (9th)
    flow.quantization.      (input, quantization_bit,                quantization_formula
      min_max_observer       quantization_scheme,                     (4th; in 0.4 already)
                             per_layer_quantization, name)
    flow.quantization.      (input, quantization_bit,                quantization_formula
      moving_average_min_    quantization_scheme, momentum, name)     (4th; in 0.4 already)
      max_observer
    flow.quantization.      (input, scale, zero_point,               quantization_formula
      fake_quantization      quantization_bit, quantization_scheme,   (6th; in 0.4 already)
                             name)
    flow.optimizer.LAMB,    (lr_scheduler, ..., loss_scale_factor,   weight_decay,
      LARS                   grad_clipping, train_step_lbn, ...)      weight_decay_includes,
                                                                      weight_decay_excludes
                                                                      (6th-8th; OneFlow <= 0.3)
    flow.image.batch_align  (images, shape, dtype, alignment, name)  dynamic_out (5th)
    flow.data.coco_reader   (..., stride_partition, name)            remove_images_without_
                                                                      annotations (8th; <= 0.3)

`two_generations` wraps the 0.5 function: where the two forms differ in the type of the
argument at a position (a string where 0.5 has a Blob, a bool or a number), that type
decides, and an old-form call is re-bound by the old parameter names. Calls by keyword
mean the same in both generations. (OFRecordRawDecoder with exactly six positional
arguments cannot be told apart: its sixth is `auto_zero_padding` or `truncate`, which
onnxjob treats alike; fake_quantization's sixth is a name unless it is one of the
formulas, "google" or "cambricon".) Signatures that only gained parameters at the end
(layers.batch_normalization's `*_name`s) need nothing. (conv1d/conv3d, the pools,
moments, layers.conv2d and layers.dense did not change.)

Some keywords were renamed too: `renamed_keywords` takes the old name as the new one
(flow.math.reduce_max / reduce_min / reduce_prod / two_stage_reduce_*'s `x` and
reduce_mean's `input_blob`, OneFlow <= 0.4's `input_tensor`; flow.watch / watch_diff's
`blob_watched`, now `blob`; flow.enable_eager_execution's `val`, now `value`).

One kernel computes differently too: Adam's with bias correction (Adam(do_bias_correction=
True), AdamW's, LazyAdam's). OneFlow <= 0.4 scaled the learning rate, lr_t = lr *
sqrt(1 - beta2**t) / (1 - beta1**t), and stepped w - lr_t * (m / (sqrt(v) + eps) + wd * w);
0.5 steps w - lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps) - lr * wd * w. Code that reaches
onnxjob as `import oneflow` (the alias's root) rather than 0.5's
`oneflow.compatible.single_client` (where 0.5 moved the lazy API) or `onnxjob` was
written for OneFlow <= 0.4 (`written_for_0_4`) and gets <= 0.4's update.
"""
import functools
import inspect
import sys
import traceback

from onnxjob.source_info import user_location, user_stack_frame


def written_for_0_4():
    """Whether the user's code calling onnxjob now (the innermost frame outside onnxjob)
    was written for OneFlow <= 0.4: its module holds the `oneflow` root of onnxjob's alias
    (compat/oneflow_alias.py: `import oneflow as flow`) and not onnxjob itself (0.5's
    `oneflow.compatible.single_client`, or `import onnxjob`). A module holding neither
    counts as <= 0.4 when the process imported `oneflow` through the alias and never
    `oneflow.compatible.single_client`."""
    package = sys.modules.get("onnxjob")     # (not imported here: it imports this module)
    frame = user_stack_frame()
    if frame is not None:
        values = list(frame.f_globals.values())
        if any(v is package for v in values):
            return False
        if any(type(v).__name__ == "_RootAlias" for v in values):
            return True
    root = sys.modules.get("oneflow")
    return type(root).__name__ == "_RootAlias" and \
        "oneflow.compatible.single_client" not in sys.modules


def print_deprecated(old, new):
    """Print OneFlow's warning that `old` (a path under its lazy API, e.g.
    "optimizer.PolynomialSchduler") will be removed for `new`, then the calling line of the
    user's code, as OneFlow's deprecated names did. The paths are spelled as the program
    imported OneFlow: `oneflow.` for OneFlow <= 0.4, `oneflow.compatible.single_client.`
    for 0.5."""
    root = "oneflow." if written_for_0_4() else "oneflow.compatible.single_client."
    print("WARNING:", root + old, "will be removed in the future, use {} instead.".format(
        root + new))
    frame = user_stack_frame()
    if frame is not None:
        print(traceback.format_stack(frame, limit=1)[0])


def two_generations(old_params, is_old):
    """Decorator: accept both OneFlow's <= 0.4 positional order `old_params` (names of the
    0.5 function's parameters) and the 0.5 order. `is_old(args)` looks at the positional
    arguments and says whether the call is in the old form."""
    def wrap(fn):
        params = inspect.signature(fn).parameters
        unknown = [p for p in old_params if p not in params]
        assert not unknown, f"{fn.__name__}: {unknown} are not parameters"

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not is_old(args):
                return fn(*args, **kwargs)
            if len(args) > len(old_params):
                raise TypeError(f"{user_location()}: {fn.__name__}() takes at most "
                                f"{len(old_params)} positional arguments in OneFlow <= 0.4 "
                                f"({', '.join(old_params)}), got {len(args)}")
            named = dict(zip(old_params, args))
            twice = sorted(set(named) & set(kwargs))
            if twice:
                raise TypeError(f"{user_location()}: {fn.__name__}() got multiple values for "
                                f"{', '.join(twice)} (OneFlow <= 0.4 order: "
                                f"{', '.join(old_params)})")
            return fn(**named, **kwargs)
        call.legacy_parameters = tuple(old_params)
        return call
    return wrap


def positional_is(index, types):
    """An `is_old` test: the positional argument at `index` is an instance of `types`
    (bools are not taken for numbers)."""
    def test(args):
        if len(args) <= index:
            return False
        value = args[index]
        if isinstance(value, bool) and bool not in _as_tuple(types):
            return False
        return isinstance(value, types)
    return test


def _as_tuple(types):
    return types if isinstance(types, tuple) else (types,)


def renamed_keywords(**old_to_new):
    """Decorator: accept OneFlow <= 0.4's keyword names (`old=new` pairs) for parameters
    0.5 renamed; giving both spellings is a TypeError naming the user's line."""
    def wrap(fn):
        params = inspect.signature(fn).parameters
        unknown = [new for new in old_to_new.values() if new not in params]
        assert not unknown, f"{fn.__name__}: {unknown} are not parameters"

        @functools.wraps(fn)
        def call(*args, **kwargs):
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{user_location()}: {fn.__name__}() got both {new}= "
                                        f"and {old}= (OneFlow <= 0.4's name for {new})")
                    kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)
        call.renamed_keywords = dict(old_to_new)
        return call
    return wrap
