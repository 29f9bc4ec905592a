"""OneFlow's OFRecord files: read, write, and find the part files of a dataset.

A file (`part-00000`, ...) is a sequence of records, each an 8-byte little-endian int64
length followed by that many bytes of a serialized `oneflow.OFRecord` protobuf message
(oneflow/core/record/record.proto):

    message OFRecord { map<string, Feature> feature = 1; }
    message Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                                   DoubleList double_list = 3; Int32List int32_list = 4;
                                   Int64List int64_list = 5; } }

(the lists are `repeated` values, packed for the numbers). The message classes are built
here from that definition with protobuf's descriptor API, so no generated code is needed.
Records decode to {feature name: ndarray (numbers) or list of bytes}.
"""
import os
import struct

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from onnxjob.errors import OnnxJobError

_LENGTH = struct.Struct("<q")
# feature kind -> (list message, NumPy dtype of its values or None for bytes)
KINDS = {"bytes_list": ("BytesList", None), "float_list": ("FloatList", np.float32),
         "double_list": ("DoubleList", np.float64), "int32_list": ("Int32List", np.int32),
         "int64_list": ("Int64List", np.int64)}
_FIELD_TYPES = {None: descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
                np.float32: descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
                np.float64: descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
                np.int32: descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                np.int64: descriptor_pb2.FieldDescriptorProto.TYPE_INT64}


class RecordError(OnnxJobError, ValueError):
    """An OFRecord file or record is not what the reader expects (names file and record)."""


def _record_classes():
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="onnxjob_ofrecord.proto",
                                               package="oneflow", syntax="proto2")
    for message, dtype in KINDS.values():
        m = proto.message_type.add(name=message)
        field = m.field.add(name="value", number=1, label=F.LABEL_REPEATED,
                            type=_FIELD_TYPES[dtype])
        if dtype is not None:
            field.options.packed = True
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (kind, (message, _)) in enumerate(KINDS.items(), start=1):
        feature.field.add(name=kind, number=number, label=F.LABEL_OPTIONAL, type=F.TYPE_MESSAGE,
                          type_name=f".oneflow.{message}", oneof_index=0)
    record = proto.message_type.add(name="OFRecord")
    entry = record.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL, type=F.TYPE_STRING)
    entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL, type=F.TYPE_MESSAGE,
                    type_name=".oneflow.Feature")
    record.field.add(name="feature", number=1, label=F.LABEL_REPEATED, type=F.TYPE_MESSAGE,
                     type_name=".oneflow.OFRecord.FeatureEntry")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


_POOL = _record_classes()


def record_message_class(name):
    """The class of record.proto's message `name` ("OFRecord", "Feature", "BytesList",
    "FloatList", "DoubleList", "Int32List" or "Int64List"; `oneflow.core.record.record_pb2`
    under the `oneflow` alias)."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"oneflow.{name}"))


OFRecord = record_message_class("OFRecord")


def encode_record(features):
    """The bytes of one OFRecord: `features` maps names to bytes / lists of bytes (a
    bytes_list) or arrays / numbers (float32, float64, int32 or int64 lists by dtype;
    Python floats are float32 and ints int64, as OneFlow's tools write them)."""
    record = OFRecord()
    for name, value in features.items():
        feature = record.feature[name]
        if isinstance(value, (bytes, bytearray)):
            value = [bytes(value)]
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], (bytes, bytearray)):
            feature.bytes_list.value.extend(bytes(v) for v in value)
            continue
        array = np.asarray(value)
        if array.dtype.kind == "f":
            kind = "double_list" if array.dtype == np.float64 and not isinstance(value, float) \
                else "float_list"
        elif array.dtype.kind in "iub":
            kind = "int32_list" if array.dtype in (np.int32, np.int16, np.int8, np.uint8) \
                else "int64_list"
        else:
            raise TypeError(f"feature {name!r}: cannot store {array.dtype} in an OFRecord")
        getattr(feature, kind).value.extend(array.reshape(-1).tolist())
    return record.SerializeToString()


def decode_record(data, where="record"):
    """{feature name: ndarray or list of bytes} of one serialized OFRecord."""
    record = OFRecord()
    try:
        record.ParseFromString(data)
    except Exception as e:
        raise RecordError(f"{where}: not an OFRecord message ({e})") from None
    out = {}
    for name, feature in record.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            out[name] = np.zeros(0, np.float32)
            continue
        values = getattr(feature, kind).value
        dtype = KINDS[kind][1]
        out[name] = list(values) if dtype is None else np.asarray(values, dtype=dtype)
    return out


