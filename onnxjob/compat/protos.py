"""OneFlow's generated protobuf modules that programs import, built without OneFlow:

    oneflow.core.record.record_pb2           OFRecord, Feature, BytesList, FloatList,
                                             DoubleList, Int32List, Int64List (the classes
                                             onnxjob's OFRecord reader and writer use)
    oneflow.core.job.initializer_conf_pb2    InitializerConf and its *InitializerConf parts,
                                             the VarianceNorm / RandomDistribution values
                                             (flow.get_variable(initializer=...) takes one)

The messages are built with protobuf's descriptor API from the .proto definitions in
OneFlow's oneflow/core/{record/record,job/initializer_conf}.proto (same package, field
names, numbers and defaults), so serialized bytes are OneFlow's.
"""
import functools
import types

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.internal import enum_type_wrapper

from onnxjob.errors import missing_api
from onnxjob.io.ofrecord import record_message_class

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"float": _F.TYPE_FLOAT, "double": _F.TYPE_DOUBLE, "int32": _F.TYPE_INT32,
            "int64": _F.TYPE_INT64, "string": _F.TYPE_STRING, "bool": _F.TYPE_BOOL}
_ENUMS = {"VarianceNorm": ["kFanIn", "kFanOut", "kAverage"],
          "RandomDistribution": ["kRandomUniform", "kRandomNormal", "kTruncatedNormal"]}
# message -> [(field, number, type, default or None, required)]
_INITIALIZER_MESSAGES = {
    "ConstantInitializerConf": [("value", 1, "float", "0", False)],
    "ConstantIntInitializerConf": [("value", 1, "int64", "0", False)],
    "RandomUniformInitializerConf": [("min", 1, "float", "0", False),
                                     ("max", 2, "float", "1", False)],
    "RandomUniformIntInitializerConf": [("min", 1, "int32", "0", False),
                                        ("max", 2, "int32", "1", False)],
    "RandomNormalInitializerConf": [("mean", 1, "float", "0", False),
                                    ("std", 2, "float", "1", False)],
    "TruncatedNormalInitializerConf": [("mean", 1, "float", "0.0", False),
                                       ("std", 2, "float", "0.05", False)],
    "XavierInitializerConf": [("variance_norm", 1, "VarianceNorm", None, True),
                              ("data_format", 2, "string", None, True)],
    "MsraInitializerConf": [("variance_norm", 1, "VarianceNorm", None, True),
                            ("data_format", 2, "string", None, True)],
    "RangeInitializerConf": [("start", 1, "double", "0", False),
                             ("stride", 2, "double", "1", False),
                             ("axis", 3, "int64", "-1", False)],
    "IntRangeInitializerConf": [("start", 1, "int64", "0", False),
                                ("stride", 2, "int64", "1", False),
                                ("axis", 3, "int64", "-1", False)],
    "VarianceScalingInitializerConf": [("scale", 1, "float", None, True),
                                       ("variance_norm", 2, "VarianceNorm", None, True),
                                       ("distribution", 3, "RandomDistribution", None, True),
                                       ("data_format", 4, "string", None, True)],
    "EmptyInitializerConf": [],
}
_INITIALIZER_ONEOF = ["constant_conf", "constant_int_conf", "random_uniform_conf",
                      "random_uniform_int_conf", "random_normal_conf",
                      "truncated_normal_conf", "xavier_conf", "msra_conf", "range_conf",
                      "int_range_conf", "variance_scaling_conf", "empty_conf"]


