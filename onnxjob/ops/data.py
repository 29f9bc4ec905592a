"""`flow.data`: data a job makes or reads itself (and the MNIST loaders for the docs).

The readers and decoders run on the host before each run (runtime/pipeline.py, ops/host.py),
reading OneFlow's OFRecord datasets (io/ofrecord.py); decoders that give fixed-shape
arrays become graph inputs. The image decoders give tensor buffers: lists of
(where, (H, W, C) image) that the flow.image ops (ops/image.py) take; the pixel work is
io/images.py, spread over a small thread pool per batch.
"""
import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob import dtypes
from onnxjob.errors import TraceError, missing_api
from onnxjob.frontend import initializers
from onnxjob.graph.tracer import current_builder
from onnxjob.io import images, ofrecord
from onnxjob.io.mnist import load_mnist, load_mnist_subset  # noqa: F401
from onnxjob.ops.host import (RECORD, TENSOR_BUFFER, check_host_value, checked_args,
                              encoded_items, host_value, to_blob)
from onnxjob.ops.random import gen_seed
from onnxjob.runtime.pipeline import HostNode


def decode_random(shape, dtype, batch_size=1, initializer=None, tick=None, name=None):
    """A (batch_size, *shape) batch drawn afresh from `initializer` (default uniform on
    [0, 1]) for every run of the job: synthetic data with no placeholder."""
    if not isinstance(shape, (list, tuple)):
        raise TraceError(f"flow.data.decode_random: shape must be a list or tuple, got {shape!r}")
    if dtype is None:
        raise TraceError("flow.data.decode_random needs a dtype")
    builder = current_builder("flow.data.decode_random")
    np_dtype = dtypes.to_numpy(dtype)
    full_shape = (int(batch_size),) + tuple(int(d) for d in shape)
    initializer = initializer or initializers.random_uniform_initializer()
    rng = np.random.default_rng(builder.random.randrange(2 ** 63))
    name = builder.unique_name(name or "DecodeRandom")
    node = HostNode(name, lambda: initializer.sample(full_shape, np_dtype, rng).astype(
        np_dtype, copy=False))
    return builder.add_source(name, full_shape, np_dtype, node)


def ofrecord_reader(ofrecord_dir, batch_size=1, data_part_num=1, part_name_prefix="part-",
                    part_name_suffix_length=-1, random_shuffle=False, shuffle_buffer_size=1024,
                    shuffle_after_epoch=False, name=None):
    """Batches of `batch_size` raw records from `ofrecord_dir`/part-..., as OneFlow reads
    them (see io.ofrecord.RecordReader); decode them with OFRecordRawDecoder & co."""
    builder = current_builder("flow.data.ofrecord_reader")
    paths = ofrecord.part_paths(ofrecord_dir, data_part_num, part_name_prefix,
                                part_name_suffix_length)
    try:
        reader = ofrecord.RecordReader(paths, batch_size, random_shuffle, shuffle_buffer_size,
                                       shuffle_after_epoch, seed=builder.random.randrange(2 ** 63))
    except ofrecord.RecordError as e:
        raise TraceError(f"flow.data.ofrecord_reader: {e}") from None
    return host_value(name or "OFRecordReader", reader.next_batch, [], batch_size, RECORD,
                      "flow.data.ofrecord_reader")


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


def image_decoder_random_crop_resize(input_blob, target_width, target_height, num_attempts=None,
                                     seed=None, random_area=None, random_aspect_ratio=None,
                                     num_workers=None, warmup_size=None, max_num_pixels=None,
                                     name=None):
    """Encoded images (OFRecordBytesDecoder) decoded, randomly cropped as
    OFRecordImageDecoderRandomCrop does and resized (bilinear) to a uint8
    (N, target_height, target_width, 3) RGB batch in one op.

    num_workers, warmup_size and max_num_pixels tune OneFlow's GPU decoder; onnxjob
    accepts them and decodes on the host's decode threads (io.images.map_ordered).
    """
    api = "flow.data.ImageDecoderRandomCropResize"
    check_host_value(input_blob, api, TENSOR_BUFFER)
    crop_args = checked_args(images.random_crop_args, api,
                             10 if num_attempts is None else num_attempts,
                             random_area or [0.08, 1.0], random_aspect_ratio or [0.75, 1.333333])
    batch_size = input_blob.batch_size
    generators = images.slot_generators(gen_seed(seed)[0], batch_size)
    width, height = int(target_width), int(target_height)

    def decode_one(item):
        slot, (where, data) = item
        image = images.decode(data, "RGB", where)
        window = images.random_crop_window(*image.shape[:2], generators[slot], *crop_args)
        return images.resize(images.crop(image, window), width, height, "bilinear")

    def decode(batch):
        return np.stack(images.map_ordered(decode_one, enumerate(encoded_items(batch, api))))

    return to_blob(name or "ImageDecoderRandomCropResize", decode, [input_blob],
                   (batch_size, height, width, 3), np.uint8, api)


ImageDecoderRandomCropResize = image_decoder_random_crop_resize
ofrecord_bytes_decoder = OFRecordBytesDecoder
ofrecord_image_decoder = OFRecordImageDecoder
ofrecord_image_decoder_random_crop = OFRecordImageDecoderRandomCrop

from onnxjob.ops.data_legacy import (BlobConf, ImageCodec, ImagePreprocessor,  # noqa: E402,F401
                                     ImageResizePreprocessor, NormByChannelPreprocessor, RawCodec,
                                     decode_ofrecord, ofrecord_image_classification_reader,
                                     ofrecord_loader)
from onnxjob.ops.coco_data import coco_reader  # noqa: E402,F401
from onnxjob.ops.onerec_data import (OneRecDecoder, onerec_decoder,  # noqa: E402,F401
                                     onerec_reader)
from onnxjob.ops.gpt_data import (MegatronGPTMMapDataLoader,  # noqa: E402,F401
                                  megatron_gpt_mmap_data_loader)

__getattr__ = missing_api("flow.data")
