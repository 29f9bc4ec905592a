"""`flow.data`'s OFRecord reader and decoders (re-exported by ops/data.py): batches of
raw records from OneFlow's OFRecord datasets (io/ofrecord.py) and their features decoded
on the host before each run (runtime/pipeline.py, ops/host.py): numbers as fixed-shape
arrays that become graph inputs, encoded images as tensor buffers of (where, (H, W, C)
image) for the flow.image ops (the pixel work is io/images.py)."""
import itertools

import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import current_builder
from onnxjob.io import images, ofrecord
from onnxjob.ops.host import (RECORD, TENSOR_BUFFER, check_host_value, checked_args,
                              host_value, to_blob)
from onnxjob.ops.parallel import balanced_parts, parallel_num
from onnxjob.ops.random import gen_seed


def ofrecord_reader(ofrecord_dir, batch_size=1, data_part_num=1, part_name_prefix="part-",
                    part_name_suffix_length=-1, random_shuffle=False, shuffle_buffer_size=1024,
                    shuffle_after_epoch=False, name=None):
    """Batches of `batch_size` raw records from `ofrecord_dir`/part-..., as OneFlow reads
    them (see io.ofrecord.RecordReader); decode them with OFRecordRawDecoder & co."""
    builder = current_builder("flow.data.ofrecord_reader")
    paths = ofrecord.part_paths(ofrecord_dir, data_part_num, part_name_prefix,
                                part_name_suffix_length)
    devices = parallel_num()
    if devices < 2 or len(paths) < devices or batch_size % devices:
        devices = 1
    try:
        readers = [ofrecord.RecordReader(part, batch_size // devices, random_shuffle,
                                         shuffle_buffer_size, shuffle_after_epoch,
                                         seed=builder.random.randrange(2 ** 63))
                   for part in _groups(paths, balanced_parts(len(paths), devices))]
    except ofrecord.RecordError as e:
        raise TraceError(f"flow.data.ofrecord_reader: {e}") from None

    def next_batch():
        # the placement's devices each read batch_size / n records of their own part files
        # (ofrecord_dataset.h: BalancedSplitter(data_part_num, parallel_num)); the batch is
        # theirs in device order, as OneFlow's consistent blob concatenates them
        return [record for reader in readers for record in reader.next_batch()]
    return host_value(name or "OFRecordReader", next_batch, [], batch_size, RECORD,
                      "flow.data.ofrecord_reader")


def _groups(items, sizes):
    """`items` in consecutive groups of `sizes`."""
    ends = list(itertools.accumulate(sizes))
    return [items[end - size:end] for size, end in zip(sizes, ends)]


def _feature(where, record, blob_name):
    try:
        return record[blob_name]
    except KeyError:
        raise ofrecord.RecordError(f"{where}: no feature {blob_name!r} (it has "
                                   f"{sorted(record)})") from None


def _raw_values(where, value, count, np_dtype, truncate, dim1_varying_length):
    """One record's feature as `count` values of `np_dtype` (OneFlow's raw decoding)."""
    if isinstance(value, list):  # a bytes_list: its one entry's bytes, as int8
        if len(value) != 1:
            raise ofrecord.RecordError(f"{where}: a raw bytes feature holds one entry, got "
                                       f"{len(value)}")
        value = np.frombuffer(value[0], np.int8)[:count]
        out = np.zeros(count, np_dtype)
        out[:len(value)] = value
        return out
    if len(value) != count and not truncate and not dim1_varying_length:
        raise ofrecord.RecordError(f"{where}: {len(value)} values where the decoder's shape "
                                   f"holds {count} (pass auto_zero_padding=True to pad)")
    out = np.zeros(count, np_dtype)
    kept = min(count, len(value))
    out[:kept] = value[:kept]
    return out


@two_generations(("input_blob", "blob_name", "shape", "dtype", "dim1_varying_length",
                  "auto_zero_padding", "name"), positional_is(6, str))
