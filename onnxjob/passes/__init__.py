"""Graph passes run over every job's onnx_ir model before it is emitted.

The default pipeline runs to a fixed point through `onnx_ir.passes.PassManager`. Users add
passes with `function_config.passes([MyPass()])` or `register_pass(MyPass)` (every job),
and turn the pipeline off with `function_config.disable_passes(True)` or
`ONNXJOB_DISABLE_PASSES=1` for debugging.
"""
import collections
import logging
import os

import onnx_ir as ir
import onnx_ir.passes as ir_passes
from onnx_ir.passes import common

from onnxjob import settings

# onnx_ir's passes log each job's bookkeeping at INFO ("Removed 11 unused nodes"): a
# program that sets its own logging to INFO would print it among its lines, where OneFlow
# printed nothing. Unless someone set that logger's level, only its warnings pass.
_PASS_LOGGER = logging.getLogger("onnx_ir.passes")
if _PASS_LOGGER.level == logging.NOTSET:
    _PASS_LOGGER.setLevel(logging.WARNING)

from .align_broadcast_ranks import AlignBroadcastRanks
from .auto_mixed_precision import AutoMixedPrecision
from .batch_backward_casts import BatchBackwardCasts
from .batch_norm_row_statistics import BatchNormRowStatistics
from .batch_norm_statistics import BatchNormStatistics
from .default_pipeline import default_pass_names, default_pipeline, final_passes
from .fold_reshapes import FoldReshapes
from .fold_transpose_into_gemm import FoldTransposeIntoGemm
from .half_affine_pairs import HalfAffinePairs
from .half_column_sums import HalfColumnSums
from .keep_on_cuda import KeepOnCuda
from .mask_before_unpool import MaskBeforeMaxUnpool
from .pad_before_transpose import PadBeforeTranspose
from .recompute_cheap_values import RecomputeCheapValues
from .relu_mask_as_mul import ReluMaskAsMul
from .scatter_add_into_sum import ScatterAddIntoSum
from .separable_average_pools import SeparableAveragePools
from .share_batch_norm_centering import ShareBatchNormCentering
from .share_casts_through_views import ShareCastsThroughViews
from .softmax_cross_entropy_rows import SoftmaxCrossEntropyRows
from .split_channel_reductions import SplitChannelReductions
from .sum_square_reductions import SumSquareReductions

_REGISTERED = []


def register_pass(pass_factory):
    """Run `pass_factory()` (an onnx_ir PassBase) on every job after the default passes."""
    _REGISTERED.append(pass_factory)
    return pass_factory


def default_passes(device=None, mixed_precision=False):
    """The pipeline every job runs (each pass: one module, rewrite cases in its docstring);
    jobs compiled for `device="cuda"` also run KeepOnCuda, SplitChannelReductions and
    PadBeforeTranspose (and ShareBatchNormCentering unless `mixed_precision`), the others
    ReluMaskAsMul and BatchNormStatistics.

    `ONNXJOB_SKIP_PASSES=Name,Name` leaves those passes out (by class name), to measure
    or debug one pass at a time (a name that is no default pass raises SettingsError).
    """
    skip = set(settings.get("SKIP_PASSES"))
    return [p for p in default_pipeline(device, mixed_precision)
            if type(p).__name__ not in skip]


def _final_stage(device=None, mixed_precision=False):
    """The final passes not skipped (ONNXJOB_SKIP_PASSES) and the clean-up after them,
    or None."""
    skip = set(settings.get("SKIP_PASSES"))
    passes = [p for p in final_passes(device, mixed_precision)
              if type(p).__name__ not in skip]
    if not passes:
        return None
    return ir_passes.PassManager(passes + [common.RemoveUnusedNodesPass()], steps=1)


def build_pipeline(config=None, device=None):
    extra = list(config.get("passes", []) if config is not None else [])
    extra += [factory() for factory in _REGISTERED]
    passes = default_passes(device, mixed_precision_type(config) is not None)
    return ir_passes.PassManager(passes + extra, steps=4, early_stop=True)


def has_user_passes(config=None):
    """Whether the pipeline for `config` runs passes beyond the default ones."""
    return bool(_REGISTERED or (config is not None and config.get("passes")))


