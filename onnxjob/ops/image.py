"""`flow.image`: OneFlow's image ops on batches of decoded images, run on the host.

They take the decoders' tensor buffers (ops/data.py: a list of (where, (H, W, C) image)
made each run) and give tensor buffers, or fixed-shape arrays that become graph inputs
(Resize to a fixed size, CropMirrorNormalize, batch_align; CropMirrorNormalize also reads
such a host-fed uint8 batch, and flow.random.CoinFlip as its mirror, and runs as graph ops on
a uint8 batch computed in the graph, e.g. by flow.cast). The pixel work is
io/images.py: cv::resize's arithmetic, OneFlow's crop and normalize arithmetic.
"""
import numpy as np

from onnxjob import dtypes
from onnxjob.compat.generations import positional_is, two_generations
from onnxjob.errors import TraceError, missing_api
from onnxjob.graph.tracer import Blob, as_blob, int64_constant, op
from onnxjob.io import images as image_io
from onnxjob.io.ofrecord import RecordError
from onnxjob.ops.host import (TENSOR_BUFFER, HostValue, check_host_value, checked_args,
                              encoded_items, host_readable, host_value, to_blob)
from onnxjob.ops.random import gen_seed

__all__ = ["CropMirrorNormalize", "Resize", "batch_align", "crop_mirror_normalize", "decode",
           "flip", "normalize", "random_crop", "resize", "target_resize"]

_INTERP_TYPES = {"Linear": "bilinear", "NN": "nearest_neighbor", "Cubic": "bicubic"}


def _image_dtype(dtype, api):
    """The NumPy dtype of flow `dtype`, which must be uint8 or float32 (OneFlow's image
    kernels take no other)."""
    np_dtype = dtypes.to_numpy(dtype) if dtype is not None else None
    if np_dtype not in (np.uint8, np.float32):
        raise TraceError(f"{api}: dtype must be flow.uint8 or flow.float32, got {dtype!r}")
    return np_dtype


def _channels(where, image, channels, api):
    """Check that `image` is (H, W, channels) (any channels if None)."""
    if image.ndim != 3 or channels not in (None, image.shape[2]):
        raise RecordError(f"{where}: {api} expects (H, W, {channels or 'C'}) images, got one "
                          f"of shape {image.shape}")


def _each(batch, fn):
    """[fn(where, image)] over a tensor buffer's items on the decode threads, in order."""
    return image_io.map_ordered(lambda item: fn(*item), batch)


# -- resize -----------------------------------------------------------------------------

def Resize(image, target_size=None, min_size=None, max_size=None, keep_aspect_ratio=False,
           resize_side="shorter", channels=3, dtype=None, interpolation_type="auto", name=None,
           color_space=None, interp_type=None, resize_shorter=0, resize_x=0, resize_y=0):
    """Images resized to `target_size` = (width, height) (a fixed (N, h, w, channels)
    batch of `dtype`, uint8 by default), or, with keep_aspect_ratio, so that their
    `resize_side` side is `target_size`. Returns (images, scale, new_size) as OneFlow
    does: (N, 2) float32 (w, h) scale factors, (N, 2) int32 (w, h) sizes (None for a fixed
    size); only the images when a deprecated argument (color_space, interp_type,
    resize_shorter, resize_x / resize_y) is used."""
    api = "flow.image.Resize"
    check_host_value(image, api, TENSOR_BUFFER)
    deprecated = any(a is not None for a in (color_space, interp_type)) or resize_shorter > 0 \
        or (resize_x > 0 and resize_y > 0)
    if color_space is not None:
        channels = checked_args(image_io.channels_of, api, color_space.upper())
    if interp_type is not None:
        if interp_type not in _INTERP_TYPES:
            raise TraceError(f"{api}: interp_type must be one of {', '.join(_INTERP_TYPES)}, "
                             f"got {interp_type!r}")
        interpolation_type = _INTERP_TYPES[interp_type]
    if resize_x > 0 and resize_y > 0:
        target_size, keep_aspect_ratio = (resize_x, resize_y), False
    if resize_shorter > 0:
        target_size, keep_aspect_ratio, resize_side = resize_shorter, True, "shorter"
    if interpolation_type not in image_io.INTERPOLATIONS:
        raise TraceError(f"{api}: interpolation_type must be one of "
                         f"{', '.join(image_io.INTERPOLATIONS)}, got {interpolation_type!r}")
    name = name or "ImageResize"
    if keep_aspect_ratio:
        out = _resize_keep_aspect_ratio(image, target_size, min_size or 0, max_size or 0,
                                        resize_side, interpolation_type, name, api)
    else:
        out = _resize_to_fixed(image, target_size, int(channels), dtype, interpolation_type,
                               name, api)
    return out[0] if deprecated else out


