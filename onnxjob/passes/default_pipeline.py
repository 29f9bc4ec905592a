"""The passes every job runs by default, per device, and their class names: the names
ONNXJOB_SKIP_PASSES takes (onnxjob/settings.py checks them here; the package's `__init__`
runs the pipeline, reading the settings)."""
from onnx_ir.passes import common

from .align_broadcast_ranks import AlignBroadcastRanks
from .batch_norm_statistics import BatchNormStatistics
from .fold_reshapes import FoldReshapes
from .fold_transpose_into_gemm import FoldTransposeIntoGemm
from .keep_on_cuda import KeepOnCuda
from .mask_before_unpool import MaskBeforeMaxUnpool
from .sum_square_reductions import SumSquareReductions
from .recompute_cheap_values import RecomputeCheapValues
from .relu_mask_as_mul import ReluMaskAsMul
from .split_channel_reductions import SplitChannelReductions


def default_pipeline(device):
    """The default passes, in order, for a job compiled for `device` ("cpu" or "cuda")."""
    return [
        FoldReshapes(),
        FoldTransposeIntoGemm(),
        MaskBeforeMaxUnpool(),
        # (before SplitChannelReductions splits the mean it matches; after
        # BatchNormStatistics, which matches the batch norm's mean of a square itself)
        *([SumSquareReductions(), KeepOnCuda(), SplitChannelReductions()]
          if device == "cuda" else
          [ReluMaskAsMul(), BatchNormStatistics(), SumSquareReductions()]),
        AlignBroadcastRanks(),
        common.CommonSubexpressionEliminationPass(),
        common.RemoveUnusedNodesPass(),
        common.TopologicalSortPass(),
    ]


def final_passes():
    """Passes that run once after everything else (mixed precision included): they plan
    the step's memory, which CSE would undo (passes/recompute_cheap_values.py)."""
    return [RecomputeCheapValues()]


def default_pass_names():
    """Class names of the default passes on any device (what ONNXJOB_SKIP_PASSES takes)."""
    return sorted({type(p).__name__ for device in ("cpu", "cuda")
                   for p in default_pipeline(device) + final_passes()})
