"""`import oneflow` resolving to onnxjob, for code written for OneFlow.

An import hook (a `sys.meta_path` finder) active only where it is installed: by
`python -m onnxjob run script.py` for that process, or by `install_oneflow_alias()`.
onnxjob never installs a top-level `oneflow` package, which would shadow a real OneFlow.

What resolves:

    oneflow, oneflow.compatible.single_client      the flow namespace (onnxjob)
    oneflow.typing, ...single_client.typing        onnxjob.typing
    oneflow.<namespace>, ...single_client.<ns>     onnxjob's namespace modules (math, nn,
                                                   distribute, unittest, unittest.env, ...)
    oneflow.core.operator.op_conf_pb2              OneFlow's enums model code reads (kNone, ...),
                                                   and the InitializerConf messages that
                                                   OneFlow <= 0.2 kept there
    oneflow.core.common.data_type_pb2
    oneflow.core.record.record_pb2                 OFRecord messages (compat/protos.py)
    oneflow.core.job.initializer_conf_pb2          InitializerConf messages
    oneflow.core.framework.variable_meta_info_pb2  VariableMetaInfo (a checkpoint's `meta`)
    oneflow.core.register.logical_blob_id_pb2      LogicalBlobId messages
    oneflow.core.serving.saved_model_pb2           importable (tests import it at the top); its
                                                   messages describe OneFlow's saved-model
                                                   format, so using one raises naming the line
    oneflow.[compatible.single_client.]ops.transpose_util   OneFlow's permutation helpers
      (and <= 0.4's oneflow.python.ops.transpose_util)
    oneflow._oneflow_internal, oneflow_api         OneFlow's C++ extension (0.5, 0.4): importable
                                                   (scripts import it at the top); the names job
                                                   code reaches (compat/framework_modules.py),
                                                   any other name raises naming it
    oneflow.python.framework.<m>,                  OneFlow's internal modules that programs
    oneflow.compatible.single_client.framework.<m>  copy code from: session_context, id_util,
                                                   remote_blob, distribute, c_api_util,
                                                   local_blob
    oneflow.python.oneflow_export                  (<= 0.4) its tagging decorators
    oneflow.python_gen.compatibility               (0.2/0.3) with_cuda

    oneflow_onnx.oneflow2onnx.util, .flow2onnx     OneFlow's standalone ONNX converter, in its
                                                   job-function form, on onnxjob's export
                                                   (compat/oneflow_onnx_converter.py)
    oneflow_onnx.<other>                           from a real oneflow_onnx package on
                                                   sys.path (pip's oneflow_convert: its
                                                   x2oneflow writes job code on flow.* ops)

Any other `oneflow.*` or `oneflow_onnx.*` module raises ModuleNotFoundError naming it and
the importing line.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

import onnxjob
from onnxjob import dtypes
from onnxjob.compat import framework_modules, protos
from onnxjob.errors import missing_api
from onnxjob.source_info import user_location

_SINGLE_CLIENT = "oneflow.compatible.single_client"
_EXTENSION_04 = "oneflow_api"  # OneFlow <= 0.4's top-level name of its C++ extension
_CONVERTER = "oneflow_onnx"    # OneFlow's standalone ONNX converter (oneflow_convert)
_CONVERTER_MODULES = (_CONVERTER + ".oneflow2onnx.util", _CONVERTER + ".oneflow2onnx.flow2onnx")
ONEFLOW_API_VERSION = "0.5.0"
_FRAMEWORK_PACKAGES = ("oneflow.python.framework", _SINGLE_CLIENT + ".framework")


def _handled(fullname):
    """Whether the alias hands out `fullname` (or refuses it, naming it)."""
    return (fullname in ("oneflow", _EXTENSION_04, _CONVERTER) or
            fullname.startswith(("oneflow.", _CONVERTER + ".")))


def _enum_module(name, doc, **values):
    module = types.ModuleType(name, doc)
    module.__dict__.update(values)
    module.__getattr__ = missing_api(name)   # another name: said with the user's line
    return module


def _public_names(module):
    return {name: value for name, value in vars(module).items() if not name.startswith("_")}


def _core_modules():
    """OneFlow's protobuf enum modules that model code imports, as plain constants."""
    # OneFlow <= 0.2 defined InitializerConf and its parts in op_conf.proto (0.3 moved
    # them to job/initializer_conf.proto, same package and fields)
    op_conf = _enum_module("oneflow.core.operator.op_conf_pb2",
                           "OneFlow's op_conf.proto enums (ActivationType) and "
                           "InitializerConf messages.",
                           kNone=0, kTanH=1, kSigmoid=2, kRelu=3,
                           **_public_names(protos.initializer_conf_pb2()))
    data_type = _enum_module("oneflow.core.common.data_type_pb2",
                             "OneFlow's data_type.proto DataType values.",
                             kInvalidDataType=0,
                             **{d.oneflow_enum: d.oneflow_enum_value for d in dtypes.ALL})
    # OneFlow's saved_model.prototxt holds compiled op lists that onnxjob cannot run;
    # its own saved models are read by flow.serving.InferenceSession.load_saved_model
    saved_model = _enum_module("oneflow.core.serving.saved_model_pb2",
                               "OneFlow's saved_model.proto (its messages are not provided).")
    saved_model.__getattr__ = missing_api(
        saved_model.__name__,
        default="it describes OneFlow's saved-model format (compiled op lists), which "
                "onnxjob does not read: load onnxjob's saved models with "
                "flow.serving.InferenceSession().load_saved_model(path)")
    return {op_conf.__name__: op_conf, data_type.__name__: data_type,
            saved_model.__name__: saved_model,
            "oneflow.core.record.record_pb2": protos.record_pb2,
            "oneflow.core.job.initializer_conf_pb2": protos.initializer_conf_pb2,
            "oneflow.core.framework.variable_meta_info_pb2": protos.variable_meta_info_pb2,
            "oneflow.core.register.logical_blob_id_pb2": protos.logical_blob_id_pb2}


