"""Argument checks at their edges (ticketing._common): the shortcut for the usual lease gives
the same answer, or the same refusal, as the full checks."""

from __future__ import annotations

import math

import pytest

from ticketing import InvalidArgument
from ticketing._common import lease_ms


@pytest.mark.parametrize("lease, ms", [(0.001, 1), (0.0015, 2), (0.0010000001, 1), (1, 1000), (30.5, 30500),
                                       (4294967.295, 4294967295), (4294967.2954, 4294967295),
                                       (4294967.2949999, 4294967295)])
def test_lease_ms(lease: float, ms: int) -> None:
    assert lease_ms(lease) == ms and type(lease_ms(lease)) is int


@pytest.mark.parametrize("lease, message", [
    (0, "below 1 ms"), (0.0, "below 1 ms"), (-0.0, "below 1 ms"), (0.0009, "below 1 ms"), (-1, "below 1 ms"),
    (0.00099999999, "below 1 ms"), (4294967.2955, "too long"), (4294967.296, "too long"), (1e300, "too long"),
    (2**40, "too long"), (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite"),
    (True, "not bool"), (False, "not bool"), ("1", "not str"), (None, "not NoneType")])
def test_lease_ms_refusals(lease: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        lease_ms(lease)  # type: ignore[arg-type]
