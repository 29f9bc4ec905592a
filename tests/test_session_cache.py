"""The on-disk cache of onnxruntime's optimized models (onnxjob/runtime/session_cache.py)."""
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import onnxjob as flow
from onnxjob.runtime import backend, session_cache
from onnxjob.runtime.session import default_session

from models import define_jobs, lenet, lenet_training, random_batch


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    """The cache keeps CPU sessions' optimized models (backend.create_session): on a GPU
    machine these jobs are run on the CPU."""
    monkeypatch.setenv("ONNXJOB_DEVICE", "cpu")


def test_a_second_start_loads_the_optimized_model_and_trains_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    loaded_from = []
    real = ort.InferenceSession

    def recording(model, *args, **kwargs):
        loaded_from.append(model if isinstance(model, str) else "bytes")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    first, model_bytes = lenet_training()
    cached = backend.cached_session_path(model_bytes, True)
    assert os.path.isfile(cached), sorted(os.listdir(tmp_path))
    assert cached not in loaded_from
    loaded_from.clear()
    second, _ = lenet_training()
    assert cached in loaded_from, "the second start did not use the cached model"
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))     # where it would go otherwise
    assert session_cache.cached_model_path(b"model") is None
    lenet_training(steps=1)
    assert not os.listdir(tmp_path)


def test_the_cache_drops_the_least_recently_used_models(tmp_path):
    for age, name in enumerate(["old", "mid", "new"]):
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + age, 1000 + age))
    session_cache.touch(str(tmp_path / "old.onnx"))        # used just now
    session_cache._trim(str(tmp_path), 2000)
    assert sorted(os.listdir(tmp_path)) == ["new.onnx", "old.onnx"]


def test_a_trim_skips_files_another_process_removed_meanwhile(tmp_path, monkeypatch):
    """Two processes trimming one cache folder: a listed file may be gone by its stat."""
    for age, name in enumerate(["gone", "old", "new"]):
        path = tmp_path / f"{name}.onnx"
        path.write_bytes(b"x" * 1000)
        os.utime(path, (1000 + age, 1000 + age))
    listed = list(os.scandir(tmp_path))
    os.remove(tmp_path / "gone.onnx")                    # the other process's trim
    with monkeypatch.context() as patched:      # (os.scandir is the process's: undone here,
        patched.setattr(session_cache.os, "scandir", lambda folder: iter(listed))
        session_cache._trim(str(tmp_path), 1000)   # before pytest removes tmp_path with it)
    assert os.listdir(tmp_path) == ["new.onnx"]


def _lenet_start_counting_pipelines(monkeypatch, config=None):
    """Define the LeNet jobs in a fresh session and start it; returns how many times the
    pass pipeline ran and the train job's runtime."""
    from onnxjob.graph import compiler
    from onnxjob.frontend.config import started_session
    runs = []
    real = compiler.run_default_pipeline

    def counting(model, *args, **kwargs):
        runs.append(model.graph.name)
        return real(model, *args, **kwargs)

    monkeypatch.setattr(compiler, "run_default_pipeline", counting)
    flow.clear_default_session()
    flow.config.seed(3)
    define_jobs(lenet)
    started_session()
    return runs, default_session().runtimes["train_job"]


def test_a_second_start_takes_the_passes_result_from_the_cache(tmp_path, monkeypatch):
    from onnxjob.passes import op_counts
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    runs, first = _lenet_start_counting_pipelines(monkeypatch)
    assert "train_job" in runs
    assert any(name.endswith(".passes.onnx") for name in os.listdir(tmp_path))
    first_bytes, first_ops = first.model_bytes, op_counts(first.compiled.model)
    images, labels = random_batch()
    first_losses = [first.run({"images": images, "labels": labels})[0] for _ in range(2)]
    runs, second = _lenet_start_counting_pipelines(monkeypatch)
    assert runs == [], "the passes ran again on an unchanged graph"
    assert second.model_bytes == first_bytes
    assert op_counts(second.compiled.model) == first_ops     # the graph after the passes
    assert second.compiled.variable_inputs == first.compiled.variable_inputs
    losses = [second.run({"images": images, "labels": labels})[0] for _ in range(2)]
    np.testing.assert_allclose(losses, first_losses, rtol=1e-6)


