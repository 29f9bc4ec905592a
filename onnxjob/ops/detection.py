"""`flow.detection` (and `flow.object_*`): box and polygon annotations of a batch of
images, flipped, scaled or drawn as masks with the images they belong to.

They take host tensor buffers (one entry per image: (K, 4) boxes x0, y0, x1, y1 or
(P, 2) polygon points) and per-image host blobs: `image_size` (N, 2) int32 (width,
height), `scale` (N, 2) float32 (flow.image.Resize's), `flip_code` an int or an int8 (N,)
blob (flow.random.CoinFlip): 1 left-right, 2 up-down, 3 both, 0 none. The arithmetic is
OneFlow's kernels': a box flips to width - x - 1, a polygon point to width - x.
"""
import numpy as np

from onnxjob.errors import TraceError
from onnxjob.graph.tracer import Blob
from onnxjob.io.ofrecord import RecordError
from onnxjob.ops.host import TENSOR_BUFFER, check_host_value, host_readable, host_value


def _per_image(value, n, np_dtype, columns, label, api):
    """`value` checked to be a host-fed (n, *columns) blob of `np_dtype`."""
    shape = (n,) + columns
    if not (isinstance(value, Blob) and host_readable(value)
            and value.np_dtype == np_dtype and tuple(value.shape) == shape):
        raise TraceError(f"{api}: {label} must be a {np.dtype(np_dtype).name} {shape} blob made "
                         f"on the host (a data op's, flow.tensor_buffer_to_tensor's) or a job "
                         f"argument, got {value!r}")
    return value


def _entries(batch, columns, api):
    for where, array in batch:
        array = np.asarray(array)
        if array.ndim != 2 or array.shape[1] != columns or array.dtype.kind != "f":
            raise RecordError(f"{where}: {api} takes float ({columns} columns) entries, got "
                              f"{array.shape} {array.dtype}")
        yield where, array


def _flip_inputs(x, image_size, flip_code, api):
    check_host_value(x, api, TENSOR_BUFFER)
    n = x.batch_size
    inputs = [x, _per_image(image_size, n, np.int32, (2,), "image_size", api)]
    if isinstance(flip_code, Blob):
        inputs.append(_per_image(flip_code, n, np.int8, (), "flip_code", api))
    elif isinstance(flip_code, bool) or not isinstance(flip_code, int) or not 0 <= flip_code <= 3:
        raise TraceError(f"{api}: flip_code must be 0, 1, 2 or 3 (or an int8 blob of them), "
                         f"got {flip_code!r}")
    return inputs


def _flip(x, image_size, flip_code, name, columns, offset, api):
    def compute(batch, sizes, codes=None):
        codes = np.full(len(batch), flip_code) if codes is None else codes
        out = []
        for (where, array), (width, height), code in zip(_entries(batch, columns, api), sizes,
                                                          codes):
            array = array.copy()
            xs, ys = array[:, 0::2], array[:, 1::2]
            if code & 1:
                xs[:] = (width - offset - xs)[:, ::-1] if columns == 4 else width - xs
            if code & 2:
                ys[:] = (height - offset - ys)[:, ::-1] if columns == 4 else height - ys
            out.append((where, array))
        return out

    return host_value(name, compute, _flip_inputs(x, image_size, flip_code, api),
                      x.batch_size, TENSOR_BUFFER, api)


def object_bbox_flip(bbox, image_size, flip_code, name=None):
    """Boxes (x0, y0, x1, y1) of each image flipped with it: left-right x0, x1 become
    width - x1 - 1, width - x0 - 1 (up-down likewise with the height)."""
    return _flip(bbox, image_size, flip_code, name or "ObjectBboxFlip", 4, 1,
                 "flow.detection.object_bbox_flip")


def object_segmentation_polygon_flip(poly, image_size, flip_code, name=None):
    """Polygon points (x, y) of each image flipped with it: x becomes width - x (left-right),
    y height - y (up-down)."""
    return _flip(poly, image_size, flip_code, name or "ObjectSegmPolyFlip", 2, 0,
                 "flow.detection.object_segmentation_polygon_flip")


def _scale(x, scale, name, columns, api):
    check_host_value(x, api, TENSOR_BUFFER)
    _per_image(scale, x.batch_size, np.float32, (2,), "scale", api)

    def compute(batch, scales):
        out = []
        for (where, array), (sw, sh) in zip(_entries(batch, columns, api), scales):
            array = array.copy()
            array[:, 0::2] *= array.dtype.type(sw)
            array[:, 1::2] *= array.dtype.type(sh)
            out.append((where, array))
        return out

    return host_value(name, compute, [x, scale], x.batch_size, TENSOR_BUFFER, api)