def OFRecordRawDecoder(input_blob, blob_name, shape, dtype, dim1_varying_length=False,
                       truncate=False, auto_zero_padding=False, name=None):
    """Feature `blob_name` of each record as a (batch, *shape) array of `dtype`: number
    lists converted, a bytes entry read as int8; `auto_zero_padding` (or `truncate`) pads
    short lists with zeros and cuts long ones, otherwise the count must match."""
    api = "flow.data.OFRecordRawDecoder"
    check_host_value(input_blob, api, RECORD)
    np_dtype = dtypes.to_numpy(dtype)
    shape = tuple(int(d) for d in shape)
    count = int(np.prod(shape))
    pad = truncate or auto_zero_padding

    def decode(batch):
        out = np.empty((len(batch), count), np_dtype)
        for i, (where, data) in enumerate(batch):
            record = ofrecord.decode_record(data, where)
            out[i] = _raw_values(where, _feature(where, record, blob_name), count, np_dtype,
                                 pad, dim1_varying_length)
        return out.reshape((len(batch),) + shape)

    return to_blob(name or f"OFRecordRawDecoder_{blob_name}", decode, [input_blob],
                   (input_blob.batch_size,) + shape, np_dtype, api)


ofrecord_raw_decoder = OFRecordRawDecoder


def _encoded_bytes(where, data, blob_name, api):
    """The one byte string of feature `blob_name` of serialized record `data`."""
    value = _feature(where, ofrecord.decode_record(data, where), blob_name)
    if not isinstance(value, list):
        raise ofrecord.RecordError(f"{where}: feature {blob_name!r} holds {value.dtype} numbers, "
                                   f"not bytes ({api} reads one encoded byte string)")
    if len(value) != 1:
        raise ofrecord.RecordError(f"{where}: feature {blob_name!r} holds {len(value)} byte "
                                   f"strings, {api} reads one")
    return value[0]


def OFRecordBytesDecoder(input_blob, blob_name, name=None):
    """The bytes of feature `blob_name` of each record, as a tensor buffer (one byte string
    per record) for flow.image.decode or ImageDecoderRandomCropResize."""
    api = "flow.data.OFRecordBytesDecoder"
    check_host_value(input_blob, api, RECORD)

    def decode(batch):
        return [(where, _encoded_bytes(where, data, blob_name, api)) for where, data in batch]

    return host_value(name or f"OFRecordBytesDecoder_{blob_name}", decode, [input_blob],
                      input_blob.batch_size, TENSOR_BUFFER, api)


def OFRecordImageDecoder(input_blob, blob_name, color_space="BGR", name=None):
    """The encoded image of feature `blob_name` of each record, decoded to an (H, W, C)
    uint8 image in `color_space` ("BGR", OneFlow's default, "RGB" or "GRAY")."""
    api = "flow.data.OFRecordImageDecoder"
    check_host_value(input_blob, api, RECORD)
    checked_args(images.channels_of, api, color_space)

    def decode_one(item):
        where, data = item
        return where, images.decode(_encoded_bytes(where, data, blob_name, api), color_space,
                                    where)

    return host_value(name or f"OFRecordImageDecoder_{blob_name}",
                      lambda batch: images.map_ordered(decode_one, batch), [input_blob],
                      input_blob.batch_size, TENSOR_BUFFER, api)


def OFRecordImageDecoderRandomCrop(input_blob, blob_name, color_space="BGR", num_attempts=10,
                                   seed=None, random_area=[0.08, 1.0],
                                   random_aspect_ratio=[0.75, 1.333333],
                                   name="OFRecordImageDecoderRandomCrop"):
    """OFRecordImageDecoder keeping a random window of each image: OneFlow's crop of a
    random area fraction and aspect ratio (io.images.random_crop_window), one generator
    per batch slot seeded from `seed` (or the job's seed stream)."""
    api = "flow.data.OFRecordImageDecoderRandomCrop"
    check_host_value(input_blob, api, RECORD)
    checked_args(images.channels_of, api, color_space)
    crop_args = checked_args(images.random_crop_args, api, num_attempts, random_area,
                             random_aspect_ratio)
    generators = images.slot_generators(gen_seed(seed)[0], input_blob.batch_size)

    def decode_one(item):
        slot, (where, data) = item
        image = images.decode(_encoded_bytes(where, data, blob_name, api), color_space, where)
        window = images.random_crop_window(*image.shape[:2], generators[slot], *crop_args)
        return where, images.crop(image, window)

    return host_value(name or "OFRecordImageDecoderRandomCrop",
                      lambda batch: images.map_ordered(decode_one, enumerate(batch)),
                      [input_blob], input_blob.batch_size, TENSOR_BUFFER, api)


ofrecord_bytes_decoder = OFRecordBytesDecoder
ofrecord_image_decoder = OFRecordImageDecoder
ofrecord_image_decoder_random_crop = OFRecordImageDecoderRandomCrop