resize = Resize


def _scale(width, height, image):
    """OneFlow's float32 (new / old width, new / old height)."""
    return (np.float32(width) / np.float32(image.shape[1]),
            np.float32(height) / np.float32(image.shape[0]))


def _resize_to_fixed(image, target_size, channels, dtype, interpolation, name, api):
    if (not isinstance(target_size, (list, tuple)) or len(target_size) != 2
            or not all(isinstance(s, int) and s > 0 for s in target_size)):
        raise TraceError(f"{api}: target_size must be (width, height) when keep_aspect_ratio "
                         f"is False, got {target_size!r}")
    np_dtype = _image_dtype(dtypes.uint8 if dtype is None else dtype, api)
    width, height = target_size

    def resize_one(where, img):
        _channels(where, img, channels, api)
        # OneFlow resizes in the image's dtype, then converts as cv::Mat::convertTo does
        # (float to uint8 rounds half to even and saturates)
        out = image_io.convert(image_io.resize(img, width, height, interpolation), np_dtype)
        return out, _scale(width, height, img)

    def compute(batch):
        done = _each(batch, resize_one)
        return (np.stack([out for out, _ in done]),
                np.array([scale for _, scale in done], np.float32))

    n = image.batch_size
    both = host_value(name, compute, [image], n, TENSOR_BUFFER, api)
    out = to_blob(f"{name}_out", lambda v: v[0], [both], (n, height, width, channels), np_dtype,
                  api)
    scale = to_blob(f"{name}_scale", lambda v: v[1], [both], (n, 2), np.float32, api)
    return out, scale, None


def _resize_keep_aspect_ratio(image, target_size, min_size, max_size, resize_side,
                              interpolation, name, api):
    if isinstance(target_size, bool) or not isinstance(target_size, int) or target_size <= 0:
        raise TraceError(f"{api}: target_size must be a positive int when keep_aspect_ratio "
                         f"is True, got {target_size!r}")
    if resize_side not in ("shorter", "longer"):
        raise TraceError(f"{api}: resize_side must be \"shorter\" or \"longer\", got "
                         f"{resize_side!r}")
    if (min_size > 0 and target_size < min_size) or (max_size > 0 and target_size > max_size):
        raise TraceError(f"{api}: target_size {target_size} must lie within min_size "
                         f"{min_size} and max_size {max_size}")
    longer = resize_side == "longer"

    def resize_one(where, img):
        _channels(where, img, None, api)
        width, height = image_io.keep_aspect_size(img.shape[0], img.shape[1], target_size,
                                                  min_size, max_size, longer)
        out = image_io.resize(img, width, height, interpolation)
        return where, out, (width, height), _scale(width, height, img)

    n = image.batch_size
    done = host_value(name, lambda batch: _each(batch, resize_one), [image], n, TENSOR_BUFFER,
                      api)
    out = host_value(f"{name}_out", lambda v: [(where, img) for where, img, _, _ in v], [done],
                     n, TENSOR_BUFFER, api)
    scale = to_blob(f"{name}_scale", lambda v: np.array([s for *_, s in v], np.float32),
                    [done], (n, 2), np.float32, api)
    size = to_blob(f"{name}_size", lambda v: np.array([s for _, _, s, _ in v], np.int32),
                   [done], (n, 2), np.int32, api)
    return out, scale, size


def target_resize(images, target_size, min_size=None, max_size=None, resize_side="shorter",
                  interpolation_type="auto", name=None):
    """Resize keeping the aspect ratio; returns (images, new_size, scale) in OneFlow's
    order for this op."""
    out, scale, size = Resize(images, target_size=target_size, min_size=min_size,
                              max_size=max_size, keep_aspect_ratio=True, resize_side=resize_side,
                              interpolation_type=interpolation_type,
                              name=name or "ImageTargetResize")
    return out, size, scale


# -- crop, mirror, normalize ------------------------------------------------------------

