"""The host-side image work of the data ops (ops/data.py, ops/image.py), in OneFlow's terms.

OneFlow's image kernels use OpenCV. onnxjob decodes with Pillow and resamples with NumPy,
using the coefficient tables of OpenCV's cv::resize, so results agree with OneFlow's up to
the rounding of OpenCV's fixed-point uint8 paths (at most 1 level):

- decode: Pillow (libjpeg-turbo, libpng) into BGR like cv::imdecode, RGB or GRAY on demand.
  Pixels equal OpenCV's when both use the same codec library. Read as GRAY, a color JPEG
  gives libjpeg's own luma (as OpenCV's does), other color images Pillow's ITU-R 601 luma
  (OpenCV's weights; the rounding may differ by 1). EXIF orientation is not applied.
- resize: OpenCV's INTER_LINEAR, INTER_NEAREST, INTER_CUBIC (a = -0.75) and INTER_AREA.
  NOTE: Pillow's own filters are not these functions: its resize low-passes the image when
  shrinking and its affine transform truncates instead of rounding.
- random_crop_window: OneFlow's RandomCropGenerator (random area and aspect ratio).
  NOTE: the draws come from NumPy's generators, not std::mt19937 through libstdc++'s
  distributions, so a given seed picks other windows than OneFlow's.
- crop_mirror_normalize: OneFlow's CropMirrorNormalize kernel, to the float32 bit.

Images are (H, W, C) arrays, uint8 or float32. A batch of images or byte strings travels
between host nodes as a list of (where, value), `where` naming the file and record for
errors. `map_ordered` spreads the per-item work of a batch over a small thread pool
(Pillow and NumPy release the GIL) and keeps the batch order.
"""
import functools
import io
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from onnxjob import settings
from onnxjob.io.ofrecord import RecordError

COLOR_SPACES = ("BGR", "RGB", "GRAY")
INTERPOLATIONS = ("auto", "bilinear", "nearest_neighbor", "nn", "bicubic", "area")

_pool = (0, None)  # (threads, ThreadPoolExecutor)
_pool_lock = threading.Lock()


def decode_threads():
    """Threads decoding a batch: $ONNXJOB_DECODE_THREADS, else min(4, cores) (the NOTE at
    onnxjob/settings.py's default says why)."""
    return settings.get("DECODE_THREADS")


def _executor(threads):
    """The shared decode pool, remade when the thread count changed."""
    global _pool
    with _pool_lock:
        if _pool[0] != threads:
            if _pool[1] is not None:
                _pool[1].shutdown(wait=False)  # work already queued there still completes
            _pool = (threads, ThreadPoolExecutor(max_workers=threads,
                                                 thread_name_prefix="onnxjob-decode"))
        return _pool[1]


