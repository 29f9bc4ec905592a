"""The table of OneFlow op types that `flow.user_op_builder` can build.

Each entry reads as OneFlow's C++ registration of the op type does (REGISTER_USER_OP in
oneflow/user/ops/*.cpp, v0.5.0): its input and output arguments, its attributes with
their types and defaults, and the function that builds it from onnxjob's ops:

    register("leaky_relu", "x -> y | alpha: float",
             lambda x, a: nn.leaky_relu(x.one("x"), a["alpha"]), flow="flow.nn.leaky_relu")

Signature: `inputs -> outputs | attributes`. An argument is `name` (exactly one blob),
`name?` (optional: none or one), `name*N` (N or more) or `name[N]` (exactly N). An
attribute is `name: type` or `name: type = default` (a Python literal; a dtype by its
flow name). Types are OneFlow's attribute types: int32, int64,
float, double, bool, string, shape, dtype, list_int32, list_int64, list_float,
list_dtype, list_shape, list_string; the builder's Attr() converts and checks a value by
the type of its op type's attribute, as OneFlow's does.

An attribute the builder does not set takes its default; without one, its type's zero
value (0, False, "", an empty list or shape), as in OneFlow 0.5, whose `Attr<T>(name)`
registers `T()` as the default. A dtype attribute without a default is the exception:
OneFlow's zero DataType is kInvalidDataType, which no op takes, so the builder must set it.

The function gets the inputs (an `Args`: name -> list of Blobs, [] for an optional input
not given) and the attributes (name -> converted value, defaults filled in) and returns
the outputs: a Blob (the first output), a tuple (the outputs in signature order; a list
for a variadic one), a dict name -> Blob or list, or None (no outputs).
"""
import ast
import difflib
import numbers

import numpy as np

from onnxjob import dtypes
from onnxjob.errors import TraceError
from onnxjob.graph.tracer import Blob

_TABLE = {}
REQUIRED = object()   # the "default" of an attribute the builder must set (dtypes)

_INT_RANGES = {"int32": (-2 ** 31, 2 ** 31 - 1), "int64": (-2 ** 63, 2 ** 63 - 1)}
# the default of an attribute registered without one: T() (lists: [], filled in below)
_ZEROS = {"int32": 0, "int64": 0, "bool": False, "float": 0.0, "double": 0.0, "string": "",
          "shape": ()}


class Arg:
    """One input or output argument: its name and how many blobs it takes (low..high,
    high None = unbounded)."""

    __slots__ = ("name", "low", "high")

    def __init__(self, text):
        text = text.strip()
        if text.endswith("?"):
            self.name, self.low, self.high = text[:-1], 0, 1
        elif "*" in text:
            self.name, n = text.split("*")
            self.low, self.high = int(n), None
        elif text.endswith("]"):
            self.name, n = text[:-1].split("[")
            self.low = self.high = int(n)
        else:
            self.name, self.low, self.high = text, 1, 1

    @property
    def optional(self):
        return self.low == 0

    def describe(self):
        if self.high == self.low:
            return f"{self.name!r} ({self.low} blob{'s' if self.low != 1 else ''})"
        if self.high is None:
            return f"{self.name!r} ({self.low} or more blobs)"
        return f"{self.name!r} (optional)"

    def accepts(self, n):
        return self.low <= n and (self.high is None or n <= self.high)


class Args(dict):
    """An op's inputs: argument name -> list of Blobs ([] for an optional one not given)."""

    def one(self, name):
        """The single Blob of argument `name`."""
        return self[name][0]

    def opt(self, name):
        """The Blob of optional argument `name`, or None."""
        return self[name][0] if self[name] else None