def CropMirrorNormalize(input_blob, mirror_blob=None, color_space="BGR", output_layout="NCHW",
                        crop_h=0, crop_w=0, crop_pos_y=0.5, crop_pos_x=0.5, mean=[0.0],
                        std=[1.0], output_dtype=dtypes.float, name=None):
    """A float32 (N, C, crop_h, crop_w) (NCHW) or (N, crop_h, crop_w, C) (NHWC) batch:
    the window at (crop_pos_y, crop_pos_x) of each image's slack, mirrored left-right where
    `mirror_blob` (int8, e.g. flow.random.CoinFlip) is 1, as (pixel - mean) / std per
    channel. Takes a tensor buffer of uint8 images (crop_h, crop_w required) or a host-fed
    uint8 (N, H, W, C) batch (no crop: the whole image; a crop is clipped to it)."""
    api = "flow.image.CropMirrorNormalize"
    channels = checked_args(image_io.channels_of, api, color_space)
    if output_layout not in ("NCHW", "NHWC"):
        raise TraceError(f"{api}: output_layout must be \"NCHW\" or \"NHWC\", got "
                         f"{output_layout!r}")
    if output_dtype is not dtypes.float32:
        raise TraceError(f"{api}: output_dtype must be flow.float (OneFlow's kernels give "
                         f"float32 only), got {output_dtype!r}")
    mean_vec = _per_channel(mean, channels, "mean", api)
    inv_std = np.float32(1.0) / _per_channel(std, channels, "std", api)
    n, out_h, out_w = _crop_shape(input_blob, channels, int(crop_h), int(crop_w), api)
    inputs = [input_blob]
    if mirror_blob is not None:
        _check_per_image(mirror_blob, n, "mirror_blob", api)
        inputs.append(mirror_blob)
    nchw = output_layout == "NCHW"
    if isinstance(input_blob, HostValue):
        if mirror_blob is not None and not host_readable(mirror_blob):
            raise TraceError(f"{api}: the mirror flags of a tensor buffer's images are read "
                             "on the host, where a blob computed in the graph cannot go; use "
                             "flow.random.CoinFlip's or a job argument, or resize the images "
                             "to one size first")
    elif any(isinstance(v, Blob) and v.host_node is None for v in inputs):
        # a batch (or mirror flags) computed in the graph: OneFlow's
        # crop_mirror_normalize_from_uint8 takes any uint8 (N, H, W, C) blob
        return _crop_mirror_normalize_in_graph(input_blob, mirror_blob, out_h, out_w,
                                               crop_pos_y, crop_pos_x, mean_vec, inv_std,
                                               nchw, name)

    def normalize_one(item):
        (where, img), mirror = item
        if img.dtype != np.uint8:
            raise RecordError(f"{where}: {api} takes uint8 images, got {img.dtype}")
        _channels(where, img, channels, api)
        if img.shape[0] < out_h or img.shape[1] < out_w:
            raise RecordError(f"{where}: {api}: the {img.shape[0]}x{img.shape[1]} image is "
                              f"smaller than the {out_h}x{out_w} crop")
        return image_io.crop_mirror_normalize(img, out_h, out_w, crop_pos_y, crop_pos_x,
                                              mirror, mean_vec, inv_std, nchw)

    def compute(batch, mirror=None):
        mirror = np.zeros(n, np.int8) if mirror is None else np.asarray(mirror).reshape(-1)
        return np.stack(image_io.map_ordered(normalize_one, zip(_items(batch, api), mirror)))

    shape = (n, channels, out_h, out_w) if nchw else (n, out_h, out_w, channels)
    return to_blob(name or "CropMirrorNormalize", compute, inputs, shape, np.float32, api)


crop_mirror_normalize = CropMirrorNormalize


def _crop_mirror_normalize_in_graph(x, mirror, out_h, out_w, crop_pos_y, crop_pos_x, mean,
                                    inv_std, nchw, name):
    """CropMirrorNormalize of a uint8 (N, H, W, C) Blob as graph ops, with the window of
    image_io.crop_mirror_normalize (the same for every image: the batch has one size)."""
    _, in_h, in_w, _ = x.shape
    y0 = int(np.float32(in_h - out_h) * np.float32(crop_pos_y))
    x0 = int(np.float32(in_w - out_w) * np.float32(crop_pos_x))
    window = op("Slice", x, int64_constant(x, [y0, x0]),
                int64_constant(x, [y0 + out_h, x0 + out_w]), int64_constant(x, [1, 2]))
    if mirror is not None:
        mirrored = op("Slice", window, int64_constant(x, [-1]),
                      int64_constant(x, [-(2 ** 62)]), int64_constant(x, [2]),
                      int64_constant(x, [-1]))
        flags = op("Reshape", op("Cast", mirror, to=9),      # 9: BOOL
                   int64_constant(x, [-1, 1, 1, 1]))
        window = op("Where", flags, mirrored, window)
    pixels = op("Cast", window, to=1)                      # 1: FLOAT
    out = op("Mul", op("Sub", pixels, as_blob(mean, like=pixels)),
             as_blob(inv_std, like=pixels))
    return op("Transpose", out, perm=[0, 3, 1, 2], name=name) if nchw else \
        op("Identity", out, name=name)


