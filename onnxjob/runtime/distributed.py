"""Data-parallel training over `torch.distributed` (the optional extra
`pip install onnxjob[distributed]`); onnxjob has no communication layer of its own.

A process is one rank when the launcher's environment says so: `torchrun` or
`python -m onnxjob run --nproc N script.py` set RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Then:

- a train job is traced at its placeholders' shapes, the whole (logical) batch B, as on one
  device; the caller passes the whole batch on every rank, as OneFlow's consistent view
  takes it, and rank r feeds rows [r * B/W, (r + 1) * B/W) (B must divide by the world
  size W) to the graph split for its share (graph/split_batch.py);
- the step is the one train graph cut at the gradients (runtime/data_parallel.py):
  forward + backward (one onnxruntime session, or stages where collectives exchange
  statistics: runtime/staged.py), then the gradients summed across ranks in one flat
  bucket per dtype (all_reduce), then the optimizer's update (a second session);
- the variables start equal everywhere (broadcast from rank 0 when the session starts), and
  stay equal, since every rank applies the same summed gradients;
- a step's outputs come back as the whole batch's: split outputs (per-example values)
  gathered in rank order, partial means (a mean loss) averaged, partial sums summed;
- checkpoints are written by rank 0 only; every rank waits for the write.

Batch norm normalizes with the whole batch's statistics (synchronized batch norm, as
PyTorch's SyncBatchNorm; graph/primitives/batch_norm.py), so a model with batch norm
trains as one process on the whole batch would; ONNXJOB_SYNC_BATCH_NORM=0 normalizes each
rank's share with its own statistics instead (fewer collectives; DDP without
SyncBatchNorm).

The process group: gloo on the CPU; on CUDA (the session's device, `use_device`) each rank
is bound to its GPU (LOCAL_RANK modulo the GPUs it sees, for torch and for onnxruntime's
CUDA EP) and the group is NCCL, or gloo with CUDA tensors where NCCL cannot run (ranks
sharing a GPU, a torch without NCCL). The NumPy collectives below copy through that
device; the step's gradients and synchronized statistics on CUDA stay on the GPU
(runtime/tensor_collectives.py, runtime/value_paths.py).
"""
import contextlib
import datetime
import functools
import os
import secrets
import sys

import numpy as np

from onnxjob import settings
from onnxjob.errors import TraceError
from onnxjob.runtime import backend

# internal, for tests (no public setting): a world of one rank also runs the data-parallel
# step (split graph, gradient buckets, all-reduce), to compare it with a plain session
# (tests/test_dlpack_path.py; tests/test_distributed_cuda.py: NCCL at world size 1)
STEP_AT_WORLD_SIZE_1 = False

# the session's device ("cpu" or "cuda", use_device) and, once the group is made, its
# backend and the device the NumPy collectives' tensors go through
_group = {"device": "cpu", "backend": None, "tensors_on": "cpu"}


class StalledRankError(RuntimeError):
    """A collective waited longer than ONNXJOB_DIST_TIMEOUT for the other ranks."""


class LostRankError(RuntimeError):
    """Another rank's process ended (crashed, killed) while this one was in a collective."""


# what gloo says when the peer's process is gone
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
              "Connection refused")


def _timeout_s():
    return settings.get("DIST_TIMEOUT")


@contextlib.contextmanager
def _collective(what):
    """Turn gloo's timeout into an error that says which rank waited, in what, how long
    (the launcher names the rank that never came: onnxjob/launch.py)."""
    try:
        yield
    except RuntimeError as e:
        rank, size = world()
        gone = next((phrase for phrase in _PEER_GONE if phrase in str(e)), None)
        if gone is not None:
            raise LostRankError(
                f"rank {rank} of {size}: another rank's process ended during {what} (gloo: "
                f"{gone}); the launcher names it") from e
        if "Timed out" not in str(e) and "timed out" not in str(e):
            raise
        raise StalledRankError(
            f"rank {rank} of {size} waited {_timeout_s():g} s (ONNXJOB_DIST_TIMEOUT) in {what} "
            "for the other ranks: one of them stalled or died before reaching it") from e


def world():
    """(rank, world size) from the launcher's environment; (0, 1) outside one."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def enabled():
    return world()[1] > 1 or STEP_AT_WORLD_SIZE_1


def _import_torch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise ImportError("data-parallel training (WORLD_SIZE > 1) runs on torch.distributed: "
                          "pip install 'onnxjob[distributed]'") from None
    return torch, dist


def local_rank():
    """This rank's index on its machine (LOCAL_RANK; RANK where a launcher set none)."""
    return int(os.environ.get("LOCAL_RANK", world()[0]))