def test_the_passes_cache_key_follows_skipped_passes_and_user_passes(tmp_path, monkeypatch):
    import onnx_ir as ir
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    _lenet_start_counting_pipelines(monkeypatch)
    monkeypatch.setenv("ONNXJOB_SKIP_PASSES", "FoldReshapes")
    runs, _ = _lenet_start_counting_pipelines(monkeypatch)
    assert "train_job" in runs, "another pipeline must not reuse the first one's result"
    monkeypatch.delenv("ONNXJOB_SKIP_PASSES")

    class Nothing(ir.passes.InPlacePass):
        def call(self, model):
            return ir.passes.PassResult(model, False)

    from onnxjob.passes import register_pass, _REGISTERED
    register_pass(Nothing)
    try:
        before = sorted(os.listdir(tmp_path))
        runs, _ = _lenet_start_counting_pipelines(monkeypatch)
        assert "train_job" in runs, "a user pass's result must not come from the cache"
    finally:
        _REGISTERED.remove(Nothing)
    assert [n for n in sorted(os.listdir(tmp_path)) if n.endswith(".passes.onnx")] == \
        [n for n in before if n.endswith(".passes.onnx")]


def _small_model(alpha=0.5, shape=(2, 3), constant=1.0, source="user.py:3"):
    import onnx_ir as ir
    from onnxjob.graph.compiler import IR_VERSION
    from onnxjob.graph.tracer import GraphBuilder, op, tracing
    builder = GraphBuilder("g")
    with tracing(builder):
        x = builder.add_input("x", shape, np.float32)
        y = op("LeakyRelu", op("Add", x, builder.constant(np.full(shape, constant, np.float32))),
               alpha=alpha)
        builder.graph.outputs.append(y.value)
    model = ir.Model(builder.graph, ir_version=IR_VERSION)
    for node in model.graph:
        node.metadata_props["source"] = source
    return model


def test_the_passes_cache_key_changes_with_anything_in_the_graph():
    """graph_digest stands for the serialized graph: equal for equal graphs, different when
    an attribute, a shape, a constant's bytes or a node's source line differ."""
    from onnxjob.graph.pass_cache import graph_digest
    base = graph_digest(_small_model())
    assert graph_digest(_small_model()) == base
    for changed in (dict(alpha=0.25), dict(shape=(2, 4)), dict(constant=2.0),
                    dict(source="user.py:4")):
        assert graph_digest(_small_model(**changed)) != base, changed


def test_a_session_start_pauses_the_cycle_collector_and_restores_it(monkeypatch):
    """Tracing allocates ~10^6 objects; the collector is off while a session starts and
    back on afterwards, also when the start fails."""
    import gc
    from onnxjob.graph import compiler
    seen = []
    real = compiler.run_default_pipeline

    def recording(model, *args, **kwargs):
        seen.append(gc.isenabled())
        return real(model, *args, **kwargs)

    monkeypatch.setattr(compiler, "run_default_pipeline", recording)
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", "off")
    assert gc.isenabled()
    lenet_training(steps=1)
    assert seen and not any(seen) and gc.isenabled()

    def failing(model, *args, **kwargs):
        raise RuntimeError("a pass failed")

    monkeypatch.setattr(compiler, "run_default_pipeline", failing)
    with pytest.raises(RuntimeError, match="a pass failed"):
        lenet_training(steps=1)
    assert gc.isenabled()


def test_an_unreadable_passes_cache_file_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    _, first = _lenet_start_counting_pipelines(monkeypatch)
    for name in os.listdir(tmp_path):
        if name.endswith(".passes.onnx"):
            (tmp_path / name).write_bytes(b"\x08not a model")
    runs, second = _lenet_start_counting_pipelines(monkeypatch)
    assert "train_job" in runs and second.model_bytes == first.model_bytes
    runs, _ = _lenet_start_counting_pipelines(monkeypatch)
    assert runs == [], "the rewritten file was not used"