def _per_channel(values, channels, label, api):
    values = np.asarray(values, np.float32).reshape(-1)
    if values.size not in (1, channels):
        raise TraceError(f"{api}: {label} takes 1 or {channels} values, got {values.size}")
    return np.broadcast_to(values, (channels,)).copy()


def _crop_shape(value, channels, crop_h, crop_w, api):
    """(N, out_h, out_w) of CropMirrorNormalize on `value`."""
    if isinstance(value, HostValue) and value.dtype is TENSOR_BUFFER:
        if crop_h <= 0 or crop_w <= 0:
            raise TraceError(f"{api}: crop_h and crop_w are required for a tensor buffer of "
                             f"images (their sizes vary), got {crop_h}x{crop_w}")
        return value.batch_size, crop_h, crop_w
    if isinstance(value, Blob) and value.np_dtype == np.uint8 and len(value.shape) == 4:
        n, h, w, c = value.shape
        if c != channels:
            raise TraceError(f"{api}: the input has {c} channels, color_space gives {channels}")
        if crop_h <= 0 or crop_w <= 0:
            return n, h, w
        return n, min(crop_h, h), min(crop_w, w)
    raise TraceError(f"{api} takes a tensor buffer of images or a uint8 (N, H, W, C) blob "
                     f"(OneFlow's kernels take no other), got {value!r}")


def _check_per_image(value, n, label, api):
    """`value`, an int8 (N,) Blob (flow.random.CoinFlip's, or any other) read per image."""
    if not (isinstance(value, Blob) and value.np_dtype == np.int8
            and tuple(value.shape) == (n,)):
        raise TraceError(f"{api}: {label} must be an int8 ({n},) blob, such as "
                         f"flow.random.CoinFlip(batch_size={n}), got {value!r}")


def _items(batch, api):
    """A tensor buffer's (where, image) items, or those of a host-fed (N, H, W, C) array."""
    if isinstance(batch, np.ndarray):
        return [(f"{api}: batch image {i}", image) for i, image in enumerate(batch)]
    return batch


# -- other image ops --------------------------------------------------------------------

def random_crop(input_blob, num_attempts=10, seed=None, random_area=None,
                random_aspect_ratio=None, name="ImageRandomCrop"):
    """A random window of each image (OneFlow's random area and aspect-ratio crop, as
    flow.data.OFRecordImageDecoderRandomCrop does while decoding)."""
    api = "flow.image.random_crop"
    check_host_value(input_blob, api, TENSOR_BUFFER)
    crop_args = checked_args(image_io.random_crop_args, api, num_attempts,
                             random_area or [0.08, 1.0], random_aspect_ratio or [0.75, 1.333333])
    generators = image_io.slot_generators(gen_seed(seed)[0], input_blob.batch_size)

    def crop_one(item):
        slot, (where, img) = item
        window = image_io.random_crop_window(*img.shape[:2], generators[slot], *crop_args)
        return where, image_io.crop(img, window)

    return host_value(name or "ImageRandomCrop",
                      lambda batch: image_io.map_ordered(crop_one, enumerate(batch)),
                      [input_blob], input_blob.batch_size, TENSOR_BUFFER, api)


def decode(images_bytes_buffer, dtype=dtypes.uint8, color_space="BGR", name=None):
    """Encoded images (flow.data.OFRecordBytesDecoder) decoded to (H, W, C) images of
    `dtype` (uint8 or float32) in `color_space`."""
    api = "flow.image.decode"
    check_host_value(images_bytes_buffer, api, TENSOR_BUFFER)
    np_dtype = _image_dtype(dtype, api)
    checked_args(image_io.channels_of, api, color_space)

    def decode_one(where, data):
        pixels = image_io.decode(data, color_space, where, any_depth=True)
        if pixels.dtype == np.uint16 and np_dtype == np.uint8:    # (cv::Mat::convertTo)
            pixels = np.minimum(pixels, 255)
        return where, pixels.astype(np_dtype, copy=False)

    return host_value(name or "ImageDecode",
                      lambda batch: _each(encoded_items(batch, api), decode_one),
                      [images_bytes_buffer], images_bytes_buffer.batch_size, TENSOR_BUFFER,
                      api)


