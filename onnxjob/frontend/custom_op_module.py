"""`flow.experimental.custom_op_module`: OneFlow's custom ops defined in a folder.

OneFlow 0.3-0.5 build a custom op from a folder `<path>/<name>/` holding
`<name>_py_api.py` (the Python functions that build the op with flow.user_op_builder),
`<name>_cpp_def.cpp` (REGISTER_USER_OP: its inputs, outputs and attributes) and its
kernels: `<name>_py_kernel.py` (functions `forward(args)` and `backward(args)`, NumPy in
and out, the kernels of the op types `<name>_forward` and `<name>_backward`) or C++ ones:

    op = flow.experimental.custom_op_module("user_sigmoid", module_path)
    op.py_api().cpp_def().py_kernel().build_load()
    y = op.api.user_sigmoid_forward(x)          # inside a job

onnxjob reads the C++ definition's arguments and attributes (it compiles nothing) and runs
Python kernels inside onnxruntime (ops/python_kernels.py); a C++ or CUDA kernel cannot run
and is refused naming the line. `build_load()` adds the op types to flow.user_op_builder's
table for this process. What OneFlow's infer function computes (output shapes and dtypes)
is taken from the Python kernel. Its gradient registration is read where it has OneFlow's
documented form (REGISTER_USER_OP_GRAD(fw).SetBackwardOpConfGenFn: one backward op of
this module, its inputs bound to the forward op's inputs, outputs and output gradients,
its outputs to the forward inputs' gradients); an op without one cannot be differentiated
through (the train job raises naming the line).
"""
import importlib.util
import os
import re

import numpy as np

from onnxjob.errors import TraceError, UnsupportedAPIError
from onnxjob.graph.tracer import as_blob
from onnxjob.ops import python_kernels
from onnxjob.ops.user_ops import spec
from onnxjob.source_info import user_location

_CPP_TYPES = {"int32_t": "int32", "int64_t": "int64", "float": "float", "double": "double",
              "bool": "bool", "std::string": "string", "Shape": "shape", "DataType": "dtype",
              "std::vector<int32_t>": "list_int32", "std::vector<int64_t>": "list_int64",
              "std::vector<float>": "list_float", "std::vector<std::string>": "list_string"}
_ARG = re.compile(r"\.(Input|OptionalInput|InputWithMinimum|Output|OptionalOutput|"
                  r"OutputWithMinimum)\(\s*\"(\w+)\"\s*(?:,\s*(\d+)\s*)?\)")
_ATTR = re.compile(r"\.Attr<\s*([\w:<>\s]+?)\s*>\(\s*\"(\w+)\"")
_BIND = re.compile(r"\.InputBind\(\s*\"(\w+)\"\s*,\s*ctx->FwOp\(\)\.(input|output|output_grad)"
                   r"\(\s*\"(\w+)\"\s*,\s*0\s*\)\s*\)")
_GRAD_OF = re.compile(r"InputGradBind\(\s*user_op::OpArg\(\s*\"(\w+)\"\s*,\s*0\s*\)")
_GRAD_IS = re.compile(r"GetOp\([^)]*\)\.output\(\s*\"(\w+)\"\s*,\s*0\s*\)")


class CustomOpModule:
    """One custom op folder (OneFlow's CustomOpModule): call `py_api()`, `cpp_def()`,
    `py_kernel()` in any order, then `build_load()`; `api` is the loaded `<name>_py_api`."""

    def __init__(self, op_module_name, module_path=""):
        self.op_module_name_ = op_module_name
        self.api = None
        self.folder = os.path.join(os.path.normpath(module_path or "."), op_module_name)
        if not os.path.isdir(self.folder):
            raise AssertionError(f"{user_location()}: flow.experimental.custom_op_module: no "
                                 f"folder {self.folder!r} (module_path/op_module_name)")
        self.definitions = {}    # op type -> signature (from the C++ definition)
        self.gradients = {}      # forward op type -> its GradientSpec (the C++ file's)
        self.kernel = None       # the loaded <name>_py_kernel module

    def _source(self, suffix):
        path = os.path.join(self.folder, f"{self.op_module_name_}_{suffix}")
        assert os.path.exists(path), f"{user_location()}: {path} does not exist"
        return path

    def _load(self, suffix):
        spec_ = importlib.util.spec_from_file_location(self.op_module_name_,
                                                       self._source(suffix))
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
        return module

    def py_api(self):
        """Load `<name>_py_api.py` as `self.api`."""
        self.api = self._load("py_api.py")
        return self

    def cpp_def(self):
        """Read the op types `<name>_cpp_def.cpp` registers (REGISTER_USER_OP)."""
        with open(self._source("cpp_def.cpp")) as f:
            text = f.read()
        self.definitions.update(read_cpp_definitions(text))
        self.gradients.update(read_cpp_gradients(text))
        return self

    def py_kernel(self):
        """Load `<name>_py_kernel.py`: its forward/backward are the kernels of
        `<name>_forward` / `<name>_backward`."""
        self.kernel = self._load("py_kernel.py")
        return self

    def cpp_kernel(self):
        raise UnsupportedAPIError(
            f"{user_location()}: flow.experimental.custom_op_module({self.op_module_name_!r})"
            ".cpp_kernel(): onnxjob runs no C++ kernels (it runs ONNX graphs in onnxruntime); "
            "a custom op with a Python kernel (py_kernel()) runs")

    def gpu_kernel(self):
        raise NotImplementedError   # as OneFlow's

    def build_load(self):
        """Add the defined op types to flow.user_op_builder's table (those without a Python
        kernel raise when built: their kernel is C++)."""
        if not self.definitions:
            raise UnsupportedAPIError(
                f"{user_location()}: flow.experimental.custom_op_module"
                f"({self.op_module_name_!r}).build_load(): no op type defined; call "
                "cpp_def() first (its REGISTER_USER_OP gives the op's arguments)")
        for op_type_name, signature in self.definitions.items():
            spec.register_custom(op_type_name, signature,
                                 self._implementation(op_type_name))
        return self

    def _implementation(self, op_type_name):
        kernel = None
        if self.kernel is not None:
            for suffix in ("forward", "backward"):
                if op_type_name == f"{self.op_module_name_}_{suffix}":
                    kernel = getattr(self.kernel, suffix, None)

        def build(args, attrs):
            if kernel is None:
                raise UnsupportedAPIError(
                    f"{user_location()}: op type {op_type_name!r} has no Python kernel "
                    f"(py_kernel() of {self.op_module_name_!r} gives one to "
                    f"{self.op_module_name_}_forward and _backward); onnxjob runs no C++ "
                    "kernels")
            inputs = [b for blobs in args.values() for b in blobs]
            outputs = spec.lookup_custom(op_type_name).outputs
            if any(o.high != 1 for o in outputs):
                raise TraceError(f"{user_location()}: op type {op_type_name!r}: a Python "
                                 "kernel's outputs must be one blob each")
            grad_spec = self.gradients.get(op_type_name)
            gradient = None if grad_spec is None else grad_spec.rule(
                [name for name, blobs in args.items() for _ in blobs],
                [o.name for o in outputs])
            made = python_kernels.emit(op_type_name, kernel, inputs, len(outputs), gradient)
            return {o.name: b for o, b in zip(outputs, made)}
        return build