def write_records(path, records):
    """Write `records` (feature dicts, or bytes already encoded) to one part file."""
    with open(path, "wb") as f:
        for record in records:
            data = record if isinstance(record, (bytes, bytearray)) else encode_record(record)
            f.write(_LENGTH.pack(len(data)))
            f.write(data)


def iter_records(path):
    """(index, raw bytes) of every record of one part file, checked as it goes."""
    with open(path, "rb") as f:
        index = 0
        while True:
            head = f.read(_LENGTH.size)
            if not head:
                return
            if len(head) < _LENGTH.size:
                raise RecordError(f"{path}: record {index}: the file ends inside a length "
                                  "prefix (truncated file)")
            (size,) = _LENGTH.unpack(head)
            if size <= 0:
                raise RecordError(f"{path}: record {index}: length {size} is not positive "
                                  "(not an OFRecord file?)")
            data = f.read(size)
            if len(data) < size:
                raise RecordError(f"{path}: record {index}: {size} bytes announced, {len(data)} "
                                  "left in the file (truncated file)")
            yield index, data
            index += 1


def read_records(path):
    """Every record of one part file, decoded."""
    return [decode_record(data, f"{path}: record {i}") for i, data in iter_records(path)]


def part_paths(data_dir, data_part_num, part_name_prefix="part-", part_name_suffix_length=-1):
    """OneFlow's part file names: prefix + index, zero-padded to `part_name_suffix_length`."""
    paths = []
    for i in range(data_part_num):
        number = str(i)
        paths.append(os.path.join(data_dir, part_name_prefix
                                  + "0" * max(part_name_suffix_length - len(number), 0) + number))
    return paths


def write_dataset(data_dir, records, data_part_num=1, part_name_suffix_length=5,
                  part_name_prefix="part-"):
    """Split `records` over `data_part_num` part files in `data_dir` (created), as
    OneFlow's converters lay datasets out; returns the paths."""
    os.makedirs(data_dir, exist_ok=True)
    records = list(records)
    paths = part_paths(data_dir, data_part_num, part_name_prefix, part_name_suffix_length)
    bounds = np.linspace(0, len(records), data_part_num + 1).round().astype(int)
    for path, start, end in zip(paths, bounds[:-1], bounds[1:]):
        write_records(path, records[start:end])
    return paths


class RecordReader:
    """OneFlow's OFRecordReader: batches of raw records from a dataset's part files.

    Files are read in order and again from the start when all are read; with
    `shuffle_after_epoch` the file order is shuffled at each epoch instead. With
    `random_shuffle` a buffer of `shuffle_buffer_size` records is filled first, and each
    record read then swaps with a random one of the buffer (OneFlow's RandomShuffleDataset).
    A batch is a list of (where, bytes), `where` naming the file and record for errors.
    """

    def __init__(self, paths, batch_size, random_shuffle=False, shuffle_buffer_size=1024,
                 shuffle_after_epoch=False, seed=None, iterate=None, kind="OFRecord part"):
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise RecordError(f"{kind} file {missing[0]} does not exist "
                              f"({len(missing)} of {len(paths)} files missing)")
        self._iterate = iterate or iter_records   # (index, bytes) of one file
        self._kind = kind
        self._paths = list(paths)
        self._batch_size = batch_size
        self._shuffle_after_epoch = shuffle_after_epoch
        self._rng = np.random.default_rng(seed)
        self._epoch = 0
        self._stream = self._records()
        self._buffer = None
        if random_shuffle:
            self._buffer = [next(self._stream) for _ in range(shuffle_buffer_size)]

    def _records(self):
        while True:
            found = False
            for path in self._paths:
                for index, data in self._iterate(path):
                    found = True
                    yield f"{path}: record {index}", data
            if not found:
                raise RecordError(f"the {self._kind} files hold no record: {self._paths}")
            self._epoch += 1
            if self._shuffle_after_epoch:
                self._rng.shuffle(self._paths)

    def next_batch(self):
        batch = [next(self._stream) for _ in range(self._batch_size)]
        if self._buffer is not None:
            for i in range(len(batch)):
                j = int(self._rng.integers(len(self._buffer)))
                batch[i], self._buffer[j] = self._buffer[j], batch[i]
        return batch
