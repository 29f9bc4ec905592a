"""flow.data.megatron_gpt_mmap_data_loader on Megatron indexed datasets written by
onnxjob.io.megatron: OneFlow's sample layout (seq_length + 1 tokens, consecutive samples
sharing one, documents end to end over epochs), splits, shuffling, errors."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.io import megatron

DOCS = [list(range(100, 107)), list(range(200, 203)), list(range(300, 311)),
        list(range(400, 405))]


@pytest.fixture
def prefix(tmp_path):
    path = str(tmp_path / "corpus_text_document")
    megatron.write_dataset(path, DOCS, np.uint16)
    return path


def loader_job(prefix, seq_length, num_samples, batch_size, **kwargs):
    @flow.global_function()
    def job() -> tp.Numpy:
        return flow.data.megatron_gpt_mmap_data_loader(prefix, seq_length, num_samples,
                                                       batch_size, **kwargs)
    return job


def windows(tokens, seq_length):
    return [tokens[i:i + seq_length + 1]
            for i in range(0, len(tokens) - seq_length, seq_length)]


def test_index_round_trip(prefix):
    dtype, sizes, addresses, offsets = megatron.read_index(prefix + ".idx")
    assert dtype == np.uint16
    np.testing.assert_array_equal(sizes, [7, 3, 11, 5])
    np.testing.assert_array_equal(addresses, [0, 14, 20, 42])
    np.testing.assert_array_equal(offsets, [0, 1, 2, 3, 4])


def test_unshuffled_samples_run_over_the_documents(prefix):
    job = loader_job(prefix, 4, 6, 2, shuffle=False)
    tokens = sum(DOCS, [])
    expected = windows(tokens, 4)
    got = np.concatenate([job(), job(), job()])
    assert got.dtype == np.int64 and got.shape == (6, 5)
    np.testing.assert_array_equal(got, expected[:6])


def test_epochs_repeat_the_documents(prefix):
    # 26 tokens per epoch; 9 samples of 4 need 37 tokens: two epochs laid end to end
    job = loader_job(prefix, 4, 9, 3, shuffle=False, dtype=flow.int32)
    tokens = sum(DOCS, []) * 2
    got = np.concatenate([job() for _ in range(3)])
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, windows(tokens, 4)[:9])


def test_splits_take_their_share_of_documents(prefix):
    job = loader_job(prefix, 3, 2, 2, shuffle=False, split_sizes=[3, 1], split_index=1)
    np.testing.assert_array_equal(job(), windows(DOCS[3] * 2, 3)[:2])


def test_shuffled_samples_are_the_same_windows_in_a_seeded_order(prefix):
    tokens = sum(DOCS, [])
    runs = []
    for seed in (7, 7, 8):
        flow.clear_default_session()
        job = loader_job(prefix, 5, 5, 5, shuffle=True, random_seed=seed)
        runs.append(job())
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])
    for sample in runs[0]:
        # each sample is a window of the documents in some order: every token's successor
        # within a document is kept, and it has seq_length + 1 tokens
        assert len(sample) == 6 and all(t in tokens for t in sample)


def test_errors(prefix, tmp_path):
    job = loader_job(prefix, 4, 2, 2, shuffle=False)
    job()
    job()
    job()   # 6 samples are laid out (one epoch's 26 tokens)
    with pytest.raises(Exception, match="sample 6 of a GPT dataset of 6 samples"):
        job()
    flow.clear_default_session()
    with pytest.raises(TraceError, match="not a Megatron index"):
        (tmp_path / "bad.idx").write_bytes(b"nope")
        loader_job(str(tmp_path / "bad"), 4, 2, 2)()
    flow.clear_default_session()
    with pytest.raises(TraceError, match="start_from_saved_progress"):
        loader_job(prefix, 4, 2, 2, start_from_saved_progress=True)()
    assert flow.data.MegatronGPTMMapDataLoader is flow.data.megatron_gpt_mmap_data_loader