class OpType:
    """One op type of the table: its arguments, attributes and implementation."""

    def __init__(self, name, signature, impl, flow=None, section=None):
        self.name = name
        self.impl = impl
        self.flow = flow          # the flow function doing the same, for hints
        self.section = section    # the family module that registered it
        args, _, attr_text = signature.partition("|")
        ins, _, outs = args.partition("->")
        self.inputs = tuple(Arg(t) for t in ins.split(",") if t.strip())
        self.outputs = tuple(Arg(t) for t in outs.split(",") if t.strip())
        self.attrs = _parse_attrs(attr_text)

    # -- checks the builder makes -------------------------------------------------------
    def _where(self):
        return f"flow.user_op_builder: op type {self.name!r}"

    def check_input(self, name, blobs):
        """Input `name` set to the list `blobs`: a known argument, a count it takes."""
        known = {a.name: a for a in self.inputs}
        if name not in known:
            expected = ", ".join(a.describe() for a in self.inputs) or "no inputs"
            raise TraceError(f"{self._where()} has no input {name!r}; it takes {expected}")
        if not known[name].accepts(len(blobs)):
            raise TraceError(f"{self._where()}: input {known[name].describe()} got "
                             f"{len(blobs)} blobs")
        for b in blobs:
            if not isinstance(b, Blob):
                raise TraceError(f"{self._where()}: input {name!r} takes Blobs of a job, got "
                                 f"{type(b).__name__}")

    def check_inputs(self, given):
        """`given`: name -> list of Blobs, all the inputs the builder set."""
        for name, blobs in given.items():
            self.check_input(name, blobs)
        missing = [a.describe() for a in self.inputs if not a.optional and a.name not in given]
        if missing:
            expected = ", ".join(a.describe() for a in self.inputs)
            raise TraceError(f"{self._where()} needs input {', '.join(missing)} (it takes "
                             f"{expected}); set it with .Input(name, [blob, ...])")

    def check_output(self, name, num):
        """Output `name` declared with `num` blobs: a known argument, a count it makes."""
        known = {a.name: a for a in self.outputs}
        if name not in known:
            expected = ", ".join(a.describe() for a in self.outputs) or "no outputs"
            raise TraceError(f"{self._where()} has no output {name!r}; it makes {expected}")
        if not known[name].accepts(num):
            raise TraceError(f"{self._where()}: output {known[name].describe()} was "
                             f"declared with {num} blobs")

    def check_outputs(self, declared):
        """`declared`: name -> number of blobs, all the outputs the builder declared."""
        for name, num in declared.items():
            self.check_output(name, num)
        missing = [a.describe() for a in self.outputs
                   if not a.optional and a.name not in declared]
        if missing:
            expected = ", ".join(a.describe() for a in self.outputs)
            raise TraceError(f"{self._where()} makes output {', '.join(missing)}, not "
                             f"declared: add .Output(name) for it (it makes {expected})")

    def convert_attr(self, name, value):
        """`value` as attribute `name` of this op type, checked against its type."""
        if name not in self.attrs:
            known = ", ".join(f"{n}: {t}" for n, (t, _) in self.attrs.items()) or "none"
            raise TraceError(f"{self._where()} has no attribute {name!r} (its attributes: "
                             f"{known})")
        kind = self.attrs[name][0]
        try:
            return convert(kind, value)
        except (TypeError, ValueError) as e:
            raise TraceError(f"{self._where()}: attribute {name!r} is {kind}, got "
                             f"{value!r}: {e}") from None

    def complete_attrs(self, given):
        """All attributes: those `given` (already converted) and the defaults (lists
        copied, so an op cannot change a default)."""
        out = {}
        for name, (kind, default) in self.attrs.items():
            if name in given:
                out[name] = given[name]
            elif default is REQUIRED:
                raise TraceError(f"{self._where()} needs attribute {name!r} ({kind}); set it "
                                 f"with .Attr({name!r}, value)")
            else:
                out[name] = list(default) if isinstance(default, list) else default
        return out

    # -- building -------------------------------------------------------------------------
    def __call__(self, inputs, attrs):
        """Build the op: inputs name -> list of Blobs, attrs complete; returns its outputs,
        name -> list of Blobs."""
        args = Args({a.name: list(inputs.get(a.name, ())) for a in self.inputs})
        result = self.impl(args, attrs)
        if result is None:
            return {}
        if isinstance(result, Blob):
            result = (result,)
        if not isinstance(result, dict):
            result = {a.name: r for a, r in zip(self.outputs, result) if r is not None}
        return {k: (list(v) if isinstance(v, (list, tuple)) else [v]) for k, v in result.items()}


