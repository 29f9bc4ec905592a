"""flow.image and the image decoders: resizing against references written from OpenCV's
cv::resize (and against Pillow where it computes the same function), OneFlow's
CropMirrorNormalize, random crop and keep-aspect-ratio arithmetic, the ops inside jobs,
the dtypes OneFlow allows, OneFlow 0.5's signatures, and errors for bad arguments."""
import inspect
import math
import threading
import time
from typing import Tuple

import numpy as np
import pytest
from PIL import Image

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.io import images, ofrecord
from onnxjob.settings import SettingsError
from ofrecord_datasets import encode

SIZES = [(24, 32), (40, 30), (17, 50), (33, 33)]


def picture(height, width, seed):
    """A smooth RGB test image with some noise (resampling errors show on both)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    return np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)


PICTURES = [picture(h, w, i) for i, (h, w) in enumerate(SIZES)]


@pytest.fixture
def data_dir(tmp_path):
    """The PICTURES as PNG records ("encoded", "label")."""
    records = [{"encoded": encode(p), "label": np.int32(i)} for i, p in enumerate(PICTURES)]
    ofrecord.write_dataset(str(tmp_path), records)
    return str(tmp_path)


def run_job(data_dir, body, outputs=1):
    """One run of a predict job returning body(records) (`outputs` blobs)."""
    ret = tp.Numpy if outputs == 1 else Tuple[(tp.Numpy,) * outputs]

    def job_body():
        records = flow.data.ofrecord_reader(data_dir, batch_size=len(SIZES),
                                             part_name_suffix_length=5)
        return body(records)

    job_body.__annotations__["return"] = ret
    return flow.global_function()(job_body)()


def aligned(buffer, dtype=flow.uint8, channels=3):
    """A tensor buffer of images in one zero-padded batch (to read it back)."""
    return flow.image.batch_align(buffer, (64, 64, channels), dtype, 0, dynamic_out=False)


def unaligned(batch, shapes):
    return [image[:h, :w] for image, (h, w) in zip(batch, shapes)]


# -- resize: references -------------------------------------------------------------------

def _keys_cubic(t, a=-0.75):
    t = abs(t)
    if t <= 1:
        return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
    return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a if t < 2 else 0.0


def _ref_weights(d, scale, size, mode):
    """{input index: weight} of output index d along one axis, by cv::resize's definition
    (replicated borders)."""
    weights = {}

    def add(i, w):
        i = min(max(i, 0), size - 1)
        weights[i] = weights.get(i, 0.0) + w

    if mode == "nearest":
        add(math.floor(d * scale), 1.0)
    elif mode in ("linear", "cubic"):
        center = (d + 0.5) * scale - 0.5
        base = math.floor(center)
        taps = range(0, 2) if mode == "linear" else range(-1, 3)
        for k in taps:
            t = center - (base + k)
            add(base + k, 1 - abs(t) if mode == "linear" else _keys_cubic(t))
    elif mode == "area":  # each output cell averages the input area it covers
        start, end = d * scale, min((d + 1) * scale, size)
        for i in range(math.floor(start), math.ceil(end)):
            add(i, (min(end, i + 1) - max(start, i)) / (end - start))
    else:  # OpenCV's INTER_AREA along an axis that grows
        i = math.floor(d * scale)
        frac = (d + 1) - (i + 1) / scale
        frac = 0.0 if frac <= 0 else frac - math.floor(frac)
        add(i, 1 - frac)
        add(i + 1, frac)
    return weights


def ref_resize(image, width, height, mode):
    """cv::resize of `image` computed one output pixel at a time, in float64."""
    src_h, src_w = image.shape[:2]
    pixels = image.astype(np.float64)
    if mode == "area" and (width > src_w or height > src_h):
        mode = "area-enlarge"
    rows = [_ref_weights(y, src_h / height, src_h, mode) for y in range(height)]
    cols = [_ref_weights(x, src_w / width, src_w, mode) for x in range(width)]
    out = np.zeros((height, width, image.shape[2]))
    for y, wy in enumerate(rows):
        for x, wx in enumerate(cols):
            out[y, x] = sum(wy[i] * wx[j] * pixels[i, j] for i in wy for j in wx)
    return np.clip(np.floor(out + 0.5), 0, 255) if image.dtype == np.uint8 else out


RESIZES = [((37, 53), (17, 23)), ((5, 7), (13, 11)), ((20, 9), (7, 30)), ((12, 16), (6, 8)),
           ((10, 10), (10, 10)), ((9, 31), (4, 40))]


@pytest.mark.parametrize("interpolation, mode", [
    ("bilinear", "linear"), ("nearest_neighbor", "nearest"), ("nn", "nearest"),
    ("bicubic", "cubic"), ("area", "area")])
@pytest.mark.parametrize("src, dst", RESIZES, ids=lambda s: "x".join(map(str, s)))
def test_resize_matches_cv_resize_reference(interpolation, mode, src, dst):
    image = picture(*src, seed=1)
    ours = images.resize(image, dst[1], dst[0], interpolation)
    ref = ref_resize(image, dst[1], dst[0], mode)
    assert ours.shape == (*dst, 3) and ours.dtype == np.uint8
    diff = np.abs(ours.astype(int) - ref)
    # OpenCV's uint8 arithmetic (11-bit weights, shifted vertical sums, float area sums)
    # is within 1 of the exact value; tests/test_image_resize_opencv.py checks its bits
    assert diff.max() <= 1
    as_float = images.resize(image.astype(np.float32), dst[1], dst[0], interpolation)
    np.testing.assert_allclose(as_float, ref_resize(image.astype(np.float32), dst[1], dst[0],
                                                    mode), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("src, dst", RESIZES, ids=lambda s: "x".join(map(str, s)))
def test_auto_interpolation_is_linear_growing_and_area_shrinking(src, dst):
    image = picture(*src, seed=2)
    mode = "bilinear" if dst[0] * dst[1] >= src[0] * src[1] else "area"
    np.testing.assert_array_equal(images.resize(image, dst[1], dst[0], "auto"),
                                  images.resize(image, dst[1], dst[0], mode))


def test_resize_agrees_with_pillow_where_pillow_computes_the_same_function():
    image = picture(32, 44, seed=3)
    grown = np.asarray(Image.fromarray(image).resize((70, 50), Image.BILINEAR))
    assert np.abs(images.resize(image, 70, 50, "bilinear").astype(int) - grown).max() <= 1
    for factor in (2, 4):  # area averages of whole cells
        reduced = np.asarray(Image.fromarray(image).reduce(factor))
        if factor == 4:  # OpenCV's sum * (1.f / 16) rounds a half to even, Pillow's up
            sums = image.reshape(8, 4, 11, 4, 3).sum(axis=(1, 3))
            reduced = np.where(sums % 16 == 8, np.rint(sums / 16), reduced).astype(np.uint8)
        np.testing.assert_array_equal(images.resize(image, 44 // factor, 32 // factor, "area"),
                                      reduced)
    sx, sy = 44 / 13, 32 / 41  # OpenCV's nearest takes floor(d * scale)
    nearest = Image.fromarray(image).transform((13, 41), Image.AFFINE,
                                               (sx, 0, -0.5 * sx, 0, sy, -0.5 * sy),
                                               Image.NEAREST)
    np.testing.assert_array_equal(images.resize(image, 13, 41, "nn"), np.asarray(nearest))


@pytest.mark.parametrize("hw, target, min_size, max_size, longer, expected", [
    ((300, 400), 256, 0, 0, False, (341, 256)),
    ((400, 300), 256, 0, 0, False, (256, 341)),
    ((300, 400), 256, 0, 300, False, (300, 225)),
    ((10, 25), 5, 0, 0, False, (12, 5)),          # 12.5 rounds half to even
    ((10, 30), 5, 0, 0, False, (15, 5)),
    ((300, 400), 200, 0, 0, True, (200, 150)),
    ((100, 400), 200, 80, 0, True, (320, 80)),
])
def test_keep_aspect_ratio_sizes(hw, target, min_size, max_size, longer, expected):
    assert images.keep_aspect_size(*hw, target, min_size, max_size, longer) == expected


# -- crop, mirror, normalize: reference ---------------------------------------------------

def ref_crop_mirror_normalize(image, out_h, out_w, pos_y, pos_x, mirror, mean, std, nchw):
    """OneFlow's CMN1Sample, one output value at a time in float32."""
    in_h, in_w, channels = image.shape
    out = np.zeros((out_h, out_w, channels), np.float32)
    for c in range(channels):
        inv_std = np.float32(1.0) / np.float32(std[c % len(std)])
        for h in range(out_h):
            in_y = int(np.float32(np.float32(in_h - out_h) * np.float32(pos_y)) + np.float32(h))
            for w in range(out_w):
                offset = (out_w - 1 - w) if mirror else w
                in_x = int(np.float32(np.float32(in_w - out_w) * np.float32(pos_x))
                           + np.float32(offset))
                out[h, w, c] = (np.float32(image[in_y, in_x, c])
                                - np.float32(mean[c % len(mean)])) * inv_std
    return out.transpose(2, 0, 1) if nchw else out


