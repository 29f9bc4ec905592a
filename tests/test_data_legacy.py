"""OneFlow's older flow.data reader API (decode_ofrecord with BlobConf / RawCodec /
ImageCodec / NormByChannelPreprocessor, ofrecord_loader), the image-classification
reader, tensor buffers and the flow.detection box and polygon ops, against NumPy
computations of what OneFlow's kernels do."""
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.io import images, ofrecord
from onnxjob.ops.detection import polygons_mask
from ofrecord_datasets import encode

SIZES = [(20, 30), (16, 16), (25, 18)]


def picture(height, width, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


PICTURES = [picture(h, w, i) for i, (h, w) in enumerate(SIZES)]


def resized(image, width, height):
    """flow.image.Resize's default ("auto") interpolation of one image."""
    return images.resize(image, width, height, "auto")


@pytest.fixture
def data_dir(tmp_path):
    """PNG "encoded" images, int64 "class/label", float "feature" lists of 4."""
    records = [{"encoded": encode(p), "class/label": np.int64(10 + i),
                "feature": np.arange(4, dtype=np.float32) + i}
               for i, p in enumerate(PICTURES)]
    ofrecord.write_dataset(str(tmp_path), records, part_name_suffix_length=-1)
    return str(tmp_path)


def test_decode_ofrecord_raw_and_image_blobs(data_dir):
    norm = flow.data.NormByChannelPreprocessor((10.0, 20.0, 30.0), (2.0, 4.0, 8.0))
    blobs = [
        flow.data.BlobConf("feature", (4,), flow.float, flow.data.RawCodec()),
        flow.data.BlobConf("encoded", (12, 10, 3), flow.float,
                           flow.data.ImageCodec([flow.data.ImagePreprocessor("bgr2rgb")]),
                           preprocessors=[norm]),
        flow.data.BlobConf("encoded", (8, 6, 3), flow.uint8, flow.data.ImageCodec(
            [flow.data.ImageResizePreprocessor(7, 5)])),
    ]

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        return flow.data.decode_ofrecord(data_dir, blobs, batch_size=3)

    feature, normalized, small = job()
    np.testing.assert_array_equal(feature, np.arange(4) + np.arange(3)[:, None])
    # no resize preprocessor: the BlobConf's first two dims are the target (width, height)
    expected = np.stack([resized(p, 12, 10) for p in PICTURES])
    assert normalized.shape == (3, 10, 12, 3)    # NHWC, as data_format channels_last
    np.testing.assert_allclose(normalized, (expected - [10, 20, 30]) / [2, 4, 8], rtol=1e-6)
    bgr = [p[..., ::-1] for p in PICTURES]
    np.testing.assert_array_equal(small, np.stack([resized(p, 7, 5)
                                                     for p in bgr]))


def test_decode_ofrecord_mirror_flips_some_images(data_dir):
    codec = flow.data.ImageCodec([flow.data.ImagePreprocessor("bgr2rgb"),
                                  flow.data.ImagePreprocessor("mirror")])
    conf = flow.data.BlobConf("encoded", (16, 16, 3), flow.float, codec,
                              [flow.data.NormByChannelPreprocessor((0, 0, 0),
                                                                   data_format="channels_first")])

    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.data.decode_ofrecord(data_dir, [conf], batch_size=3)[0]

    plain = np.stack([resized(p, 16, 16) for p in PICTURES])
    plain = plain.transpose(0, 3, 1, 2).astype(np.float32)
    seen = set()
    for _ in range(8):
        out = job()
        for image, reference in zip(out, plain):
            if np.array_equal(image, reference):
                seen.add("kept")
            else:
                np.testing.assert_array_equal(image, reference[:, :, ::-1])
                seen.add("mirrored")
    assert seen == {"kept", "mirrored"}


def test_ofrecord_loader_and_raw_codec_truncate(data_dir):
    @flow.global_function()
    def job() -> tp.Numpy:
        records = flow.data.ofrecord_loader(data_dir, batch_size=2, shuffle=False)
        return flow.data.BlobConf("feature", (6,), flow.int32,
                                  flow.data.RawCodec(truncate=True)).decode_blob(records, 2)

    np.testing.assert_array_equal(job(), [[0, 1, 2, 3, 0, 0], [1, 2, 3, 4, 0, 0]])


def test_preprocessor_arguments_are_checked():
    with pytest.raises(ValueError, match="bgr2rgb"):
        flow.data.ImagePreprocessor("rotate")
    assert flow.data.NormByChannelPreprocessor([1]).output_layout() == "NHWC"
    assert flow.data.ImageCodec().do_resize() == (False, -1, -1)


def test_image_classification_reader_labels_feed_the_loss(data_dir):
    # OneFlow's reader returns the labels as an int32 (N,) blob (tensor_buffer_to_tensor
    # and squeeze inside it): straight into the loss, as programs use it
    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy]:
        image, label = flow.data.ofrecord_image_classification_reader(
            data_dir, "encoded", "class/label", batch_size=3, color_space="RGB")
        image, _, _ = flow.image.Resize(image, target_size=(9, 11))
        flat = flow.reshape(flow.cast(image, flow.float), [3, -1])
        logits = flow.slice(flat, [None, 0], [None, 16]) / 255
        loss = flow.nn.sparse_softmax_cross_entropy_with_logits(label, logits)
        return image, label, loss

    image, label, loss = job()
    np.testing.assert_array_equal(label, [10, 11, 12])
    assert label.dtype == np.int32
    logits = image.reshape(3, -1)[:, :16].astype(np.float32) / 255
    log_softmax = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(loss, -log_softmax[np.arange(3), [10, 11, 12]], rtol=1e-5)
    np.testing.assert_array_equal(image, np.stack([resized(p, 9, 11)
                                                   for p in PICTURES]))


