"""The collectives of runtime/distributed.py on torch tensors, left where they are: on the
GPU for the device-resident step (NCCL, or gloo's CUDA tensors; runtime/value_paths.py),
on the CPU where tests prove that path against the NumPy one.

The buckets and the math are the NumPy versions': one flat bucket per dtype (torch.cat,
the copy that np.concatenate makes there), float32 sent as float16 with `half`, a mean
divided after the sum, the results views of the bucket in the inputs' shapes.
"""
from onnxjob.runtime import distributed


def _torch_dist():
    return distributed._torch_distributed()


def _by_dtype(tensors):
    """{dtype: (indices of `tensors` with it, their values as one flat tensor)}."""
    torch, _ = _torch_dist()
    indices = {}
    for i, tensor in enumerate(tensors):
        indices.setdefault(tensor.dtype, []).append(i)
    return {dtype: (where, torch.cat([tensors[i].reshape(-1) for i in where]))
            for dtype, where in indices.items()}


def _unflatten(flat, tensors, where, out, lead=()):
    """Cut `flat` (with leading axes `lead`) back into the shapes of tensors[i], i in where."""
    offset = 0
    for i in where:
        n = tensors[i].numel()
        out[i] = flat[..., offset:offset + n].reshape(lead + tuple(tensors[i].shape))
        offset += n


def total_async(tensors, mean=False, half=False):
    """Start the all-reduce of each tensor's sum over the ranks (one per dtype; with
    `mean`, the mean) and return a function that waits for it and returns the tensors.
    With `half`, float32 travels as float16 (function_config.all_reduce_fp16)."""
    torch, dist = _torch_dist()
    size = distributed.world()[1]
    started = []
    for dtype, (where, bucket) in _by_dtype(tensors).items():
        if half and dtype == torch.float32:
            bucket = bucket.half()
        with distributed._collective("an all-reduce"):
            started.append((dtype, where, bucket, dist.all_reduce(bucket, async_op=True)))

    def wait():
        out = [None] * len(tensors)
        for dtype, where, bucket, work in started:
            with distributed._collective("an all-reduce"):
                # NOTE: on CUDA this orders torch's current stream after the collective;
                # the host goes on (value_paths.py synchronizes before onnxruntime reads)
                work.wait()
            summed = bucket.to(dtype)
            if mean:
                summed = (summed / size if summed.is_floating_point()
                          else torch.div(summed, size, rounding_mode="trunc"))
            _unflatten(summed, tensors, where, out)
        return out
    return wait


def all_gather_async(tensors):
    """Start gathering each tensor as every rank has it (one collective per dtype) and
    return a function that waits for it and returns them: shape (world size,) + the
    tensor's shape, rank r's at [r]."""
    torch, dist = _torch_dist()
    size = distributed.world()[1]
    started = []
    for _, (where, flat) in _by_dtype(tensors).items():
        parts = [torch.empty_like(flat) for _ in range(size)]
        with distributed._collective("an all-gather"):
            started.append((where, flat, parts, dist.all_gather(parts, flat, async_op=True)))

    def wait():
        out = [None] * len(tensors)
        for where, _, parts, work in started:
            with distributed._collective("an all-gather"):
                work.wait()
            _unflatten(torch.stack(parts), tensors, where, out, lead=(size,))
        return out
    return wait
