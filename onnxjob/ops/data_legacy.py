"""OneFlow's older `flow.data` reader API, built on the OFRecord reader and decoders.

`decode_ofrecord(dir, [BlobConf(...), ...])` reads a batch of records and decodes one blob
per BlobConf: a RawCodec reads numbers (ofrecord_raw_decoder), an ImageCodec decodes an
image, resizes it (to its ImageResizePreprocessor's size, else the BlobConf's first two
dims) and applies the NormByChannelPreprocessors (crop_mirror_normalize, mirrored at
random with an ImagePreprocessor("mirror")). `ofrecord_loader` is the older name of
ofrecord_reader; `ofrecord_image_classification_reader` reads (image, label) tensor
buffers in one op.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.io import ofrecord
from onnxjob.ops import image as image_ops
from onnxjob.ops.host import RECORD, TENSOR_BUFFER, check_host_value, host_value
from onnxjob.ops.ofrecord_data import ofrecord_image_decoder, ofrecord_raw_decoder, ofrecord_reader
from onnxjob.ops.random import coin_flip
from onnxjob.ops.shapes import squeeze
from onnxjob.ops.tensor_buffer import tensor_buffer_to_tensor


class ImagePreprocessor:
    """"bgr2rgb" (decode in RGB) or "mirror" (flip left-right at random)."""

    def __init__(self, preprocessor):
        assert isinstance(preprocessor, str)
        if preprocessor.lower() not in ("bgr2rgb", "mirror"):
            raise ValueError('preprocessor must be "bgr2rgb" or "mirror".')
        self.preprocessor = preprocessor

    def is_rgb(self):
        return self.preprocessor.lower() == "bgr2rgb"

    def is_mirror(self):
        return self.preprocessor.lower() == "mirror"


class ImageResizePreprocessor:
    """Resize the decoded image to `width` x `height`."""

    def __init__(self, width, height):
        assert isinstance(width, int) and isinstance(height, int)
        self.width, self.height = width, height


class ImageCodec:
    """Decode an encoded image feature, with ImagePreprocessor / ImageResizePreprocessor
    steps."""

    def __init__(self, image_preprocessors=None):
        self.image_preprocessors = list(image_preprocessors) if isinstance(
            image_preprocessors, (list, tuple)) else []

    def color_space(self):
        return "RGB" if any(isinstance(p, ImagePreprocessor) and p.is_rgb()
                            for p in self.image_preprocessors) else "BGR"

    def do_mirror(self):
        return any(isinstance(p, ImagePreprocessor) and p.is_mirror()
                   for p in self.image_preprocessors)

    def do_resize(self):
        for p in self.image_preprocessors:
            if isinstance(p, ImageResizePreprocessor):
                return True, p.width, p.height
        return False, -1, -1


class RawCodec:
    """Read a number (or bytes) feature as is; `truncate` (or the deprecated
    `auto_zero_padding`) pads short features with zeros and cuts long ones."""

    def __init__(self, truncate=False, auto_zero_padding=False):
        if auto_zero_padding:
            print("WARNING: auto_zero_padding has been deprecated, Please use truncate "
                  "instead.")
        self.truncate = truncate or auto_zero_padding


class NormByChannelPreprocessor:
    """(pixel - mean) / std per channel; `data_format` "channels_last" gives NHWC, any
    other NCHW."""

    def __init__(self, mean_values, std_values=(1.0, 1.0, 1.0), data_format="channels_last"):
        assert isinstance(mean_values, (list, tuple))
        assert isinstance(std_values, (list, tuple))
        assert isinstance(data_format, str)
        self.mean_values, self.std_values, self.data_format = mean_values, std_values, data_format

    def output_layout(self):
        return "NHWC" if self.data_format == "channels_last" else "NCHW"


class BlobConf:
    """One blob decode_ofrecord makes: feature `name` decoded by `codec` to `shape` and
    `dtype`, then `preprocessors` (NormByChannelPreprocessor)."""

    def __init__(self, name, shape, dtype, codec, preprocessors=None):
        assert isinstance(name, str)
        assert isinstance(shape, (list, tuple))
        self.name, self.shape, self.dtype, self.codec = name, shape, dtype, codec
        self.preprocessors = list(preprocessors) if isinstance(
            preprocessors, (list, tuple)) else []

    def decode_blob(self, input_blob, batch_size):
        """This blob decoded from the records `input_blob` (ofrecord_reader's)."""
        if isinstance(self.codec, ImageCodec):
            color_space = self.codec.color_space()
            image = ofrecord_image_decoder(input_blob, self.name, color_space=color_space)
            mirror = coin_flip(batch_size) if self.codec.do_mirror() else None
            do_resize, width, height = self.codec.do_resize()
            if not do_resize:
                assert len(self.shape) >= 2
                width, height = self.shape[0], self.shape[1]
            image, _, _ = image_ops.resize(image, target_size=(width, height))
            for preprocess in self.preprocessors:
                image = image_ops.crop_mirror_normalize(
                    image, mirror_blob=mirror, color_space=color_space,
                    output_layout=preprocess.output_layout(), mean=preprocess.mean_values,
                    std=preprocess.std_values, output_dtype=self.dtype)
            return image
        if isinstance(self.codec, RawCodec):
            return ofrecord_raw_decoder(input_blob, self.name, shape=self.shape,
                                        dtype=self.dtype, truncate=self.codec.truncate)
        raise NotImplementedError(f"BlobConf {self.name!r}: codec must be an ImageCodec or a "
                                  f"RawCodec, got {self.codec!r}")


def ofrecord_loader(ofrecord_dir, batch_size=1, data_part_num=1, part_name_prefix="part-",
                    part_name_suffix_length=-1, shuffle=False, shuffle_buffer_size=1024,
                    name=None):
    """The older name of flow.data.ofrecord_reader (`shuffle` is its random_shuffle)."""
    return ofrecord_reader(ofrecord_dir, batch_size=batch_size, data_part_num=data_part_num,
                           part_name_prefix=part_name_prefix,
                           part_name_suffix_length=part_name_suffix_length,
                           random_shuffle=shuffle, shuffle_buffer_size=shuffle_buffer_size,
                           name=name)


def decode_ofrecord(ofrecord_dir, blobs, batch_size=1, data_part_num=1,
                    part_name_prefix="part-", part_name_suffix_length=-1, shuffle=False,
                    buffer_size=1024, name=None):
    """A tuple with one blob per BlobConf in `blobs`, decoded from each batch of
    `batch_size` records of `ofrecord_dir` (module docstring)."""
    records = ofrecord_loader(ofrecord_dir, batch_size, data_part_num, part_name_prefix,
                              part_name_suffix_length, shuffle, buffer_size, name)
    return tuple(conf.decode_blob(records, batch_size) for conf in blobs)


def _label(where, record, feature_name):
    """OneFlow's image-classification label: the one int32 / int64 of the feature, as an
    int32 (1,) array."""
    value = record.get(feature_name)
    if value is None:
        raise ofrecord.RecordError(f"{where}: no feature {feature_name!r} (it has "
                                   f"{sorted(record)})")
    if isinstance(value, list) or value.dtype.kind != "i" or value.size != 1:
        what = "bytes" if isinstance(value, list) else f"{value.size} {value.dtype} values"
        raise ofrecord.RecordError(f"{where}: label feature {feature_name!r} must hold one "
                                   f"int32 or int64, got {what}")
    return value.astype(np.int32).reshape(1)


def ofrecord_image_classification_reader(ofrecord_dir, image_feature_name, label_feature_name,
                                         batch_size=1, data_part_num=1,
                                         part_name_prefix="part-", part_name_suffix_length=-1,
                                         random_shuffle=False, shuffle_buffer_size=1024,
                                         shuffle_after_epoch=False, color_space="BGR",
                                         decode_buffer_size_per_thread=32,
                                         num_decode_threads_per_machine=None, name=None):
    """(images, labels) of each batch of records: a tensor buffer of the decoded (H, W, C)
    uint8 images in `color_space`, and the labels as an int32 (N,) blob (OneFlow's reader
    turns its label buffer into a tensor and squeezes it, in every version), ready for
    flow.nn.sparse_softmax_cross_entropy_with_logits. The decode-thread arguments tune
    OneFlow's reader; onnxjob decodes on its own decode threads."""
    api = "flow.data.ofrecord_image_classification_reader"
    if not isinstance(label_feature_name, str):
        raise TraceError(f"{api}: label_feature_name must be a str, got {label_feature_name!r}")
    records = ofrecord_reader(ofrecord_dir, batch_size=batch_size,
                              data_part_num=data_part_num, part_name_prefix=part_name_prefix,
                              part_name_suffix_length=part_name_suffix_length,
                              random_shuffle=random_shuffle,
                              shuffle_buffer_size=shuffle_buffer_size,
                              shuffle_after_epoch=shuffle_after_epoch, name=name)
    check_host_value(records, api, RECORD)
    images = ofrecord_image_decoder(records, image_feature_name, color_space=color_space)

    def labels(batch):
        return [(where, _label(where, ofrecord.decode_record(record, where), label_feature_name))
                for where, record in batch]

    label = host_value(f"{name or 'OFRecordImageClassificationReader'}_label", labels,
                       [records], batch_size, TENSOR_BUFFER, api)
    label = tensor_buffer_to_tensor(label, dtype=dtypes.int32, instance_shape=[1])
    return images, squeeze(label, axis=[-1])


__all__ = ["BlobConf", "ImageCodec", "ImagePreprocessor", "ImageResizePreprocessor",
           "NormByChannelPreprocessor", "RawCodec", "decode_ofrecord", "ofrecord_loader",
           "ofrecord_image_classification_reader"]
