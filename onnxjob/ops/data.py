"""`flow.data`: data a job makes or reads itself (and the MNIST loaders for the docs).

The readers and decoders run on the host before each run (runtime/pipeline.py, ops/host.py),
reading OneFlow's OFRecord datasets (io/ofrecord.py, ops/ofrecord_data.py; the older reader
API: ops/data_legacy.py), COCO, OneRec and Megatron's GPT data; decoders that give fixed-shape
arrays become graph inputs. The image decoders give tensor buffers: lists of
(where, (H, W, C) image) that the flow.image ops (ops/image.py) take; the pixel work is
io/images.py, spread over a small thread pool per batch.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError, missing_api
from onnxjob.frontend import initializers
from onnxjob.graph.tracer import current_builder
from onnxjob.io import images
from onnxjob.io.mnist import load_mnist, load_mnist_subset  # noqa: F401
from onnxjob.ops.coco_data import coco_reader  # noqa: F401
from onnxjob.ops.data_legacy import (BlobConf, ImageCodec, ImagePreprocessor,  # noqa: F401
                                     ImageResizePreprocessor, NormByChannelPreprocessor, RawCodec,
                                     decode_ofrecord, ofrecord_image_classification_reader,
                                     ofrecord_loader)
from onnxjob.ops.gpt_data import (MegatronGPTMMapDataLoader,  # noqa: F401
                                  megatron_gpt_mmap_data_loader)
from onnxjob.ops.host import TENSOR_BUFFER, check_host_value, checked_args, encoded_items, to_blob
from onnxjob.ops.ofrecord_data import (OFRecordBytesDecoder, OFRecordImageDecoder,  # noqa: F401
                                       OFRecordImageDecoderRandomCrop, OFRecordRawDecoder,
                                       ofrecord_bytes_decoder, ofrecord_image_decoder,
                                       ofrecord_image_decoder_random_crop,
                                       ofrecord_raw_decoder, ofrecord_reader)
from onnxjob.ops.onerec_data import OneRecDecoder, onerec_decoder, onerec_reader  # noqa: F401
from onnxjob.ops.random import gen_seed
from onnxjob.runtime.pipeline import HostNode


def decode_random(shape, dtype, batch_size=1, initializer=None, tick=None, name=None):
    """A (batch_size, *shape) batch drawn from `initializer` (default uniform on [0, 1])
    at the job's first run and the same at every later run, as OneFlow's DecodeRandomKernel
    fills its one output register once (decode_random_kernel.cpp: is_init_): synthetic
    data with no placeholder (a synthetic-data benchmark fits that one batch)."""
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
    drawn = []

    def batch():
        if not drawn:
            value = initializer.sample(full_shape, np_dtype, rng).astype(np_dtype, copy=False)
            value.flags.writeable = False       # (every run is given this one array)
            drawn.append(value)
        return drawn[0]
    return builder.add_source(name, full_shape, np_dtype, HostNode(name, batch))


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

__getattr__ = missing_api("flow.data")