def _parse_attrs(text):
    attrs = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, rest = item.partition(":")
        kind, _, default = rest.partition("=")
        kind = kind.strip()
        if kind not in _CONVERTERS:
            raise ValueError(f"unknown attribute type {kind!r} in {item!r}")
        value = REQUIRED if kind == "dtype" else _ZEROS.get(kind, [])
        if default.strip():
            default = default.strip()
            value = (getattr(dtypes, default) if kind == "dtype" else
                     convert(kind, ast.literal_eval(default)))
        attrs[name.strip()] = (kind, value)
    return attrs


# -- attribute types (OneFlow's UserOpConfBuilder.Attr, ops/user_op_builder.py) -------------

def _int(kind):
    def f(v):
        if not isinstance(v, numbers.Integral):
            raise TypeError(f"expected an int, got {type(v).__name__}")
        low, high = _INT_RANGES[kind]
        if not low <= int(v) <= high:
            raise ValueError(f"out of the {kind} range")
        return int(v)
    return f


def _bool(v):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"expected a bool, got {type(v).__name__}")
    return bool(v)


def _real(single):
    def f(v):
        if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)):
            raise TypeError(f"expected a float or an int, got {type(v).__name__}")
        # a float attribute is stored as float32, as OneFlow stores it
        return float(np.float32(v)) if single else float(v)
    return f


def _string(v):
    if not isinstance(v, str):
        raise TypeError(f"expected a str, got {type(v).__name__}")
    return v


def _dtype(v):
    if not (isinstance(v, type) and issubclass(v, dtypes.dtype)):
        raise TypeError("expected a flow dtype (flow.float32, flow.int64, ...)")
    return v


def _sequence(item):
    def f(v):
        if not isinstance(v, (list, tuple)):
            raise TypeError(f"expected a list or tuple, got {type(v).__name__}")
        return [item(x) for x in v]
    return f


def _shape(v):
    return tuple(_sequence(_int("int64"))(v))


_CONVERTERS = {
    "int32": _int("int32"), "int64": _int("int64"), "bool": _bool,
    "float": _real(True), "double": _real(False), "string": _string, "shape": _shape,
    "dtype": _dtype, "list_int32": _sequence(_int("int32")),
    "list_int64": _sequence(_int("int64")), "list_float": _sequence(_real(True)),
    "list_dtype": _sequence(_dtype), "list_shape": _sequence(_shape),
    "list_string": _sequence(_string),
}


def convert(kind, value):
    """`value` as an attribute of type `kind` (TypeError / ValueError if it is not one)."""
    return _CONVERTERS[kind](value)


# -- the table ------------------------------------------------------------------------------

def register(name, signature, impl, flow=None, section=None):
    """Add op type `name` (see the module docstring)."""
    if name in _TABLE:
        raise ValueError(f"op type {name!r} is registered twice")
    _TABLE[name] = OpType(name, signature, impl, flow=flow, section=section)
    return _TABLE[name]


def registrar(section):
    """`register` for the op types of one family module."""
    def reg(name, signature, impl, flow=None):
        return register(name, signature, impl, flow=flow, section=section)
    return reg


# op types a program defines (flow.experimental.custom_op_module): a later definition of
# a name replaces the earlier one; the table's own names are never replaced
_CUSTOM = {}


def register_custom(name, signature, impl):
    """Add op type `name` that a program defines (frontend/custom_op_module.py)."""
    if name in _TABLE:
        raise ValueError(f"op type {name!r} is one of OneFlow's own; a custom op cannot "
                         "replace it")
    _CUSTOM[name] = OpType(name, signature, impl, section="custom")
    return _CUSTOM[name]


