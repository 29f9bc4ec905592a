"""`import oneflow` resolving to onnxjob, for code written for OneFlow.

An import hook (a `sys.meta_path` finder) active only where it is installed: by
`python -m onnxjob run script.py` for that process, or by `install_oneflow_alias()`.
onnxjob never installs a top-level `oneflow` package, which would shadow a real OneFlow.

What resolves:

    oneflow, oneflow.compatible.single_client      the flow namespace (onnxjob)
    oneflow.typing, ...single_client.typing        onnxjob.typing
    oneflow.<namespace>, ...single_client.<ns>     onnxjob's namespace modules (math, nn,
                                                   distribute, unittest, unittest.env, ...)
    oneflow.core.operator.op_conf_pb2              OneFlow's enums model code reads (kNone, ...)
    oneflow.core.common.data_type_pb2
    oneflow.core.record.record_pb2                 OFRecord messages (compat/protos.py)
    oneflow.core.job.initializer_conf_pb2          InitializerConf messages
    oneflow.[compatible.single_client.]ops.transpose_util   OneFlow's permutation helpers
    oneflow._oneflow_internal                      importable (scripts import it at the top);
                                                   its C++ bindings: `distribute` is onnxjob's,
                                                   any other name raises naming it

Any other `oneflow.*` module raises ModuleNotFoundError naming it and the importing line.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

import onnxjob
from onnxjob import dtypes
from onnxjob.compat import protos
from onnxjob.errors import missing_api
from onnxjob.source_info import user_location

_SINGLE_CLIENT = "oneflow.compatible.single_client"


def _enum_module(name, doc, **values):
    module = types.ModuleType(name, doc)
    module.__dict__.update(values)
    return module


def _core_modules():
    """OneFlow's protobuf enum modules that model code imports, as plain constants."""
    op_conf = _enum_module("oneflow.core.operator.op_conf_pb2",
                           "OneFlow's op_conf.proto enums (ActivationType).",
                           kNone=0, kTanH=1, kSigmoid=2, kRelu=3)
    data_type = _enum_module("oneflow.core.common.data_type_pb2",
                             "OneFlow's data_type.proto DataType values.",
                             kInvalidDataType=0,
                             **{d.oneflow_enum: d.oneflow_enum_value for d in dtypes.ALL})
    return {op_conf.__name__: op_conf, data_type.__name__: data_type,
            "oneflow.core.record.record_pb2": protos.record_pb2,
            "oneflow.core.job.initializer_conf_pb2": protos.initializer_conf_pb2}


def _internal_module():
    """`oneflow._oneflow_internal`, OneFlow's pybind11 extension. Many scripts and tests
    import it without using it; the one submodule job code reaches (`distribute`) is
    onnxjob's, every other name raises UnsupportedAPIError naming it and the user's line."""
    module = types.ModuleType("oneflow._oneflow_internal", _internal_module.__doc__)
    module.distribute = onnxjob.distribute
    module.__getattr__ = missing_api(
        "oneflow._oneflow_internal",
        reasons={}, default="it is OneFlow's C++ extension (sessions, kernels, eager "
        "tensors), which onnxjob replaces with ONNX graphs run by onnxruntime")
    return module


class _RootAlias(types.ModuleType):
    """`oneflow` itself: onnxjob's names, plus the `compatible` and `core` packages."""

    def __getattr__(self, name):
        return getattr(onnxjob, name)


class OneFlowAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `oneflow` and `oneflow.*` modules and hands out onnxjob's."""

    def __init__(self):
        self._created = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "oneflow" and not fullname.startswith("oneflow."):
            return None
        module = self._resolve(fullname)
        spec = importlib.util.spec_from_loader(fullname, self,
                                               is_package=hasattr(module, "__path__"))
        self._created[fullname] = module
        return spec

    def create_module(self, spec):
        return self._created.pop(spec.name)

    def exec_module(self, module):
        pass  # the modules handed out are already initialised

    def _resolve(self, fullname):
        if fullname == "oneflow":
            root = _RootAlias("oneflow", onnxjob.__doc__)
            root.__path__ = []
            return root
        if fullname in ("oneflow.compatible", "oneflow.core", "oneflow.core.operator",
                        "oneflow.core.common", "oneflow.core.record", "oneflow.core.job"):
            package = types.ModuleType(fullname)
            package.__path__ = []
            return package
        if fullname == _SINGLE_CLIENT:
            return onnxjob
        if fullname == "oneflow._oneflow_internal":
            return _internal_module()
        if fullname in ("oneflow.ops", _SINGLE_CLIENT + ".ops"):
            # OneFlow's package of op wrappers: only its helper module is importable
            package = types.ModuleType(fullname)
            package.__path__ = []
            return package
        if fullname in ("oneflow.ops.transpose_util", _SINGLE_CLIENT + ".ops.transpose_util"):
            return importlib.import_module("onnxjob.compat.transpose_util")
        core = _core_modules()
        if fullname in core:
            module = core[fullname]
            return module() if callable(module) else module
        for prefix in (_SINGLE_CLIENT + ".", "oneflow."):
            if fullname.startswith(prefix):
                namespace = onnxjob
                for part in fullname[len(prefix):].split("."):
                    namespace = getattr(namespace, part, None)
                if isinstance(namespace, types.ModuleType):
                    return namespace
                break
        raise ModuleNotFoundError(
            f"{user_location()}: `import {fullname}`: onnxjob provides no module of that name "
            "(it implements OneFlow's single-device job-function API: oneflow, "
            f"{_SINGLE_CLIENT}, their typing, math, nn, layers, data, random, ... and "
            "oneflow.core.operator.op_conf_pb2)", name=fullname)


def install_oneflow_alias():
    """Make `import oneflow` (and `oneflow.compatible.single_client`) give onnxjob in this
    process. Returns the finder; `uninstall_oneflow_alias()` removes it again."""
    for finder in sys.meta_path:
        if isinstance(finder, OneFlowAliasFinder):
            return finder
    real = sys.modules.get("oneflow")
    if real is not None and not isinstance(real, _RootAlias):
        where = getattr(real, "__file__", real)
        raise ImportError(f"a real OneFlow is already imported ({where}); the onnxjob alias "
                          "would shadow it")
    finder = OneFlowAliasFinder()
    sys.meta_path.insert(0, finder)
    return finder


def uninstall_oneflow_alias():
    """Remove the hook and forget every `oneflow*` module it handed out."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, OneFlowAliasFinder)]
    for name in [n for n in sys.modules if n == "oneflow" or n.startswith("oneflow.")]:
        del sys.modules[name]


def import_oneflow_module(directory, module):
    """Import `module` from `directory` (code written for OneFlow, e.g. OneFlow-Benchmark's
    model files) with the alias installed and `directory` on sys.path, as a script there
    would see it."""
    install_oneflow_alias()
    directory = os.path.abspath(directory)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return importlib.import_module(module)