def test_an_unreadable_cached_model_is_optimized_again(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    first, model_bytes = lenet_training()
    cached = backend.cached_session_path(model_bytes, True)
    with open(cached, "wb") as f:
        f.write(b"\x08not a model")
    second, _ = lenet_training()
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert os.path.getsize(cached) > 100, "the cached model was not written again"


def test_a_session_from_the_cached_model_runs_the_nodes_in_the_same_order(tmp_path,
                                                                          monkeypatch):
    """The order decides which activations are alive together (a ResNet50 batch-32 step
    from the cached model peaked 0.9 GB higher in the default order)."""
    import json
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path / "cache"))
    _, model_bytes = lenet_training(steps=1)
    real = backend.session_options

    def profiling(*args, **kwargs):
        opts = real(*args, **kwargs)
        opts.enable_profiling = True
        opts.profile_file_prefix = str(tmp_path / "profile")
        return opts

    monkeypatch.setattr(backend, "session_options", profiling)
    images, labels = random_batch()
    session, runtime = default_session(), default_session().runtimes["train_job"]
    feeds = {"images": images, "labels": labels}
    feeds.update({name: session.variable_numpy(var)
                  for var, name in runtime.compiled.variable_inputs.items()})
    orders = []
    for cached in (False, True):    # optimized in memory; loaded from the cache file
        ort_session = backend.create_session(model_bytes, "cpu", True, cached=cached)
        ort_session.run(None, feeds)
        with open(ort_session.end_profiling()) as f:
            events = json.load(f)
        orders.append([e["args"]["op_name"] for e in events
                       if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")])
    assert os.path.isfile(backend.cached_session_path(model_bytes, True))
    assert len(orders[0]) > 50 and orders[0] == orders[1]


def test_a_graph_ordered_session_caches_the_model_it_loads(tmp_path, monkeypatch):
    """CUDA train sessions run the optimized graph in the graph's order (runtime/
    graph_order.py) and cache the reordered model they load; here the CPU EP stands in for
    CUDA: the second start loads that file, makes no optimizing session, runs the nodes in
    the same order and trains the same."""
    from onnxjob.runtime import graph_order
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(backend, "in_graph_order", lambda device, is_train: is_train)
    kept = []
    real = graph_order.session_in_graph_order

    def recording(*args, keep=None, **kwargs):
        return real(*args, keep=lambda data: (kept.append(data), keep(data)), **kwargs)
    monkeypatch.setattr(graph_order, "session_in_graph_order", recording)
    first, model_bytes = lenet_training()
    cached = backend.cached_session_path(model_bytes, True)
    assert len(kept) == 1 and os.path.isfile(cached)
    data = Path(cached).read_bytes()
    assert data == kept[0] + session_cache.stamp_bytes(cached), "not the reordered model"

    def no_optimizing_session(*args, **kwargs):
        raise AssertionError("the cached graph-ordered model was not used")
    monkeypatch.setattr(graph_order, "session_in_graph_order", no_optimizing_session)
    second, _ = lenet_training()
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def _warnings(err):
    return [line for line in err.splitlines() if line.startswith("onnxjob: ignoring the cached")]


def _restamp(source, target, data=None):
    """Write `source`'s cached model (or `data`, its bytes read earlier) to `target` as if
    the cache had put it there, stamp and all: a valid file of the wrong graph."""
    data = source.read_bytes() if data is None else data
    stamp = session_cache.stamp_bytes(str(source))
    assert data.endswith(stamp), "every cached file ends with its stamp"
    target.write_bytes(data[:-len(stamp)] + session_cache.stamp_bytes(str(target)))


def _lenet_files(tmp_path, suffix):
    return sorted(p for p in tmp_path.iterdir() if p.name.endswith(suffix)
                  and (suffix == ".passes.onnx" or not p.name.endswith(".passes.onnx")))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other_graph", "unstamped"])
def test_a_wrong_cached_model_is_a_miss_said_once_and_rebuilt(tmp_path, monkeypatch, capfd,
                                                            damage):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    first, model_bytes = lenet_training()
    cached = Path(backend.cached_session_path(model_bytes, True))
    good = cached.read_bytes()
    others = [p for p in _lenet_files(tmp_path, ".onnx") if p != cached]
    assert others, "the eval job's optimized model is cached too"
    if damage == "garbage":
        cached.write_bytes(b"\x08not a model")
    elif damage == "truncated":
        cached.write_bytes(good[:len(good) * 2 // 3])
    elif damage == "other_graph":      # LeNet's eval graph, stamped as the train graph
        _restamp(others[0], cached)
    else:                              # a right model without the stamp (older onnxjob)
        cached.write_bytes(good[:-len(session_cache.stamp_bytes(str(cached)))])
    capfd.readouterr()
    second, _ = lenet_training()
    warned = _warnings(capfd.readouterr().err)
    assert len(warned) == 1 and str(cached) in warned[0], warned
    if damage == "other_graph":
        assert "graph input" in warned[0]
    for a, b in zip(first, second):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert cached.read_bytes() == good, "the entry was not rebuilt as it was"
    lenet_training(steps=1)
    assert _warnings(capfd.readouterr().err) == [], "the rebuilt entry was not accepted"


def test_a_cached_model_with_other_outputs_is_a_miss():
    """The input/output check itself: the same inputs with one output renamed."""
    from onnx import helper, TensorProto
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])

    def model(output):
        graph = helper.make_graph([helper.make_node("Relu", ["x"], [output])], "g", [x],
                                  [helper.make_tensor_value_info(output, TensorProto.FLOAT, [2])])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=8).SerializeToString()

    session = ort.InferenceSession(model("y"))
    assert session_cache.io_problem(session, model("y")) is None
    problem = session_cache.io_problem(session, model("z"))
    assert "output #0" in problem and "'y'" in problem and "'z'" in problem


def test_swapped_passes_cache_files_are_misses_and_rewritten(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    _, first = _lenet_start_counting_pipelines(monkeypatch)
    train_file, eval_file = _lenet_files(tmp_path, ".passes.onnx")
    originals = {p: p.read_bytes() for p in (train_file, eval_file)}
    _restamp(eval_file, train_file, originals[eval_file])      # the two files swapped
    _restamp(train_file, eval_file, originals[train_file])
    capfd.readouterr()
    runs, second = _lenet_start_counting_pipelines(monkeypatch)
    warned = _warnings(capfd.readouterr().err)
    assert sorted(runs) == ["eval_job", "train_job"], "a wrong passes file was used"
    assert len(warned) == 2 and all("graph" in line for line in warned), warned
    assert second.model_bytes == first.model_bytes
    assert {p: p.read_bytes() for p in originals} == originals, "not rewritten as they were"
    runs, _ = _lenet_start_counting_pipelines(monkeypatch)
    assert runs == []


def test_a_truncated_passes_cache_file_is_a_miss(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    _lenet_start_counting_pipelines(monkeypatch)
    for path in _lenet_files(tmp_path, ".passes.onnx"):
        data = path.read_bytes()
        path.write_bytes(data[:len(data) - 3])    # still parses as a protobuf, maybe
    capfd.readouterr()
    runs, _ = _lenet_start_counting_pipelines(monkeypatch)
    assert sorted(runs) == ["eval_job", "train_job"]
    assert len(_warnings(capfd.readouterr().err)) == 2


def test_the_session_cache_key_follows_the_session_options_and_onnxjob(monkeypatch):
    base = backend.cached_session_path(b"model", True)
    assert backend.cached_session_path(b"model", True) == base
    assert backend.cached_session_path(b"model", False) != base
    assert backend.cached_session_path(b"model", True, deterministic=True) != base
    monkeypatch.setenv("ONNXJOB_NUM_THREADS", "1")
    assert backend.cached_session_path(b"model", True) != base
    monkeypatch.delenv("ONNXJOB_NUM_THREADS")
    monkeypatch.setattr(backend, "optimization_level",
                        lambda *a: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    assert backend.cached_session_path(b"model", True) != base
    monkeypatch.undo()
    monkeypatch.setattr(backend, "disabled_transformers", lambda *a: ["EliminateDropout"])
    assert backend.cached_session_path(b"model", True) != base
    monkeypatch.undo()
    monkeypatch.setattr(session_cache, "onnxjob_version", lambda: "another onnxjob")
    assert backend.cached_session_path(b"model", True) != base


def test_the_passes_cache_key_follows_onnxjob(monkeypatch):
    from onnxjob.graph import pass_cache
    base = pass_cache.path_for("digest", "cpu")
    monkeypatch.setattr(session_cache, "onnxjob_version", lambda: "another onnxjob")
    assert pass_cache.path_for("digest", "cpu") != base


def test_onnxjob_version_names_the_code_that_runs(tmp_path):
    """An installed release by its version; a checkout or editable install (whose version
    stays while its code changes) by a hash of its source, which follows every edit."""
    import importlib.metadata
    import onnxjob
    version = session_cache.onnxjob_version()
    try:
        release = importlib.metadata.distribution("onnxjob")
        is_release = os.path.abspath(str(release.locate_file("onnxjob/__init__.py"))) == \
            os.path.abspath(onnxjob.__file__)
    except importlib.metadata.PackageNotFoundError:
        is_release = False
    if is_release:
        assert version == release.version
    else:
        assert version == "source-" + session_cache._source_digest(
            os.path.dirname(os.path.abspath(onnxjob.__file__)))
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.txt").write_text("not source")
    before = session_cache._source_digest(str(tmp_path))
    (tmp_path / "notes.txt").write_text("changed, still not source")
    assert session_cache._source_digest(str(tmp_path)) == before
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert session_cache._source_digest(str(tmp_path)) != before


def test_an_unexpected_session_output_order_is_a_clear_error():
    from types import SimpleNamespace
    from onnxjob.runtime.session import check_output_order
    outputs = [SimpleNamespace(name="b"), SimpleNamespace(name="a")]
    check_output_order("job", list(reversed(outputs)), ["a", "b"])
    with pytest.raises(RuntimeError, match="job 'job'.*outputs"):
        check_output_order("job", outputs, ["a", "b"])


@pytest.mark.filterwarnings("ignore:flow.summary.create_summary_writer")
def test_a_job_of_no_nodes_starts_again_without_a_cache_warning(tmp_path, monkeypatch, capfd):
    """A job that only creates a summary writer has no nodes: nothing is cached for it,
    so a second start has no damaged entry to warn about."""
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    for start in range(2):
        flow.clear_default_session()

        @flow.global_function()
        def create_writer():
            flow.summary.create_summary_writer(str(tmp_path / "logs"))
        create_writer()
        flow.clear_default_session()
    assert _warnings(capfd.readouterr().err) == []