@pytest.mark.parametrize("pos_y, pos_x, mirror, mean, std, nchw", [
    (0.5, 0.5, False, [0.0], [1.0], True),
    (0.0, 1.0, True, [123.68, 116.779, 103.939], [58.393, 57.12, 57.375], True),
    (0.3, 0.7, True, [10.0], [3.0], False),
])
def test_crop_mirror_normalize_matches_oneflow_kernel(pos_y, pos_x, mirror, mean, std, nchw):
    image = picture(23, 31, seed=4)
    out = images.crop_mirror_normalize(
        image, 16, 20, pos_y, pos_x, mirror, np.broadcast_to(np.float32(mean), 3),
        np.float32(1) / np.broadcast_to(np.float32(std), 3), nchw)
    np.testing.assert_array_equal(
        out, ref_crop_mirror_normalize(image, 16, 20, pos_y, pos_x, mirror, mean, std, nchw))


# -- random crop --------------------------------------------------------------------------

@pytest.mark.parametrize("hw, area, ratio, expected_hw", [
    ((1, 100), (0.08, 1.0), (0.75, 1.333333), (1, 1)),      # too wide: height x max width
    ((100, 1), (0.08, 1.0), (0.75, 1.333333), (1, 1)),      # too tall: max height x width
    ((40, 40), (0.5, 0.5), (1.0, 1.0), (28, 28)),           # round(sqrt(800))
    ((30, 40), (1.0, 1.0), (1.0, 1.0), (30, 30)),           # no fit: clipped to the ratio
    ((3, 3), (0.5, 0.5), (1.01, 1.02), (1, 2)),             # no fit: shrunk to the area
    ((10, 10), (0.5, 0.5), (3.0, 3.0), (3, 10)),
])
def test_random_crop_window_shapes_follow_oneflow(hw, area, ratio, expected_hw):
    rng = np.random.default_rng(0)
    for _ in range(5):
        y, x, h, w = images.random_crop_window(*hw, rng, area, ratio, 10)
        assert (h, w) == expected_hw
        assert 0 <= y <= hw[0] - h and 0 <= x <= hw[1] - w


