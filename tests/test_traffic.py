"""The traffic model of a step (onnxjob/graph/traffic.py): bytes read and written per node,
grouped by what made the node."""
import numpy as np
import onnx_ir as ir

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.graph import traffic
from onnxjob.graph.compiler import compile_job
from onnxjob.runtime.session import default_session

F32 = ir.DataType.FLOAT


def _node(op_type, inputs, shape, dtype=F32):
    node = ir.node(op_type, inputs)
    node.outputs[0].type, node.outputs[0].shape = ir.TensorType(dtype), ir.Shape(shape)
    return node


def test_each_input_is_read_once_and_each_output_written_once():
    x = ir.Value(name="x", type=ir.TensorType(F32), shape=ir.Shape([10]))
    half = ir.Value(name="h", type=ir.TensorType(ir.DataType.FLOAT16), shape=ir.Shape([10]))
    assert traffic.node_traffic(_node("Mul", [x, x], [10])) == (40, 40)
    assert traffic.node_traffic(_node("Add", [x, half], [10])) == (60, 40)
    assert traffic.node_traffic(_node("Cast", [x], [10], ir.DataType.FLOAT16)) == (40, 20)
    shape = ir.Value(name="s", const_value=ir.tensor(np.array([2, 5], np.int64)))
    assert traffic.node_traffic(_node("Reshape", [x, shape], [2, 5])) == (0, 0)   # a view


def test_a_train_step_s_nodes_are_grouped_by_what_made_them():
    """A conv / batch norm / ReLU step: each group holds the nodes its phase and op made,
    and a ReLU's bytes are those of its activation."""
    @flow.global_function(type="train")
    def job(x: tp.Numpy.Placeholder((4, 3, 8, 8))) -> tp.Numpy:
        init = flow.random_normal_initializer(stddev=0.1)
        h = flow.layers.conv2d(x, 6, 3, padding="SAME", kernel_initializer=init, name="c")
        h = flow.nn.relu(flow.layers.batch_normalization(h, axis=1, name="bn"))
        loss = flow.math.reduce_mean(h)
        flow.optimizer.SGD(flow.optimizer.PiecewiseConstantScheduler([], [0.1]),
                           momentum=0.9).minimize(loss)
        return loss

    session = default_session()
    session.device = "cuda"     # the graph the CUDA EP would run, compiled without a GPU
    graph = compile_job(session.jobs["job"], session, 0).model.graph
    step = traffic.traffic(graph)
    groups = step.by_group()
    for expected in ("forward batch norm", "backward batch norm", "forward ReLU",
                     "backward ReLU", "optimizer", "convolutions and matmuls (compute)"):
        assert expected in groups, sorted(groups)
    (relu,) = [t for t in step.nodes if t.node.op_type == "Relu"]
    assert relu.group == "forward ReLU" and relu.read == relu.written == 4 * 6 * 8 * 8 * 4
    (momentum,) = [t for t in step.nodes if t.node.outputs[0].name == "c-weight-momentum/next"]
    assert momentum.group == "optimizer"
    assert sum(b for _, b in groups.values()) == sum(t.moved for t in step.nodes)
    assert step.memory_bound_bytes() + step.compute_bytes() == sum(t.moved for t in step.nodes)
    flow.clear_default_session()
