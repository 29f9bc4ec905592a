"""COCO detection datasets (an instances_*.json annotation file and an image folder), read
as OneFlow's COCO reader reads them.

COCOMeta keeps the images (sorted by id; with remove_images_without_annotations, only
those with an annotation whose box is over 1 x 1 pixels), their non-crowd annotations in
file order, and category ids renumbered 1, 2, ... in sorted order. Per image it gives the
boxes as clipped x0, y0, x1, y1 (x1 = x + max(w - 1, 0), empty boxes dropped), the
labels, and the polygon points with their (point, polygon, object) index.

COCOSampler yields batches of image indices: the images in order (shuffled at each epoch
with a generator seeded by seed + epoch: NumPy's permutation, not OneFlow's std::shuffle),
grouped by aspect ratio (height // width) as OneFlow's GroupBatchDataset does: a batch
holds images of one group, in the order they were read.
"""
import json
import os

import numpy as np


class COCOError(ValueError):
    """A COCO annotation file or image that cannot be read."""


class COCOMeta:
    """The images and annotations of one COCO annotation file (module docstring)."""

    def __init__(self, annotation_file, image_dir, remove_images_without_annotations=True):
        try:
            with open(annotation_file) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise COCOError(f"cannot read the COCO annotation file {annotation_file}: {e}") \
                from None
        self.annotation_file, self.image_dir = annotation_file, image_dir
        self.images = {image["id"]: image for image in data["images"]}
        self.annotations = {i: [] for i in self.images}
        for anno in data.get("annotations", []):
            if anno.get("iscrowd", 0) == 1:
                continue
            segm = anno.get("segmentation")
            if isinstance(segm, list) and any(len(poly) <= 6 for poly in segm):
                raise COCOError(f"{annotation_file}: annotation {anno['id']} has a polygon of "
                                "fewer than 4 points")
            self.annotations[anno["image_id"]].append(anno)
        ids = sorted(self.images)
        if remove_images_without_annotations:
            ids = [i for i in ids if self._has_valid_annotations(i)]
        self.image_ids = ids
        categories = sorted(c["id"] for c in data.get("categories", []))
        self.contiguous = {c: n + 1 for n, c in enumerate(categories)}

    def _has_valid_annotations(self, image_id):
        annos = self.annotations[image_id]
        if not annos or not any(a["bbox"][2] > 1 and a["bbox"][3] > 1 for a in annos):
            return False
        if "keypoints" not in annos[0]:
            return True
        visible = sum(int(v > 0) for a in annos for v in a.get("keypoints", [])[2::3])
        return visible >= 10

    def __len__(self):
        return len(self.image_ids)

    def image(self, index):
        return self.images[self.image_ids[index]]

    def where(self, index):
        return f"{self.annotation_file}: image {self.image_ids[index]}"

    def encoded(self, index):
        path = os.path.join(self.image_dir, self.image(index)["file_name"])
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise COCOError(f"{self.where(index)}: cannot read {path}: {e}") from None

    def boxes(self, index):
        """(K, 4) float32 x0, y0, x1, y1, clipped to the image; empty boxes dropped."""
        image = self.image(index)
        f32 = np.float32
        width, height = f32(image["width"]), f32(image["height"])
        out = []
        for anno in self.annotations[self.image_ids[index]]:
            left, top, w, h = (f32(v) for v in anno["bbox"])
            right = left + max(w - f32(1), f32(0))
            bottom = top + max(h - f32(1), f32(0))
            left, right = (min(max(v, f32(0)), width - f32(1)) for v in (left, right))
            top, bottom = (min(max(v, f32(0)), height - f32(1)) for v in (top, bottom))
            if right > left and bottom > top:
                out.append((left, top, right, bottom))
        return np.array(out, np.float32).reshape(-1, 4)

    def labels(self, index):
        """(K,) int32 contiguous category ids, one per annotation (empty boxes included)."""
        return np.array([self.contiguous[a["category_id"]]
                         for a in self.annotations[self.image_ids[index]]], np.int32)

    def polygons(self, index):
        """((P, 2) float32 points, (P, 3) int32 (point, polygon, object) index)."""
        points, rows = [], []
        for obj, anno in enumerate(self.annotations[self.image_ids[index]]):
            segm = anno.get("segmentation")
            if not isinstance(segm, list):
                raise COCOError(f"{self.where(index)}: annotation {anno['id']} has no polygon "
                                "segmentation (run-length masks are not read)")
            for poly_index, poly in enumerate(segm):
                pts = np.asarray(poly, np.float32).reshape(-1, 2)
                points.append(pts)
                rows.extend((p, poly_index, obj) for p in range(len(pts)))
        pts = np.concatenate(points) if points else np.zeros((0, 2), np.float32)
        return pts, np.array(rows, np.int32).reshape(-1, 3)


class COCOSampler:
    """Batches of image indices of a COCOMeta (module docstring)."""

    def __init__(self, meta, batch_size, shuffle=True, seed=0, group_by_aspect_ratio=True):
        if len(meta) == 0:
            raise COCOError(f"{meta.annotation_file}: no image to read")
        self.meta, self.batch_size = meta, int(batch_size)
        self.shuffle, self.seed, self.group = shuffle, int(seed), group_by_aspect_ratio
        self.epoch, self.pos = 0, 0
        self.order = self._epoch_order()
        self.buffered = {}   # group id -> [[order, [indices]], ...]
        self.count = 0

    def _epoch_order(self):
        order = np.arange(len(self.meta))
        if self.shuffle:
            np.random.Generator(np.random.MT19937(self.seed + self.epoch)).shuffle(order)
        self.epoch += 1
        return order

    def _next_index(self):
        index = int(self.order[self.pos])
        self.pos += 1
        if self.pos >= len(self.order):
            self.order, self.pos = self._epoch_order(), 0
        return index

    def _group_of(self, index):
        image = self.meta.image(index)
        return int(image["height"]) // int(image["width"]) if self.group else 0

    def next_batch(self):
        """The image indices of the next batch."""
        waiting = [(lists[0][0], g) for g, lists in self.buffered.items() if lists]
        group = min(waiting)[1] if waiting else -1
        batch = self.buffered[group].pop(0)[1] if waiting else []
        while len(batch) < self.batch_size:
            index = self._next_index()
            found = self._group_of(index)
            if group == -1:
                group = found
            if found == group:
                batch.append(index)
                continue
            lists = self.buffered.setdefault(found, [])
            if not lists or len(lists[-1][1]) == self.batch_size:
                lists.append([self.count, [index]])
                self.count += 1
            else:
                lists[-1][1].append(index)
        return batch
