"""onnxruntime's optimization of CPU train sessions (runtime/backend.py): the level they
stop at and the transformers they leave out change how long a session takes to create,
never the graph it runs."""
import collections

import onnx
import onnxruntime as ort
import pytest

import onnxjob as flow
from onnxjob.runtime import backend
from onnxjob.runtime.session import default_session
from models import lenet_training


def _lenet_train_model():
    return lenet_training(steps=1)[1]


def _bert_train_model():
    from bert_models import define_train_job, synthetic_batch
    flow.clear_default_session()
    train_job = define_train_job(2)
    train_job(*synthetic_batch(2))
    return default_session().runtimes["train_job"].model_bytes


def _optimized_ops(model_bytes, tmp_path, level, disabled):
    """The op types (with domain) of `model_bytes` as onnxruntime optimized it."""
    opts = backend.session_options(True)
    opts.graph_optimization_level = level
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"],
                         disabled_optimizers=disabled)
    model = onnx.load(opts.optimized_model_filepath)
    return collections.Counter(f"{n.domain}:{n.op_type}" for n in model.graph.node)


def test_cpu_train_sessions_stop_at_extended_and_predict_sessions_do_not():
    extended, every = (ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                       ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert backend.session_options(True).graph_optimization_level == extended
    assert backend.session_options(False).graph_optimization_level == every
    assert backend.session_options(True, device="cuda").graph_optimization_level == every
    trimmed = backend.disabled_transformers(True, "cpu")
    assert "EliminateDropout" in trimmed and "AttentionFusion" in trimmed
    assert "AttentionFusion" not in backend.disabled_transformers(False, "cpu")
    assert "AttentionFusion" not in backend.disabled_transformers(True, "cuda")


@pytest.mark.parametrize("model", [_lenet_train_model, _bert_train_model],
                         ids=["lenet", "bert"])
def test_left_out_transformers_would_not_have_rewritten_a_train_graph(model, tmp_path):
    model_bytes = model()
    level = backend.optimization_level(True, "cpu")
    every_transformer = ["EliminateDropout"] + backend.NEVER_MATCHING_TRANSFORMERS
    full = _optimized_ops(model_bytes, tmp_path, level, every_transformer)
    trimmed = _optimized_ops(model_bytes, tmp_path, level,
                             backend.disabled_transformers(True, "cpu"))
    assert trimmed == full
    # EXTENDED does rewrite these graphs (so the comparison above can see a change)
    basic = _optimized_ops(model_bytes, tmp_path, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                           every_transformer)
    assert basic != full