def test_random_crop_windows_fit_and_keep_the_ratio_range():
    rng = np.random.default_rng(1)
    areas = []
    for _ in range(400):
        height, width = rng.integers(8, 300, 2)
        y, x, h, w = images.random_crop_window(height, width, rng)
        assert 0 <= y and y + h <= height and 0 <= x and x + w <= width
        assert 0.6 < w / h < 1.7  # 3/4 .. 4/3, give or take the rounding of small windows
        areas.append(h * w / (height * width))
    assert 0.0 < min(areas) < 0.2 and max(areas) > 0.9


# -- the ops in jobs ----------------------------------------------------------------------

def test_decoders_give_bgr_rgb_and_gray(data_dir):
    bgr, rgb, gray = run_job(data_dir, lambda r: (
        aligned(flow.data.OFRecordImageDecoder(r, "encoded")),
        aligned(flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB")),
        aligned(flow.data.OFRecordImageDecoder(r, "encoded", color_space="GRAY"), channels=1)),
        outputs=3)
    for i, p in enumerate(PICTURES):
        h, w = p.shape[:2]
        np.testing.assert_array_equal(rgb[i, :h, :w], p)
        np.testing.assert_array_equal(bgr[i, :h, :w], p[:, :, ::-1])
        luma = np.asarray(Image.fromarray(p).convert("L"))
        np.testing.assert_array_equal(gray[i, :h, :w, 0], luma)
        assert not rgb[i, h:].any() and not rgb[i, :, w:].any()


def test_resize_op_to_fixed_size_returns_images_and_scales(data_dir):
    out, scale = run_job(data_dir, lambda r: flow.image.Resize(
        flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB"),
        target_size=[20, 15], interpolation_type="bilinear")[:2], outputs=2)
    assert out.shape == (4, 15, 20, 3) and out.dtype == np.uint8
    for i, p in enumerate(PICTURES):
        np.testing.assert_array_equal(out[i], images.resize(p, 20, 15, "bilinear"))
        np.testing.assert_allclose(scale[i], [20 / p.shape[1], 15 / p.shape[0]], rtol=1e-6)


def test_resize_op_keeping_the_aspect_ratio_returns_sizes_and_scales(data_dir):
    def body(records):
        decoded = flow.data.OFRecordImageDecoder(records, "encoded", color_space="RGB")
        out, scale, size = flow.image.Resize(decoded, target_size=20, keep_aspect_ratio=True,
                                             resize_side="shorter", max_size=40)
        resized, new_size, new_scale = flow.image.target_resize(decoded, 20, max_size=40)
        return aligned(out), scale, size, aligned(resized), new_size, new_scale

    out, scale, size, again, size_again, scale_again = run_job(data_dir, body, outputs=6)
    for i, p in enumerate(PICTURES):
        width, height = images.keep_aspect_size(*p.shape[:2], 20, 0, 40)
        assert tuple(size[i]) == (width, height) and size.dtype == np.int32
        np.testing.assert_allclose(scale[i], [width / p.shape[1], height / p.shape[0]])
        np.testing.assert_array_equal(out[i, :height, :width],
                                      images.resize(p, width, height, "auto"))
    np.testing.assert_array_equal(again, out)
    np.testing.assert_array_equal(size_again, size)
    np.testing.assert_array_equal(scale_again, scale)


def test_deprecated_resize_arguments_return_only_the_images(data_dir):
    def body(records):
        decoded = flow.data.OFRecordImageDecoder(records, "encoded")
        fixed = flow.image.Resize(decoded, resize_x=12, resize_y=10, interp_type="NN")
        shorter = flow.image.Resize(decoded, resize_shorter=18, color_space="BGR")
        return fixed, aligned(shorter)

    fixed, shorter = run_job(data_dir, body, outputs=2)
    assert fixed.shape == (4, 10, 12, 3)
    np.testing.assert_array_equal(fixed[0], images.resize(PICTURES[0][:, :, ::-1], 12, 10, "nn"))
    width, height = images.keep_aspect_size(*SIZES[0], 18)
    assert (width, height) == (24, 18)
    np.testing.assert_array_equal(shorter[0, :18, :24],
                                  images.resize(PICTURES[0][:, :, ::-1], 24, 18, "auto"))
    assert not shorter[0, 18:].any() and not shorter[0, :, 24:].any()


def test_crop_mirror_normalize_reads_coin_flips_from_tensor_buffers_and_batches(data_dir):
    mean, std = [100.0, 110.0, 120.0], [50.0, 60.0, 70.0]

    def body(records):
        decoded = flow.data.OFRecordImageDecoder(records, "encoded", color_space="RGB")
        flips = flow.random.CoinFlip(batch_size=4, seed=3)
        cropped = flow.image.CropMirrorNormalize(decoded, mirror_blob=flips, color_space="RGB",
                                                 crop_h=16, crop_w=12, crop_pos_y=0.25,
                                                 crop_pos_x=0.75, mean=mean, std=std)
        fixed = flow.image.Resize(decoded, target_size=[14, 10])[0]
        whole = flow.image.CropMirrorNormalize(fixed, mirror_blob=flips, color_space="RGB",
                                               output_layout="NHWC", mean=mean, std=std)
        return flips, cropped, whole, fixed, flips * 2

    flips, cropped, whole, fixed, doubled = run_job(data_dir, body, outputs=5)
    assert cropped.shape == (4, 3, 16, 12) and whole.shape == (4, 10, 14, 3)
    np.testing.assert_array_equal(doubled, 2 * flips)  # CoinFlip is a graph blob too
    for i, p in enumerate(PICTURES):
        np.testing.assert_array_equal(cropped[i], ref_crop_mirror_normalize(
            p, 16, 12, 0.25, 0.75, flips[i], mean, std, nchw=True))
        np.testing.assert_array_equal(whole[i], ref_crop_mirror_normalize(
            fixed[i], 10, 14, 0.5, 0.5, flips[i], mean, std, nchw=False))


def test_coin_flip_draws_its_probability_afresh_every_run():
    config = flow.function_config()
    config.prefetch(0)

    @flow.global_function(function_config=config)
    def job() -> tp.Numpy:
        return flow.random.CoinFlip(batch_size=4000, probability=0.25)

    first, second = job(), job()
    assert abs(first.mean() - 0.25) < 0.03 and not np.array_equal(first, second)


def test_random_crop_decoders_are_seeded_windows_of_the_images(data_dir):
    def crops(seed):
        flow.clear_default_session()
        return run_job(data_dir, lambda r: (
            aligned(flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", color_space="RGB",
                                                              seed=seed)),
            aligned(flow.image.random_crop(
                flow.data.OFRecordImageDecoder(r, "encoded", color_space="RGB"), seed=seed))),
            outputs=2)

    first, again, other = crops(5), crops(5), crops(6)
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[0], first[1])  # the same windows, decoded or not
    assert not np.array_equal(first[0], other[0])
    for i, p in enumerate(PICTURES):
        window = first[0][i]
        h, w = window.any(-1).any(1).sum(), window.any(-1).any(0).sum()
        found = [(y, x) for y in range(p.shape[0] - h + 1) for x in range(p.shape[1] - w + 1)
                 if np.array_equal(p[y:y + h, x:x + w], window[:h, :w])]
        assert found, f"crop {i} ({h}x{w}) is not a window of the image"