def test_tensor_to_tensor_buffer_round_trip():
    @flow.global_function()
    def job(x: tp.Numpy.Placeholder((4, 3, 5, 6))) -> Tuple[tp.Numpy, tp.Numpy]:
        buffer = flow.tensor_to_tensor_buffer(x, instance_dims=2)
        assert buffer.shape == (4, 3)
        back = flow.tensor_buffer_to_tensor(buffer, dtype=flow.float32, instance_shape=[30])
        parts = flow.tensor_buffer_to_list_of_tensors(buffer, (5, 6), flow.float32)
        assert len(parts) == 12
        return back, parts[7]

    x = np.random.rand(4, 3, 5, 6).astype(np.float32)
    back, part = job(x)
    np.testing.assert_array_equal(back, x.reshape(4, 3, 30))
    np.testing.assert_array_equal(part, x[2, 1])


def test_gen_tensor_buffer_to_list_of_tensors():
    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        x = flow.gen_tensor_buffer((2, 2), [(10, 10), (50, 50), (20, 80), (100, 100)],
                                   [0.0, 1.0, 2.0, 3.0], flow.int64)
        return tuple(flow.tensor_buffer_to_list_of_tensors(x, (100, 100), flow.int64, True))

    outs = job()
    for out, shape, value in zip(outs, [(10, 10), (50, 50), (20, 80), (100, 100)], range(4)):
        np.testing.assert_array_equal(out, np.full(shape, value, np.int64))
    flow.clear_default_session()

    @flow.global_function()
    def fixed() -> tp.Numpy:
        x = flow.gen_tensor_buffer((2,), [(3,), (2,)], [1.0, 2.0])
        return flow.tensor_buffer_to_list_of_tensors(x, (3,), flow.float32)[0]

    with pytest.raises(TraceError, match=r"entry 1 is \(2,\)"):
        fixed()


def test_tensor_buffer_to_tensor_checks_entries():
    @flow.global_function()
    def job() -> tp.Numpy:
        x = flow.gen_tensor_buffer((2,), [(2, 2), (2, 2)], [1.0, 2.0])
        return flow.tensor_buffer_to_tensor(x, dtype=flow.float32, instance_shape=[4])

    np.testing.assert_array_equal(job(), [[1] * 4, [2] * 4])
    flow.clear_default_session()

    @flow.global_function()
    def wrong() -> tp.Numpy:
        x = flow.gen_tensor_buffer((2,), [(2, 2), (2, 3)], [1.0, 2.0])
        return flow.tensor_buffer_to_tensor(x, dtype=flow.float32, instance_shape=[4])

    with pytest.raises(Exception, match="6 values"):
        wrong()


# -- detection ---------------------------------------------------------------------------

BOXES = [np.array([[1, 2, 5, 7], [0, 0, 9, 3]], np.float32), np.array([[3, 1, 4, 2]], np.float32)]
POLYS = [np.array([[1, 1], [6, 1], [6, 4]], np.float32), np.array([[2, 3], [4, 5]], np.float32)]
IMAGE_SIZE = np.array([[10, 8], [6, 5]], np.int32)   # (width, height)


def buffer_of(arrays, dtype=flow.float32):
    """A host tensor buffer holding `arrays` (via gen_tensor_buffer + a host map)."""
    from onnxjob.ops.host import TENSOR_BUFFER, host_value
    source = flow.gen_tensor_buffer((len(arrays),), [a.shape for a in arrays],
                                    [0.0] * len(arrays), dtype)
    return host_value("Fixture", lambda batch: [(w, a) for (w, _), a in zip(batch, arrays)],
                      [source], len(arrays), TENSOR_BUFFER, "test")


