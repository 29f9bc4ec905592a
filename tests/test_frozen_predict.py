"""Predict jobs switch to a session with the variables as constants once the variables stop
changing (onnxjob/frozen.py), and back as soon as any variable is written."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.runtime.session import default_session
from onnxjob.settings import SettingsError
from models import BATCH, define_jobs, lenet, random_batch

IMAGE = tp.Numpy.Placeholder((BATCH, 1, 28, 28), dtype=flow.float)


def _define(threshold):
    train, _ = define_jobs(lenet)

    def predict_job(name, after):
        config = flow.function_config()
        config.freeze_variables_after(after)

        def body(images: IMAGE) -> tp.Numpy:
            return lenet(images)
        body.__name__ = name
        return flow.global_function(type="predict", function_config=config)(body)

    return train, predict_job("frozen", threshold), predict_job("fed", 0)


def _frozen_session(job_name):
    frozen = default_session().runtimes[job_name]._frozen
    return None if frozen is None else frozen._session


def test_frozen_results_equal_fed_results_and_follow_every_write():
    train, frozen, fed = _define(threshold=2)
    images, labels = random_batch()
    first = frozen(images)
    assert _frozen_session("frozen") is None            # one call: still fed
    second = frozen(images)
    assert _frozen_session("frozen") is not None        # second call at the same values
    np.testing.assert_allclose(second, fed(images), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(first, second, rtol=1e-5, atol=1e-5)

    train(images, labels)                               # a write: back to the fed session
    after_train = frozen(images)
    assert _frozen_session("frozen") is None
    assert not np.allclose(after_train, second, atol=1e-3)
    np.testing.assert_allclose(after_train, fed(images), rtol=1e-5, atol=1e-5)

    frozen(images)                                      # frozen again at the new values
    assert _frozen_session("frozen") is not None
    flow.load_variables({"conv1-bias": np.full(32, 0.5, np.float32)})
    after_load = frozen(images)
    assert _frozen_session("frozen") is None
    np.testing.assert_allclose(after_load, fed(images), rtol=1e-5, atol=1e-5)
    assert not np.allclose(after_load, after_train, atol=1e-3)


def test_alternating_train_and_predict_never_builds_a_frozen_session():
    train, frozen, _ = _define(threshold=2)
    images, labels = random_batch()
    for _ in range(4):
        train(images, labels)
        frozen(images)
        assert _frozen_session("frozen") is None


def test_threshold_zero_keeps_variables_fed():
    _, _, fed = _define(threshold=2)
    images, _ = random_batch()
    for _ in range(3):
        fed(images)
    assert default_session().runtimes["fed"]._frozen is None


def test_environment_sets_the_default_threshold(monkeypatch):
    monkeypatch.setenv("ONNXJOB_FREEZE_AFTER", "1")

    @flow.global_function(type="predict")
    def plain(images: IMAGE) -> tp.Numpy:
        return lenet(images)
    plain(random_batch()[0])
    assert _frozen_session("plain") is not None


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_bad_threshold_is_refused_where_it_is_set(bad):
    config = flow.function_config()
    with pytest.raises(ValueError, match="freeze_variables_after takes a count >= 0"):
        config.freeze_variables_after(bad)


def test_bad_environment_threshold_is_refused(monkeypatch):
    monkeypatch.setenv("ONNXJOB_FREEZE_AFTER", "many")

    @flow.global_function(type="predict")
    def job(images: IMAGE) -> tp.Numpy:
        return lenet(images)
    with pytest.raises(SettingsError,
                       match="ONNXJOB_FREEZE_AFTER='many': expected an integer >= 0"):
        job(random_batch()[0])


def test_variables_too_big_to_embed_stay_fed(monkeypatch):
    from onnxjob.runtime import frozen
    monkeypatch.setattr(frozen, "MAX_FROZEN_BYTES", 1000)    # LeNet has ~6.6 MB of weights
    _, frozen_job, fed = _define(threshold=1)
    images, _ = random_batch()
    for _ in range(3):
        np.testing.assert_allclose(frozen_job(images), fed(images), rtol=1e-5, atol=1e-5)
    assert _frozen_session("frozen") is None


def test_random_draws_of_a_job_reading_variables_never_repeat():
    # A frozen session's generators would start again from their seeds: the calls after each
    # freeze repeated the draws of the first calls (OneFlow's kernels keep one generator per
    # op for the session's life), e.g. MC-dropout or sampling estimates reusing samples.
    config = flow.function_config()
    config.freeze_variables_after(2)

    @flow.global_function(type="predict", function_config=config)
    def sample(z: tp.Numpy.Placeholder((8, 3))) -> tp.Numpy:
        p = flow.math.sigmoid(flow.layers.dense(z, 12, name="d"))
        return flow.random.bernoulli(p, seed=7)

    z = np.zeros((8, 3), np.float32)                # p = 0.5 for all 96 draws
    draws = [sample(z).tobytes() for _ in range(8)]
    assert len(set(draws)) == len(draws)
    assert _frozen_session("sample") is None
