"""hpctorch's median is statistics.median's, without its imports."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctorch.median import median


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e9, max_value=1e9), min_size=1))
def test_it_is_statistics_median(values: list[float]) -> None:
    assert median(values) == statistics.median(values)
    assert median(iter(values)) == statistics.median(values)


def test_no_values_is_an_error_as_there() -> None:
    with pytest.raises(ValueError):
        median([])