def host_blob(array):
    """`array` as a host-fed blob (as a data op's outputs are)."""
    from onnxjob.ops.host import to_blob
    return to_blob("Const", lambda: array, [], array.shape, array.dtype, "test")


def read_entries(buffer, arrays):
    """The entries of a host tensor buffer (shaped like `arrays`) as job outputs."""
    from onnxjob.ops.host import to_blob
    return tuple(to_blob(f"Entry{i}", lambda batch, i=i: np.asarray(batch[i][1]), [buffer],
                         a.shape, a.dtype, "test") for i, a in enumerate(arrays))


def detection_job(body, arrays):
    flow.clear_default_session()
    @flow.global_function()
    def job() -> Tuple[tuple(tp.Numpy for _ in arrays)]:
        return read_entries(body(buffer_of(arrays)), arrays)
    return job()


@pytest.mark.parametrize("code", [0, 1, 2, 3])
def test_object_bbox_flip(code):
    out = detection_job(lambda b: flow.detection.object_bbox_flip(b, host_blob(IMAGE_SIZE),
                                                                  code), BOXES)
    for got, boxes, (width, height) in zip(out, BOXES, IMAGE_SIZE):
        want = boxes.copy()
        if code & 1:
            want[:, 0], want[:, 2] = width - boxes[:, 2] - 1, width - boxes[:, 0] - 1
        if code & 2:
            want[:, 1], want[:, 3] = height - boxes[:, 3] - 1, height - boxes[:, 1] - 1
        np.testing.assert_array_equal(got, want)


def test_object_flips_per_image_codes_and_polygons():
    codes = np.array([1, 2], np.int8)
    out = detection_job(lambda b: flow.object_segmentation_polygon_flip(
        b, host_blob(IMAGE_SIZE), host_blob(codes)), POLYS)
    np.testing.assert_array_equal(out[0], np.stack([10 - POLYS[0][:, 0], POLYS[0][:, 1]], 1))
    np.testing.assert_array_equal(out[1], np.stack([POLYS[1][:, 0], 5 - POLYS[1][:, 1]], 1))


def test_object_scale():
    scale = np.array([[0.5, 2.0], [3.0, 1.0]], np.float32)
    boxes = detection_job(lambda b: flow.detection.object_bbox_scale(b, host_blob(scale)), BOXES)
    polys = detection_job(lambda b: flow.object_segmentation_polygon_scale(
        b, host_blob(scale)), POLYS)
    for got, arr, (sw, sh) in zip(boxes + polys, BOXES + POLYS, np.concatenate([scale, scale])):
        np.testing.assert_allclose(got[:, 0::2], arr[:, 0::2] * sw)
        np.testing.assert_allclose(got[:, 1::2], arr[:, 1::2] * sh)


def test_flip_checks_its_arguments():
    @flow.global_function()
    def job() -> tp.Numpy:
        out = flow.detection.object_bbox_flip(buffer_of(BOXES), host_blob(IMAGE_SIZE), 5)
        return read_entries(out, BOXES)[0]

    with pytest.raises(TraceError, match="flip_code must be 0, 1, 2 or 3"):
        job()


def test_polygons_mask_fills_inside_and_outline():
    square = polygons_mask([[(1, 1), (4, 1), (4, 3), (1, 3)]], 6, 5)
    want = np.zeros((5, 6), np.int8)
    want[1:4, 1:5] = 1
    np.testing.assert_array_equal(square, want)
    triangle = polygons_mask([[(0, 0), (4, 0), (0, 4)]], 5, 5)
    np.testing.assert_array_equal(
        triangle, (np.add.outer(np.arange(5), np.arange(5)) <= 4).astype(np.int8))


def test_polygon_to_mask_groups_points_by_object():
    points = [np.array([[0, 0], [2, 0], [2, 2], [0, 2], [4, 4], [5, 4], [5, 5]], np.float32)]
    index = [np.array([[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 0, 0],
                       [0, 0, 1], [1, 0, 1], [2, 0, 1]], np.int32)]
    size = np.array([[6, 6]], np.int32)

    @flow.global_function()
    def job() -> tp.Numpy:
        masks = flow.detection.object_segmentation_polygon_to_mask(
            buffer_of(points), buffer_of(index, flow.int32), host_blob(size))
        return read_entries(masks, [np.zeros((2, 6, 6), np.int8)])[0]

    masks = job()
    np.testing.assert_array_equal(masks[0], polygons_mask([[(0, 0), (2, 0), (2, 2), (0, 2)]], 6, 6))
    np.testing.assert_array_equal(masks[1], polygons_mask([[(4, 4), (5, 4), (5, 5)]], 6, 6))
    assert masks[0].sum() == 9 and masks[1].sum() == 3
