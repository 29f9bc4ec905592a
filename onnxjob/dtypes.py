"""OneFlow dtypes (`flow.float`, `flow.int32`, ...) and their NumPy / ONNX counterparts.

As in OneFlow the dtypes are classes, not instances: `flow.float is flow.float32`.
"""
import sys
import types

import numpy as np
import onnx_ir as ir


class _DTypeMeta(type):
    def __instancecheck__(cls, obj):
        # `isinstance(flow.float32, flow.dtype)` holds, as for OneFlow's dtype objects
        if cls is dtype and isinstance(obj, type) and issubclass(obj, dtype):
            return True
        return super().__instancecheck__(obj)


class dtype(metaclass=_DTypeMeta):
    """Base of every flow dtype class (`flow.dtype`: isinstance(flow.float, flow.dtype))."""

    np_dtype = None
    ir_dtype = None
    oneflow_enum = None  # name used in checkpoint `meta` files (kFloat, ...)


def _make(name, np_dtype, ir_dtype, enum_name, enum_value):
    cls = type(name, (dtype,), {
        "np_dtype": np.dtype(np_dtype) if np_dtype is not None else None,
        "ir_dtype": ir_dtype,
        "oneflow_enum": enum_name,
        "oneflow_enum_value": enum_value,
        "__repr__": lambda self: f"<flow.{name}>",
    })
    cls.__module__ = "onnxjob"
    return cls


char = _make("char", np.int8, ir.DataType.INT8, "kChar", 1)
float32 = _make("float32", np.float32, ir.DataType.FLOAT, "kFloat", 2)
float64 = _make("float64", np.float64, ir.DataType.DOUBLE, "kDouble", 3)
int8 = _make("int8", np.int8, ir.DataType.INT8, "kInt8", 4)
int32 = _make("int32", np.int32, ir.DataType.INT32, "kInt32", 5)
int64 = _make("int64", np.int64, ir.DataType.INT64, "kInt64", 6)
uint8 = _make("uint8", np.uint8, ir.DataType.UINT8, "kUInt8", 7)
record = _make("record", None, None, "kOFRecord", 8)
float16 = _make("float16", np.float16, ir.DataType.FLOAT16, "kFloat16", 9)
tensor_buffer = _make("tensor_buffer", None, None, "kTensorBuffer", 10)
# a mixed-precision compute type (function_config.mixed_precision_data_type); no NumPy type
bfloat16 = _make("bfloat16", None, ir.DataType.BFLOAT16, "kBFloat16", 11)
bool_ = _make("bool", np.bool_, ir.DataType.BOOL, None, None)
float = float32
double = float64

ALL = (char, float32, float64, int8, int32, int64, uint8, record, float16, tensor_buffer)
_BY_NP = {int8: int8}
_FROM_NP = {}
for _d in (float32, float64, float16, int8, int32, int64, uint8, bool_):
    _FROM_NP[_d.np_dtype] = _d
_FROM_ENUM = {d.oneflow_enum: d for d in ALL}


def from_numpy(np_dtype):
    """The flow dtype of a NumPy dtype (TypeError if there is none)."""
    try:
        return _FROM_NP[np.dtype(np_dtype)]
    except KeyError:
        raise TypeError(f"onnxjob has no dtype for NumPy dtype {np.dtype(np_dtype)}") from None


def from_oneflow_enum(name):
    """The flow dtype named by a checkpoint `meta` file (`kFloat`, ..., or its DataType
    number as a string, `2`)."""
    if name.isdigit():
        name = next((d.oneflow_enum for d in _FROM_ENUM.values()
                     if d.oneflow_enum_value == int(name)), name)
    if name not in _FROM_ENUM or _FROM_ENUM[name].np_dtype is None:
        raise ValueError(f"unsupported OneFlow data_type {name!r}")
    return _FROM_ENUM[name]


def to_numpy(flow_dtype):
    """NumPy dtype of a flow dtype class (or of anything NumPy understands)."""
    if isinstance(flow_dtype, type) and issubclass(flow_dtype, dtype):
        if flow_dtype.np_dtype is None:
            raise TypeError(f"{flow_dtype.__name__} has no NumPy counterpart")
        return flow_dtype.np_dtype
    return np.dtype(flow_dtype)


def is_floating(np_dtype):
    return np.issubdtype(np.dtype(np_dtype), np.floating)


def scalar_array(value, np_dtype):
    """`value` (a number or array) as an ndarray of `np_dtype` (None: its own), where an
    integer outside an integer dtype's range wraps as OneFlow's kernels cast the int64
    operand or value they are given (`static_cast<T>`: scalar_mul, scalar_add, constant;
    `ids * 2654435761` on int32 ids, `mask * 255` on int8) instead of NumPy 2's
    OverflowError."""
    if np_dtype is not None and np.dtype(np_dtype).kind in "iu":
        arr = np.asarray(value)
        if arr.dtype.kind in "iub":
            return arr.astype(np.int64).astype(np_dtype)
    return np.asarray(value, dtype=np_dtype)


# OneFlow's flow.dtypes(): the list its framework/dtype.py keeps (flow.float and
# flow.double appear under both of their names, as there)
_ONEFLOW_DTYPES = (char, float, float32, double, float64, float16, int8, int32, int64, uint8,
                   record, tensor_buffer, bfloat16)


class _DTypesModule(types.ModuleType):
    """This module, callable as OneFlow's `flow.dtypes()` (`flow.dtypes` is this module:
    `from onnxjob import dtypes` is onnxjob's own import of it)."""

    def __call__(self):
        return list(_ONEFLOW_DTYPES)


sys.modules[__name__].__class__ = _DTypesModule