def dump_folder(config=None):
    """Where the pipeline for `config` writes its graphs (`function_config.dump_passes`,
    else ONNXJOB_DUMP_PASSES), or None."""
    return (config.get("dump_passes") if config is not None else None) or \
        settings.get("DUMP_PASSES")


def mixed_precision_type(config=None):
    """The half type a job computes in (`function_config.enable_auto_mixed_precision(True)`,
    `mixed_precision_data_type(...)`: ir.DataType.FLOAT16 by default, or BFLOAT16), or None
    when the job runs in float32."""
    if config is None or not config.get("enable_auto_mixed_precision", False):
        return None
    name = str(config.get("mixed_precision_data_type", "float16"))
    return ir.DataType.BFLOAT16 if name == "bfloat16" else ir.DataType.FLOAT16


def _mixed_precision_stage(half):
    """AMP and the clean-up after it, run once (not to a fixed point: it is not idempotent)."""
    return ir_passes.PassManager([
        AutoMixedPrecision(half),
        ShareCastsThroughViews(),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass(),
        common.TopologicalSortPass(),
    ], steps=1)


def passes_disabled(config=None):
    """Whether the pipeline is off (ONNXJOB_DISABLE_PASSES, or function_config.disable_passes)."""
    if settings.get("DISABLE_PASSES"):
        return True
    return bool(config is not None and config.get("disable_passes", False))


def run_default_pipeline(model, config=None, device=None):
    """Run the pipeline in place on `model` (compiled for `device`, "cpu" or "cuda"),
    then AutoMixedPrecision when the job asks for it; returns the last PassResult (or None
    if disabled).

    With `function_config.dump_passes(dir)` (or `ONNXJOB_DUMP_PASSES=dir`) the graph is
    written before and after as `<dir>/<job>.before.onnx` / `.after.onnx` and the node
    counts per op are printed.
    """
    half = mixed_precision_type(config)
    amp = _mixed_precision_stage(half) if half is not None else None
    if passes_disabled(config):
        # mixed precision changes the numbers: it is what the user asked for, not an
        # optimization, so it runs with the other passes off too
        return amp(model) if amp is not None else None
    dump_dir = dump_folder(config)
    before = op_counts(model) if dump_dir else None
    if dump_dir:
        _save(model, dump_dir, "before")
    result = build_pipeline(config, device)(model)
    for stage in (amp, _final_stage(device, half is not None)):
        if stage is not None:
            result = ir_passes.PassResult(model, stage(model).modified or result.modified)
    if dump_dir:
        _save(model, dump_dir, "after")
        print(format_op_count_diff(model.graph.name, before, op_counts(model)))
    return result


def _save(model, directory, stage):
    os.makedirs(directory, exist_ok=True)
    ir.save(model, os.path.join(directory, f"{model.graph.name}.{stage}.onnx"))


def format_op_count_diff(title, before, after):
    """A table of node counts per op type before and after the passes."""
    lines = [f"passes on {title}: {sum(before.values())} -> {sum(after.values())} nodes"]
    for op in sorted(set(before) | set(after)):
        b, a = before.get(op, 0), after.get(op, 0)
        if a != b:
            lines.append(f"  {op:24s} {b:4d} -> {a:4d}")
    return "\n".join(lines)


def op_counts(model):
    """{op_type: count} of a model's main graph, for looking at what passes did."""
    return dict(collections.Counter(node.op_type for node in model.graph))


__all__ = ["AlignBroadcastRanks", "AutoMixedPrecision", "BatchBackwardCasts",
           "BatchNormRowStatistics",
           "BatchNormStatistics", "FoldReshapes",
           "FoldTransposeIntoGemm", "HalfAffinePairs", "HalfColumnSums", "KeepOnCuda",
           "MaskBeforeMaxUnpool",
           "PadBeforeTranspose", "RecomputeCheapValues", "ReluMaskAsMul",
           "ScatterAddIntoSum", "SeparableAveragePools",
           "ShareBatchNormCentering", "ShareCastsThroughViews", "SoftmaxCrossEntropyRows",
           "SplitChannelReductions", "SumSquareReductions",
           "build_pipeline", "default_pass_names", "default_passes", "dump_folder",
           "format_op_count_diff", "has_user_passes", "mixed_precision_type", "op_counts",
           "register_pass", "run_default_pipeline"]
