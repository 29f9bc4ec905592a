"""The passes every job runs by default, per device, and their class names: the names
ONNXJOB_SKIP_PASSES takes (onnxjob/settings.py checks them here; the package's `__init__`
runs the pipeline, reading the settings)."""
from onnx_ir.passes import common

from .align_broadcast_ranks import AlignBroadcastRanks
from .batch_backward_casts import BatchBackwardCasts
from .batch_norm_row_statistics import BatchNormRowStatistics
from .batch_norm_statistics import BatchNormStatistics
from .fold_reshapes import FoldReshapes
from .fold_transpose_into_gemm import FoldTransposeIntoGemm
from .half_affine_pairs import HalfAffinePairs
from .half_column_sums import HalfColumnSums
from .keep_on_cuda import KeepOnCuda
from .mask_before_unpool import MaskBeforeMaxUnpool
from .pad_before_transpose import PadBeforeTranspose
from .sum_square_reductions import SumSquareReductions
from .recompute_cheap_values import RecomputeCheapValues
from .relu_mask_as_mul import ReluMaskAsMul
from .scatter_add_into_sum import ScatterAddIntoSum
from .separable_average_pools import SeparableAveragePools
from .share_batch_norm_centering import ShareBatchNormCentering
from .softmax_cross_entropy_rows import SoftmaxCrossEntropyRows
from .split_channel_reductions import SplitChannelReductions


def default_pipeline(device, mixed_precision=False):
    """The default passes, in order, for a job compiled for `device` ("cpu" or "cuda"),
    `mixed_precision` when AutoMixedPrecision runs after them."""
    return [
        FoldReshapes(),
        SeparableAveragePools(),
        # (first: it matches the batch norm's mean before SplitChannelReductions splits it;
        # in float32 only, see its docstring)
        *([ShareBatchNormCentering()] if device == "cuda" and not mixed_precision else []),
        # (under mixed precision it takes the batch norm's statistics and gradient sums in
        # its stead, also before the reductions it matches are rewritten)
        *([BatchNormRowStatistics()] if device == "cuda" and mixed_precision else []),
        FoldTransposeIntoGemm(),
        MaskBeforeMaxUnpool(),
        SoftmaxCrossEntropyRows(),
        ScatterAddIntoSum(),
        # (before SplitChannelReductions splits the mean it matches; after
        # BatchNormStatistics, which matches the batch norm's mean of a square itself)
        *([SumSquareReductions(), KeepOnCuda(), SplitChannelReductions(),
           PadBeforeTranspose()]
          if device == "cuda" else
          [ReluMaskAsMul(), BatchNormStatistics(), SumSquareReductions()]),
        AlignBroadcastRanks(),
        # (again: the rewrites above leave reshapes of reshapes, which another round of
        # the whole pipeline would otherwise be run for)
        FoldReshapes(),
        # (equal constants made by separate rewrites, the batch norm's epsilon in its
        # forward and backward, become one, so that CSE merges what computes from them)
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass(),
        common.TopologicalSortPass(),
    ]


def final_passes(device=None, mixed_precision=False):
    """Passes that run once after everything else (mixed precision included): they read
    AutoMixedPrecision's result (HalfColumnSums, HalfAffinePairs: CUDA jobs) or plan the
    step's memory, which CSE would undo (passes/recompute_cheap_values.py);
    BatchBackwardCasts after the passes that make half per-channel parameters."""
    return [*([HalfColumnSums(), HalfAffinePairs(), BatchBackwardCasts()]
              if device == "cuda" and mixed_precision else []),
            RecomputeCheapValues()]


def default_pass_names():
    """Class names of the default passes on any device (what ONNXJOB_SKIP_PASSES takes)."""
    return sorted({type(p).__name__ for device in ("cpu", "cuda") for amp in (False, True)
                   for p in default_pipeline(device, amp) + final_passes(device, amp)})
