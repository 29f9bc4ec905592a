"""The gradient all-reduce's time per data-parallel step, for bench_data_parallel.py.

`install()`, before the session starts, wraps the step's bucketed all-reduce on both paths
(runtime/value_paths.py: NumPy arrays over gloo on the CPU, device tensors over NCCL or
gloo on CUDA); call `step_done()` after each step and `report(skip)` at the end, on every
rank (it runs collectives). Two numbers per step:

- exposed: how long the step waits for its buckets after part A's last stage, until the
  sums are there (on CUDA torch's streams are synchronized in the wait: the time the
  all-reduce was not hidden behind the backward stages);
- alone: the step's buckets (same sizes, dtypes, float16 where all_reduce_fp16 sends
  them) all-reduced again after the run, one at a time, each synchronized (median of
  repeats): the all-reduce's own cost, hidden or not.
"""
import statistics
import time

import numpy as np

from onnxjob.runtime import distributed, value_paths

_steps = []         # per step: {"buckets": [(numel, torch dtype, device)], "exposed": s}
_current = {"buckets": [], "exposed": 0.0}


def _synchronize():
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _describe(values, half):
    """[(numel, torch dtype, device)]: one bucket per dtype, as total_async makes them."""
    import torch
    buckets = {}
    for value in values:
        if isinstance(value, np.ndarray):
            dtype, numel = torch.from_numpy(np.empty(0, value.dtype)).dtype, value.size
            device = distributed._group["tensors_on"]
        else:
            dtype, numel, device = value.dtype, value.numel(), value.device
        total, _ = buckets.get(dtype, (0, device))
        buckets[dtype] = (total + numel, device)
    return [(numel, torch.float16 if half and dtype == torch.float32 else dtype, device)
            for dtype, (numel, device) in buckets.items()]


def _timed(total_async):
    def timed(values, mean=False, half=False):
        wait = total_async(values, mean, half)
        _current["buckets"].extend(_describe(values, half))

        def timed_wait():
            start = time.perf_counter()
            out = wait()
            _synchronize()
            _current["exposed"] += time.perf_counter() - start
            return out
        return timed_wait
    return timed


def install():
    """Wrap both paths' gradient all-reduce (before the session starts)."""
    for path in (value_paths.HostPath, value_paths.DevicePath):
        path.total_async = staticmethod(_timed(path.total_async))


def step_done():
    _steps.append(dict(_current))
    _current.update(buckets=[], exposed=0.0)


def report(skip, repeats=10):
    """{"exposed_s", "alone_s", "bytes", "buckets", "backend"} per step (medians over the
    steps after the first `skip`); collective: every rank calls it."""
    import torch
    _, dist = distributed._torch_distributed()
    steps = _steps[skip:]
    buckets = steps[-1]["buckets"]
    alone = []
    for _ in range(repeats):
        total = 0.0
        for numel, dtype, device in buckets:
            tensor = torch.ones(numel, dtype=dtype, device=device)
            _synchronize()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            _synchronize()
            total += time.perf_counter() - start
        alone.append(total)
    return {"exposed_s": statistics.median(s["exposed"] for s in steps),
            "alone_s": statistics.median(alone),
            "bytes": sum(n * torch.empty(0, dtype=d).element_size() for n, d, _ in buckets),
            "buckets": len(buckets), "backend": distributed._group["backend"]}
