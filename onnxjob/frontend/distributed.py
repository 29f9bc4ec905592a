"""`flow.distributed`: this process's place among the ranks of
`python -m onnxjob run --nproc N` (runtime/distributed.py); rank 0 of 1 otherwise."""
import os

from onnxjob.errors import missing_api
from onnxjob.runtime import distributed as _runtime


def get_rank():
    """The rank of this process (0 outside a multi-rank launch)."""
    return _runtime.world()[0]


def get_world_size():
    """The number of ranks (1 outside a multi-rank launch)."""
    return _runtime.world()[1]


def get_local_rank():
    """The rank of this process on this machine (LOCAL_RANK, set by the launcher)."""
    return int(os.environ.get("LOCAL_RANK", get_rank()))


def is_multi_client():
    """Whether every rank runs the script itself (OneFlow's multi-client mode): True under
    a launch of several ranks, False for a single process (OneFlow's single client)."""
    return get_world_size() > 1


__getattr__ = missing_api("flow.distributed")