class _RootAlias(types.ModuleType):
    """`oneflow` itself: onnxjob's names, plus the `compatible` and `core` packages."""

    def __getattr__(self, name):
        if name == "_oneflow_internal":     # (OneFlow's __init__ imports its extension)
            return importlib.import_module("oneflow._oneflow_internal")
        return getattr(onnxjob, name)


def _real_converter_folders(subpackage=""):
    """The folders of a real `oneflow_onnx` package (or of its `subpackage`) on sys.path,
    which the modules onnxjob does not stand in for load from: the package pip installs
    from OneFlow's oneflow_convert is plain Python on flow.* ops but for the exporter."""
    folders = []
    for entry in sys.path:
        folder = os.path.join(entry or os.getcwd(), _CONVERTER, subpackage)
        if os.path.abspath(entry or os.getcwd()) != IMPORT_ROOT and \
                os.path.isfile(os.path.join(folder, "__init__.py")):
            folders.append(folder)
    return folders


class OneFlowAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `oneflow` and `oneflow.*` modules and hands out onnxjob's."""

    def __init__(self):
        self._created = {}

    def find_spec(self, fullname, path=None, target=None):
        if not _handled(fullname):
            return None
        if fullname.startswith(_CONVERTER + ".") and \
                fullname not in _CONVERTER_MODULES + (_CONVERTER + ".oneflow2onnx",) and \
                _real_converter_folders():
            return None     # (from the real package: the stand-in's __path__ holds it)
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
            # the OneFlow release whose job-function API onnxjob reproduces: a program's
            # version test (`flow.__version__ < "0.3.0"` in OneFlow's documentation
            # samples) takes the branch of that API, not of onnxjob's own version number
            root.__version__ = ONEFLOW_API_VERSION
            return root
        if fullname in ("oneflow.compatible", "oneflow.core", "oneflow.core.operator",
                        "oneflow.core.common", "oneflow.core.record", "oneflow.core.job",
                        "oneflow.core.serving", "oneflow.core.framework",
                        "oneflow.core.register", "oneflow.python_gen"):
            package = types.ModuleType(fullname)
            package.__path__ = []
            return package
        if fullname == _SINGLE_CLIENT:
            return onnxjob
        if fullname in (_CONVERTER, _CONVERTER + ".oneflow2onnx"):
            package = types.ModuleType(fullname)
            package.__path__ = _real_converter_folders(fullname.partition(".")[2])
            return package
        if fullname in _CONVERTER_MODULES:
            return importlib.import_module("onnxjob.compat.oneflow_onnx_converter")
        if fullname in ("oneflow._oneflow_internal", _EXTENSION_04):
            return framework_modules.extension_module(fullname)
        if fullname == "oneflow.python.oneflow_export":
            return framework_modules.oneflow_export_module(fullname)
        if fullname == "oneflow.python_gen.compatibility":    # (OneFlow 0.2/0.3's build)
            from onnxjob.frontend.sysconfig import with_cuda
            return _enum_module(fullname, "Whether this build runs CUDA.", with_cuda=with_cuda())
        if fullname in _FRAMEWORK_PACKAGES or fullname == "oneflow.python":
            package = types.ModuleType(fullname)
            package.__path__ = []
            return package
        package, _, name = fullname.rpartition(".")
        if package in _FRAMEWORK_PACKAGES:
            module = framework_modules.framework_module(package, name)
            if module is not None:
                return module
        if fullname in ("oneflow.ops", _SINGLE_CLIENT + ".ops", "oneflow.python.ops"):
            # OneFlow's package of op wrappers: only its helper module is importable
            package = types.ModuleType(fullname)
            package.__path__ = []
            return package
        if fullname in ("oneflow.ops.transpose_util", _SINGLE_CLIENT + ".ops.transpose_util",
                        "oneflow.python.ops.transpose_util"):    # (<= 0.4's path)
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
            "oneflow.core.operator.op_conf_pb2; of OneFlow's converter, "
            f"{' and '.join(_CONVERTER_MODULES)})", name=fullname)


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