def test_image_decoder_random_crop_resize_gives_fixed_rgb_batches(tmp_path):
    square = picture(30, 30, seed=9)
    ofrecord.write_dataset(str(tmp_path), [{"encoded": encode(square, "PNG")}] * 2)

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy]:
        records = flow.data.ofrecord_reader(str(tmp_path), batch_size=2,
                                            part_name_suffix_length=5)
        encoded = flow.data.OFRecordBytesDecoder(records, "encoded")
        whole = flow.data.ImageDecoderRandomCropResize(encoded, 16, 12, random_area=[1.0, 1.0],
                                                       random_aspect_ratio=[1.0, 1.0])
        return whole, flow.data.ImageDecoderRandomCropResize(encoded, 8, 8, seed=1)

    whole, random = job()
    assert whole.shape == (2, 12, 16, 3) and whole.dtype == np.uint8
    np.testing.assert_array_equal(whole[0], images.resize(square, 16, 12, "bilinear"))
    assert random.shape == (2, 8, 8, 3)


def test_flip_normalize_and_decode_as_float(data_dir):
    def body(records):
        encoded = flow.data.OFRecordBytesDecoder(records, "encoded")
        floats = flow.image.decode(encoded, dtype=flow.float, color_space="RGB")
        flips = flow.random.CoinFlip(batch_size=4, seed=2)
        return (aligned(flow.image.flip(floats, 3), flow.float),
                aligned(flow.image.flip(flow.image.decode(encoded), flips)), flips,
                aligned(flow.image.normalize(floats, std=[2.0, 4.0, 8.0], mean=[1.0, 2.0, 3.0]),
                        flow.float))

    both, coins, flips, normalized = run_job(data_dir, body, outputs=4)
    for i, p in enumerate(PICTURES):
        h, w = p.shape[:2]
        np.testing.assert_array_equal(both[i, :h, :w], p[::-1, ::-1].astype(np.float32))
        np.testing.assert_array_equal(coins[i, :h, :w],
                                      p[:, ::-1, ::-1] if flips[i] else p[:, :, ::-1])
        np.testing.assert_allclose(normalized[i, :h, :w],
                                   (p - np.float32([1, 2, 3])) / np.float32([2, 4, 8]))


