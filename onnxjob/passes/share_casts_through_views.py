"""ShareCastsThroughViews: a view of a value, cast, reads the value's cast instead.

Rewrite case (mixed precision: a per-channel reduction reads a float32 cast of a reshaped
half activation, passes/split_channel_reductions.py, while other nodes read a float32
cast of the activation itself):
    Cast(View(v), to=T)   where Cast(v, to=T) exists  ->  View(Cast(v, to=T))
View is Reshape, Squeeze, Unsqueeze or Flatten (with its other inputs and attributes).
The activation is then cast once, not twice: ResNet50's AMP step at batch 64 cast each
batch norm's input and each incoming gradient twice (graph/traffic.py: 7.7 GiB a step).
Runs in the mixed-precision stage, after AutoMixedPrecision made the casts.
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import attr, replace_value

VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def _cast_of(value, to):
    """An existing Cast of `value` to `to`, or None."""
    for use in value.uses():
        node = use.node
        if node.op_type == "Cast" and node.domain == "" and attr(node, "to") == to and \
                node.graph is not None:
            return node
    return None


class ShareCastsThroughViews(InPlacePass):
    def call(self, model):
        graph = model.graph
        modified = False
        for cast in list(graph):
            if cast.op_type != "Cast" or cast.graph is None or cast.domain != "":
                continue
            view = cast.inputs[0].producer()
            if view is None or view.op_type not in VIEWS or view.domain != "":
                continue
            shared = _cast_of(view.inputs[0], attr(cast, "to"))
            if shared is None:
                continue
            out = cast.outputs[0]
            moved = ir.Node("", view.op_type, [shared.outputs[0]] + list(view.inputs[1:]),
                            attributes=list(view.attributes.values()),
                            name=f"{cast.name}/view", metadata_props=dict(cast.metadata_props))
            moved.outputs[0].name = f"{out.name}/view"
            moved.outputs[0].type, moved.outputs[0].shape = out.type, out.shape
            graph.insert_before(cast, moved)
            if replace_value(out, moved.outputs[0]):
                graph.remove(cast, safe=True)
                if not view.outputs[0].uses() and not view.outputs[0].is_graph_output():
                    graph.remove(view, safe=True)
                modified = True
            else:
                graph.remove(moved, safe=True)
        if modified:    # a cast that comes later than the view it now feeds
            graph.sort()
        return PassResult(model, modified)
