"""onnxjob's resize against OpenCV's own: onnxjob.io.images.resize (what flow.image.Resize,
flow.image.target_resize and the random-crop-resize decoder run) and flow.image.Resize in
jobs give cv2.resize's pixels exactly, as OneFlow's kernels (cv::resize) do, for uint8 and
float32 images of 1 and 3 channels; float results resized to uint8 saturate as OneFlow's
cv::Mat::convertTo does.

OneFlow builds OpenCV without IPP (cmake/third_party/opencv.cmake: WITH_IPP=OFF), so the
reference is cv2.resize with IPP off (cv2's IPP path computes uint8 cubic and float32
linear and cubic differently)."""
import io
from typing import Tuple

import numpy as np
import pytest
from PIL import Image

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.io import images, ofrecord

cv2 = pytest.importorskip("cv2", reason="the reference is OpenCV's cv2.resize "
                                        "(pip install opencv-python-headless)")

FLAGS = {"nn": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC,
         "area": cv2.INTER_AREA}

SIZES = [  # (source height, width), (target height, width)
    ((300, 200), (224, 224)),   # a random crop's typical shape to a network's input
    ((375, 500), (224, 224)),
    ((64, 48), (32, 24)),       # integer shrink factors (2x2: OpenCV's fast paths)
    ((90, 60), (30, 20)),
    ((96, 64), (24, 32)),
    ((98, 49), (2, 1)),         # integer factors whose double scale is not a whole number
    ((40, 30), (80, 60)),       # integer growth factors
    ((20, 30), (60, 90)),
    ((37, 53), (17, 23)),       # non-integer factors
    ((45, 31), (100, 77)),
    ((50, 80), (120, 30)),      # one axis grows, the other shrinks
    ((120, 30), (50, 80)),
    ((21, 41), (7, 41)),        # one axis kept
    ((33, 17), (1, 1)),         # 1-pixel targets and sources
    ((9, 13), (1, 13)),
    ((9, 13), (9, 1)),
    ((1, 1), (5, 7)),
]


@pytest.fixture(autouse=True)
def opencv_without_ipp():
    was = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    yield
    cv2.ipp.setUseIPP(was)


def picture(height, width, channels, dtype, seed):
    """A smooth image with noise; float32 ones run a little beyond 0..255 (they are not
    clipped), uint8 ones are clipped."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    pixels = base[:, :, :channels] + rng.normal(0, 25, (height, width, channels))
    if dtype == np.uint8:
        return np.clip(pixels, 0, 255).astype(np.uint8)
    return pixels.astype(np.float32)


def cv_resize(image, width, height, flag):
    out = cv2.resize(image, (width, height), interpolation=flag)
    return out.reshape(height, width, image.shape[2])


def assert_same(ours, want):
    assert ours.shape == want.shape and ours.dtype == want.dtype
    if want.dtype == np.uint8:
        np.testing.assert_array_equal(ours, want)
    else:
        np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
@pytest.mark.parametrize("interpolation", list(FLAGS))
@pytest.mark.parametrize("src, dst", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_resize_equals_cv2_resize(src, dst, interpolation, dtype):
    for channels in (1, 3):
        image = picture(*src, channels, dtype, seed=src[0] * 1000 + src[1])
        assert_same(images.resize(image, dst[1], dst[0], interpolation),
                    cv_resize(image, dst[1], dst[0], FLAGS[interpolation]))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
def test_resize_equals_cv2_resize_on_random_sizes(dtype):
    rng = np.random.default_rng(7)
    for trial in range(40):
        src = tuple(int(s) for s in rng.integers(1, 90, 2))
        dst = tuple(int(s) for s in rng.integers(1, 130, 2))
        for interpolation, flag in FLAGS.items():
            image = picture(*src, 1 + 2 * (trial % 2), dtype, seed=trial)
            assert_same(images.resize(image, dst[1], dst[0], interpolation),
                        cv_resize(image, dst[1], dst[0], flag))


def test_float_to_uint8_conversion_rounds_half_to_even_and_saturates_as_opencv():
    values = np.array([[0.5, 1.5, 2.5, -0.4, -3, 127.5, 254.5, 255.5, 300, -1e9, 2e9]],
                      np.float32)
    ours = images.convert(values, np.uint8)
    np.testing.assert_array_equal(ours, cv2.add(values, 0.0, dtype=cv2.CV_8U))
    np.testing.assert_array_equal(ours[0], [0, 2, 2, 0, 0, 128, 254, 255, 255, 0, 255])


def test_resize_job_on_ofrecords_equals_cv2_resize(tmp_path):
    """flow.image.Resize in a job on decoded PNG records: "auto" (area when shrinking,
    linear when growing, OneFlow's GetCvInterpolationFlag) and the named interpolations."""
    sources = [picture(300, 200, 3, np.uint8, 1), picture(375, 500, 3, np.uint8, 2),
               picture(37, 53, 3, np.uint8, 3), picture(112, 112, 3, np.uint8, 4)]
    records = []
    for bgr in sources:
        buffer = io.BytesIO()
        Image.fromarray(bgr[:, :, ::-1]).save(buffer, "PNG")
        records.append({"encoded": buffer.getvalue()})
    ofrecord.write_dataset(str(tmp_path), records)
    kinds = ["auto", "bilinear", "nn", "bicubic", "area"]

    @flow.global_function()
    def job() -> Tuple[(tp.Numpy,) * len(kinds)]:
        rec = flow.data.ofrecord_reader(str(tmp_path), batch_size=len(sources),
                                        data_part_num=1, part_name_suffix_length=5)
        image = flow.data.OFRecordImageDecoder(rec, "encoded", color_space="BGR")
        return tuple(flow.image.Resize(image, target_size=(224, 224),
                                       interpolation_type=kind)[0] for kind in kinds)

    for kind, out in zip(kinds, job()):
        for bgr, got in zip(sources, out):
            if kind == "auto":
                flag = cv2.INTER_LINEAR if 224 * 224 >= bgr.shape[0] * bgr.shape[1] \
                    else cv2.INTER_AREA
            else:
                flag = FLAGS[kind]
            np.testing.assert_array_equal(got, cv_resize(bgr, 224, 224, flag), err_msg=kind)


def test_resize_job_of_float_images_to_uint8_saturates_as_opencv():
    """Float images resized to uint8 (OneFlow: cv::resize in float, then convertTo): the
    cubic overshoot beyond 0..255 saturates instead of wrapping."""
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    image = picture(30, 40, 3, np.float32, 5) * np.float32(1.3) - np.float32(40)

    @flow.global_function(function_config=config)
    def job(x: tp.ListListNumpy.Placeholder((1, 30, 40, 3), dtype=flow.float32)
            ) -> tp.ListNumpy:
        buffer = flow.tensor_list_to_tensor_buffer(x)
        out, _, _ = flow.image.resize(buffer, target_size=(57, 23), dtype=flow.uint8,
                                      interpolation_type="bicubic")
        return out

    got = job([[image[None]]])[0][0]
    resized = cv_resize(image, 57, 23, cv2.INTER_CUBIC)
    assert resized.min() < 0 and resized.max() > 255
    np.testing.assert_array_equal(got, cv2.add(resized, 0.0, dtype=cv2.CV_8U))