def use_device(device):
    """The session starts with its jobs on `device` ("cpu" or "cuda"), before any
    collective. On CUDA this rank is bound to its GPU: LOCAL_RANK modulo the GPUs it sees
    (more ranks than GPUs share them), for torch and for onnxruntime's sessions and
    variables (backend.use_cuda_device)."""
    _group["device"] = device
    if device != "cuda":
        return
    torch, _ = _import_torch()
    if not torch.cuda.is_available():
        raise RuntimeError(
            "data-parallel training on the GPU (onnxruntime runs the jobs on CUDA) hands the "
            "gradients to torch.distributed on the GPU, but this torch has no CUDA "
            f"(torch {torch.__version__}, torch.cuda.is_available() is False): install a CUDA "
            "build of torch, or set ONNXJOB_DEVICE=cpu to train on CPU ranks")
    gpu = local_rank() % torch.cuda.device_count()
    torch.cuda.set_device(gpu)
    backend.use_cuda_device(gpu)


def _backend_name(torch, dist):
    """(torch.distributed backend, why it is not NCCL or None) for this rank's device."""
    if _group["device"] != "cuda":
        return "gloo", None
    if not dist.is_nccl_available():
        return "gloo", "this torch has no NCCL"
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world()[1]))
    gpus = torch.cuda.device_count()
    if local_size > gpus:
        # NCCL refuses two ranks of one group on one GPU ("Duplicate GPU detected")
        return "gloo", f"{local_size} ranks on this machine share its {gpus} GPU(s)"
    return "nccl", None


@functools.lru_cache(maxsize=None)
def _torch_distributed():
    torch, dist = _import_torch()
    if not dist.is_initialized():
        name, why_not_nccl = _backend_name(torch, dist)
        if why_not_nccl is not None and world()[0] == 0:
            print(f"onnxjob: the ranks all-reduce on the GPU with gloo's CUDA tensors, not "
                  f"NCCL: {why_not_nccl}", file=sys.stderr)
        dist.init_process_group(name, timeout=datetime.timedelta(seconds=_timeout_s()))
    name = dist.get_backend()
    _group["backend"] = name
    # NCCL takes CUDA tensors only; gloo takes CPU tensors (and CUDA ones)
    _group["tensors_on"] = (torch.device("cuda", torch.cuda.current_device())
                            if name == "nccl" else torch.device("cpu"))
    return torch, dist


def _tensor(array):
    """A torch tensor of `array` on the device the NumPy collectives go through (the
    array's own memory on the CPU)."""
    torch, _ = _torch_distributed()
    return torch.from_numpy(array).to(_group["tensors_on"])


def shutdown():
    """Leave the process group (the session closes): gloo's threads must be stopped before
    the interpreter exits, or the C++ runtime may abort the process ("terminate called
    without an active exception"). No barrier: a rank that failed must not wait here."""
    if not _torch_distributed.cache_info().currsize:
        return
    _, dist = _torch_distributed()
    if dist.is_initialized():
        dist.destroy_process_group()
    _torch_distributed.cache_clear()
    _group.update(backend=None, tensors_on="cpu")


def broadcast_from_rank0(arrays):
    """{name: array} as rank 0 has it, on every rank (one broadcast per array)."""
    torch, dist = _torch_distributed()
    out = {}
    for name, array in arrays.items():
        tensor = _tensor(np.asarray(array, order="C").copy())
        with _collective("the broadcast of the initial variables"):
            dist.broadcast(tensor, src=0)
        out[name] = tensor.cpu().numpy()
    return out


def shared_seed():
    """A random 62-bit number, the same on every rank (rank 0's draw)."""
    drawn = np.array([secrets.randbits(62)], np.int64)
    return int(broadcast_from_rank0({"seed": drawn})["seed"][0])


def _by_dtype(arrays):
    """{dtype: (indices of `arrays` with it, their values as one flat array)}: one bucket
    per dtype, one collective per bucket (as DDP's buckets)."""
    indices = {}
    for i, array in enumerate(arrays):
        indices.setdefault(np.dtype(array.dtype), []).append(i)
    return {dtype: (where, np.concatenate([np.ravel(arrays[i]) for i in where]))
            for dtype, where in indices.items()}


def _unflatten(flat, arrays, where, out, lead=()):
    """Cut `flat` (with leading axes `lead`) back into the shapes of arrays[i], i in where."""
    offset = 0
    for i in where:
        n = arrays[i].size
        out[i] = flat[..., offset:offset + n].reshape(lead + arrays[i].shape)
        offset += n


