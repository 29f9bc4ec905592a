"""flow.data.coco_reader on a small COCO dataset written here: OneFlow's box clipping
and label renumbering, polygon indices, image removal, aspect-ratio grouping, epochs,
and decoding the images it returns with flow.image.decode."""
import json
from typing import Tuple

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.io import coco
from onnxjob.ops.host import to_blob
from ofrecord_datasets import encode

# (id, height, width): groups by height // width are 1, 0, 2, 1, 1; image 9 has no annotation
IMAGES = [(4, 16, 16), (2, 10, 20), (7, 30, 12), (1, 12, 12), (5, 20, 18), (9, 8, 8)]


def pixels(image_id, height, width):
    return np.full((height, width, 3), image_id * 10, np.uint8)


@pytest.fixture
def dataset(tmp_path):
    images, annotations = [], []
    for image_id, height, width in IMAGES:
        (tmp_path / f"{image_id}.png").write_bytes(encode(pixels(image_id, height, width)))
        images.append({"id": image_id, "file_name": f"{image_id}.png", "height": height,
                       "width": width})
    next_id = iter(range(100, 200))
    for image_id, height, width in IMAGES[:-1]:
        annotations.append({"id": next(next_id), "image_id": image_id, "category_id": 5,
                            "iscrowd": 0, "bbox": [2.0, 3.0, 6.0, 4.0],
                            "segmentation": [[2, 3, 7, 3, 7, 6, 2, 6]]})
        annotations.append({"id": next(next_id), "image_id": image_id, "category_id": 3,
                            "iscrowd": 0, "bbox": [width - 3.0, -2.0, 10.0, 0.5],
                            "segmentation": [[1, 1, 4, 1, 4, 4, 1, 4],
                                             [0, 0, 2, 0, 2, 2, 0, 2]]})
        annotations.append({"id": next(next_id), "image_id": image_id, "category_id": 3,
                            "iscrowd": 1, "bbox": [0, 0, 5, 5], "segmentation": {"counts": []}})
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 5}, {"id": 3}]}))
    return str(path), str(tmp_path)


def test_meta_follows_oneflows_rules(dataset):
    meta = coco.COCOMeta(*dataset)
    assert meta.image_ids == [1, 2, 4, 5, 7]   # sorted, image 9 (no annotation) removed
    assert len(coco.COCOMeta(*dataset, remove_images_without_annotations=False)) == 6
    index = meta.image_ids.index(2)            # 10 x 20
    np.testing.assert_array_equal(meta.boxes(index), [[2, 3, 7, 6]])   # the second is empty
    np.testing.assert_array_equal(meta.labels(index), [2, 1])          # 3 -> 1, 5 -> 2
    points, rows = meta.polygons(index)
    assert points.shape == (12, 2) and rows.shape == (12, 3)
    np.testing.assert_array_equal(points[4:8], [[1, 1], [4, 1], [4, 4], [1, 4]])
    np.testing.assert_array_equal(rows[:, 2], [0] * 4 + [1] * 8)
    np.testing.assert_array_equal(rows[4:, 1], [0] * 4 + [1] * 4)
    np.testing.assert_array_equal(rows[4:, 0], [0, 1, 2, 3] * 2)


def test_box_clipping_keeps_boxes_inside_the_image(tmp_path):
    (tmp_path / "a.png").write_bytes(encode(pixels(1, 10, 10)))
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.png", "height": 10,
                                            "width": 10}],
                                "annotations": [{"id": 1, "image_id": 1, "category_id": 1,
                                                 "iscrowd": 0, "bbox": [-3, 4, 20, 9],
                                                 "segmentation": [[0, 0, 1, 0, 1, 1, 0, 1]]}],
                                "categories": [{"id": 1}]}))
    np.testing.assert_array_equal(coco.COCOMeta(str(path), str(tmp_path)).boxes(0),
                                  [[0, 4, 9, 9]])


def test_batches_group_by_aspect_ratio():
    class Meta:
        image_ids = list(range(5))
        annotation_file = "x"

        def __len__(self):
            return 5

        def image(self, i):
            return {"height": [16, 10, 30, 12, 20][i], "width": [16, 20, 12, 12, 18][i]}

    sampler = coco.COCOSampler(Meta(), 2, shuffle=False)
    # groups 1, 0, 2, 1, 1: the first batch waits for a second group-1 image
    assert sampler.next_batch() == [0, 3]
    assert sampler.next_batch() == [1, 1]     # group 0 then fills from the next epoch
    flat = coco.COCOSampler(Meta(), 2, shuffle=False, group_by_aspect_ratio=False)
    assert [flat.next_batch() for _ in range(3)] == [[0, 1], [2, 3], [4, 0]]


def test_coco_reader_job(dataset):
    meta = coco.COCOMeta(*dataset)

    @flow.global_function()
    def job() -> Tuple[tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy, tp.Numpy]:
        image, image_id, image_size, bbox, label, segm, segm_index = flow.data.coco_reader(
            dataset[0], dataset[1], batch_size=2, shuffle=False, group_by_aspect_ratio=False,
            name="COCOReader")
        decoded = flow.image.decode(image, dtype=flow.uint8, color_space="RGB")
        first_pixel = to_blob("px", lambda b: np.array([img[0, 0, 0] for _, img in b],
                                                       np.uint8), [decoded], (2,), np.uint8, "t")
        boxes = to_blob("nb", lambda b: np.array([len(x) for _, x in b], np.int32), [bbox],
                        (2,), np.int32, "t")
        return image_id, image_size, first_pixel, boxes, flow.tensor_buffer_to_list_of_tensors(
            segm_index, (12, 3), flow.int32)[0]

    ids, sizes, first, boxes, index = job()
    np.testing.assert_array_equal(ids, [1, 2])
    np.testing.assert_array_equal(sizes, [[12, 12], [10, 20]])   # (height, width)
    np.testing.assert_array_equal(first, [10, 20])
    np.testing.assert_array_equal(boxes, [len(meta.boxes(0)), len(meta.boxes(1))])
    np.testing.assert_array_equal(index, meta.polygons(0)[1])
    ids, *_ = job()
    np.testing.assert_array_equal(ids, [4, 5])


def test_short_polygons_are_refused(dataset):
    data = json.loads(open(dataset[0]).read())
    data["annotations"][0]["segmentation"] = [[0, 0, 4, 0, 4, 4]]   # OneFlow needs > 6 values
    with open(dataset[0], "w") as f:
        json.dump(data, f)
    with pytest.raises(coco.COCOError, match="fewer than 4 points"):
        coco.COCOMeta(*dataset)


def test_missing_annotation_file(tmp_path):
    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.data.coco_reader(str(tmp_path / "none.json"), str(tmp_path), 2)[1]

    with pytest.raises(TraceError, match="cannot read the COCO annotation file"):
        job()