# -- dtypes, signatures, errors -----------------------------------------------------------

DTYPES = [flow.float32, flow.float64, flow.int8, flow.int32, flow.int64, flow.uint8]
DTYPE_OPS = {
    "Resize": lambda d, dt: flow.image.Resize(d, target_size=[8, 8], dtype=dt)[0],
    "decode": lambda d, dt: aligned(flow.image.decode(d, dtype=dt), dt),
    "batch_align": lambda d, dt: aligned(d, dt),
    "CropMirrorNormalize": lambda d, dt: flow.image.CropMirrorNormalize(
        d, crop_h=8, crop_w=8, output_dtype=dt),
}
ALLOWED = {"Resize": (flow.uint8, flow.float32), "decode": (flow.uint8, flow.float32),
           "batch_align": (flow.uint8, flow.float32), "CropMirrorNormalize": (flow.float32,)}


@pytest.mark.parametrize("name", list(DTYPE_OPS))
def test_dtype_sweep_runs_or_refuses_at_trace_time(data_dir, name):
    for dt in DTYPES:
        flow.clear_default_session()

        def body(records, dt=dt):
            source = (flow.data.OFRecordBytesDecoder(records, "encoded") if name == "decode"
                      else flow.data.OFRecordImageDecoder(records, "encoded"))
            return DTYPE_OPS[name](source, dt)

        if dt in ALLOWED[name]:
            assert run_job(data_dir, body).dtype == flow.convert_oneflow_dtype_to_numpy_dtype(dt)
        else:
            with pytest.raises(TraceError, match="must be flow"):
                run_job(data_dir, body)


