"""The on-disk cache of onnxruntime's optimized models (onnxjob/runtime/session_cache.py)."""
import os

import numpy as np
import onnxruntime as ort
import pytest

import onnxjob as flow
from onnxjob.runtime import session_cache
from onnxjob.runtime.session import default_session

from models import define_jobs, lenet, lenet_training, random_batch


def test_a_second_start_loads_the_optimized_model_and_trains_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXJOB_CACHE_DIR", str(tmp_path))
    loaded_from = []
    real = ort.InferenceSession

    def recording(model, *args, **kwargs):
        loaded_from.append(model if isinstance(model, str) else "bytes")
        return real(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    first, model_bytes = lenet_training()
    cached = session_cache.cached_model_path(model_bytes, True, False)
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
    cached = session_cache.cached_model_path(model_bytes, True, False)
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
    from onnxjob.runtime import backend
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
    assert os.path.isfile(session_cache.cached_model_path(model_bytes, True, False))
    assert len(orders[0]) > 50 and orders[0] == orders[1]