def total(arrays, mean=False):
    """The element-wise sum over the ranks of each array (with `mean`, the mean)."""
    return total_async(arrays, mean)()


def total_async(arrays, mean=False, half=False):
    """Start the all-reduce of `total` (one per dtype) and return a function that waits
    for it and returns the arrays. With `half`, float32 arrays travel as float16
    (function_config.all_reduce_fp16: half the traffic, float16's precision and range)."""
    torch, dist = _torch_distributed()
    size = world()[1]
    started = []
    for dtype, (where, flat) in _by_dtype(arrays).items():
        bucket = _tensor(flat)
        if half and dtype == np.float32:
            bucket = bucket.half()
        with _collective("an all-reduce"):
            started.append((dtype, where, bucket, dist.all_reduce(bucket, async_op=True)))

    def wait():
        out = [None] * len(arrays)
        for dtype, where, bucket, work in started:
            with _collective("an all-reduce"):
                work.wait()
            summed = bucket.cpu().numpy().astype(dtype, copy=False)
            if mean:
                summed = (summed / dtype.type(size)).astype(dtype, copy=False)
            _unflatten(summed, arrays, where, out)
        return out
    return wait


def all_gather(arrays):
    """Each array as every rank has it: shape (world size,) + its shape, rank r's at [r]."""
    return all_gather_async(arrays)()


def all_gather_async(arrays):
    """Start `all_gather` (one collective per dtype) and return a function that waits for
    it and returns the gathered arrays (runtime/staged.py computes while it travels)."""
    torch, dist = _torch_distributed()
    size = world()[1]
    started = []
    for _, (where, flat) in _by_dtype(arrays).items():
        mine = _tensor(flat)        # (flat is a copy: the caller may reuse its arrays)
        parts = [torch.empty_like(mine) for _ in range(size)]
        with _collective("an all-gather"):
            started.append((where, mine, parts, dist.all_gather(parts, mine, async_op=True)))

    def wait():
        out = [None] * len(arrays)
        for where, _, parts, work in started:
            with _collective("an all-gather"):
                work.wait()
            _unflatten(torch.stack(parts).cpu().numpy(), arrays, where, out, lead=(size,))
        return out
    return wait


def all_gather_objects(value):
    """[rank 0's value, rank 1's, ...] of a picklable `value` (arrays of any shape)."""
    _, dist = _torch_distributed()
    out = [None] * world()[1]
    with _collective("an all-gather"):
        dist.all_gather_object(out, value)
    return out


def gather_split(array, axis, inner, batch):
    """The whole value of a step output split over the ranks along `axis`
    (graph/split_batch.py's Split: the axis holds outer x batch x inner elements of which
    this rank has outer x batch/W x inner), from every rank's part."""
    array = np.asarray(array, order="C")
    gathered = all_gather([array])[0]                   # (W,) + local shape
    size = gathered.shape[0]
    outer = array.shape[axis] * size // (batch * inner)
    atoms = gathered.reshape((size,) + array.shape[:axis] + (outer, batch // size, inner) +
                             array.shape[axis + 1:])
    # move the rank axis next to its rows: (..., outer, W, rows, inner, ...)
    atoms = np.moveaxis(atoms, 0, axis + 1)
    shape = list(array.shape)
    shape[axis] *= size
    return atoms.reshape(shape)


def barrier():
    with _collective("a barrier"):
        _torch_distributed()[1].barrier()


def local_rows(array, micro_batches=1):
    """This rank's share of a global batch (rows along the first axis). Split in
    `micro_batches` equal parts (gradient accumulation), this rank's share of each part,
    concatenated: the rank's k-th micro-batch is its share of the batch's k-th, so that the
    ranks together step as one process does on the whole batch."""
    rank, size = world()
    if micro_batches > 1 and array.ndim and array.shape[0] % (micro_batches * size) == 0:
        return np.concatenate([local_rows(part) for part in np.split(array, micro_batches)])
    share = array.shape[0] // size
    return array[rank * share:(rank + 1) * share]


def local_batch(shape, where):
    """A placeholder's shape on this rank: the batch axis divided by the world size."""
    size = world()[1]
    if not shape or shape[0] % size:
        # a TraceError (a ValueError) names the user's line that called the job
        raise TraceError(f"{where}: a train job's batch axis must divide by the world size "
                         f"{size} for data-parallel training, got shape {tuple(shape)}")
    return (shape[0] // size,) + tuple(shape[1:])
