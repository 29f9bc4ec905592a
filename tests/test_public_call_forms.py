"""Every public function of the flow namespaces (flow, flow.math, flow.nn, flow.layers,
flow.random, flow.image, flow.data, flow.detection) called inside a job with OneFlow's
documented argument forms: small blobs of the rank and dtype each parameter takes (built
by parameter name, with per-function forms where the rank or kind differs), host tensor
buffers for the image and detection ops, and tiny OFRecord, OneRec, Megatron and COCO
files written here for the readers. Then `None` for each parameter whose default is None
(OneFlow reads None there as "the default").

The documented form must run. A None form may give a result or one of the errors
OneFlow's users meet: onnxjob's own (naming the line) or an AssertionError as OneFlow
asserts. A raw TypeError / AttributeError / KeyError / IndexError / ValueError ...
raised inside onnxjob fails the test. A function whose arguments cannot be built here is
skipped with the reason."""
import inspect
import json
import math

import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import OnnxJobError
from onnxjob.frontend.blob_arguments import API_MODULES
from onnxjob.graph.tracer import Blob
from onnxjob.io import megatron, ofrecord, onerec
from ofrecord_datasets import encode

NAMESPACES = {"flow": flow, "flow.math": flow.math, "flow.nn": flow.nn,
              "flow.layers": flow.layers, "flow.random": flow.random, "flow.image": flow.image,
              "flow.data": flow.data, "flow.detection": flow.detection}
# (API_MODULES: the modules OneFlow's API is implemented in; other functions a namespace
# module shows, graph primitives, compat decorators, errors, are imports, not API)
# onnxjob's helpers that an op module's namespace shows: not OneFlow names
INTERNAL = {"named_op", "convolution", "is_channels_last", "spatial_tuple", "variable_blob",
            "functional_layer_norm", "op_seed", "to_blob", "check_host_value",
            "checked_args", "encoded_items", "gen_seed", "host_value"}
# made outside a job, or taking no blob: not called here (they have tests of their own)
NOT_OPS = {"global_function", "clear_default_session", "sync_default_session", "watch",
           "watch_diff", "load", "load_variables", "get_all_variables", "save", "export",
           "find_or_create_module", "current_global_function_desc", "current_scope",
           "current_resource", "current_machine_id", "inter_job_reuse_mem_strategy",
           "manual_seed", "no_grad", "eager_execution_enabled", "enable_eager_execution",
           "Model", "Size", "convert_oneflow_dtype_to_numpy_dtype", "FunctionConfig",
           "ExecutionConfig", "function_config", "FixedTensorDef", "MirroredTensorDef",
           "user_op_builder", "consistent_user_op_builder", "user_op_module_builder",
           "consistent_user_op_module_builder", "empty_initializer", "load_mnist",
           "load_mnist_subset", "device_prior_placement", "fixed_placement"}

