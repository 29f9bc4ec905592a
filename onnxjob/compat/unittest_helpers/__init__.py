"""`flow.unittest`: OneFlow's test helpers (framework/unittest.py) for one device.

`TestCase` starts every test with an empty default session; `skip_unless_<n>n<d>d()`
skip a test unless the environment (ONEFLOW_TEST_NODE_LIST, ONEFLOW_TEST_DEVICE_NUM) has
n nodes of d devices, so by default only the `1n1d` tests run; `num_nodes_required` and
`register_test_cases` as in OneFlow. OneFlow's multi-node / multi-process launch is not
provided: a TestCase under such an environment raises NotImplementedError.
"""
import importlib.util
import os
import unittest

from onnxjob.compat.unittest_helpers import env
from onnxjob.errors import missing_api, unsupported_form
from onnxjob.compat.unittest_helpers.env import device_num, node_size
from onnxjob.frontend.helpers import enable_eager_execution, enable_typing_check
from onnxjob.runtime.session import clear_default_session


class _ClearDefaultSession:
    def setUp(self):
        clear_default_session()
        enable_eager_execution(False)


class TestCase(unittest.TestCase):
    """A unittest.TestCase whose setUp clears the default session (OneFlow's TestCase)."""

    def setUp(self):
        if env.has_node_list() or (device_num() > 1 and
                                   os.getenv("ONEFLOW_TEST_MULTI_PROCESS") == "1"):
            raise unsupported_form(
                "flow.unittest.TestCase in a multi-node / multi-process test environment "
                "(ONEFLOW_TEST_NODE_LIST, ONEFLOW_TEST_MULTI_PROCESS)",
                "its tests run on one machine and device")
        clear_default_session()
        enable_eager_execution(env.eager_execution_enabled())
        enable_typing_check(env.typing_check_enabled())


def skip_unless(n, d):
    """A decorator: the test runs only with `n` nodes of `d` devices each."""
    if node_size() == n and device_num() == d:
        return lambda func: func
    return unittest.skip(f"only runs when node_size is {n} and device_num is {d}")


def skip_unless_1n1d():
    """Run only on 1 node with 1 device (the default environment)."""
    return skip_unless(1, 1)


def skip_unless_1n2d():
    """Run only on 1 node with 2 devices."""
    return skip_unless(1, 2)


def skip_unless_1n4d():
    """Run only on 1 node with 4 devices."""
    return skip_unless(1, 4)


def skip_unless_2n1d():
    """Run only on 2 nodes with 1 device each."""
    return skip_unless(2, 1)


def skip_unless_2n2d():
    """Run only on 2 nodes with 2 devices each."""
    return skip_unless(2, 2)


def skip_unless_2n4d():
    """Run only on 2 nodes with 4 devices each."""
    return skip_unless(2, 4)


def num_nodes_required(num_nodes):
    """Mark a test function with the number of nodes it needs (register_test_cases reads it)."""
    def decorator(f):
        f.__oneflow_test_case_num_nodes_required__ = num_nodes
        return f
    return decorator


def _num_nodes(func):
    return getattr(func, "__oneflow_test_case_num_nodes_required__", 1)


def register_test_cases(scope, directory, filter_by_num_nodes, base_class=unittest.TestCase,
                        test_case_mixin=_ClearDefaultSession):
    """For each `test*.py` in `directory`, put into `scope` a TestCase class (named after
    the file) whose methods are the file's `test*` functions that `filter_by_num_nodes`
    accepts (given each one's required node count)."""
    for f in sorted(os.listdir(directory)):
        path = os.path.join(directory, f)
        if not (os.path.isfile(path) and f.endswith(".py") and f.startswith("test")):
            continue
        class_name = f[:-3]
        spec = importlib.util.spec_from_file_location(class_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        methods = {name: getattr(module, name) for name in dir(module)
                   if name.startswith("test") and callable(getattr(module, name))
                   and filter_by_num_nodes(_num_nodes(getattr(module, name)))}
        scope[class_name] = type(class_name, (test_case_mixin, base_class), methods)


__getattr__ = missing_api("flow.unittest")
