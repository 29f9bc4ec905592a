"""The host-side image work of the data ops (ops/data.py, ops/image.py), in OneFlow's terms.

OneFlow's image kernels use OpenCV. onnxjob decodes with Pillow and resamples with NumPy,
repeating cv::resize's arithmetic, so resized pixels equal OneFlow's:

- decode: Pillow (libjpeg-turbo, libpng) into BGR like cv::imdecode, RGB or GRAY on demand.
  Pixels equal OpenCV's when both use the same codec library. Read as GRAY, a color JPEG
  gives libjpeg's own luma (as OpenCV's does), other color images Pillow's ITU-R 601 luma
  (OpenCV's weights; the rounding may differ by 1). EXIF orientation is not applied. A
  16-bit PNG gives its high bytes (libpng's strip, as cv::imdecode's default depth reads
  it) or, for flow.image.decode (IMREAD_ANYDEPTH), its 16-bit values (a color one through
  OpenCV itself, an optional dependency: Pillow keeps 8 bits of it).
- resize: cv::resize's INTER_LINEAR, INTER_NEAREST, INTER_CUBIC and INTER_AREA, uint8 and
  float32, equal to cv2.resize's (OpenCV 4.x and 5.x, IPP off as in OneFlow's build) to
  the bit: its coordinate rounding, 11-bit fixed-point uint8 weights, integer-factor and
  2x2 fast paths, summation order and SIMD rounding (the section "resizing" says which
  OpenCV function each step follows). `convert` is OneFlow's saturating float-to-uint8
  conversion of the result. NOTE: Pillow's own filters are not these functions: its
  resize low-passes the image when shrinking and its affine transform truncates.
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


# Pillow's modes of a 16-bit single-channel image (a 16-bit grayscale PNG)
_SIXTEEN_BIT_GRAY = ("I;16", "I;16B", "I;16L", "I")


def decode(data, color_space="BGR", where="image", any_depth=False):
    """The (H, W, 3) BGR / RGB or (H, W, 1) GRAY uint8 pixels of encoded image `data`, as
    cv::imdecode reads them: a 16-bit image gives its high bytes (libpng's strip to 8
    bits, OneFlow's OFRecord decoders), or with `any_depth` (IMREAD_ANYDEPTH, OneFlow's
    flow.image.decode) a 16-bit image its own uint16 values (a color one through OpenCV,
    when installed), which the caller converts (saturating to uint8, or to float32)."""
    mode = "L" if color_space == "GRAY" else "RGB"
    Image = _pillow_image()
    if any_depth and _is_sixteen_bit_color_png(data):
        return _opencv_any_depth(data, color_space, where)
    try:
        image = Image.open(io.BytesIO(data))
        if mode == "L" and image.format == "JPEG":
            image.draft("L", None)  # libjpeg's own luma, as cv::IMREAD_GRAYSCALE reads it
        image.load()
        if image.mode in _SIXTEEN_BIT_GRAY:
            return _sixteen_bit_gray(np.asarray(image), color_space, any_depth)
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


def _sixteen_bit_gray(values, color_space, any_depth):
    """A 16-bit grayscale image's pixels in `color_space`: its values as uint16 with
    `any_depth`, else their high bytes; three equal channels for BGR / RGB (cv::imdecode's
    gray to color)."""
    values = values.astype(np.uint16)
    pixels = values if any_depth else (values >> 8).astype(np.uint8)
    if color_space == "GRAY":
        return pixels[:, :, None]
    return np.repeat(pixels[:, :, None], 3, axis=2)


def _opencv_any_depth(data, color_space, where):
    """A 16-bit color PNG read by OpenCV itself with IMREAD_ANYDEPTH (Pillow keeps 8 of its
    bits): OpenCV is optional, so without it the image is refused naming the record."""
    try:
        import cv2
    except ImportError:
        raise RecordError(
            f"{where}: a PNG of 16-bit color samples, which OneFlow's flow.image.decode keeps "
            "(IMREAD_ANYDEPTH) and Pillow reads 8 bits of: pip install "
            "opencv-python-headless to decode it as OneFlow does") from None
    flags = cv2.IMREAD_ANYDEPTH | (cv2.IMREAD_GRAYSCALE if color_space == "GRAY"
                                   else cv2.IMREAD_COLOR)
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    if pixels is None:
        raise RecordError(f"{where}: the bytes ({len(data)}) do not decode as an image")
    if color_space == "GRAY":
        return pixels[:, :, None]
    return np.ascontiguousarray(pixels[:, :, ::-1]) if color_space == "RGB" else pixels


def _is_sixteen_bit_color_png(data):
    """Whether `data` is a PNG of 16-bit samples in color (its IHDR's bit depth and color
    type: RGB, gray with alpha, RGBA)."""
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 25 and data[24] == 16 and \
        data[25] in (2, 4, 6)


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


# -- resizing: cv::resize ---------------------------------------------------------------
#
# The functions below reproduce cv::resize (cv::hal::resize in OpenCV's
# modules/imgproc/src/resize.cpp) as OneFlow runs it: OpenCV's own C++ and SSE-baseline
# SIMD loops, without IPP (OneFlow's cmake/third_party/opencv.cmake sets WITH_IPP=OFF).
# Each names the OpenCV function whose arithmetic it follows: coordinates in float64 then
# float32 as OpenCV computes them, uint8 weights in 11-bit fixed point, sums added in
# OpenCV's order, and the vector loops' arithmetic where it differs from the C loops'.
# uint8 and float32 results equal cv2.resize's (with cv2.ipp.setUseIPP(False)) exactly;
# tests/test_image_resize_opencv.py checks them. The passes work on (rows, width * channels)
# views, the per-pixel tables repeated over the channels.

_COEF_SCALE = 2048            # INTER_RESIZE_COEF_SCALE = 1 << INTER_RESIZE_COEF_BITS
_SSE_LANES = {"s16": 8, "f32": 4}   # lanes of the 128-bit universal intrinsics (vx_*)


def cv_interpolation(interpolation, src_w, src_h, dst_w, dst_h):
    """OneFlow's interpolation name as OpenCV's mode: "linear", "nearest", "cubic" or
    "area" ("auto": linear when the image grows, area when it shrinks; OneFlow's
    GetCvInterpolationFlag)."""
    if interpolation == "auto":
        return "linear" if dst_w * dst_h >= src_w * src_h else "area"
    return {"bilinear": "linear", "nearest_neighbor": "nearest", "nn": "nearest",
            "bicubic": "cubic", "area": "area"}[interpolation]


def resize(image, width, height, interpolation="bilinear"):
    """`image` (H, W, C), uint8 or float32, resized to (height, width, C) with OneFlow's
    interpolation name, as cv::resize(image, out, Size(width, height), 0, 0, flag) does
    (hal::resize's choice of implementation)."""
    src_h, src_w, channels = image.shape
    if (src_h, src_w) == (height, width):
        return image.copy()
    mode = cv_interpolation(interpolation, src_w, src_h, width, height)
    if mode == "nearest":
        return _resize_nearest(image, width, height)
    scale_x, scale_y = _scales(src_w, width)[1], _scales(src_h, height)[1]
    factors = _integer_scale(scale_x), _integer_scale(scale_y)
    if mode == "linear" and factors == (2, 2):
        mode = "area"  # hal::resize: a 2x2 linear shrink is the 2x2 area average
    if mode == "area" and scale_x >= 1 and scale_y >= 1:
        if None not in factors:
            return _resize_area_fast(image, width, height, *factors)
        out = _resize_area(image.reshape(src_h, -1), width, height, channels)
    else:
        out = _resize_generic(image.reshape(src_h, -1), width, height, channels, mode)
    return out.reshape(height, width, channels)


def convert(image, dtype):
    """`image` as `dtype` as OneFlow's CvMatConvertToDataType (cv::Mat::convertTo) makes
    it: to uint8 rounded half to even and saturated (saturate_cast<uchar>)."""
    if image.dtype == np.dtype(dtype):
        return image
    return _saturate_uint8(image) if np.dtype(dtype) == np.uint8 else image.astype(dtype)


def _saturate_uint8(values):
    """saturate_cast<uchar> of float values: cvRound (SSE cvtss2si: half to even; NaN,
    infinities and values beyond int32 give INT_MIN, so 0) clipped to 0..255."""
    rounded = np.rint(values)
    with np.errstate(invalid="ignore"):
        rounded[~(np.abs(rounded) < 2.0 ** 31)] = 0
    return np.clip(rounded, 0, 255, out=rounded).astype(np.uint8)


def _scales(src, dst):
    """(inv_scale, scale) of one axis as cv::resize computes them: dst / src, then
    1. / inv_scale (not src / dst: they differ in the last bit for some sizes)."""
    inv_scale = dst / src
    return inv_scale, 1.0 / inv_scale


def _integer_scale(scale):
    """saturate_cast<int>(scale) if scale is an integer within DBL_EPSILON (hal::resize's
    is_area_fast), else None."""
    iscale = int(np.rint(scale))
    return iscale if abs(scale - iscale) < np.finfo(np.float64).eps else None


def _sequential_sum(terms):
    """sum(terms) added left to right, as OpenCV's C loops add (no reassociation); the
    first term is summed into, so it must be a fresh array."""
    out = None
    for term in terms:
        out = term if out is None else np.add(out, term, out=out)
    return out


def _readonly(*arrays):
    """`arrays`, made read-only: the cached tables are shared by the decode threads."""
    for array in arrays:
        array.setflags(write=False)
    return arrays if len(arrays) > 1 else arrays[0]


def _per_element(index, weight, channels):
    """Per-pixel (index, weight) tables, (dst, k), as tables over a row's width * channels
    elements: (dst * channels, k)."""
    index = index[:, None, :] * channels + np.arange(channels)[None, :, None]
    return index.reshape(-1, index.shape[2]), np.repeat(weight, channels, axis=0)


def _hresize(rows, index, weight, dtype):
    """The horizontal pass (HResizeLinear, HResizeCubic, ResizeArea_Invoker's buf) over
    (rows, width * channels): out[:, e] = sum over k of rows[:, index[e, k]] * weight[e, k],
    added in order in `dtype` (int32 for uint8 with fixed-point weights, else float32)."""
    out = None
    for k in range(index.shape[1]):
        term = np.take(rows, index[:, k], axis=1).astype(dtype)
        term *= weight[:, k]
        out = term if out is None else np.add(out, term, out=out)
    return out


# nearest: resizeNN

@functools.lru_cache(maxsize=512)
def _nearest_index(src, dst):
    """resizeNN's source index of each output: min(cvFloor(d * ifx), src - 1) with
    ifx = 1. / inv_scale."""
    ifx = 1.0 / _scales(src, dst)[0]
    return _readonly(np.minimum(np.floor(np.arange(dst) * ifx).astype(np.int64), src - 1))


def _resize_nearest(image, width, height):
    """resizeNN: each output copies its nearest (floored) source pixel."""
    rows = np.take(image, _nearest_index(image.shape[0], height), axis=0)
    return np.take(rows, _nearest_index(image.shape[1], width), axis=1)


# area, integer factors: resizeAreaFast_

def _resize_area_fast(image, width, height, fx, fy):
    """resizeAreaFast_: the mean of each fx x fy block. uint8: (sum + 2) >> 2 for 2x2
    blocks of 1, 3 or 4 channels (ResizeAreaFastVec), else saturate_cast(sum * (1.f/area));
    float32: sum * (1.f/area), the sum added as the C loop adds it, or for 2x2 blocks of 1
    or 4 channels as ResizeAreaFastVec_SIMD_32f does on the elements its loop covers."""
    channels = image.shape[2]
    blocks = image[:height * fy, :width * fx].reshape(height, fy, width, fx, channels)
    cells = [blocks[:, y, :, x] for y in range(fy) for x in range(fx)]  # OpenCV's ofs order
    scale = np.float32(1.0) / np.float32(fx * fy)
    if image.dtype == np.uint8:
        total = _sequential_sum(cell.astype(np.int32) for cell in cells)
        if (fx, fy) == (2, 2) and channels in (1, 3, 4):
            return ((total + 2) >> 2).astype(np.uint8)
        return _saturate_uint8(total.astype(np.float32) * scale)
    out = _area_fast_sum_32f(cells) * scale
    if (fx, fy) == (2, 2) and channels in (1, 4):
        simd = ((cells[0] + cells[1]) + (cells[2] + cells[3])) * scale
        end = _simd_end(width * channels, _SSE_LANES["f32"])
        out.reshape(height, -1)[:, :end] = simd.reshape(height, -1)[:, :end]
    return out


def _area_fast_sum_32f(cells):
    """resizeAreaFast_'s C loop sum in float32: sum += S[0] + S[1] + S[2] + S[3] for each
    4 cells (CV_ENABLE_UNROLLED), then sum += S[k] for the rest."""
    whole = len(cells) - len(cells) % 4
    terms = [((a + b) + c) + d for a, b, c, d in zip(*[iter(cells[:whole])] * 4)]
    return _sequential_sum([np.zeros_like(cells[0])] + terms + cells[whole:])


# area, other shrinking factors: resizeArea_

@functools.lru_cache(maxsize=512)
def _area_tab(src, dst):
    """computeResizeAreaTab as (index, weight), each (dst, k): output d sums
    weight[d, j] * input[index[d, j]] over j in order (zero weights pad the rows). The
    first and last input cells count with their covered fraction (unless it is at most
    1e-3), everything divided by the cell width (clipped to the image)."""
    scale = _scales(src, dst)[1]
    fsx1 = np.arange(dst) * scale
    fsx2 = fsx1 + scale
    cell = np.minimum(scale, src - fsx1)[:, None]
    sx2 = np.minimum(np.floor(fsx2), src - 1)
    sx1 = np.minimum(np.ceil(fsx1), sx2)
    head, tail = sx1 - fsx1 > 1e-3, fsx2 - sx2 > 1e-3
    count = (sx2 - sx1) + head + tail
    index = (sx1 - head)[:, None] + np.arange(int(count.max()))
    weight = np.where(index < sx2[:, None], 1.0 / cell,
                      np.minimum(np.minimum(fsx2 - sx2, 1.0)[:, None], cell) / cell)
    weight = np.where(head[:, None] & (index == sx1[:, None] - 1),
                      (sx1 - fsx1)[:, None] / cell, weight)
    weight = np.where(np.arange(index.shape[1]) < count[:, None], weight, 0.0)
    return _readonly(np.minimum(index, src - 1).astype(np.int64), weight.astype(np.float32))


@functools.lru_cache(maxsize=512)
def _area_row_tab(src, dst, channels):
    return _readonly(*_per_element(*_area_tab(src, dst), channels))


def _resize_area(rows, width, height, channels):
    """resizeArea_ (ResizeArea_Invoker) of (H, W * C) rows: each source row's weighted
    cells summed in float32, then the weighted sums of the rows, each added in order."""
    row_sums = _hresize(rows, *_area_row_tab(rows.shape[1] // channels, width, channels),
                        np.float32)
    y_index, y_weight = _area_tab(rows.shape[0], height)
    out = _sequential_sum(y_weight[:, k, None] * np.take(row_sums, y_index[:, k], axis=0)
                          for k in range(y_index.shape[1]))
    return _saturate_uint8(out) if rows.dtype == np.uint8 else out


# linear, cubic, and area where an axis grows: resizeGeneric_

def _cubic_coeffs(x):
    """interpolateCubic (A = -0.75) in float32, for float32 fractions x: (n, 4)."""
    f = np.float32
    A = f(-0.75)
    x1, mx = x + f(1), f(1) - x
    c0 = ((A * x1 - f(5) * A) * x1 + f(8) * A) * x1 - f(4) * A
    c1 = ((A + f(2)) * x - (A + f(3))) * x * x + f(1)
    c2 = ((A + f(2)) * mx - (A + f(3))) * mx * mx + f(1)
    return np.stack([c0, c1, c2, ((f(1) - c0) - c1) - c2], axis=1)


@functools.lru_cache(maxsize=512)
def _generic_taps(src, dst, mode, horizontal, fixed):
    """hal::resize's xofs/alpha (horizontal) or yofs/beta loop for resizeGeneric_, as
    (index, weight) of shape (dst, k), indices clamped to the image (replicated borders).
    Linear and cubic: sx = cvFloor((d + 0.5) * scale - 0.5) in float32; area (an axis
    grows): sx = cvFloor(d * scale), fx = (d + 1) - (sx + 1) * inv_scale wrapped to [0, 1).
    Horizontally a linear tap left or right of the image takes the border pixel whole;
    vertically OpenCV keeps the weights and clamps the rows. `fixed`: weights as
    saturate_cast<short>(w * 2048), the uint8 path's."""
    inv_scale, scale = _scales(src, dst)
    d = np.arange(dst, dtype=np.float64)
    if mode == "area":
        start = np.floor(d * scale)
        frac = ((d + 1) - (start + 1) * inv_scale).astype(np.float32)
        frac = np.where(frac <= 0, np.float32(0), frac - np.floor(frac))
    else:
        position = ((d + 0.5) * scale - 0.5).astype(np.float32)
        start = np.floor(position)
        frac = position - start
    start = start.astype(np.int64)
    if mode == "cubic":
        offsets, weight = np.arange(-1, 3), _cubic_coeffs(frac)
    else:
        if horizontal:
            frac = np.where((start < 0) | (start >= src - 1), np.float32(0), frac)
            start = np.clip(start, 0, src - 1)
        offsets, weight = np.arange(2), np.stack([np.float32(1) - frac, frac], axis=1)
    index = np.clip(start[:, None] + offsets, 0, src - 1)
    if fixed:
        weight = np.clip(np.rint(weight * np.float32(_COEF_SCALE)), -2 ** 15, 2 ** 15 - 1)
        return _readonly(index, weight.astype(np.int32))
    return _readonly(index, weight.astype(np.float32))


@functools.lru_cache(maxsize=512)
def _generic_row_tab(src, dst, mode, fixed, channels):
    return _readonly(*_per_element(*_generic_taps(src, dst, mode, True, fixed), channels))


def _resize_generic(rows, width, height, channels, mode):
    """resizeGeneric_ of (H, W * C) rows: the horizontal pass over the source rows used
    (HResizeLinear / HResizeCubic), then the vertical one (VResizeLinear / VResizeCubic)."""
    fixed = rows.dtype == np.uint8
    x_tab = _generic_row_tab(rows.shape[1] // channels, width, mode, fixed, channels)
    y_index, y_weight = _generic_taps(rows.shape[0], height, mode, False, fixed)
    used, y_index = np.unique(y_index, return_inverse=True)
    if len(used) < rows.shape[0]:
        rows = np.take(rows, used, axis=0)
    sums = _hresize(rows, *x_tab, np.int32 if fixed else np.float32)
    y_index = y_index.reshape(height, -1)
    if mode != "cubic":
        return (_vresize_linear_8u if fixed else _vresize_linear_32f)(sums, y_index, y_weight)
    return (_vresize_cubic_8u if fixed else _vresize_cubic_32f)(sums, y_index, y_weight)


def _simd_end(width, lanes):
    """Where a vector loop `for (; x <= width - lanes; x += lanes)` over a row stops."""
    return width - width % lanes


def _vresize_linear_8u(sums, index, weight):
    """VResizeLinear<uchar, int, short> (VResizeLinearVec_32s8u, and its scalar form) of
    horizontal sums S: (((S0 >> 4) * b0 >> 16) + ((S1 >> 4) * b1 >> 16) + 2) >> 2."""
    sums >>= 4
    out = None
    for k in range(2):
        term = np.take(sums, index[:, k], axis=0)
        term *= weight[:, k, None]
        term >>= 16
        out = term if out is None else np.add(out, term, out=out)
    out += 2
    out >>= 2
    return np.clip(out, 0, 255, out=out).astype(np.uint8)


def _vresize_linear_32f(sums, index, weight):
    """VResizeLinear<float> (and VResizeLinearVec_32f): S0 * b0 + S1 * b1."""
    out = np.take(sums, index[:, 0], axis=0) * weight[:, 0, None]
    out += np.take(sums, index[:, 1], axis=0) * weight[:, 1, None]
    return out


def _vresize_cubic_8u(sums, index, weight):
    """VResizeCubic<uchar, int, short>: VResizeCubicVec_32s8u's float32
    round(S0*b0 + (S1*b1 + (S2*b2 + S3*b3))) with b = beta * (1.f / 2^22) on the
    elements of each row its vector loop covers, FixedPtCast's
    (S0*beta0 + ... + S3*beta3 + 2^21) >> 22 on the rest; saturated."""
    taps = [np.take(sums, index[:, k], axis=0) for k in range(4)]
    b = weight.astype(np.float32) * np.float32(1.0 / _COEF_SCALE ** 2)
    s = [tap.astype(np.float32) for tap in taps]
    out = s[3] * b[:, 3, None]
    for k in (2, 1, 0):
        out = s[k] * b[:, k, None] + out
    out = _saturate_uint8(out)
    end = _simd_end(out.shape[1], _SSE_LANES["s16"])
    if end < out.shape[1]:
        total = _sequential_sum(taps[k][:, end:].astype(np.int64) * weight[:, k, None]
                                for k in range(4))
        out[:, end:] = np.clip((total + (1 << 21)) >> 22, 0, 255)
    return out


def _vresize_cubic_32f(sums, index, weight):
    """VResizeCubic<float>: VResizeCubicVec_32f's S0*b0 + (S1*b1 + (S2*b2 + S3*b3)) on
    the elements of each row its vector loop covers, the C loop's
    ((S0*b0 + S1*b1) + S2*b2) + S3*b3 on the rest."""
    taps = [np.take(sums, index[:, k], axis=0) for k in range(4)]
    b = [weight[:, k, None] for k in range(4)]
    out = taps[3] * b[3]
    for k in (2, 1, 0):
        out = taps[k] * b[k] + out
    end = _simd_end(out.shape[1], _SSE_LANES["f32"])
    if end < out.shape[1]:
        out[:, end:] = _sequential_sum(taps[k][:, end:] * b[k] for k in range(4))
    return out


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