ONEFLOW_SIGNATURES = {
    "image.Resize": "image, target_size=None, min_size=None, max_size=None, "
                    "keep_aspect_ratio=False, resize_side='shorter', channels=3, dtype=None, "
                    "interpolation_type='auto', name=None, color_space=None, interp_type=None, "
                    "resize_shorter=0, resize_x=0, resize_y=0",
    "image.target_resize": "images, target_size, min_size=None, max_size=None, "
                           "resize_side='shorter', interpolation_type='auto', name=None",
    "image.CropMirrorNormalize": "input_blob, mirror_blob=None, color_space='BGR', "
                                 "output_layout='NCHW', crop_h=0, crop_w=0, crop_pos_y=0.5, "
                                 "crop_pos_x=0.5, mean=[0.0], std=[1.0], "
                                 f"output_dtype={flow.float!r}, name=None",
    "image.random_crop": "input_blob, num_attempts=10, seed=None, random_area=None, "
                         "random_aspect_ratio=None, name='ImageRandomCrop'",
    "image.decode": f"images_bytes_buffer, dtype={flow.uint8!r}, color_space='BGR', name=None",
    "image.flip": "image, flip_code, name=None",
    "image.normalize": "image, std, mean, name=None",
    "image.batch_align": "images, shape, dtype, alignment, dynamic_out=True, name=None",
    "data.OFRecordBytesDecoder": "input_blob, blob_name, name=None",
    "data.OFRecordImageDecoder": "input_blob, blob_name, color_space='BGR', name=None",
    "data.OFRecordImageDecoderRandomCrop": "input_blob, blob_name, color_space='BGR', "
                                           "num_attempts=10, seed=None, random_area=[0.08, 1.0], "
                                           "random_aspect_ratio=[0.75, 1.333333], "
                                           "name='OFRecordImageDecoderRandomCrop'",
    "data.ImageDecoderRandomCropResize": "input_blob, target_width, target_height, "
                                         "num_attempts=None, seed=None, random_area=None, "
                                         "random_aspect_ratio=None, num_workers=None, "
                                         "warmup_size=None, max_num_pixels=None, name=None",
}
ALIASES = [("image.resize", "image.Resize"), ("image.crop_mirror_normalize",
                                              "image.CropMirrorNormalize"),
           ("data.ofrecord_bytes_decoder", "data.OFRecordBytesDecoder"),
           ("data.ofrecord_image_decoder", "data.OFRecordImageDecoder"),
           ("data.ofrecord_image_decoder_random_crop", "data.OFRecordImageDecoderRandomCrop"),
           ("data.image_decoder_random_crop_resize", "data.ImageDecoderRandomCropResize")]


def _api(name):
    namespace, attr = name.split(".")
    return getattr(getattr(flow, namespace), attr)


@pytest.mark.parametrize("name", list(ONEFLOW_SIGNATURES))
def test_signature_matches_oneflow(name):
    assert str(inspect.signature(_api(name)))[1:-1] == ONEFLOW_SIGNATURES[name]


def test_aliases_and_missing_names():
    for alias, name in ALIASES:
        assert _api(alias) is _api(name)
    with pytest.raises(UnsupportedAPIError, match="flow.image.no_such_op"):
        flow.image.no_such_op  # noqa: B018


