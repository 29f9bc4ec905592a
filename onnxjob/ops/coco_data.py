"""`flow.data.coco_reader`: batches of a COCO detection dataset (io/coco.py), read on the
host: encoded images and per-image annotations as tensor buffers, ids and sizes as blobs."""
import numpy as np

from onnxjob.compat.generations import positional_is, two_generations
from onnxjob.errors import TraceError
from onnxjob.io import coco
from onnxjob.ops.host import TENSOR_BUFFER, host_value, to_blob
from onnxjob.ops.random import gen_seed


@two_generations(("annotation_file", "image_dir", "batch_size", "shuffle", "random_seed",
                  "group_by_aspect_ratio", "stride_partition", "name"), positional_is(7, str))
def coco_reader(annotation_file, image_dir, batch_size, shuffle=True, random_seed=None,
                group_by_aspect_ratio=True, stride_partition=True,
                remove_images_without_annotations=True, name=None):
    """[image, image_id, image_size, gt_bbox, gt_label, gt_segm, gt_segm_index] of each
    batch of `batch_size` images, as OneFlow's COCO reader gives them: the encoded image
    bytes (flow.image.decode them), (N,) int64 image ids, (N, 2) int32 (height, width),
    and tensor buffers of float32 (K, 4) boxes x0, y0, x1, y1, int32 (K,) labels (category
    ids renumbered from 1), float32 (P, 2) polygon points and their int32 (P, 3) (point,
    polygon, object) index. Images are grouped by aspect ratio per batch
    (group_by_aspect_ratio) and reshuffled each epoch (shuffle, `random_seed`); see
    io/coco.py. stride_partition splits OneFlow's reader over devices: onnxjob reads the
    whole batch in one process."""
    api = "flow.data.coco_reader"
    try:
        meta = coco.COCOMeta(annotation_file, image_dir, remove_images_without_annotations)
        sampler = coco.COCOSampler(meta, batch_size, shuffle, gen_seed(random_seed)[0] % 2 ** 32,
                                   group_by_aspect_ratio)
    except coco.COCOError as e:
        raise TraceError(f"{api}: {e}") from None
    n = int(batch_size)
    name = name or "COCOReader"
    batch = host_value(name, sampler.next_batch, [], n, TENSOR_BUFFER, api)

    def buffer(label, read):
        return host_value(f"{name}_{label}",
                          lambda indices: [(meta.where(i), read(i)) for i in indices],
                          [batch], n, TENSOR_BUFFER, api)

    image = buffer("image", meta.encoded)
    image_id = to_blob(f"{name}_image_id",
                       lambda indices: np.array([meta.image_ids[i] for i in indices], np.int64),
                       [batch], (n,), np.int64, api)
    image_size = to_blob(f"{name}_image_size", lambda indices: np.array(
        [(meta.image(i)["height"], meta.image(i)["width"]) for i in indices], np.int32),
        [batch], (n, 2), np.int32, api)
    segm = host_value(f"{name}_segm_both", lambda indices: [
        (meta.where(i), meta.polygons(i)) for i in indices], [batch], n, TENSOR_BUFFER, api)
    points = host_value(f"{name}_gt_segm", lambda v: [(w, p[0]) for w, p in v], [segm], n,
                        TENSOR_BUFFER, api)
    index = host_value(f"{name}_gt_segm_index", lambda v: [(w, p[1]) for w, p in v], [segm],
                       n, TENSOR_BUFFER, api)
    return [image, image_id, image_size, buffer("gt_bbox", meta.boxes),
            buffer("gt_label", meta.labels), points, index]