# A folder of stand-in packages (`oneflow`, `oneflow_api`, `oneflow_onnx`) that install the
# hook when imported: what the child processes of a script run by `python -m onnxjob run`
# find
IMPORT_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "import_root")


def alias_in_child_processes():
    """Make `import oneflow` resolve to onnxjob in the Python processes started from this
    one: multiprocessing's spawn and forkserver workers, which take sys.path but not the
    hook (IMPORT_ROOT goes after sys.path's first entry, the script's folder), and Python
    programs run as subprocesses (IMPORT_ROOT first on PYTHONPATH), as a program that
    starts `python train.py` with a real OneFlow installed would see it."""
    if IMPORT_ROOT not in sys.path:
        sys.path.insert(min(1, len(sys.path)), IMPORT_ROOT)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if IMPORT_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([IMPORT_ROOT] + [p for p in paths if p])


def replace_with_alias(name):
    """Called by IMPORT_ROOT's stand-in module `name` while it is being imported: installs
    the hook and the names NumPy and Python removed (compat/removed_names.py) and puts the
    alias's module in sys.modules in its place (the import statement then returns the
    alias)."""
    del sys.modules[name]
    install_for_oneflow_scripts()   # (as the runner gave them to the parent)
    sys.modules[name] = importlib.import_module(name)


def install_for_oneflow_scripts():
    """What a script written for OneFlow expects of this process: the `oneflow` alias and
    the names NumPy and Python removed since OneFlow's releases (compat/removed_names.py).
    The runner, its child processes and OneFlow's op-test harness call it."""
    from onnxjob.compat.removed_names import restore_removed_names
    install_oneflow_alias()
    restore_removed_names()


def uninstall_oneflow_alias():
    """Remove the hook and forget every `oneflow*` module it handed out."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, OneFlowAliasFinder)]
    for name in [n for n in sys.modules if _handled(n)]:
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
