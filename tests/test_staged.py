"""runtime/staged.py: a graph cut at its collectives runs as stages, each stage's nodes
that its collectives do not wait for running while they travel, and nodes moved into the
session that reads them. Collectives here are a world of one rank's (the gather adds a
leading axis of 1, the reductions return their input), so every schedule must give the
plain graph's values bit for bit."""
import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxjob.graph.primitives.collectives import DOMAIN
from onnxjob.runtime import staged
from onnxjob.runtime.value_paths import HostPath

F = TensorProto.FLOAT


def _graph():
    """A forward/backward-like chain: stage 0 computes the statistic h's collective waits
    for, and w_t (a transpose of a weight, read only after the collective) and g (a
    'weight gradient', a graph output nothing else reads); stage 1 normalizes with the
    gathered statistic and reshapes."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("ReduceMean", ["h"], ["stat"], axes=[0], keepdims=0),
        helper.make_node("AllGather", ["stat"], ["gathered"], domain=DOMAIN, ranks=1),
        helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
        helper.make_node("Reshape", ["h", "flat"], ["h_flat"]),
        helper.make_node("MatMul", ["h", "w"], ["g"]),
        helper.make_node("ReduceMean", ["gathered"], ["mean"], axes=[0], keepdims=0),
        helper.make_node("Sub", ["h", "mean"], ["centered"]),
        helper.make_node("MatMul", ["centered", "w_t"], ["back"]),
        helper.make_node("AllReduceSum", ["back"], ["summed"], domain=DOMAIN),
        helper.make_node("Reshape", ["summed", "flat"], ["out"]),
        helper.make_node("Add", ["h_flat", "out"], ["total"]),
    ]
    inputs = [helper.make_tensor_value_info("x", F, [4, 3]),
              helper.make_tensor_value_info("w", F, [3, 3])]
    outputs = [helper.make_tensor_value_info(n, F, s)
               for n, s in (("total", [12]), ("g", [4, 3]), ("out", [12]))]
    values = [helper.make_tensor_value_info(n, F, s) for n, s in (
        ("h", [4, 3]), ("stat", [3]), ("gathered", [1, 3]), ("w_t", [3, 3]),
        ("h_flat", [12]), ("mean", [3]), ("centered", [4, 3]), ("back", [4, 3]),
        ("summed", [4, 3]))]
    flat = numpy_helper.from_array(np.array([-1], np.int64), "flat")
    graph = helper.make_graph(nodes, "g", inputs, outputs, [flat], value_info=values)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(DOMAIN, 1)],
                             ir_version=8)


def _local(model):
    """`model` with its collectives as one rank's, in onnxruntime's ops."""
    model = onnx.load_from_string(model.SerializeToString())
    nodes = []
    for node in model.graph.node:
        if node.op_type == "AllGather":
            nodes.append(helper.make_node("Unsqueeze", [node.input[0], "axis0"], node.output))
        elif node.domain == DOMAIN:
            nodes.append(helper.make_node("Identity", node.input, node.output))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), "axis0"))
    keep = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return model


class _OneRank(HostPath):
    """HostPath with one rank's collectives, recording what happens in order."""
    events = []

    @staticmethod
    def run(session, output_names, inputs):
        _OneRank.events.append(("run", tuple(i.name for i in session.get_outputs())))
        return session.run_with_ort_values(output_names, inputs)


def _start(kind, local):
    def start(arrays):
        _OneRank.events.append(("start", kind))

        def wait():
            _OneRank.events.append(("wait", kind))
            return [local(a) for a in arrays]
        return wait
    return start


_OneRank.start_collective = {"AllGather": _start("AllGather", lambda a: a[None]),
                             "AllReduceMean": _start("AllReduceMean", np.array),
                             "AllReduceSum": _start("AllReduceSum", np.array)}


def _session(model_bytes):
    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


def _nodes(run):
    return [n.output[0] for n in run.nodes]


FEEDS = {"x": np.arange(12, dtype=np.float32).reshape(4, 3) / 7,
         "w": np.linspace(-1, 1, 9, dtype=np.float32).reshape(3, 3)}


@pytest.mark.parametrize("overlap,sink", list(itertools.product([True, False], repeat=2)))
def test_every_schedule_computes_the_plain_graph(overlap, sink):
    model = _graph()
    expected = _session(_local(model).SerializeToString()).run(None, FEEDS)
    session = staged.StagedSession(model, _session, _OneRank, overlap=overlap, sink=sink)
    assert session.stage_count == 3
    for got, want in zip(session.run(FEEDS), expected):
        np.testing.assert_array_equal(got, want)