FLOATS = np.linspace(0.1, 0.9, 512, dtype=np.float32)
INTS = (np.arange(512) % 2).astype(np.int32)      # valid indices for any axis of size >= 2
COCO_IMAGES = [(1, 8, 10), (2, 10, 8)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Tiny datasets for the readers: OFRecord ("x" floats, "encoded" JPEG, "class/label"),
    a Megatron corpus, a OneRec file and a COCO annotation file with its images."""
    root = tmp_path_factory.mktemp("call_forms")
    image = np.arange(8 * 10 * 3, dtype=np.uint8).reshape(8, 10, 3)
    records = [{"x": np.float32([i, i + 1, i + 2]), "encoded": encode(image, "JPEG"),
                "class/label": np.int32(i)} for i in range(4)]
    ofrecord.write_dataset(str(root / "ofrecord"), records, part_name_suffix_length=-1)
    megatron.write_dataset(str(root / "corpus"), [list(range(20)), list(range(30, 45))])
    onerec.write_examples(str(root / "a.onerec"),
                          [{"dense": np.full((2, 3), i, np.float32)} for i in range(4)])
    images = []
    for image_id, height, width in COCO_IMAGES:
        (root / f"{image_id}.png").write_bytes(encode(np.full((height, width, 3), 9,
                                                              np.uint8)))
        images.append({"id": image_id, "file_name": f"{image_id}.png", "height": height,
                       "width": width})
    annotations = [{"id": 10 + i, "image_id": image_id, "category_id": 1, "iscrowd": 0,
                    "bbox": [1.0, 1.0, 4.0, 4.0], "segmentation": [[1, 1, 5, 1, 5, 5, 1, 5]]}
                   for i, (image_id, _, _) in enumerate(COCO_IMAGES)]
    (root / "coco.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                "categories": [{"id": 1}]}))
    return {"ofrecord": str(root / "ofrecord"), "corpus": str(root / "corpus"),
            "onerec": [str(root / "a.onerec")], "coco": (str(root / "coco.json"), str(root))}


class Args:
    """Argument values inside the job: small blobs cut from its placeholders, host tensor
    buffers, readers over the tiny datasets."""

    def __init__(self, floats, ints, files):
        self._floats, self._ints, self.files = floats, ints, files

    def _cut(self, source, shape):
        n = math.prod(shape)
        return flow.reshape(flow.slice_v2(source, [(0, n, 1)]), list(shape))

    def f(self, *shape):
        """A float32 blob of `shape`, values in (0, 1)."""
        return self._cut(self._floats, shape)

    def i(self, *shape, dtype=flow.int32):
        """An int blob of `shape`, values 0 and 1."""
        ints = self._cut(self._ints, shape)
        return ints if dtype is flow.int32 else flow.cast(ints, dtype)

    def mask(self, *shape):
        return self.i(*shape, dtype=flow.int8)

    def variable(self, name, *shape, dtype=flow.float):
        return flow.get_variable(name, shape, dtype=dtype,
                                 initializer=flow.zeros_initializer(dtype))

    @staticmethod
    def buffer(shapes, values, dtype):
        """A host tensor buffer of one entry per shape, each filled with its value."""
        return flow.gen_tensor_buffer([len(shapes)], shapes, values, data_type=dtype)

    def images(self):
        return self.buffer([(6, 8, 3), (8, 6, 3)], [10.0, 200.0], flow.uint8)

    def per_image(self, values, dtype):
        """A host (2, 2) blob of `dtype` (image sizes, scales)."""
        return flow.tensor_buffer_to_tensor(self.buffer([(2,), (2,)], values, dtype), dtype,
                                            [2])

    def tensor_list(self):
        """A tensor list of two (1, k) float tensors, made on the host."""
        return flow.tensor_buffer_to_tensor_list(self.buffer([(3,), (2,)], [1.0, 2.0],
                                                             flow.float), [3], flow.float)

    def records(self):
        return flow.data.ofrecord_reader(self.files["ofrecord"], batch_size=2)

    def encoded(self):
        return flow.data.OFRecordBytesDecoder(self.records(), "encoded")


def _by_name(a):
    """Argument builders by parameter name: the common forms."""
    return {
        **dict.fromkeys(["x", "input", "a", "input_tensor", "input_blob", "inputs", "logits",
                         "prediction", "predictions", "data", "params", "like", "value", "y",
                         "b", "dy", "target", "input1", "input2", "anchor", "positive",
                         "negative", "one", "updates", "norm"], lambda: a.f(2, 3)),
        **dict.fromkeys(["labels", "label", "indices", "segment_ids", "targets"],
                        lambda: a.i(2)),
        **dict.fromkeys(["condition", "mask"], lambda: a.mask(2, 3)),
        "shape": lambda: [2, 3], "axis": lambda: 0, "axes": lambda: [0], "k": lambda: 1,
        "units": lambda: 2, "ksize": lambda: 1, "strides": lambda: 1,
        "padding": lambda: "VALID", "rate": lambda: 0.5, "depth": lambda: 3,
        "dtype": lambda: flow.float, "num_segments": lambda: 3, "size": lambda: [1, 2],
        "begin": lambda: [0, 1], "paddings": lambda: [[0, 0], [1, 1]],
        "expand_size": lambda: [2, 3], "num_or_size_splits": lambda: 1,
        "instance_shape": lambda: [3], "instance_dims": lambda: 1,
        "slice_tup_list": lambda: [(0, 1, 1)], "repeat_num": lambda: 2,
        "max_acc_num": lambda: 2, "coeffs": lambda: [1.0, 2.0], "capacity": lambda: 4,
        "num_sample": lambda: 2, "head_size": lambda: 1, "upscale_factor": lambda: 2,
        "h_upscale_factor": lambda: 2, "w_upscale_factor": lambda: 2, "start": lambda: 3,
        "name": lambda: "v", "flip_code": lambda: 1, "target_size": lambda: 6,
        "std": lambda: [1.0, 2.0, 4.0], "mean": lambda: [0.0, 1.0, 2.0],
        "alignment": lambda: 4, "images": a.images, "image": a.images,
        "images_bytes_buffer": a.encoded, "bbox": lambda: a.buffer(
            [(3, 4), (2, 4)], [1.0, 2.0], flow.float),
        "poly": lambda: a.buffer([(1, 2), (1, 2)], [1.0, 2.0], flow.float),
        "poly_index": lambda: a.buffer([(1, 3), (1, 3)], [0, 0], flow.int32),
        "image_size": lambda: a.per_image([9, 7], flow.int32),
        "scale": lambda: a.per_image([0.5, 2.0], flow.float),
        "ofrecord_dir": lambda: a.files["ofrecord"], "batch_size": lambda: 2,
        "blob_name": lambda: "x", "image_feature_name": lambda: "encoded",
        "label_feature_name": lambda: "class/label", "target_width": lambda: 4,
        "target_height": lambda: 4, "data_file_prefix": lambda: a.files["corpus"],
        "seq_length": lambda: 3, "num_samples": lambda: 4, "files": lambda: a.files["onerec"],
        "key": lambda: "dense", "annotation_file": lambda: a.files["coco"][0],
        "image_dir": lambda: a.files["coco"][1],
        "blobs": lambda: [flow.data.BlobConf("x", shape=(3,), dtype=flow.float,
                                             codec=flow.data.RawCodec())],
    }


def _per_function(a):
    """Forms of the functions whose parameters differ from the common ones: by name, or by
    namespace and name where two namespaces' functions of one name differ."""
    nchw, ncw, ncdhw = (lambda: a.f(1, 2, 4, 4)), (lambda: a.f(1, 2, 4)), \
        (lambda: a.f(1, 2, 2, 3, 3))
    pool = {"input": nchw, "ksize": lambda: 2, "strides": lambda: 2}
    image_records = {"input_blob": a.records, "blob_name": lambda: "encoded"}
    return {
        "acc": {"one": lambda: flow.repeat(a.f(2, 3), 2)},
        "pack": {"input": lambda: flow.unpack(a.f(2, 3), 2), "pack_num": lambda: 2},
        "assign": {"ref": lambda: a.variable("ref", 2, 3)},
        "broadcast_like": {"x": lambda: a.f(2, 1), "broadcast_axes": lambda: [1]},
        "broadcast_to_compatible_with": {"compatible": lambda: [a.f(2, 1)], "x": lambda: a.f(3)},
        "categorical_ordinal_encode": {"table": lambda: a.variable("table", 8, dtype=flow.int32),
                                       "size": lambda: a.variable("size", 1, dtype=flow.int32),
                                       "input_tensor": lambda: a.i(2, 3)},
        "categorical_ordinal_encoder": {"input_tensor": lambda: a.i(2, 3)},
        **dict.fromkeys(["clamp", "clip", "clip_by_scalar", "clip_by_value"], {
            "values": lambda: a.f(2, 3), "min_value": lambda: 0.2, "max_value": lambda: 0.7}),
        "concat": {"inputs": lambda: [a.f(2, 3), a.f(2, 3)]},
        "constant": {"value": lambda: 1.5}, "constant_scalar": {"value": lambda: 1.5},
        "constant_like": {"value": lambda: 2.0},
        "masked_fill": {"value": lambda: 0.0},
        "constant_pad2d": {"x": nchw, "padding": lambda: 1},
        "zero_pad2d": {"x": nchw, "padding": lambda: 1},
        "reflection_pad2d": {"x": nchw, "padding": lambda: 1},
        "replication_pad2d": {"x": nchw, "padding": lambda: 1},
        "same_padding": {"x": nchw, "padding": lambda: "SAME_LOWER", "data_format": lambda: "NCHW",
                         "kernel_size": lambda: [3, 3], "strides": lambda: [1, 1],
                         "dilation_rate": lambda: [1, 1]},
        "ctc_loss": {"log_probs": lambda: flow.nn.log_softmax(a.f(4, 2, 3)),
                     "targets": lambda: a.i(2, 2, dtype=flow.int64) + 1,
                     "input_lengths": lambda: flow.constant(4, shape=[2], dtype=flow.int64),
                     "target_lengths": lambda: flow.constant(1, shape=[2], dtype=flow.int64)},
        "ctc_greedy_decoder": {"log_probs": lambda: flow.nn.log_softmax(a.f(4, 2, 3)),
                               "input_lengths": lambda: flow.constant(4, shape=[2],
                                                                      dtype=flow.int64)},
        "dim_gather": {"input": lambda: a.f(2, 3), "dim": lambda: 0,
                       "index": lambda: a.i(2, 3)},
        "distributed_partial_fc_sample": {"weight": lambda: a.f(4, 3)},
        "expand_dims": {"axis": lambda: 1},
        "gather_nd": {"indices": lambda: a.i(2, 1)},
        "gen_tensor_buffer": {"shape": lambda: [2], "shape_list": lambda: [(2,), (3,)],
                              "value_list": lambda: [1.0, 2.0]},
        "get_variable": {"shape": lambda: (2,), "initializer": flow.zeros_initializer},
        "hierarchical_parallel_cast": {"nd_sbp": lambda: ["B"]},
        "identity_n": {"inputs": lambda: [a.f(2, 3), a.f(3)]},
        "stack": {"inputs": lambda: [a.f(2, 3), a.f(2, 3)]},
        "add_n": {"inputs": lambda: [a.f(2, 3), a.f(2, 3)]},
        "multi_count_not_finite": {"x": lambda: [a.f(2, 3), a.f(3)]},
        **dict.fromkeys(["image_batch_align", "batch_align"], {
            "shape": lambda: [8, 8, 3], "dtype": lambda: flow.uint8,
            "dynamic_out": lambda: False}),
        "image_random_crop": {"input_blob": a.images}, "random_crop": {"input_blob": a.images},
        "image_resize": {"target_size": lambda: [4, 5]},
        "Resize": {"target_size": lambda: [4, 5]}, "resize": {"target_size": lambda: [4, 5]},
        "CropMirrorNormalize": {"input_blob": lambda: flow.image.Resize(
            a.images(), target_size=[4, 5])[0]},
        "crop_mirror_normalize": {"input_blob": lambda: flow.image.Resize(
            a.images(), target_size=[4, 5])[0]},
        "image_normalize": {"image": lambda: flow.image.decode(a.encoded(), dtype=flow.float)},
        "normalize": {"image": lambda: flow.image.decode(a.encoded(), dtype=flow.float)},
        "in_top_k": {"predictions": lambda: a.f(2, 3)},
        "indexed_slices_reduce_sum": {"indices": lambda: a.i(4), "values": lambda: a.f(4, 3)},
        "matmul": {"b": lambda: a.f(3, 2)},
        "unpack": {"unpack_num": lambda: 2},
        "polyval": {"coeffs": lambda: [1.0, 2.0]},
        "range": {"start": lambda: 3},
        "reverse": {"axis": lambda: 1},
        "scatter_nd": {"indices": lambda: a.i(2, 1), "updates": lambda: a.f(2, 3),
                       "shape": lambda: [3, 3]},
        "tensor_scatter_nd_add": {"indices": lambda: a.i(2, 1)},
        "tensor_scatter_nd_update": {"indices": lambda: a.i(2, 1)},
        "slice_update": {"update": lambda: a.f(1, 3)},
        "smooth_l1_loss": {"label": lambda: a.f(2, 3)},
        "sync_dynamic_resize": {"size": lambda: flow.constant(1, shape=[1], dtype=flow.int32)},
        "tensor_buffer_to_list_of_tensors": {
            "x": lambda: a.buffer([(3,), (3,)], [1.0, 2.0], flow.float),
            "out_shape": lambda: [3], "out_dtype": lambda: flow.float},
        "tensor_buffer_to_tensor": {"x": lambda: a.buffer([(3,), (3,)], [1.0, 2.0], flow.float),
                                    "dtype": lambda: flow.float},
        "tensor_to_tensor_buffer": {"x": lambda: a.f(2, 3)},
        "tensor_buffer_to_tensor_list": {
            "input": lambda: a.buffer([(3,), (2,)], [1.0, 2.0], flow.float),
            "shape": lambda: [3]},
        "tensor_list_to_tensor_buffer": {"input": a.tensor_list},
        "tensor_list_split": {"input_tensor_list": a.tensor_list},
        "unsorted_batch_segment_sum": {"segment_ids": lambda: a.i(2, 3)},
        "unsorted_segment_sum_like": {"like": lambda: a.f(3, 3)},
        "where": {"x": lambda: a.f(2, 3), "y": lambda: a.f(2, 3)},
        "gelu_grad": {}, "sigmoid_grad": {}, "softmax_grad": {},
        "BCELoss": {"target": lambda: flow.math.round(a.f(2, 3))},
        "BCEWithLogitsLoss": {"target": lambda: flow.math.round(a.f(2, 3))},
        "MarginRankingLoss": {"target": lambda: flow.constant(1.0, shape=[2, 3])},
        "GroupNorm": {"x": nchw, "num_groups": lambda: 2},
        "InstanceNorm1d": {"x": ncw}, "InstanceNorm2d": {"x": nchw},
        "InstanceNorm3d": {"x": ncdhw},
        "PixelShuffle": {"input": lambda: a.f(1, 4, 2, 2)},
        "PixelShufflev2": {"input": lambda: a.f(1, 4, 2, 2)},
        "avg_pool1d": {**pool, "input": ncw}, "max_pool1d": {**pool, "input": ncw},
        "avg_pool2d": pool, "max_pool2d": pool,
        "avg_pool3d": {**pool, "input": ncdhw}, "max_pool3d": {**pool, "input": ncdhw},
        "batch_normalization": {"inputs": nchw, "x": nchw, "mean": lambda: a.f(2),
                                "variance": lambda: a.f(2), "axis": lambda: 1},
        "batch_normalization_relu": {"inputs": nchw},
        "batch_normalization_add_relu": {"inputs": nchw},
        "bias_add": {"bias": lambda: a.f(3)},
        "fused_bias_add_dropout": {"bias": lambda: a.f(3)},
        "fused_bias_add_gelu": {"bias": lambda: a.f(3)},
        "compat_conv2d": {"input": nchw, "filters": lambda: a.f(3, 2, 1, 1)},
        "conv1d": {"input": ncw, "filters": lambda: a.f(3, 2, 1)},
        "conv2d": {"input": nchw, "filters": lambda: a.f(3, 2, 1, 1)},
        "conv3d": {"input": ncdhw, "filters": lambda: a.f(3, 2, 1, 1, 1)},
        "conv2d_transpose": {"input": nchw, "filters": lambda: a.f(2, 3, 1, 1),
                             "output_shape": lambda: [1, 3, 4, 4], "strides": lambda: 1,
                             "padding": lambda: "VALID"},
        "torch_conv2d_transpose": {"input": nchw, "filters": lambda: a.f(2, 3, 1, 1),
                                   "strides": lambda: 1, "padding_needed": lambda: [0, 0],
                                   "output_padding": lambda: [0, 0]},
        "layer_norm_grad": {"mean": lambda: a.f(2), "inv_variance": lambda: a.f(2)},
        "layer_norm_param_grad": {"gamma": lambda: a.f(3)},
        "flow.layers.conv1d": {"inputs": ncw, "filters": lambda: 3, "kernel_size": lambda: 1},
        "flow.layers.conv2d": {"inputs": nchw, "filters": lambda: 3, "kernel_size": lambda: 1},
        "flow.layers.conv3d": {"inputs": ncdhw, "filters": lambda: 3,
                               "kernel_size": lambda: 1},
        "upsample_2d": {"x": nchw},
        "fused_self_attention_query_mul_key_and_value": {"x": lambda: a.f(2, 1, 3)},
        "softmax_cross_entropy_with_logits": {"labels": lambda: a.f(2, 3)},
        "sigmoid_cross_entropy_with_logits": {"labels": lambda: a.f(2, 3)},
        "moments": {"axes": lambda: [0]}, "l2_normalize": {"axis": lambda: 1},
        "combined_margin_loss": {"x": lambda: a.f(2, 3)},
        "OFRecordRawDecoder": {"input_blob": a.records, "shape": lambda: [3]},
        "ofrecord_raw_decoder": {"input_blob": a.records, "shape": lambda: [3]},
        "OFRecordBytesDecoder": image_records, "ofrecord_bytes_decoder": image_records,
        "OFRecordImageDecoder": image_records, "ofrecord_image_decoder": image_records,
        "OFRecordImageDecoderRandomCrop": image_records,
        "ofrecord_image_decoder_random_crop": image_records,
        "ImageDecoderRandomCropResize": {"input_blob": a.encoded},
        "image_decoder_random_crop_resize": {"input_blob": a.encoded},
        "OneRecDecoder": {"input_blob": lambda: flow.data.onerec_reader(a.files["onerec"], 2),
                          "shape": lambda: [2, 3]},
        "onerec_decoder": {"input_blob": lambda: flow.data.onerec_reader(a.files["onerec"], 2),
                           "shape": lambda: [2, 3]},
        "decode_random": {"shape": lambda: [3]},
        "generate_random_batch_permutation_indices": {"value": lambda: a.f(2, 3)},
        "image_decode": {}, "decode": {},
    }


def _cases():
    out = []
    for space, module in NAMESPACES.items():
        for name in sorted(dir(module)):
            fn = getattr(module, name, None)
            if name.startswith("_") or name in NOT_OPS or name in INTERNAL or \
                    not inspect.isfunction(fn) or not fn.__module__.startswith(API_MODULES):
                continue
            params = inspect.signature(fn).parameters.values()
            required = [p.name for p in params if p.default is p.empty and
                        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            nones = [p.name for p in params if p.default is None]
            out.append(pytest.param(space, name, required, nones, id=f"{space}.{name}"))
    return out


def _special(space, name, a):
    forms = _per_function(a)
    return forms.get(f"{space}.{name}") or forms.get(name, {})


def _arguments(fn, space, name, required, a):
    """{parameter: value} of the documented form of `name`: the per-function form, then the
    common forms by parameter name, for every required parameter (and the per-function
    ones that OneFlow's documentation gives although they have defaults)."""
    special, common = _special(space, name, a), _by_name(a)
    args = {}
    for param in required:
        build = special.get(param) or common.get(param)
        if build is None:
            raise LookupError(param)
        args[param] = build()
    params = inspect.signature(fn).parameters   # flow.nn.conv2d and flow.layers.conv2d: one entry
    for param, build in special.items():
        if param in params:
            args.setdefault(param, build())
    return args


def _builds(space, name, required):
    """The first parameter of `name` with no argument builder, or None."""
    special, common = _special(space, name, Args(None, None, {})), \
        _by_name(Args(None, None, {}))
    return next((p for p in required if p not in special and p not in common), None)


def _call(fn, space, name, required, extra, files):
    calls = {}

    @flow.global_function()
    def job(floats: tp.Numpy.Placeholder(FLOATS.shape),
            ints: tp.Numpy.Placeholder(INTS.shape, dtype=flow.int32)) -> tp.Numpy:
        args = _arguments(fn, space, name, required, Args(floats, ints, files))
        args.update(extra)
        calls["result"] = fn(**args)
        return floats

    job(FLOATS, INTS)
    return calls.get("result")


@pytest.mark.parametrize("space,name,required,nones", _cases())
def test_documented_forms_raise_no_raw_python_error(space, name, required, nones, files):
    fn = getattr(NAMESPACES[space], name)
    missing = _builds(space, name, required)
    if missing is not None:
        pytest.skip(f"{space}.{name}: no argument form is built here for parameter "
                    f"{missing!r}")
    flow.clear_default_session()
    try:
        _call(fn, space, name, required, {}, files)
    except OnnxJobError as e:
        pytest.fail(f"{space}.{name}'s documented form failed: {type(e).__name__}: {e}")
    for param in nones:
        flow.clear_default_session()
        try:
            _call(fn, space, name, required, {param: None}, files)
        except (OnnxJobError, AssertionError):
            pass            # onnxjob's errors name the line; OneFlow asserts
        except Exception as e:  # noqa: BLE001  (anything else is raw)
            pytest.fail(f"{space}.{name}({param}=None) raised a raw {type(e).__name__}: {e}")


# -- a non-Blob where a Blob belongs ---------------------------------------------------------
# a program's own mistakes: a settings object or a NumPy array passed to an op, or an op
# called outside any job (a TensorFlow habit). OneFlow fails on them; onnxjob must say so
# with its own error naming the line, never a raw AttributeError from inside onnxjob

class _Settings:
    """A program's settings object."""


def _blob_params(args):
    """{parameter: (shape, numpy dtype)} of the arguments that are Blobs (or lists of
    Blobs: the first one's)."""
    out = {}
    for param, value in args.items():
        first = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(first, Blob) and not first.is_tensor_list:
            out[param] = (first.shape, first.np_dtype)
    return out


def _replaced(value, stand_in):
    if isinstance(value, (list, tuple)):
        return [stand_in] + list(value[1:])
    return stand_in


def _raw(fn, call):
    try:
        call()
    except (OnnxJobError, AssertionError):
        return None
    except Exception as e:  # noqa: BLE001  (anything else is raw)
        return f"{type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize("space,name,required,nones", _cases())
def test_a_non_blob_for_a_blob_gets_onnxjobs_error(space, name, required, nones, files):
    fn = getattr(NAMESPACES[space], name)
    if _builds(space, name, required) is not None:
        pytest.skip(f"{space}.{name}: no argument form is built here")
    flow.clear_default_session()
    found, raw = {}, []

    @flow.global_function()
    def job(floats: tp.Numpy.Placeholder(FLOATS.shape),
            ints: tp.Numpy.Placeholder(INTS.shape, dtype=flow.int32)) -> tp.Numpy:
        a = Args(floats, ints, files)
        found.update(_blob_params(_arguments(fn, space, name, required, a)))
        for param, (shape, dtype) in found.items():
            for stand_in in (_Settings(), np.zeros(shape, dtype), np.zeros(shape).tolist()):
                args = _arguments(fn, space, name, required, a)
                args[param] = _replaced(args[param], stand_in)
                problem = _raw(fn, lambda: fn(**args))
                if problem:
                    raw.append(f"{param}={type(stand_in).__name__}: {problem}")
        return floats

    _raw(job, lambda: job(FLOATS, INTS))
    assert not raw, f"{space}.{name} raised raw errors: {raw}"
    # outside any job, NumPy arrays for its Blobs
    outside = {p: np.zeros(shape, dtype) for p, (shape, dtype) in found.items()}
    if outside:
        flow.clear_default_session()
        problem = _raw(fn, lambda: _call_outside(fn, space, name, required, outside))
        assert not problem, f"{space}.{name} outside a job raised a raw {problem}"


def _call_outside(fn, space, name, required, arrays):
    """`fn` with its documented non-Blob arguments and `arrays` for its Blobs, no job
    (not called where a non-Blob argument can only be built in a job)."""
    params = inspect.signature(fn).parameters
    special, common = _special(space, name, Args(None, None, {})), \
        _by_name(Args(None, None, {}))
    args = dict(arrays)
    for param in list(required) + [p for p in special if p in params]:
        if param in args:
            continue
        build = special.get(param) or common.get(param)
        try:
            args[param] = build()
        except Exception:  # noqa: BLE001  (a reader or a buffer: made in a job only)
            return None
    return fn(**args)
