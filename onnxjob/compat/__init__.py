"""Running code written for OneFlow, unchanged: the `oneflow` import alias.

    python -m onnxjob run train.py --flag ...     # the script's `import oneflow...` gets onnxjob

or, from a library:

    from onnxjob.compat import install_oneflow_alias
    install_oneflow_alias()
    import oneflow.compatible.single_client as flow
"""
from onnxjob.compat.oneflow_alias import (OneFlowAliasFinder, install_oneflow_alias,  # noqa: F401
                                          uninstall_oneflow_alias)
