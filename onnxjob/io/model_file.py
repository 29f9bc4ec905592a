"""Writing an exported ModelProto to disk, also past protobuf's 2 GiB limit.

A protobuf message cannot be serialized past 2 GiB, so neither `onnx.save` nor the
in-memory `onnx.checker` works on a model whose weights are that large. Such a model (and
any model when `external_data=True`, OneFlow's exporter's option) is written with its
weights in one file beside it, `<file name>.data` (ONNX external data, which onnxruntime
reads), and the checker then reads the written file instead of the message.
"""
import os
import tempfile
import warnings

import onnx

from onnxjob.graph.compiler import check_model
from onnxjob.source_info import user_frame

# onnx.checker.MAXIMUM_PROTOBUF: a message this size or larger cannot be serialized
PROTOBUF_LIMIT = 2 ** 31


def too_large(proto):
    """Whether `proto` is past the limit. Counts the tensor payloads, which is what makes a
    model large, without serializing it."""
    return sum(_payload_bytes(t) for t in _tensors(proto.graph)) >= PROTOBUF_LIMIT


_ITEM_BYTES = {"float_data": 4, "int32_data": 4, "int64_data": 8, "double_data": 8,
               "uint64_data": 8}


def _payload_bytes(tensor):
    return (len(tensor.raw_data) + sum(len(s) for s in tensor.string_data)
            + sum(size * len(getattr(tensor, field)) for field, size in _ITEM_BYTES.items()))


def _tensors(graph):
    """The initializers and node attribute tensors of `graph` and of its subgraphs."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def save_checked(proto, path, external_data=False, check=True, api="flow.export"):
    """Write `proto` to `path` (checked with onnx.checker and full shape inference when
    `check`); the weights go to `<path>.data` when `external_data` is asked for or the
    model is past protobuf's limit (with a warning at the user's line: the file alone
    does not run without it). `proto` is left holding references to that file."""
    large = too_large(proto)
    if not (external_data or large):
        if check:
            check_model(proto)
        onnx.save_model(proto, path)
        return
    if large and not external_data:
        warnings.warn_explicit(
            f"{api}: the model's weights are past protobuf's 2 GiB limit; they are written "
            f"beside it in {os.path.basename(path)}.data (ONNX external data), which must "
            "stay next to the .onnx file", UserWarning, *(user_frame() or ("<unknown>", 0)))
    # every weight in one file beside the model, however small
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(path) + ".data", size_threshold=0)
    if check:
        onnx.checker.check_model(path, full_check=True)


def check_in_memory(proto):
    """onnx.checker with full shape inference on `proto`, which may be past protobuf's
    limit: such a model is checked as a file with external data written to a scratch
    folder, from a copy (saving moves the weights out of the message)."""
    if not too_large(proto):
        check_model(proto)
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    with tempfile.TemporaryDirectory() as folder:
        save_checked(copy, os.path.join(folder, "model.onnx"), external_data=True)
