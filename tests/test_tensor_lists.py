"""Job arguments read by the host ops, as OneFlow's documented image and detection
pipelines feed them: tensor lists (tp.ListListNumpy) through
flow.tensor_list_to_tensor_buffer / tensor_buffer_to_tensor_list / tensor_list_split,
per-image placeholders (image_size) of the detection ops, a file's bytes decoded by
flow.image.decode, and the dynamic outputs of the host ops (batch_align's default
dynamic_out=True, tensor_buffer_to_list_of_tensors(dynamic_out=True) on entries made
each run)."""
import inspect
import io
import os
from typing import Tuple

import numpy as np
import pytest
from PIL import Image

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.io.ofrecord import RecordError

THIS_FILE = os.path.basename(__file__)


def mirrored():
    config = flow.FunctionConfig()
    config.default_logical_view(flow.scope.mirrored_view())
    return config


def job(body, *annotations, ret=tp.ListListNumpy):
    """A fresh mirrored job body(*placeholders) -> ret."""
    flow.clear_default_session()

    def fn(*args):
        return body(*args)
    fn.__annotations__ = {f"a{i}": a for i, a in enumerate(annotations)}
    fn.__annotations__["return"] = ret
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a)
         for i, a in enumerate(annotations)], return_annotation=ret)
    return flow.global_function(function_config=mirrored())(fn)


def round_trip(x, shape, dtype=flow.float32):
    buffer = flow.tensor_list_to_tensor_buffer(x)
    return flow.tensor_buffer_to_tensor_list(buffer, shape=shape, dtype=dtype)


def test_a_tensor_list_goes_through_a_tensor_buffer_and_back():
    run = job(lambda x: round_trip(x, (5, 4)), tp.ListListNumpy.Placeholder((2, 5, 4)))
    a = np.random.rand(1, 3, 2).astype(np.float32)
    b = np.random.rand(1, 2, 2).astype(np.float32)
    out = run([[a, b]])
    assert len(out) == 1 and [t.shape for t in out[0]] == [(1, 3, 2), (1, 2, 2)]
    assert np.array_equal(out[0][0], a) and np.array_equal(out[0][1], b)
    # every call reads its own arguments (nothing is made ahead of the call)
    c = np.random.rand(1, 4, 4).astype(np.float32)
    assert np.array_equal(run([[c]])[0][0], c)


def test_identity_of_a_tensor_list_is_the_list():
    """OneFlow 0.2's test_tensor_list_and_tensor_buffer: flow.identity of a ListListNumpy
    placeholder (the graph had a tensor-typed Identity of a sequence: onnxruntime refused
    the model)."""
    run = job(lambda x: flow.identity(x), tp.ListListNumpy.Placeholder((2, 5)))
    a, b = np.random.rand(1, 3).astype(np.float32), np.random.rand(1, 4).astype(np.float32)
    out = run([[a, b]])
    assert np.array_equal(out[0][0], a) and np.array_equal(out[0][1], b)


def test_tensor_buffer_to_tensor_list_casts_to_its_dtype():
    run = job(lambda x: round_trip(x, (3,), flow.int32),
              tp.ListListNumpy.Placeholder((1, 3)))
    out = run([[np.array([[1.0, 2.0, 3.0]], np.float32)]])[0][0]
    assert out.dtype == np.int32 and out.tolist() == [[1, 2, 3]]


def test_a_tensor_of_more_than_one_item_is_refused_and_the_next_call_runs():
    run = job(lambda x: round_trip(x, (2,)), tp.ListListNumpy.Placeholder((4, 2)))
    with pytest.raises(RecordError, match=r"tensor 0 of the list has shape \(2, 2\)"):
        run([[np.ones((2, 2), np.float32)]])
    assert np.array_equal(run([[np.ones((1, 2), np.float32)]])[0][0], np.ones((1, 2)))


def test_an_entry_larger_than_the_list_shape_is_refused():
    run = job(lambda x: round_trip(x, (2, 2)), tp.ListListNumpy.Placeholder((1, 3, 3)))
    with pytest.raises(RecordError, match=r"is \(3, 3\), which a tensor list of \(2, 2\)"):
        run([[np.ones((1, 3, 3), np.float32)]])