def flip(image, flip_code, name=None):
    """Each image flipped by `flip_code` (an int, or an int8 per-image blob): 1 left-right,
    2 up-down, 3 both, 0 none."""
    api = "flow.image.flip"
    check_host_value(image, api, TENSOR_BUFFER)
    inputs = [image]
    if isinstance(flip_code, Blob):
        _check_per_image(flip_code, image.batch_size, "flip_code", api)
        inputs.append(flip_code)
    elif isinstance(flip_code, bool) or not isinstance(flip_code, int) or not 0 <= flip_code <= 3:
        raise TraceError(f"{api}: flip_code must be 0, 1, 2 or 3 (or an int8 blob of them), "
                         f"got {flip_code!r}")

    def compute(batch, codes=None):
        codes = np.full(len(batch), flip_code) if codes is None else codes
        return [(where, image_io.flip(img, int(code)))
                for (where, img), code in zip(batch, codes)]

    return host_value(name or "ImageFlip", compute, inputs, image.batch_size, TENSOR_BUFFER, api)


def normalize(image, std, mean, name=None):
    """Float images as (image - mean) / std per channel (one value per channel each)."""
    api = "flow.image.normalize"
    check_host_value(image, api, TENSOR_BUFFER)
    if not isinstance(std, (list, tuple)) or not isinstance(mean, (list, tuple)):
        raise TraceError(f"{api}: std and mean must be lists of one value per channel, got "
                         f"{std!r} and {mean!r}")
    if len(std) != len(mean):
        raise TraceError(f"{api}: std and mean must have one value per channel each, got "
                         f"{len(std)} and {len(mean)}")

    def normalize_one(where, img):
        if img.dtype.kind != "f":
            raise RecordError(f"{where}: {api} takes float images (flow.image.decode with "
                              f"dtype=flow.float), got {img.dtype}")
        _channels(where, img, len(std), api)
        return where, (img - np.asarray(mean, img.dtype)) / np.asarray(std, img.dtype)

    return host_value(name or "ImageNormalize", lambda batch: _each(batch, normalize_one),
                      [image], image.batch_size, TENSOR_BUFFER, api)


@two_generations(("images", "shape", "dtype", "alignment", "name"), positional_is(4, str))
def batch_align(images, shape, dtype, alignment, dynamic_out=True, name=None):
    """The images in one zero-padded batch of `dtype` (uint8 or float32), each at the top
    left. dynamic_out=False: the (N, *shape) batch; dynamic_out=True (OneFlow's default): a
    dynamic blob of at most that, (images, tallest height, widest width, C) with height and
    width rounded up to a multiple of `alignment` (0: not rounded), as OneFlow's kernel
    makes it each run."""
    api = "flow.image.batch_align"
    check_host_value(images, api, TENSOR_BUFFER)
    np_dtype = _image_dtype(dtype, api)
    if len(shape) != 3:
        raise TraceError(f"{api}: shape must be (H, W, C), got {shape!r}")
    if alignment < 0 or (alignment and alignment & (alignment - 1)):
        raise TraceError(f"{api}: alignment must be 0 or a power of 2, got {alignment}")
    height, width, channels = (int(d) for d in shape)

    def batch_size(batch):
        if not dynamic_out:
            return height, width
        tallest = max(img.shape[0] for _, img in batch)
        widest = max(img.shape[1] for _, img in batch)
        tallest, widest = _round_up(tallest, alignment), _round_up(widest, alignment)
        if tallest * widest > height * width:
            raise RecordError(f"{api}: the batch's aligned images are {tallest}x{widest}, "
                              f"more than the {height}x{width} of shape {tuple(shape)}")
        return tallest, widest

    def align(batch):
        batch_h, batch_w = batch_size(batch)
        out = np.zeros((len(batch), batch_h, batch_w, channels), np_dtype)
        for i, (where, img) in enumerate(batch):
            _channels(where, img, channels, api)
            if img.shape[0] > batch_h or img.shape[1] > batch_w:
                raise RecordError(f"{where}: {api}: the {img.shape[0]}x{img.shape[1]} image "
                                  f"does not fit the {batch_h}x{batch_w} batch shape")
            out[i, :img.shape[0], :img.shape[1]] = img
        return out

    return to_blob(name or "ImageBatchAlign", align, [images],
                   (images.batch_size, height, width, channels), np_dtype, api,
                   dynamic=bool(dynamic_out))


def _round_up(size, alignment):
    return -(-size // alignment) * alignment if alignment else size


__getattr__ = missing_api("flow.image")