class GradientSpec:
    """A forward op type's gradient as its C++ definition registers it: the backward op
    type, its inputs (`binds`: (backward input, "input" | "output" | "output_grad",
    forward argument)) and which backward output is which forward input's gradient."""

    def __init__(self, backward, binds, grads):
        self.backward, self.binds, self.grads = backward, binds, grads

    def rule(self, input_names, output_names):
        """The gradient rule (ops/python_kernels.emit's `gradient`) of a forward op with
        these input and output argument names (one blob each)."""
        def gradient(ins, outs, output_grads):
            found = {"input": dict(zip(input_names, ins)),
                     "output": dict(zip(output_names, outs)),
                     "output_grad": {n: g if g is not None else as_blob(
                         np.zeros(y.shape, y.np_dtype), like=y)
                         for n, y, g in zip(output_names, outs, output_grads)}}
            bound = {name: [found[kind][arg]] for name, kind, arg in self.binds}
            backward = spec.lookup(self.backward)
            if backward is None:
                raise UnsupportedAPIError(
                    f"{user_location()}: the gradient of a custom op is op type "
                    f"{self.backward!r}, which build_load() did not define")
            made = backward(bound, backward.complete_attrs({}))
            return [made[self.grads[n]][0] if n in self.grads else None for n in input_names]
        return gradient


def read_cpp_definitions(text):
    """{op type: signature} of the REGISTER_USER_OP registrations in C++ `text`: their
    inputs, outputs and attributes (the table's signature form, ops/user_ops/spec.py)."""
    out = {}
    for op_type_name, body in _registrations("REGISTER_USER_OP", text):
        ins, outs = [], []
        for kind, name, n in _ARG.findall(body):
            arg = (f"{name}?" if kind.startswith("Optional")
                   else f"{name}*{n}" if kind.endswith("WithMinimum") else name)
            (ins if "Input" in kind else outs).append(arg)
        attrs = [f"{name}: {_CPP_TYPES[kind.strip()]}" for kind, name in _ATTR.findall(body)
                 if kind.strip() in _CPP_TYPES]
        out[op_type_name] = f"{', '.join(ins)} -> {', '.join(outs)} | {', '.join(attrs)}"
    return out


def read_cpp_gradients(text):
    """{forward op type: GradientSpec} of the REGISTER_USER_OP_GRAD registrations in C++
    `text` that have OneFlow's documented form (one backward op, inputs bound to the
    forward op's arguments); others are left out (no gradient)."""
    out = {}
    for op_type_name, body in _registrations("REGISTER_USER_OP_GRAD", text):
        backward = re.findall(r"OpTypeName\(\s*\"(\w+)\"\s*\)", body)
        binds = _BIND.findall(body)
        grad_of, grad_is = _GRAD_OF.findall(body), _GRAD_IS.findall(body)
        if len(backward) == 1 and binds and grad_of and len(grad_of) == len(grad_is):
            out[op_type_name] = GradientSpec(backward[0], binds, dict(zip(grad_of, grad_is)))
    return out


def _registrations(macro, text):
    """(op type, the text up to the next REGISTER_ macro) of each `macro("op type")` in
    C++ `text`."""
    for m in re.finditer(macro + r"\(\s*\"(\w+)\"\s*\)", text):
        end = text.find("REGISTER_", m.end())
        yield m.group(1), text[m.end():end if end >= 0 else len(text)]


def custom_op_module(op_module_name, module_path=""):
    """OneFlow's flow.experimental.custom_op_module (see the module docstring)."""
    return CustomOpModule(op_module_name, module_path)