def test_the_nodes_a_collective_waits_for_run_first_and_the_rest_while_it_travels():
    session = staged.StagedSession(_graph(), _session, _OneRank, sink=False)
    first = session._stages[0]
    assert _nodes(first.before) == ["h", "stat"]
    assert _nodes(first.during) == ["w_t", "h_flat", "g"]
    _OneRank.events.clear()
    session.run(FEEDS)
    kinds = [(e[0], e[1] if e[0] != "run" else "g" in e[1]) for e in _OneRank.events[:4]]
    # stage 0: the statistic, the gather starts, the gradient g is made, the gather ends
    assert kinds == [("run", False), ("start", "AllGather"), ("run", True),
                     ("wait", "AllGather")]


def test_a_serial_stage_is_one_session_before_its_collectives():
    session = staged.StagedSession(_graph(), _session, _OneRank, overlap=False, sink=False)
    first = session._stages[0]
    assert _nodes(first.before) == ["h", "stat", "w_t", "h_flat", "g"]
    assert first.during.session is None
    _OneRank.events.clear()
    session.run(FEEDS)
    assert [e[0] for e in _OneRank.events[:3]] == ["run", "start", "wait"]


def test_nodes_move_to_the_session_that_reads_them():
    """The transpose read only after the gather is made there, and the reshape of h, a
    view, where it is read: neither crosses between sessions; the graph outputs and the
    collectives' inputs stay where they are made."""
    session = staged.StagedSession(_graph(), _session, _OneRank)
    stage0, stage1, stage2 = session._stages
    assert _nodes(stage0.before) == ["h", "stat"]
    assert _nodes(stage0.during) == ["g"] and "w_t" not in _nodes(stage0.during)
    assert _nodes(stage1.before) == ["w_t", "mean", "centered", "back"]
    assert _nodes(stage2.during) == ["h_flat", "out", "total"]
    crossing = {name for stage in session._stages for run in (stage.before, stage.during)
                for name in run.outputs}
    assert crossing == {"h", "stat", "back"} | {"g", "out", "total"}    # (graph outputs)


def test_a_view_read_in_two_sessions_is_made_in_each():
    """A Reshape read before and after a collective is computed in both sessions rather
    than written out by the first (a copy onnxruntime must make for a session output)."""
    model = _graph()
    graph = model.graph
    # "centered" (stage 1) now also reads h_flat's shape back: a second reader of h_flat
    nodes = list(graph.node)
    nodes.insert(7, helper.make_node("Reshape", ["h_flat", "shape43"], ["h_again"]))
    nodes[8] = helper.make_node("Sub", ["h_again", "mean"], ["centered"])
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.append(numpy_helper.from_array(np.array([4, 3], np.int64), "shape43"))
    graph.value_info.append(helper.make_tensor_value_info("h_again", F, [4, 3]))
    expected = _session(_local(model).SerializeToString()).run(None, FEEDS)
    session = staged.StagedSession(model, _session, _OneRank)
    stage1, stage2 = session._stages[1:]
    assert "h_flat" in _nodes(stage1.before) and "h_flat" in _nodes(stage2.during)
    assert all("h_flat" not in run.outputs for stage in session._stages
               for run in (stage.before, stage.during))
    for got, want in zip(session.run(FEEDS), expected):
        np.testing.assert_array_equal(got, want)


def test_the_path_chooses_whether_a_stage_overlaps_its_collectives():
    """HostPath overlaps (gloo's milliseconds); a path that does not (DevicePath over
    NCCL: one onnxruntime run a stage) runs each stage as one session, its collectives
    after."""
    assert HostPath.overlap_collectives

    class Serial(_OneRank):
        overlap_collectives = False
    session = staged.StagedSession(_graph(), _session, Serial)
    assert session._stages[0].during.session is None
    assert staged.StagedSession(_graph(), _session, _OneRank)._stages[0].during.session


def test_the_device_path_overlaps_over_gloo_and_not_over_nccl(monkeypatch):
    pytest.importorskip("torch", reason="the device path hands values to torch")
    from onnxjob.runtime import distributed
    from onnxjob.runtime.value_paths import DevicePath
    path = DevicePath("cpu")
    monkeypatch.setitem(distributed._group, "backend", "nccl")
    assert not path.overlap_collectives
    monkeypatch.setitem(distributed._group, "backend", "gloo")
    assert path.overlap_collectives
