"""flow.Size: a tuple of dimensions with OneFlow's numel() and keyword index()."""
import pytest

import onnxjob as flow


def test_index_takes_start_and_end_keywords():
    size = flow.Size((2, 3, 2, 4, 4))
    assert size.index(2) == 0 and size.index(2, start=1, end=20) == 2
    assert size.index(4, start=4) == 4 and size.index(3, 0, 2) == 1
    with pytest.raises(ValueError):
        size.index(4, start=0, end=3)
    with pytest.raises(ValueError):
        size.index(5)