def test_tensor_list_to_tensor_buffer_takes_a_tensor_list():
    with pytest.raises(TraceError, match=f"{THIS_FILE}.*takes a tensor list"):
        job(lambda x: round_trip(x, (2,)), tp.Numpy.Placeholder((1, 2)))(
            np.ones((1, 2), np.float32))


def test_a_tensor_buffer_of_a_numpy_argument_becomes_a_tensor_list():
    def body(x):
        buffer = flow.tensor_to_tensor_buffer(x, instance_dims=2)
        return flow.tensor_buffer_to_tensor_list(buffer, shape=(3, 4), dtype=flow.float32)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    out = job(body, tp.Numpy.Placeholder((2, 3, 4)))(x)[0]
    assert [t.shape for t in out] == [(1, 3, 4), (1, 3, 4)]
    assert np.array_equal(out[1][0], x[1])


def test_tensor_list_split_gives_each_tensor_without_its_leading_one():
    a = np.random.rand(1, 3, 2).astype(np.float32)
    b = np.random.rand(1, 2, 2).astype(np.float32)
    out = job(flow.tensor_list_split, tp.ListListNumpy.Placeholder((2, 5, 4)),
              ret=Tuple[tp.ListNumpy, tp.ListNumpy])([[a, b]])
    assert np.array_equal(out[0][0], a[0]) and np.array_equal(out[1][0], b[0])


def test_object_bbox_flip_reads_boxes_and_image_sizes_passed_to_the_job():
    def body(boxes, image_size):
        buffer = flow.tensor_list_to_tensor_buffer(boxes)
        flipped = flow.object_bbox_flip(buffer, image_size, 1)
        return flow.tensor_buffer_to_tensor_list(flipped, shape=(2, 4), dtype=flow.float)
    boxes = np.array([[[20, 40, 80, 160], [30, 50, 70, 100]]], np.float32)
    width, height = 480, 620
    run = job(body, tp.ListListNumpy.Placeholder((1, 2, 4)),
              tp.ListNumpy.Placeholder((1, 2), dtype=flow.int32))
    out = run([[boxes]], [np.array([[width, height]], np.int32)])[0][0]
    # OneFlow's left-right flip of a box: x0, x1 -> width - x1 - 1, width - x0 - 1
    expected = boxes.copy()
    expected[..., 0], expected[..., 2] = width - boxes[..., 2] - 1, width - boxes[..., 0] - 1
    assert np.array_equal(out, expected)


def _png_bytes(image):
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return np.frombuffer(buffer.getvalue(), np.int8)


def test_image_decode_takes_a_files_bytes_fed_as_an_int8_tensor_list():
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (7, 9, 3), dtype=np.uint8),
              rng.integers(0, 255, (5, 4, 3), dtype=np.uint8)]
    data = [_png_bytes(img) for img in images]

    def body(files):
        decoded = flow.image_decode(flow.tensor_list_to_tensor_buffer(files), color_space="RGB")
        return flow.tensor_buffer_to_tensor_list(decoded, shape=(16, 16, 3), dtype=flow.uint8)
    run = job(body, tp.ListListNumpy.Placeholder((2, max(d.size for d in data)),
                                                 dtype=flow.int8))
    out = run([[d.reshape(1, -1) for d in data]])[0]
    for tensor, image in zip(out, images):
        assert np.array_equal(tensor[0], image)


