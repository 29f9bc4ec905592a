"""OneRec files: the record format of OneFlow's onerec_reader / onerec_decoder.

A file is a sequence of frames: a 24-byte header (magic b"^ONEREC$" as a little-endian
int64, int32 0, int32 payload size, the XXH64 of the first 16 bytes stored big-endian),
the payload padded with zeros to a multiple of 8 bytes, and the payload's XXH64
(big-endian). A payload is a flatbuffers `onerec.example.Example`: a vector of features
(name, tensor) sorted by name, a tensor being a shape (int32 vector), a type tag and a
value list (Int8List, Int16List, Int32List, Int64List, Float32List, Float64List, ...).
`write_examples` writes such files; `iter_frames` reads and checks the frames;
`decode_example` reads a payload's features as NumPy arrays.
"""
import struct

import numpy as np

from onnxjob.io.ofrecord import RecordError

MAGIC = 0x24434552454E4F5E
_HEADER = struct.Struct("<qii")
# TensorData union tags and their value types
TYPES = {1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 5: np.float32, 6: np.float64}
_TAGS = {np.dtype(v): k for k, v in TYPES.items()}

_M = 2 ** 64 - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc, lane):
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data, seed=0):
    """The XXH64 hash of `data` (bytes)."""
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed & _M, (seed - _P1) & _M]
        while p <= n - 32:
            lanes = struct.unpack_from("<4Q", data, p)
            v = [_round(a, b) for a, b in zip(v, lanes)]
            p += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for lane in v:
            h = ((h ^ _round(0, lane)) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while p + 8 <= n:
        h ^= _round(0, struct.unpack_from("<Q", data, p)[0])
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        p += 8
    if p + 4 <= n:
        h ^= (struct.unpack_from("<I", data, p)[0] * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        p += 4
    while p < n:
        h ^= (data[p] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        p += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def iter_frames(path):
    """(index, payload bytes) of every frame of a OneRec file, checked as it goes."""
    with open(path, "rb") as f:
        index = 0
        while True:
            head = f.read(24)
            if not head:
                return
            where = f"{path}: frame {index}"
            if len(head) < 24:
                raise RecordError(f"{where}: the file ends inside a frame header")
            magic, reserved, size = _HEADER.unpack_from(head)
            if magic != MAGIC or reserved != 0 or size < 0:
                raise RecordError(f"{where}: not a OneRec frame (magic {magic:#x})")
            if int.from_bytes(head[16:24], "big") != xxh64(head[:16]):
                raise RecordError(f"{where}: the header's digest does not match")
            body = f.read(size + (-size) % 8 + 8)
            if len(body) < size + (-size) % 8 + 8:
                raise RecordError(f"{where}: the file ends inside the frame (truncated file)")
            payload = body[:size]
            if int.from_bytes(body[-8:], "big") != xxh64(payload):
                raise RecordError(f"{where}: the payload's digest does not match")
            yield index, payload
            index += 1


# -- flatbuffers ------------------------------------------------------------------------

def _u32(buf, pos):
    return struct.unpack_from("<I", buf, pos)[0]


def _field(buf, table, slot):
    """The position of field `slot` (0, 1, ...) of the table at `table`, or None."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    size = struct.unpack_from("<H", buf, vtable)[0]
    if 4 + 2 * slot >= size:
        return None
    offset = struct.unpack_from("<H", buf, vtable + 4 + 2 * slot)[0]
    return table + offset if offset else None


def _deref(buf, pos):
    return pos + _u32(buf, pos)


def decode_example(payload, where="example"):
    """{feature name: ndarray of its shape} of one Example payload."""
    try:
        buf = memoryview(payload)
        root = _deref(buf, 0)
        out = {}
        features = _field(buf, root, 0)
        if features is None:
            return out
        vector = _deref(buf, features)
        for i in range(_u32(buf, vector)):
            feature = _deref(buf, vector + 4 + 4 * i)
            name_pos = _deref(buf, _field(buf, feature, 0))
            name = bytes(buf[name_pos + 4:name_pos + 4 + _u32(buf, name_pos)]).decode()
            tensor_pos = _field(buf, feature, 1)
            if tensor_pos is not None:
                out[name] = _tensor(buf, _deref(buf, tensor_pos))
        return out
    except (struct.error, IndexError, UnicodeDecodeError, TypeError) as e:
        raise RecordError(f"{where}: not a OneRec Example ({e})") from None


def _tensor(buf, tensor):
    shape_pos = _field(buf, tensor, 0)
    shape = ()
    if shape_pos is not None:
        vec = _deref(buf, shape_pos)
        shape = tuple(np.frombuffer(buf, np.int32, _u32(buf, vec), vec + 4))
    tag_pos = _field(buf, tensor, 1)
    tag = buf[tag_pos] if tag_pos is not None else 0
    if tag not in TYPES:
        return _Unsupported(tag, shape)
    values = _deref(buf, _field(buf, _deref(buf, _field(buf, tensor, 2)), 0))
    data = np.frombuffer(buf, TYPES[tag], _u32(buf, values), values + 4).copy()
    return data.reshape(shape) if int(np.prod(shape)) == data.size else _Ragged(data, shape)


class _Unsupported:
    """A string or binary tensor: listed, not decoded."""

    def __init__(self, tag, shape):
        self.tag, self.shape, self.dtype = tag, shape, None


class _Ragged:
    """A tensor whose value count differs from its shape's (kept flat)."""

    def __init__(self, values, shape):
        self.values, self.shape, self.dtype = values, shape, values.dtype


class _Writer:
    """A flatbuffer laid out front to back (children after their parents)."""

    def __init__(self):
        self.buf = bytearray(4)   # the root offset, patched by table()

    def _align(self, n, extra=0):
        while (len(self.buf) + extra) % n:
            self.buf.append(0)

    def _patch(self, at, target):
        struct.pack_into("<I", self.buf, at, target - at)

    def table(self, fields):
        """Write a table of `fields` (per slot: None, ("u8", v) or ("ref", writer fn));
        returns its position. Referenced children are written after it."""
        slots = len(fields)
        self._align(4, 4 + 2 * slots)   # the table (after the vtable) starts aligned
        vtable = len(self.buf)
        layout, size = [], 4
        for f in fields:
            layout.append(size if f else 0)
            size += 4 if f else 0
        self.buf += struct.pack(f"<HH{slots}H", 4 + 2 * slots, size, *layout)
        table = len(self.buf)
        self.buf += struct.pack("<i", table - vtable) + bytes(size - 4)
        refs = []
        for f, off in zip(fields, layout):
            if f and f[0] == "u8":
                self.buf[table + off] = f[1]
            elif f:
                refs.append((table + off, f[1]))
        for at, write in refs:
            self._patch(at, write())
        return table

    def vector(self, array):
        array = np.asarray(array, order="C")
        self._align(max(array.dtype.itemsize, 4), 4)
        pos = len(self.buf)
        self.buf += struct.pack("<I", array.size) + array.tobytes()
        return pos

    def string(self, text):
        self._align(4)
        pos = len(self.buf)
        data = text.encode()
        self.buf += struct.pack("<I", len(data)) + data + b"\0"
        return pos

    def tables(self, writers):
        self._align(4)
        pos = len(self.buf)
        self.buf += struct.pack("<I", len(writers)) + bytes(4 * len(writers))
        for i, write in enumerate(writers):
            self._patch(pos + 4 + 4 * i, write())
        return pos


def encode_example(features):
    """One Example payload of `features` ({name: ndarray of a listed dtype})."""
    w = _Writer()

    def tensor(array):
        array = np.asarray(array)
        tag = _TAGS.get(array.dtype)
        if tag is None:
            raise ValueError(f"OneRec tensors hold {sorted(str(d) for d in _TAGS)}, got "
                             f"{array.dtype}")
        return lambda: w.table([
            ("ref", lambda: w.vector(np.array(array.shape, np.int32))), ("u8", tag),
            ("ref", lambda: w.table([("ref", lambda: w.vector(array.reshape(-1)))]))])

    def feature(name, array):
        return lambda: w.table([("ref", lambda: w.string(name)), ("ref", tensor(array))])

    names = sorted(features, key=lambda n: n.encode())
    root = w.table([("ref", lambda: w.tables([feature(n, features[n]) for n in names]))])
    w._patch(0, root)
    return bytes(w.buf)


def write_examples(path, examples):
    """Write `examples` (dicts of name -> ndarray) as one OneRec file."""
    with open(path, "wb") as f:
        for features in examples:
            payload = encode_example(features)
            head = _HEADER.pack(MAGIC, 0, len(payload))
            f.write(head + xxh64(head).to_bytes(8, "big") + payload + bytes((-len(payload)) % 8)
                    + xxh64(payload).to_bytes(8, "big"))
