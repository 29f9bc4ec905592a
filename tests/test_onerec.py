"""OneRec files (onnxjob.io.onerec): XXH64 against reference digests, frames and Example
payloads round trip, corruption is caught; flow.data.onerec_reader + OneRecDecoder in
jobs with OneFlow's reshape and batch-padding rules."""
import numpy as np
import pytest

import onnxjob as flow
import onnxjob.typing as tp
from onnxjob.errors import TraceError
from onnxjob.io import onerec
from onnxjob.io.ofrecord import RecordError


def test_xxh64_reference_digests():
    # digests from the xxHash reference implementation
    assert onerec.xxh64(b"") == 0xEF46DB3751D8E999
    assert onerec.xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert onerec.xxh64(b"abc") == 0x44BC2CF5AD770999
    assert onerec.xxh64(b"0123456789" * 10) == 0xF80E7B96315AFFFA
    assert onerec.xxh64(bytes(range(256)), seed=7) == 0xD233F62EC80E6EA8


def examples(n):
    return [{"label": np.array([i], np.int64),
             "dense": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
             "ids": np.arange(i + 1, dtype=np.int32),
             "pixels": np.full((2, 2), i, np.int8)} for i in range(n)]


@pytest.fixture
def files(tmp_path):
    data = examples(5)
    paths = [str(tmp_path / "a.onerec"), str(tmp_path / "b.onerec")]
    onerec.write_examples(paths[0], data[:3])
    onerec.write_examples(paths[1], data[3:])
    return paths


def test_frames_and_examples_round_trip(files):
    payloads = [p for path in files for _, p in onerec.iter_frames(path)]
    assert len(payloads) == 5
    for payload, want in zip(payloads, examples(5)):
        got = onerec.decode_example(payload)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
            assert got[key].dtype == want[key].dtype


def test_corrupt_frames_are_caught(files):
    data = bytearray(open(files[0], "rb").read())
    data[30] ^= 0xFF   # inside the first payload
    with open(files[0], "wb") as f:
        f.write(data)
    with pytest.raises(RecordError, match="payload's digest"):
        list(onerec.iter_frames(files[0]))
    with open(files[1], "ab") as f:
        f.write(b"\x00" * 5)
    with pytest.raises(RecordError, match="ends inside a frame header"):
        list(onerec.iter_frames(files[1]))


def decoder_job(files, batch_size, **decoders):
    from typing import Tuple
    names = list(decoders)

    @flow.global_function()
    def job() -> Tuple[tuple(tp.Numpy for _ in names)]:
        records = flow.data.onerec_reader(files, batch_size=batch_size)
        return tuple(flow.data.OneRecDecoder(records, key, **kwargs)
                     for key, kwargs in decoders.items())
    return job


def test_reader_and_decoder(files):
    job = decoder_job(files, 2, label=dict(dtype=flow.int64, shape=(1,)),
                      dense=dict(dtype=flow.float, shape=(3, 2), reshape=(3, -1)),
                      pixels=dict(dtype=flow.int8, shape=(4,), reshape=(-1,)))
    label, dense, pixels = job()
    np.testing.assert_array_equal(label, [[0], [1]])
    np.testing.assert_array_equal(dense, np.stack([np.arange(6).reshape(3, 2) + i
                                                   for i in range(2)]))
    assert pixels.dtype == np.int8 and pixels.shape == (2, 4)
    np.testing.assert_array_equal(job()[0], [[2], [3]])
    np.testing.assert_array_equal(job()[0], [[4], [0]])   # the files again from the first


def test_batch_padding(files):
    job = decoder_job(files, 3, ids=dict(dtype=flow.int32, shape=(4,), batch_padding=(4,)))
    np.testing.assert_array_equal(job()[0], [[0, 0, 0, 0], [0, 1, 0, 0], [0, 1, 2, 0]])
    flow.clear_default_session()
    widest = decoder_job(files, 3, ids=dict(dtype=flow.int32, shape=(3,),
                                            batch_padding=(-1,)))
    np.testing.assert_array_equal(widest()[0], [[0, 0, 0], [0, 1, 0], [0, 1, 2]])
    flow.clear_default_session()
    unpadded = decoder_job(files, 3, ids=dict(dtype=flow.int32, shape=(3,)))
    with pytest.raises(Exception, match="first dims differ"):
        unpadded()


def test_decoder_checks_types_and_shapes(files):
    wrong_type = decoder_job(files, 2, label=dict(dtype=flow.int32, shape=(1,)))
    with pytest.raises(Exception, match="holds int64, not int32"):
        wrong_type()
    flow.clear_default_session()
    with pytest.raises(TraceError, match="only the first axis"):
        decoder_job(files, 2, dense=dict(dtype=flow.float, shape=(2, 3),
                                         batch_padding=(0, 1)))()


def test_a_dynamic_decoder_gives_each_batch_its_own_size(files):
    """OneFlow's is_dynamic: a feature smaller than the decoder's shape is a dynamic blob
    of the batch's own size (padded within the batch by batch_padding=-1); larger than
    the shape, it is refused."""
    def job_of(width):
        @flow.global_function()
        def job() -> tp.ListNumpy:
            records = flow.data.onerec_reader(files, batch_size=2)
            return flow.data.OneRecDecoder(records, "ids", flow.int32, (width,),
                                           is_dynamic=True, batch_padding=(-1,))
        return job
    job = job_of(5)
    first, second = job()[0], job()[0]
    np.testing.assert_array_equal(first, [[0, 0], [0, 1]])   # examples 0 and 1
    np.testing.assert_array_equal(second, [[0, 1, 2, 0], [0, 1, 2, 3]])
    assert first.dtype == np.int32
    flow.clear_default_session()
    with pytest.raises(Exception, match="at most the decoder's shape"):
        job_of(1)()


def test_shuffled_reading_keeps_every_example(files):
    for mode in ("instance", "batch"):
        flow.clear_default_session()
        flow.manual_seed(3)   # a fixed shuffle

        @flow.global_function()
        def job() -> tp.Numpy:
            records = flow.data.onerec_reader(files, batch_size=1, random_shuffle=True,
                                              shuffle_mode=mode, shuffle_buffer_size=2)
            return flow.data.onerec_decoder(records, "label", flow.int64, (1,))

        seen = [int(job()[0, 0]) for _ in range(10)]
        assert sorted(set(seen)) == [0, 1, 2, 3, 4]
        assert seen != [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]
