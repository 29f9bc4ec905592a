"""FoldReshapes: remove the reshapes the gradient builder leaves behind.

Rewrite cases:
  1. Reshape(x, shape) where shape == x.shape      -> x
  2. Reshape(Reshape(x, s1), s2), inner single use  -> Reshape(x, s2)
  3. Reshape(ReduceSum(x, axes, keepdims=1), s) where s is the reduced shape with the
     kept unit axes dropped                        -> ReduceSum(x, axes, keepdims=0)
Shapes must be static (they always are for onnxjob's fixed-shape placeholders).
"""
import onnx_ir as ir
from onnx_ir.passes import InPlacePass, PassResult

from ._util import attr, const_array, has_single_use, replace_value, static_shape


class FoldReshapes(InPlacePass):
    def call(self, model):
        modified = False
        graph = model.graph
        for node in list(graph):
            if node.op_type != "Reshape" or node.graph is None:
                continue
            x, shape_value = node.inputs[0], node.inputs[1]
            target = const_array(shape_value)
            out_shape = static_shape(node.outputs[0])
            if target is None or out_shape is None:
                continue
            if static_shape(x) == out_shape:  # case 1
                if replace_value(node.outputs[0], x):
                    graph.remove(node, safe=True)
                    modified = True
                continue
            producer = x.producer()
            if producer is None or not has_single_use(x):
                continue
            if producer.op_type == "Reshape":  # case 2
                node.replace_input_with(0, producer.inputs[0])
                graph.remove(producer, safe=True)
                modified = True
            elif producer.op_type == "ReduceSum" and attr(producer, "keepdims", 1) == 1:  # case 3
                axes = const_array(producer.inputs[1]) if len(producer.inputs) > 1 else None
                in_shape = static_shape(producer.inputs[0])
                if axes is None or in_shape is None:
                    continue
                axes = {int(a) % len(in_shape) for a in axes}
                dropped = tuple(d for i, d in enumerate(in_shape) if i not in axes)
                if dropped != out_shape:
                    continue
                producer.attributes["keepdims"] = ir.AttrInt64("keepdims", 0)
                producer.outputs[0].shape = ir.Shape(out_shape)
                if replace_value(node.outputs[0], producer.outputs[0]):
                    graph.remove(node, safe=True)
                    modified = True
        return PassResult(model, modified)