def map_ordered(fn, items):
    """[fn(item) for item in items], the items split over the decode threads in contiguous
    chunks; the first failing item (in batch order) raises its error."""
    items = list(items)
    threads = decode_threads()
    if threads <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    bounds = np.linspace(0, len(items), min(threads, len(items)) + 1).round().astype(int)
    chunks = [items[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    results = _executor(threads).map(lambda chunk: [fn(i) for i in chunk], chunks)
    return [value for chunk in results for value in chunk]


# -- decoding ---------------------------------------------------------------------------

def _pillow_image():
    """Pillow's Image module, imported on first use: only jobs that decode images need it."""
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError(
            "decoding images needs Pillow: pip install 'onnxjob[images]' (or pip install pillow)"
        ) from e
    return Image


def decode(data, color_space="BGR", where="image"):
    """The (H, W, 3) BGR / RGB or (H, W, 1) GRAY uint8 pixels of encoded image `data`."""
    mode = "L" if color_space == "GRAY" else "RGB"
    Image = _pillow_image()
    try:
        image = Image.open(io.BytesIO(data))
        if mode == "L" and image.format == "JPEG":
            image.draft("L", None)  # libjpeg's own luma, as cv::IMREAD_GRAYSCALE reads it
        image.load()
        if image.mode != mode:
            image = image.convert(mode)
    # NOTE: Pillow reports bad data with many exception types (OSError, SyntaxError,
    # ValueError, DecompressionBombError, ...); each becomes one error naming the record.
    except Exception as e:
        raise RecordError(f"{where}: the bytes ({len(data)}) do not decode as an image "
                          f"({type(e).__name__}: {e})") from None
    pixels = np.asarray(image)
    if color_space == "GRAY":
        return pixels[:, :, None]
    return np.ascontiguousarray(pixels[:, :, ::-1]) if color_space == "BGR" else pixels


def channels_of(color_space):
    """Channels of images in `color_space` (ValueError for a color space OneFlow lacks)."""
    if color_space not in COLOR_SPACES:
        raise ValueError(f"color_space must be one of {', '.join(COLOR_SPACES)}, got "
                         f"{color_space!r}")
    return 1 if color_space == "GRAY" else 3


# -- random crop ------------------------------------------------------------------------

def slot_generators(seed, count):
    """One NumPy generator per batch slot, from `seed` (OneFlow gives each slot its own)."""
    sequence = np.random.SeedSequence(int(seed) % 2 ** 63)
    return [np.random.default_rng(s) for s in sequence.spawn(count)]


def random_crop_args(num_attempts, random_area, random_aspect_ratio):
    """(random_area, random_aspect_ratio, num_attempts) checked as OneFlow's kernel state
    does (ValueError says what is wrong)."""
    if isinstance(num_attempts, bool) or not isinstance(num_attempts, int) or num_attempts < 1:
        raise ValueError(f"num_attempts must be an int >= 1, got {num_attempts!r}")
    for label, pair in (("random_area", random_area), ("random_aspect_ratio",
                                                        random_aspect_ratio)):
        if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                or not 0 < float(pair[0]) <= float(pair[1])):
            raise ValueError(f"{label} must be [low, high] with 0 < low <= high, got {pair!r}")
    return ((float(random_area[0]), float(random_area[1])),
            (float(random_aspect_ratio[0]), float(random_aspect_ratio[1])), num_attempts)


def _round_half_away(value):
    return int(math.floor(value + 0.5))


def random_crop_window(height, width, rng, random_area=(0.08, 1.0),
                       random_aspect_ratio=(0.75, 1.333333), num_attempts=10):
    """(y, x, h, w) of OneFlow's random crop: an area fraction and a (log-uniform) w/h
    ratio drawn up to `num_attempts` times until the window fits, else the whole image
    clipped to the ratio range and the largest area; the anchor is uniform."""
    min_ratio, max_ratio = random_aspect_ratio
    min_area = width * height * random_area[0]
    max_w = max(1, int(height * max_ratio))
    max_h = max(1, int(width * (1 / min_ratio)))
    if height * max_w < min_area:
        h, w = height, max_w
    elif width * max_h < min_area:
        h, w = max_h, width
    else:
        log_ratios = (math.log(min_ratio), math.log(max_ratio))
        for _ in range(num_attempts):
            target_area = rng.uniform(*random_area) * height * width
            ratio = math.exp(rng.uniform(*log_ratios))
            w = max(_round_half_away(math.sqrt(target_area * ratio)), 1)
            h = max(_round_half_away(math.sqrt(target_area / ratio)), 1)
            if w <= width and h <= height and min_ratio <= w / h <= max_ratio:
                break
        else:
            h, w = _fallback_window(height, width, max_h, max_w, min_ratio, max_ratio,
                                    random_area[1])
    y = int(rng.integers(0, height - h, endpoint=True))
    x = int(rng.integers(0, width - w, endpoint=True))
    return y, x, h, w


def _fallback_window(height, width, max_h, max_w, min_ratio, max_ratio, max_area_fraction):
    """The window after every attempt failed: the image clipped to the ratio range, shrunk
    to the largest allowed area."""
    ratio = width / height
    if ratio > max_ratio:
        h, w = height, max_w
    elif ratio < min_ratio:
        h, w = max_h, width
    else:
        h, w = height, width
    scale = min(1.0, max_area_fraction * width * height / (h * w))
    return max(1, int(h * math.sqrt(scale))), max(1, int(w * math.sqrt(scale)))


def crop(image, window):
    """The (y, x, h, w) window of `image`, as its own array."""
    y, x, h, w = window
    return np.ascontiguousarray(image[y:y + h, x:x + w])


# -- resizing ---------------------------------------------------------------------------

def cv_interpolation(interpolation, src_w, src_h, dst_w, dst_h):
    """OneFlow's interpolation name as OpenCV's mode: "linear", "nearest", "cubic" or
    "area" ("auto": linear when the image grows, area when it shrinks)."""
    if interpolation == "auto":
        return "linear" if dst_w * dst_h >= src_w * src_h else "area"
    return {"bilinear": "linear", "nearest_neighbor": "nearest", "nn": "nearest",
            "bicubic": "cubic", "area": "area"}[interpolation]


def _cubic_weights(a):
    """OpenCV's interpolateCubic (A = -0.75) for fractions `a`: (n, 4) weights."""
    A = -0.75
    w0 = ((A * (a + 1) - 5 * A) * (a + 1) + 8 * A) * (a + 1) - 4 * A
    w1 = ((A + 2) * a - (A + 3)) * a * a + 1
    w2 = ((A + 2) * (1 - a) - (A + 3)) * (1 - a) * (1 - a) + 1
    return np.stack([w0, w1, w2, 1 - w0 - w1 - w2], axis=1)


def _area_taps(src, dst):
    """cv::resize INTER_AREA when shrinking: each output averages the input cells it
    covers, partial cells weighted by their covered fraction (computeResizeAreaTab, which
    skips slivers of at most 1e-3 of a cell)."""
    scale = src / dst
    start = np.arange(dst) * scale
    cell = np.minimum(scale, src - start)
    index = np.floor(start).astype(np.int64)[:, None] + np.arange(math.ceil(scale) + 1)
    overlap = (np.minimum(np.minimum(start[:, None] + scale, index + 1), src)
               - np.maximum(start[:, None], index))
    weight = np.where(overlap > 1e-3, overlap, 0.0) / cell[:, None]
    return np.minimum(index, src - 1), weight.astype(np.float32)


@functools.lru_cache(maxsize=512)
def _taps(src, dst, mode):
    """(index, weight) of shape (dst, k): output d = sum_k weight[d, k] * input[index[d, k]]
    along one axis, for OpenCV mode `mode` (indices clamped: replicated borders)."""
    scale = src / dst
    out = np.arange(dst, dtype=np.float64)
    if mode == "area":
        return _area_taps(src, dst)
    if mode == "nearest":
        index = np.minimum(np.floor(out * scale).astype(np.int64), src - 1)[:, None]
        return index, np.ones((dst, 1), np.float32)
    if mode == "area_enlarge":  # cv::resize INTER_AREA where an axis grows
        start = np.floor(out * scale)
        frac = (out + 1) - (start + 1) / scale
        frac = np.where(frac <= 0, 0.0, frac - np.floor(frac))
        offsets, weight = np.arange(2), np.stack([1 - frac, frac], axis=1)
    else:
        position = (out + 0.5) * scale - 0.5
        start = np.floor(position)
        frac = position - start
        if mode == "linear":
            offsets, weight = np.arange(2), np.stack([1 - frac, frac], axis=1)
        else:
            offsets, weight = np.arange(-1, 3), _cubic_weights(frac)
    index = np.clip(start[:, None].astype(np.int64) + offsets, 0, src - 1)
    return index, weight.astype(np.float32)


def _resample(image, index, weight, axis):
    shape = [1] * image.ndim
    shape[axis] = -1
    out = None
    for k in range(index.shape[1]):
        term = np.take(image, index[:, k], axis=axis) * weight[:, k].reshape(shape)
        out = term if out is None else np.add(out, term, out=out)
    return out


def resize(image, width, height, interpolation="bilinear"):
    """`image` (H, W, C) resized to (height, width, C) as cv::resize does it, with
    OneFlow's interpolation name; uint8 results are rounded and saturated."""
    src_h, src_w = image.shape[:2]
    if (src_h, src_w) == (height, width):
        return image.copy()
    mode = cv_interpolation(interpolation, src_w, src_h, width, height)
    if mode == "area" and (width > src_w or height > src_h):
        mode = "area_enlarge"
    rows = _resample(image, *_taps(src_h, height, mode), axis=0)
    out = _resample(rows, *_taps(src_w, width, mode), axis=1)
    if image.dtype == np.uint8:
        return np.clip(np.floor(out + 0.5), 0, 255).astype(np.uint8)
    return out.astype(image.dtype, copy=False)


def keep_aspect_size(height, width, target_size, min_size=0, max_size=0, resize_longer=False):
    """(new_width, new_height) of image_resize_keep_aspect_ratio: the shorter (or longer)
    side becomes `target_size`, the other keeps the ratio, rounded half to even; the
    other side is bounded by max_size (min_size when resizing the longer side)."""
    short, long = min(height, width), max(height, width)
    ratio = short / long
    if resize_longer:
        new_long = float(target_size)
        new_short = np.rint(new_long * ratio)
        if min_size > 0 and new_short < min_size:
            new_short = float(min_size)
            new_long = np.rint(new_short / ratio)
    else:
        new_short = float(target_size)
        new_long = np.rint(new_short / ratio)
        if max_size > 0 and new_long > max_size:
            new_long = float(max_size)
            new_short = np.rint(new_long * ratio)
    if width < height:
        return int(new_short), int(new_long)
    return int(new_long), int(new_short)


# -- crop, mirror, normalize ------------------------------------------------------------

def crop_mirror_normalize(image, out_h, out_w, crop_pos_y, crop_pos_x, mirror, mean, inv_std,
                          nchw):
    """OneFlow's CropMirrorNormalize of one (H, W, C) uint8 image: the (out_h, out_w)
    window at (crop_pos_y, crop_pos_x) of the slack, mirrored left-right if `mirror`, as
    (pixel - mean) * inv_std in float32, (C, h, w) if `nchw` else (h, w, C)."""
    in_h, in_w = image.shape[:2]
    y = int(np.float32(in_h - out_h) * np.float32(crop_pos_y))
    x = int(np.float32(in_w - out_w) * np.float32(crop_pos_x))
    window = image[y:y + out_h, x:x + out_w]
    if mirror:
        window = window[:, ::-1]
    out = (window.astype(np.float32) - mean) * inv_std
    return np.ascontiguousarray(out.transpose(2, 0, 1) if nchw else out)


def flip(image, flip_code):
    """OneFlow's image_flip: 1 mirrors left-right, 2 up-down, 3 both, 0 leaves it."""
    if flip_code & 1:
        image = image[:, ::-1]
    if flip_code & 2:
        image = image[::-1]
    return np.ascontiguousarray(image)