def _image_list(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.random((1,) + s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("alignment", [0, 16])
def test_batch_align_by_default_pads_to_the_batchs_largest_image_rounded_up(alignment):
    shapes = [(20, 30, 3), (25, 12, 3), (7, 9, 3)]

    def body(images):
        buffer = flow.tensor_list_to_tensor_buffer(images)
        return flow.image_batch_align(buffer, shape=(64, 64, 3), dtype=flow.float,
                                      alignment=alignment)
    run = job(body, tp.ListListNumpy.Placeholder((3, 64, 64, 3)), ret=tp.ListNumpy)
    images = _image_list(shapes)
    out = run([images])[0]
    h, w = (32, 32) if alignment else (25, 30)
    assert out.shape == (3, h, w, 3)
    for batch_image, image in zip(out, images):
        ih, iw = image.shape[1:3]
        assert np.array_equal(batch_image[:ih, :iw], image[0])
        assert not batch_image[ih:].any() and not batch_image[:, iw:].any()
    # another call, other sizes: its own batch shape
    assert run([_image_list([(40, 40, 3)], seed=1)])[0].shape == (1, 48 if alignment else 40,
                                                                   48 if alignment else 40, 3)


def test_batch_align_with_dynamic_out_false_keeps_the_static_shape():
    def body(images):
        return flow.image_batch_align(flow.tensor_list_to_tensor_buffer(images),
                                      shape=(32, 32, 3), dtype=flow.float, alignment=0,
                                      dynamic_out=False)
    run = job(body, tp.ListListNumpy.Placeholder((2, 32, 32, 3)), ret=tp.Numpy)
    assert run([_image_list([(20, 30, 3), (25, 12, 3)])]).shape == (2, 32, 32, 3)


def test_target_resize_of_float_images_passed_to_the_job():
    def body(images):
        buffer = flow.tensor_list_to_tensor_buffer(images)
        resized, size, scale = flow.image_target_resize(buffer, target_size=20, max_size=40)
        return flow.tensor_buffer_to_tensor_list(resized, shape=(20, 40, 3),
                                                 dtype=flow.float), size, scale
    run = job(body, tp.ListListNumpy.Placeholder((1, 30, 45, 3)),
              ret=Tuple[tp.ListListNumpy, tp.ListNumpy, tp.ListNumpy])
    resized, size, scale = run([_image_list([(30, 45, 3)])])
    # the shorter side (30) becomes 20, the other keeps the aspect ratio: 45 * 20 / 30 = 30
    assert resized[0][0].shape == (1, 20, 30, 3)
    assert size[0].tolist() == [[30, 20]]
    assert np.allclose(scale[0], [[30 / 45, 20 / 30]])


def test_tensor_buffer_to_list_of_tensors_dynamic_out_on_entries_made_each_run():
    def body(x):
        return tuple(flow.tensor_buffer_to_list_of_tensors(
            flow.tensor_list_to_tensor_buffer(x), (4, 4), flow.float32, True))
    run = job(body, tp.ListListNumpy.Placeholder((2, 4, 4)),
              ret=Tuple[tp.ListNumpy, tp.ListNumpy])
    a, b = np.ones((1, 2, 3), np.float32), np.full((1, 4, 1), 2.0, np.float32)
    first, second = run([[a, b]])
    assert np.array_equal(first[0], a[0]) and np.array_equal(second[0], b[0])
    # as OneFlow's kernel: at most out_shape's element count, any axis longer
    longer = np.arange(5, dtype=np.float32).reshape(1, 5, 1)
    first, _ = run([[longer, b]])
    np.testing.assert_array_equal(first[0], longer[0])
    with pytest.raises(RecordError, match=r"\(5, 4\) float32, which does not have the rank "
                                          r"and at most the element count of \(4, 4\)"):
        run([[np.ones((1, 5, 4), np.float32), b]])


def test_tensor_buffer_to_list_of_tensors_reads_an_entry_of_the_same_count_as_out_shape():
    """Without dynamic_out OneFlow's kernel checks the element count and copies the entry
    into out_shape, row-major."""
    def body(x):
        return tuple(flow.tensor_buffer_to_list_of_tensors(
            flow.tensor_list_to_tensor_buffer(x), (4, 4), flow.float32, False))
    run = job(body, tp.ListListNumpy.Placeholder((2, 4, 4)),
              ret=Tuple[tp.ListNumpy, tp.ListNumpy])
    a = np.arange(16, dtype=np.float32).reshape(1, 2, 8)
    b = np.ones((1, 4, 4), np.float32)
    first, second = run([[a, b]])
    np.testing.assert_array_equal(first[0], a[0].reshape(4, 4))
    np.testing.assert_array_equal(second[0], b[0])
    with pytest.raises(RecordError, match=r"\(3, 3\) float32, which does not have the "
                                          r"element count of \(4, 4\)"):
        run([[np.ones((1, 3, 3), np.float32), b]])


def test_a_tensor_list_made_on_the_host_goes_back_into_a_tensor_buffer():
    def body():
        made = flow.gen_tensor_buffer([2], [(3,), (2,)], [1.0, 2.0])
        listed = flow.tensor_buffer_to_tensor_list(made, shape=[3], dtype=flow.float)
        return round_trip(listed, (3,))
    out = job(body)()[0]
    assert [t.tolist() for t in out] == [[[1.0, 1.0, 1.0]], [[2.0, 2.0]]]
