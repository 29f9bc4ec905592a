"""`flow.unittest.env`: the test environment OneFlow's test helpers read from variables
(ONEFLOW_TEST_DEVICE_NUM, ONEFLOW_TEST_NODE_LIST, ...), as OneFlow's framework/unittest.py."""
import os


def eager_execution_enabled():
    """ONEFLOW_TEST_ENABLE_EAGER == "1"."""
    return os.getenv("ONEFLOW_TEST_ENABLE_EAGER") == "1"


def typing_check_enabled():
    """ONEFLOW_TEST_ENABLE_TYPING_CHECK == "1"."""
    return os.getenv("ONEFLOW_TEST_ENABLE_TYPING_CHECK") == "1"


def node_list():
    """The comma-separated ONEFLOW_TEST_NODE_LIST (asserted to be set)."""
    node_list_str = os.getenv("ONEFLOW_TEST_NODE_LIST")
    assert node_list_str
    return node_list_str.split(",")


def has_node_list():
    """Whether ONEFLOW_TEST_NODE_LIST is set."""
    return bool(os.getenv("ONEFLOW_TEST_NODE_LIST"))


def node_size():
    """How many nodes the node list names (1 without one)."""
    return len(node_list()) if has_node_list() else 1


def has_world_size():
    """Whether ONEFLOW_TEST_WORLD_SIZE is set (it must be a number)."""
    if os.getenv("ONEFLOW_TEST_WORLD_SIZE"):
        assert os.getenv("ONEFLOW_TEST_WORLD_SIZE").isdigit(), \
            "env var ONEFLOW_TEST_WORLD_SIZE must be num"
        return True
    return False


def world_size():
    """int(ONEFLOW_TEST_WORLD_SIZE)."""
    return int(os.getenv("ONEFLOW_TEST_WORLD_SIZE"))


def device_num():
    """int(ONEFLOW_TEST_DEVICE_NUM), 1 when unset."""
    device_num_str = os.getenv("ONEFLOW_TEST_DEVICE_NUM")
    return int(device_num_str) if device_num_str else 1
