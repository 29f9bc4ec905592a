"""Running code written for OneFlow, unchanged: the `oneflow` import alias.

    python -m onnxjob run train.py --flag ...     # the script's `import oneflow...` gets onnxjob

or, from a library:

    from onnxjob.compat import install_oneflow_alias
    install_oneflow_alias()
    import oneflow.compatible.single_client as flow

    resnet_model = import_oneflow_module("path/to/cnns", "resnet_model")   # alias + sys.path
"""
from onnxjob.compat.oneflow_alias import (  # noqa: F401
    OneFlowAliasFinder, alias_in_child_processes, import_oneflow_module,
    install_for_oneflow_scripts, install_oneflow_alias, uninstall_oneflow_alias)
