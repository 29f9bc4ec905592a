"""Megatron-LM's indexed GPT datasets (`<prefix>.idx` + `<prefix>.bin`, the MMIDIDX
format), read as OneFlow's MegatronGPTMMapDataset samples them.

The index: magic b"MMIDIDX\\0\\0", version (uint64, 1), token dtype code (uint8), the
number of sequences n and of document offsets n + 1 (uint64 each), then n int32 sizes,
n int64 byte addresses into the .bin file and n + 1 int64 document offsets.

A sample is seq_length + 1 consecutive tokens of the documents of the split, laid end to
end over as many epochs as `num_samples` needs (consecutive samples share one token).
With shuffle, the documents of each epoch group and the samples are permuted with a
generator seeded by `seed`; the permutation is NumPy's, not OneFlow's std::shuffle, so a
shuffled run reads the same samples in another order than OneFlow would.
"""
import math
import os
import struct

import numpy as np

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float32,
          7: np.float64, 8: np.uint16}


class MegatronError(ValueError):
    """A Megatron dataset file that is missing or malformed."""


def read_index(path):
    """(token dtype, sizes, addresses, doc offsets) of the index file `path`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MegatronError(f"cannot read the GPT dataset index {path}: {e}") from None
    head = len(MAGIC) + 8 + 1 + 16
    if len(data) < head or data[:len(MAGIC)] != MAGIC:
        raise MegatronError(f"{path} is not a Megatron index file (no MMIDIDX header)")
    _version, code, count, offsets = struct.unpack_from("<QBQQ", data, len(MAGIC))
    if code not in DTYPES or offsets != count + 1 or len(data) != head + count * 12 + offsets * 8:
        raise MegatronError(f"{path}: malformed index (dtype code {code}, {count} sizes, "
                            f"{offsets} document offsets, {len(data)} bytes)")
    sizes = np.frombuffer(data, np.int32, count, head)
    addresses = np.frombuffer(data, np.int64, count, head + count * 4)
    doc_offsets = np.frombuffer(data, np.int64, offsets, head + count * 12)
    return np.dtype(DTYPES[code]), sizes, addresses, doc_offsets


def write_dataset(prefix, documents, dtype=np.int32):
    """Write `documents` (lists of token ids) as `<prefix>.bin` and `<prefix>.idx`."""
    dtype = np.dtype(dtype)
    code = {np.dtype(v): k for k, v in DTYPES.items()}[dtype]
    arrays = [np.asarray(d, dtype) for d in documents]
    sizes = np.array([len(a) for a in arrays], np.int32)
    addresses = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64)]) * dtype.itemsize
    with open(prefix + ".bin", "wb") as f:
        for a in arrays:
            f.write(a.tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC + struct.pack("<QBQQ", 1, code, len(arrays), len(arrays) + 1))
        f.write(sizes.tobytes() + addresses.astype(np.int64).tobytes()
                + np.arange(len(arrays) + 1, dtype=np.int64).tobytes())


def _split_documents(split_sizes, split_index, num_docs):
    total = sum(split_sizes)
    share = [int(np.rint(np.float32(s) / np.float32(total) * np.float32(num_docs)))
             for s in split_sizes]
    start = sum(share[:split_index])
    return np.arange(start, start + share[split_index])


class GPTDataset:
    """The samples of OneFlow's MegatronGPTMMapDataset (module docstring)."""

    def __init__(self, prefix, seq_length, num_samples, split_sizes=(1,), split_index=0,
                 shuffle=True, seed=0):
        self.dtype, self.sizes, self.addresses, _ = read_index(prefix + ".idx")
        path = prefix + ".bin"
        if not os.path.isfile(path):
            raise MegatronError(f"the GPT dataset has no data file {path}")
        self.tokens = np.memmap(path, np.uint8, mode="r")
        self.seq_length, self.sample_length = int(seq_length), int(seq_length) + 1
        docs = _split_documents(list(split_sizes), split_index, len(self.sizes))
        per_epoch = int(self.sizes[docs].sum())
        if per_epoch <= 1:
            raise MegatronError(f"{prefix}: split {split_index} holds {per_epoch} tokens")
        epochs = math.ceil((num_samples * seq_length + 1) / per_epoch)
        complete = _complete_epochs(num_samples, seq_length, per_epoch, epochs)
        rng = np.random.Generator(np.random.MT19937(seed))
        order = [np.tile(docs, complete)]
        if complete != epochs:
            order.append(docs.copy())
        if shuffle:
            for part in order:
                rng.shuffle(part)
        self.doc_order = np.concatenate(order)
        total = (epochs * per_epoch - 1) // seq_length
        self.starts = self._sample_starts(total)
        self.order = np.arange(len(self.starts))
        if shuffle:
            head = (complete * per_epoch - 1) // seq_length
            rng.shuffle(self.order[:head])
            if complete != epochs:
                rng.shuffle(self.order[head:])

    def _sample_starts(self, total):
        starts, doc, offset = [], 0, 0
        for _ in range(total):
            if doc >= len(self.doc_order):
                break
            starts.append((doc, offset))
            remaining = self.seq_length
            while remaining > 0:
                length = int(self.sizes[self.doc_order[doc]]) - offset
                if remaining < length:
                    offset += remaining
                else:
                    doc, offset = doc + 1, 0
                remaining -= length
        return starts

    def __len__(self):
        return len(self.order)

    def sample(self, index):
        """The seq_length + 1 tokens of sample `index` (in reading order)."""
        if not 0 <= index < len(self.order):
            raise MegatronError(f"sample {index} of a GPT dataset of {len(self.order)} samples "
                                "(num_samples sets how many epochs are laid out)")
        doc, offset = self.starts[self.order[index]]
        out, remaining = [], self.sample_length
        while remaining > 0:
            if doc >= len(self.doc_order):
                raise MegatronError("the GPT dataset ran out of tokens for a sample")
            d = self.doc_order[doc]
            take = min(int(self.sizes[d]) - offset, remaining)
            begin = int(self.addresses[d]) + offset * self.dtype.itemsize
            out.append(np.frombuffer(self.tokens[begin:begin + take * self.dtype.itemsize],
                                     self.dtype))
            remaining -= take
            doc, offset = (doc + 1, 0) if offset + take == self.sizes[d] else (doc, offset + take)
        return np.concatenate(out)


def _complete_epochs(num_samples, seq_length, per_epoch, epochs):
    """OneFlow's GetNumCompleteEpochs: the last epoch is kept apart (shuffled on its own)
    when it supplies fewer than 80% of an epoch's samples."""
    if epochs == 1:
        return 1
    per_epoch_samples = (per_epoch - 1) // seq_length
    before_last = ((epochs - 1) * per_epoch - 1) // seq_length
    last = num_samples - before_last
    return epochs - 1 if last < int(np.float32(0.8) * np.float32(per_epoch_samples)) else epochs