def lookup_custom(name):
    """The custom OpType `name`, or None."""
    return _CUSTOM.get(name)


def lookup(name):
    """The OpType registered as `name` (the table's, then a custom one), or None."""
    return _TABLE.get(name) or _CUSTOM.get(name)


def op_type_names(section=None):
    """The op type names of the table (of one family module `section`), sorted."""
    return sorted(n for n, t in _TABLE.items() if section is None or t.section == section)


def sections():
    """{family module: number of op types}."""
    out = {}
    for t in _TABLE.values():
        out[t.section] = out.get(t.section, 0) + 1
    return out


# OneFlow op types onnxjob has as flow functions only: data ops that run on the host
# (runtime/pipeline.py), ops whose outputs onnxjob does not make (ctc_loss's alpha, ...)
FLOW_ONLY = {
    "OFRecordReader": "flow.data.ofrecord_reader",
    "ofrecord_raw_decoder": "flow.data.OFRecordRawDecoder",
    "ofrecord_bytes_decoder": "flow.data.OFRecordBytesDecoder",
    "ofrecord_image_decoder": "flow.data.OFRecordImageDecoder",
    "ofrecord_image_decoder_random_crop": "flow.data.OFRecordImageDecoderRandomCrop",
    "ofrecord_image_classification_reader": "flow.data.ofrecord_image_classification_reader",
    "COCOReader": "flow.data.coco_reader",
    "OneRecReader": "flow.data.onerec_reader",
    "megatron_gpt_mmap_data_loader": "flow.data.megatron_gpt_mmap_data_loader",
    "coin_flip": "flow.random.CoinFlip",
    "image_decode": "flow.image.decode",
    "image_flip": "flow.image.flip",
    "image_normalize": "flow.image.normalize",
    "image_random_crop": "flow.image.random_crop",
    "image_resize_to_fixed": "flow.image.Resize",
    "image_resize_keep_aspect_ratio": "flow.image.Resize",
    "image_target_resize": "flow.image.target_resize",
    "image_batch_align": "flow.image.batch_align",
    "crop_mirror_normalize_from_uint8": "flow.image.CropMirrorNormalize",
    "crop_mirror_normalize_from_tensorbuffer": "flow.image.CropMirrorNormalize",
    "gen_tensor_buffer": "flow.gen_tensor_buffer",
    "tensor_buffer_to_tensor": "flow.tensor_buffer_to_tensor",
    "tensor_to_tensor_buffer": "flow.tensor_to_tensor_buffer",
    "tensor_buffer_to_list_of_tensors": "flow.tensor_buffer_to_list_of_tensors",
    "object_bbox_flip": "flow.object_bbox_flip",
    "object_bbox_scale": "flow.object_bbox_scale",
    "object_segmentation_polygon_flip": "flow.object_segmentation_polygon_flip",
    "object_segmentation_polygon_scale": "flow.object_segmentation_polygon_scale",
    "object_segmentation_polygon_to_mask": "flow.object_segmentation_polygon_to_mask",
    "ctc_loss": "flow.ctc_loss",
    "combined_margin_loss": "flow.combined_margin_loss",
    "distributed_partial_fc_sample": "flow.distributed_partial_fc_sample",
    "moving_average_min_max_observer": "flow.quantization.moving_average_min_max_observer",
    "ssp_variable_proxy": "flow.experimental.ssp_variable_proxy",
    "create_summary_writer": "flow.summary.create_summary_writer",
    "summary_write_scalar": "flow.summary.scalar",
}


def near_matches(name):
    """Op types of the table whose names are close to `name`, with their flow functions."""
    names = difflib.get_close_matches(name, list(_TABLE), n=3, cutoff=0.6)
    lower = {n.lower(): n for n in _TABLE}
    if name.lower() in lower and lower[name.lower()] not in names:
        names.insert(0, lower[name.lower()])
    return [(n, _TABLE[n].flow) for n in names]
