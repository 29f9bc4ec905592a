"""`flow.data.onerec_reader` and `OneRecDecoder` (onerec_decoder): OneRec files
(io/onerec.py) read on the host, features decoded to fixed-shape blobs as OneFlow's
onerec_decoder kernel does."""
import math

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.io import onerec
from onnxjob.io.ofrecord import RecordError, RecordReader
from onnxjob.ops.host import TENSOR_BUFFER, check_host_value, encoded_items, host_value, to_blob
from onnxjob.ops.random import gen_seed


def onerec_reader(files, batch_size=1, random_shuffle=False, shuffle_mode="instance",
                  shuffle_buffer_size=1024, shuffle_after_epoch=False, verify_example=True,
                  name=None):
    """Batches of `batch_size` OneRec examples from `files` (read in order, again from the
    first at the end; shuffle_after_epoch shuffles the file order each epoch), as a tensor
    buffer of payloads for OneRecDecoder. random_shuffle swaps each example ("instance")
    or each batch ("batch") with a random one of a buffer of shuffle_buffer_size, filled
    first. Every frame's digests are checked."""
    api = "flow.data.onerec_reader"
    if not isinstance(files, (list, tuple)) or not files:
        raise TraceError(f"{api}: files must be a non-empty list of paths, got {files!r}")
    if random_shuffle and shuffle_mode not in ("instance", "batch"):
        raise TraceError(f"{api}: shuffle_mode must be \"instance\" or \"batch\", got "
                         f"{shuffle_mode!r}")
    seed = gen_seed()[0] % 2 ** 63
    by_batch = random_shuffle and shuffle_mode == "batch"
    try:
        reader = RecordReader(list(files), batch_size, random_shuffle and not by_batch,
                              shuffle_buffer_size, shuffle_after_epoch, seed=seed,
                              iterate=onerec.iter_frames, kind="OneRec")
    except RecordError as e:
        raise TraceError(f"{api}: {e}") from None
    next_batch = reader.next_batch
    if by_batch:
        rng = np.random.default_rng(seed)
        buffer = [reader.next_batch() for _ in range(shuffle_buffer_size)]

        def next_batch():
            batch, j = reader.next_batch(), int(rng.integers(len(buffer)))
            buffer[j], batch = batch, buffer[j]
            return batch
    return host_value(name or "OneRecReader", next_batch, [], batch_size, TENSOR_BUFFER, api)


def _instance_dims(where, tensor, rank, reshape):
    """The dims of one record's tensor (after `reshape`, whose one -1 is inferred)."""
    if reshape is None:
        if len(tensor.shape) != rank:
            raise RecordError(f"{where}: the feature has shape {tuple(tensor.shape)}, not "
                              f"{rank} dims")
        return [int(d) for d in tensor.shape]
    count = math.prod(int(d) for d in tensor.shape)
    known = math.prod(d for d in reshape if d > 0)
    if (-1 in reshape and count % known) or (-1 not in reshape and count != known):
        raise RecordError(f"{where}: {count} values do not fit reshape {tuple(reshape)}")
    return [count // known if d == -1 else d for d in reshape]


def OneRecDecoder(input_blob, key, dtype, shape, is_dynamic=False, reshape=None,
                  batch_padding=None, name=None):
    """Feature `key` of each example as a (batch, *shape) blob of `dtype` (int8, int32,
    int64, float32 or float64: the feature's own type). `reshape` reads each tensor in
    another shape (one -1 inferred); `batch_padding` (its first entry; the others 0) pads
    the first axis with zeros: 0 needs equal sizes, -1 pads to the batch's largest, n > 0
    to n. All other dims must agree across the batch and equal `shape`; with is_dynamic
    they may be smaller, as in OneFlow: the blob is dynamic, (batch, *the batch's own
    dims) each run, at most (batch, *shape) (read it with tp.ListNumpy)."""
    api = "flow.data.OneRecDecoder"
    check_host_value(input_blob, api, TENSOR_BUFFER)
    np_dtype = dtypes.to_numpy(dtype)
    if np.dtype(np_dtype) not in {np.dtype(t) for t in
                                  (np.int8, np.int32, np.int64, np.float32, np.float64)}:
        raise TraceError(f"{api}: dtype must be int8, int32, int64, float32 or float64, got "
                         f"{dtype!r}")
    shape = tuple(int(d) for d in shape)
    for label, value in (("reshape", reshape), ("batch_padding", batch_padding)):
        if value is not None and len(value) != len(shape):
            raise TraceError(f"{api}: {label} must have {len(shape)} dims, got {value!r}")
    if batch_padding is not None and any(d != 0 for d in batch_padding[1:]):
        raise TraceError(f"{api}: only the first axis can be padded, got {batch_padding!r}")
    reshape = tuple(int(d) for d in reshape) if reshape is not None else None
    pad = int(batch_padding[0]) if batch_padding is not None else None

    def decode(batch):
        tensors, dims = [], []
        for where, payload in encoded_items(batch, api):
            features = onerec.decode_example(payload, where)
            if key not in features:
                raise RecordError(f"{where}: no feature {key!r} (it has {sorted(features)})")
            tensor = features[key]
            if getattr(tensor, "dtype", None) != np.dtype(np_dtype):
                raise RecordError(f"{where}: feature {key!r} holds "
                                  f"{getattr(tensor, 'dtype', 'strings or bytes')}, not "
                                  f"{np.dtype(np_dtype)}")
            tensors.append((where, tensor))
            dims.append(_instance_dims(where, tensor, len(shape), reshape))
        first = [d[0] for d in dims]
        if pad is None or pad == 0:
            if len(set(first)) > 1:
                raise RecordError(f"{batch[0][0]}: feature {key!r}: the first dims differ "
                                  f"across the batch ({first})")
            dim0 = first[0]
        else:
            dim0 = max(first) if pad == -1 else pad
            if max(first) > dim0:
                raise RecordError(f"{batch[0][0]}: feature {key!r}: a first dim of "
                                  f"{max(first)} exceeds batch_padding {pad}")
        instance = [dim0]
        for axis in range(1, len(shape)):
            sizes = {d[axis] for d in dims}
            if len(sizes) > 1:
                raise RecordError(f"{batch[0][0]}: feature {key!r}: axis {axis} differs "
                                  f"across the batch ({sorted(sizes)})")
            instance.append(sizes.pop())
        fits = all(i <= s for i, s in zip(instance, shape))
        if tuple(instance) != shape and not (is_dynamic and fits):
            what = ("at most the decoder's shape with is_dynamic=True" if is_dynamic
                    else "the decoder's shape; with is_dynamic=True at most it")
            raise RecordError(f"{batch[0][0]}: feature {key!r} gives {tuple(instance)} per "
                              f"example where it must give {what}, {shape}")
        count = math.prod(instance)
        out = np.zeros((len(batch), count), np_dtype)
        for i, (where, tensor) in enumerate(tensors):
            values = tensor.values if hasattr(tensor, "values") else tensor.reshape(-1)
            if len(values) > count or (pad is None and len(values) != count):
                raise RecordError(f"{where}: feature {key!r} holds {len(values)} values, the "
                                  f"shape {tuple(instance)} {count}")
            out[i, :len(values)] = values
        return out.reshape((len(batch),) + tuple(instance))

    return to_blob(name or f"OneRecDecoder_{key}", decode, [input_blob],
                   (input_blob.batch_size,) + shape, np_dtype, api, dynamic=bool(is_dynamic))


onerec_decoder = OneRecDecoder