def _decoded(records, color_space="BGR"):
    return flow.data.OFRecordImageDecoder(records, "encoded", color_space=color_space)


@pytest.mark.parametrize("body, match", [
    (lambda r: _decoded(r, "HSV"), "color_space must be one of BGR, RGB, GRAY"),
    (lambda r: flow.image.Resize(_decoded(r), target_size=8)[0], r"\(width, height\)"),
    (lambda r: flow.image.Resize(_decoded(r), target_size=[8, 8], keep_aspect_ratio=True)[0],
     "positive int when keep_aspect_ratio"),
    (lambda r: flow.image.Resize(_decoded(r), target_size=[8, 8], interpolation_type="lanczos"),
     "interpolation_type must be one of"),
    (lambda r: flow.image.Resize(_decoded(r), 8, keep_aspect_ratio=True, resize_side="long"),
     "resize_side must be"),
    (lambda r: flow.image.CropMirrorNormalize(_decoded(r)), "crop_h and crop_w are required"),
    (lambda r: flow.image.CropMirrorNormalize(_decoded(r), crop_h=4, crop_w=4, mean=[1, 2]),
     "mean takes 1 or 3 values"),
    (lambda r: flow.image.CropMirrorNormalize(_decoded(r), crop_h=4, crop_w=4,
                                              output_layout="CHW"), "output_layout"),
    (lambda r: flow.image.CropMirrorNormalize(
        _decoded(r), crop_h=4, crop_w=4,
        mirror_blob=flow.constant(1, shape=(4,), dtype=flow.int8)), "read on the host"),
    (lambda r: flow.image.CropMirrorNormalize(flow.constant(1, shape=(4, 5, 5), dtype=flow.uint8)),
     "takes a tensor"),
    (lambda r: flow.image.CropMirrorNormalize(
        flow.image.Resize(_decoded(r), target_size=[8, 8])[0], color_space="GRAY"),
     "has 3 channels, color_space gives 1"),
    (lambda r: flow.data.OFRecordImageDecoderRandomCrop(r, "encoded", random_area=[0.5, 0.1]),
     "random_area must be"),
    (lambda r: flow.image.random_crop(_decoded(r), num_attempts=0), "num_attempts"),
    (lambda r: flow.image.flip(_decoded(r), 4), "flip_code must be 0, 1, 2 or 3"),
    (lambda r: flow.image.batch_align(_decoded(r), (8, 8), flow.uint8, 0), "shape must be"),
    (lambda r: flow.image.batch_align(_decoded(r), (8, 8, 3), flow.uint8, 3, False),
     "power of 2"),
    (lambda r: flow.image.Resize(r, target_size=[8, 8]), "tensor_buffer blob from a data op"),
    (lambda r: flow.image.normalize(_decoded(r), std=2.0, mean=[1.0]), "lists of one value"),
])
def test_bad_arguments_raise_trace_error_naming_the_line(data_dir, body, match):
    with pytest.raises(TraceError, match=match) as info:
        run_job(data_dir, body)
    assert "test_image_ops.py" in str(info.value)


@pytest.mark.parametrize("body, match", [
    (lambda r: flow.image.CropMirrorNormalize(_decoded(r), crop_h=30, crop_w=30),
     r"record 0: .*the 24x32 image is smaller than the 30x30 crop"),
    (lambda r: flow.image.Resize(_decoded(r), target_size=[8, 8], channels=1)[0],
     r"record 0: .*expects \(H, W, 1\) images, got one of shape \(24, 32, 3\)"),
    (lambda r: aligned(flow.image.normalize(_decoded(r), [1.0] * 3, [0.0] * 3)),
     r"record 0: .*takes float images"),
    (lambda r: aligned(flow.image.decode(_decoded(r))), "takes encoded image bytes"),
    (lambda r: flow.image.batch_align(_decoded(r), (20, 20, 3), flow.uint8, 0, False),
     r"record 0: .*the 24x32 image does not fit the 20x20 batch shape"),
])
def test_bad_images_raise_at_the_call_naming_the_record(data_dir, body, match):
    with pytest.raises(ofrecord.RecordError, match=match):
        run_job(data_dir, body)


# -- the decode threads -------------------------------------------------------------------