def object_bbox_scale(bbox, scale, name=None):
    """Boxes of each image scaled with it: x by its scale's width factor, y by its height's
    (flow.image.Resize gives the (N, 2) scale)."""
    return _scale(bbox, scale, name or "ObjectBboxScale", 4, "flow.detection.object_bbox_scale")


def object_segmentation_polygon_scale(poly, scale, name=None):
    """Polygon points of each image scaled with it, as object_bbox_scale."""
    return _scale(poly, scale, name or "ObjectSegmPolyScale", 2,
                  "flow.detection.object_segmentation_polygon_scale")


def _line_pixels(p, q):
    """The pixels of the 8-connected line from p to q (Bresenham), ends included."""
    (x0, y0), (x1, y1) = p, q
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x1 >= x0 else -1), (1 if y1 >= y0 else -1)
    err, out = dx + dy, []
    while True:
        out.append((x0, y0))
        if (x0, y0) == (x1, y1):
            return out
        e2 = 2 * err
        if e2 >= dy:
            err, x0 = err + dy, x0 + sx
        if e2 <= dx:
            err, y0 = err + dx, y0 + sy


def polygons_mask(polygons, width, height):
    """An int8 (height, width) mask of 1 inside the polygons (lists of integer (x, y)
    points) and on their edges, 0 elsewhere: cv2.fillPoly(..., 1, LINE_8)'s coverage
    (pixel centres inside by the even-odd rule, plus the 8-connected outline)."""
    mask = np.zeros((height, width), np.int8)
    ys, xs = np.mgrid[0:height, 0:width]
    inside = np.zeros((height, width), bool)
    for points in polygons:
        pts = np.asarray(points, np.float64)
        for (x0, y0), (x1, y1) in zip(pts, np.roll(pts, -1, axis=0)):
            if y0 == y1:
                continue
            crosses = (ys >= min(y0, y1)) & (ys < max(y0, y1))
            x_at = x0 + (ys - y0) * (x1 - x0) / (y1 - y0)
            inside ^= crosses & (xs < x_at)
        for p, q in zip(points, points[1:] + points[:1]):
            for x, y in _line_pixels(tuple(p), tuple(q)):
                if 0 <= x < width and 0 <= y < height:
                    mask[y, x] = 1
    mask[inside] = 1
    return mask


def _segments(where, points, index):
    """[[polygon points] per object] from OneFlow's (P, 3) index (point, polygon, object)."""
    if index.ndim != 2 or index.shape[1] != 3 or len(index) != len(points):
        raise RecordError(f"{where}: the polygon index must be ({len(points)}, 3), got "
                          f"{index.shape}")
    objects = []
    for (x, y), (_, polygon, obj) in zip(np.rint(points).astype(np.int64), index.tolist()):
        if obj == len(objects):
            objects.append([])
        if obj != len(objects) - 1 or polygon > len(objects[-1]):
            raise RecordError(f"{where}: the polygon index is not in order (object {obj}, "
                              f"polygon {polygon})")
        if polygon == len(objects[-1]):
            objects[-1].append([])
        objects[-1][polygon].append((int(x), int(y)))
    return objects


def object_segmentation_polygon_to_mask(poly, poly_index, image_size, name=None):
    """A tensor buffer of int8 (objects, height, width) masks per image, one mask per
    object of the polygons `poly` (points (P, 2)) grouped by `poly_index` ((P, 3): point,
    polygon and object of each point), filled as cv2.fillPoly does."""
    api = "flow.detection.object_segmentation_polygon_to_mask"
    check_host_value(poly, api, TENSOR_BUFFER)
    check_host_value(poly_index, api, TENSOR_BUFFER)
    _per_image(image_size, poly.batch_size, np.int32, (2,), "image_size", api)

    def compute(batch, index_batch, sizes):
        out = []
        for (where, points), (_, index), (width, height) in zip(
                _entries(batch, 2, api), index_batch, sizes):
            objects = _segments(where, points, np.asarray(index))
            masks = [polygons_mask(polygons, int(width), int(height)) for polygons in objects]
            out.append((where, np.stack(masks) if masks
                        else np.zeros((0, int(height), int(width)), np.int8)))
        return out

    return host_value(name or "ObjectSegmPolyToMask", compute, [poly, poly_index, image_size],
                      poly.batch_size, TENSOR_BUFFER, api)
