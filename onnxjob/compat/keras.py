"""`flow.keras` of OneFlow 0.1.0 (removed in 0.1.x): `activations.relu`, `sigmoid`, `tanh`,
`gelu` and `maths.add`, other names of the flow.math ops, as OneFlow 0.1.0 defined them."""
from onnxjob.errors import unsupported_form
from onnxjob.frontend.namespaces import ApiNamespace
from onnxjob.ops import math


def relu(x, alpha=0.0, max_value=None, threshold=0.0, name=None):
    """flow.math.relu(x); OneFlow 0.1.0 asserts that the Keras-style options keep their
    defaults (no leaky slope, no cap, threshold 0)."""
    if alpha != 0.0 or max_value is not None or threshold != 0.0:
        raise unsupported_form(
            f"flow.keras.activations.relu(alpha={alpha!r}, max_value={max_value!r}, "
            f"threshold={threshold!r})", "OneFlow 0.1.0 takes only the defaults (alpha=0.0, "
            "max_value=None, threshold=0.0); flow.nn.leaky_relu and flow.clip_by_value "
            "give the others")
    return math.relu(x, name)


def sigmoid(x, name=None):
    """flow.math.sigmoid(x)."""
    return math.sigmoid(x, name)


def add(x, y, name=None):
    """x + y elementwise, of one shape and type (flow.math.add)."""
    return math.add(x, y, name)


keras = ApiNamespace(
    "flow.keras",
    activations=ApiNamespace("flow.keras.activations", relu=relu, sigmoid=sigmoid,
                             tanh=math.tanh, gelu=math.gelu),
    maths=ApiNamespace("flow.keras.maths", add=add))