def test_map_ordered_keeps_order_across_threads_and_raises_the_first_failure(monkeypatch):
    monkeypatch.setenv("ONNXJOB_DECODE_THREADS", "3")
    ran_on = {}

    def slow(i):
        ran_on[i] = threading.current_thread().name
        time.sleep(0.002 * (7 - i % 7))
        if i in (5, 9):
            raise ValueError(f"item {i}")
        return i * i

    assert images.map_ordered(lambda i: i * i, range(20)) == [i * i for i in range(20)]
    with pytest.raises(ValueError, match="item 5"):
        images.map_ordered(slow, range(12))
    # 12 items in 3 contiguous chunks (0-3, 4-7, 8-11), each run in order by one pool
    # thread; which thread takes which chunk (one may take two) is the pool's choice, and
    # the chunk after the failing one may be cancelled before it starts
    assert {0, 1, 2, 3, 4, 5} <= set(ran_on) and not {6, 7, 10, 11} & set(ran_on)
    for first in (0, 4, 8):
        assert len({ran_on[i] for i in ran_on if first <= i < first + 4}) <= 1, ran_on
    assert all(name.startswith("onnxjob-decode") for name in ran_on.values()), ran_on
    monkeypatch.setenv("ONNXJOB_DECODE_THREADS", "many")
    with pytest.raises(SettingsError,
                       match="ONNXJOB_DECODE_THREADS='many': expected an integer >= 1"):
        images.map_ordered(slow, range(3))


def _png(array):
    import io
    out = io.BytesIO()
    Image.fromarray(array).save(out, "PNG")
    return out.getvalue()


def test_a_16_bit_png_decodes_as_opencv_reads_it():
    """OneFlow's OFRecord decoders read images with cv::imdecode's default depth (a 16-bit
    sample's high byte), flow.image.decode with IMREAD_ANYDEPTH (the 16-bit values,
    saturated to uint8 or whole as float32)."""
    import cv2
    values = np.array([[0, 255, 256, 4096, 40000, 65535]], np.uint16)
    data = _png(values)
    buffer = np.frombuffer(data, np.uint8)
    bgr = images.decode(data, "BGR")
    np.testing.assert_array_equal(bgr, cv2.imdecode(buffer, cv2.IMREAD_COLOR))
    np.testing.assert_array_equal(bgr[0, :, 0], [0, 0, 1, 16, 156, 255])
    np.testing.assert_array_equal(images.decode(data, "GRAY")[:, :, 0],
                                  cv2.imdecode(buffer, cv2.IMREAD_GRAYSCALE))
    deep = images.decode(data, "BGR", any_depth=True)
    np.testing.assert_array_equal(deep, cv2.imdecode(buffer, cv2.IMREAD_COLOR |
                                                     cv2.IMREAD_ANYDEPTH))
    color = _png(np.zeros((2, 2, 3), np.uint8))     # (8-bit color: decoded as ever)
    assert images.decode(color, "RGB", any_depth=True).dtype == np.uint8
    sixteen_color = cv2.imencode(".png", np.full((2, 2, 3), 40000, np.uint16))[1].tobytes()
    np.testing.assert_array_equal(images.decode(sixteen_color, "RGB", any_depth=True),
                                  np.full((2, 2, 3), 40000, np.uint16))
    np.testing.assert_array_equal(images.decode(sixteen_color, "BGR"),
                                  cv2.imdecode(np.frombuffer(sixteen_color, np.uint8),
                                               cv2.IMREAD_COLOR))


def test_flow_image_decode_of_16_bit_pngs_saturates_to_uint8_and_keeps_float(tmp_path):
    values = np.array([[0, 255, 256, 4096, 40000, 65535]], np.uint16)
    records = [{"encoded": _png(values), "label": np.int32(i)} for i in range(len(SIZES))]
    ofrecord.write_dataset(str(tmp_path), records)
    as_uint8, as_float = run_job(str(tmp_path), lambda r: (
        aligned(flow.image.decode(flow.data.OFRecordBytesDecoder(r, "encoded"))),
        aligned(flow.image.decode(flow.data.OFRecordBytesDecoder(r, "encoded"),
                                  dtype=flow.float), flow.float)), outputs=2)
    np.testing.assert_array_equal(as_uint8[0, 0, :6, 0], [0, 255, 255, 255, 255, 255])
    np.testing.assert_array_equal(as_float[0, 0, :6, 2], values[0].astype(np.float32))