def _initializer_file():
    proto = descriptor_pb2.FileDescriptorProto(name="oneflow/core/job/initializer_conf.proto",
                                               package="oneflow", syntax="proto2")
    for enum, values in _ENUMS.items():
        e = proto.enum_type.add(name=enum)
        for number, value in enumerate(values):
            e.value.add(name=value, number=number)
    for message, fields in _INITIALIZER_MESSAGES.items():
        m = proto.message_type.add(name=message)
        for name, number, kind, default, required in fields:
            f = m.field.add(name=name, number=number,
                            label=_F.LABEL_REQUIRED if required else _F.LABEL_OPTIONAL)
            if kind in _ENUMS:
                f.type, f.type_name = _F.TYPE_ENUM, f".oneflow.{kind}"
            else:
                f.type = _SCALARS[kind]
            if default is not None:
                f.default_value = default
    conf = proto.message_type.add(name="InitializerConf")
    conf.oneof_decl.add(name="type")
    messages = list(_INITIALIZER_MESSAGES)
    for number, (name, message) in enumerate(zip(_INITIALIZER_ONEOF, messages), start=1):
        conf.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL, type=_F.TYPE_MESSAGE,
                       type_name=f".oneflow.{message}", oneof_index=0)
    snapshot = proto.message_type.add(name="InitializeWithSnapshotConf")
    snapshot.field.add(name="path", number=1, label=_F.LABEL_REQUIRED, type=_F.TYPE_STRING)
    snapshot.field.add(name="key", number=2, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
    return proto


@functools.lru_cache(maxsize=None)
def initializer_conf_pb2():
    """The `oneflow.core.job.initializer_conf_pb2` module."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_initializer_file())
    module = types.ModuleType("oneflow.core.job.initializer_conf_pb2",
                              "OneFlow's initializer_conf.proto messages.")
    for name in list(_INITIALIZER_MESSAGES) + ["InitializerConf", "InitializeWithSnapshotConf"]:
        descriptor = pool.FindMessageTypeByName(f"oneflow.{name}")
        setattr(module, name, message_factory.GetMessageClass(descriptor))
    for enum, values in _ENUMS.items():
        wrapper = enum_type_wrapper.EnumTypeWrapper(pool.FindEnumTypeByName(f"oneflow.{enum}"))
        setattr(module, enum, wrapper)
        for number, value in enumerate(values):
            setattr(module, value, number)
    module.__getattr__ = missing_api(module.__name__)
    return module


@functools.lru_cache(maxsize=None)
def record_pb2():
    """The `oneflow.core.record.record_pb2` module."""
    module = types.ModuleType("oneflow.core.record.record_pb2",
                              "OneFlow's record.proto messages (OFRecord files).")
    for name in ("OFRecord", "Feature", "BytesList", "FloatList", "DoubleList", "Int32List",
                 "Int64List"):
        setattr(module, name, record_message_class(name))
    module.__getattr__ = missing_api(module.__name__)
    return module


# OneFlow's data_type.proto, shape.proto, logical_blob_id.proto and
# framework/variable_meta_info.proto (v0.3-v0.5): checkpoint tools write and read the
# `meta` files with VariableMetaInfo; model code builds LogicalBlobIds
_DATA_TYPES = ["kInvalidDataType", "kChar", "kFloat", "kDouble", "kInt8", "kInt32", "kInt64",
               "kUInt8", "kOFRecord", "kFloat16", "kTensorBuffer", "kBFloat16", "kMaxDataType"]


def _field(message, name, number, label, kind):
    """Add a field: `kind` a scalar type name, or ".oneflow.<Message or Enum>"."""
    f = message.field.add(name=name, number=number, label=label)
    if kind in _SCALARS:
        f.type = _SCALARS[kind]
    else:
        f.type_name = kind
        f.type = _F.TYPE_ENUM if kind == ".oneflow.DataType" else _F.TYPE_MESSAGE


@functools.lru_cache(maxsize=None)
def _framework_pool():
    pool = descriptor_pool.DescriptorPool()
    data_type = descriptor_pb2.FileDescriptorProto(
        name="oneflow/core/common/data_type.proto", package="oneflow", syntax="proto2")
    enum = data_type.enum_type.add(name="DataType")
    for number, name in enumerate(_DATA_TYPES):
        enum.value.add(name=name, number=number)
    shape = descriptor_pb2.FileDescriptorProto(
        name="oneflow/core/common/shape.proto", package="oneflow", syntax="proto2")
    _field(shape.message_type.add(name="ShapeProto"), "dim", 1, _F.LABEL_REPEATED, "int64")
    meta = descriptor_pb2.FileDescriptorProto(
        name="oneflow/core/framework/variable_meta_info.proto", package="oneflow",
        syntax="proto2", dependency=[shape.name, data_type.name])
    info = meta.message_type.add(name="VariableMetaInfo")
    _field(info, "shape", 2, _F.LABEL_REQUIRED, ".oneflow.ShapeProto")
    _field(info, "data_type", 3, _F.LABEL_REQUIRED, ".oneflow.DataType")
    lbi = descriptor_pb2.FileDescriptorProto(
        name="oneflow/core/register/logical_blob_id.proto", package="oneflow", syntax="proto2")
    blob_id = lbi.message_type.add(name="LogicalBlobId")
    _field(blob_id, "op_name", 1, _F.LABEL_OPTIONAL, "string")
    _field(blob_id, "blob_name", 2, _F.LABEL_OPTIONAL, "string")
    pair = lbi.message_type.add(name="LogicalBlobIdPair")
    _field(pair, "first", 1, _F.LABEL_REQUIRED, ".oneflow.LogicalBlobId")
    _field(pair, "second", 2, _F.LABEL_REQUIRED, ".oneflow.LogicalBlobId")
    _field(lbi.message_type.add(name="LogicalBlobIdPairs"), "pair", 1, _F.LABEL_REPEATED,
           ".oneflow.LogicalBlobIdPair")
    for file in (data_type, shape, meta, lbi):
        pool.Add(file)
    return pool


def _messages_module(name, doc, messages, enum_values=False):
    pool = _framework_pool()
    module = types.ModuleType(name, doc)
    for message in messages:
        descriptor = pool.FindMessageTypeByName(f"oneflow.{message}")
        setattr(module, message, message_factory.GetMessageClass(descriptor))
    if enum_values:
        module.DataType = enum_type_wrapper.EnumTypeWrapper(
            pool.FindEnumTypeByName("oneflow.DataType"))
        module.__dict__.update({n: number for number, n in enumerate(_DATA_TYPES)})
    module.__getattr__ = missing_api(module.__name__)
    return module


@functools.lru_cache(maxsize=None)
def variable_meta_info_pb2():
    """The `oneflow.core.framework.variable_meta_info_pb2` module (a checkpoint's `meta`)."""
    return _messages_module("oneflow.core.framework.variable_meta_info_pb2",
                            "OneFlow's variable_meta_info.proto: a checkpoint entry's meta.",
                            ["VariableMetaInfo", "ShapeProto"], enum_values=True)


@functools.lru_cache(maxsize=None)
def logical_blob_id_pb2():
    """The `oneflow.core.register.logical_blob_id_pb2` module."""
    return _messages_module("oneflow.core.register.logical_blob_id_pb2",
                            "OneFlow's logical_blob_id.proto messages.",
                            ["LogicalBlobId", "LogicalBlobIdPair", "LogicalBlobIdPairs"])
