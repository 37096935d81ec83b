"""The client's code tables equal protocol/constants.json, by name and value."""

from __future__ import annotations

import enum

import pytest

from ticketing import constants
from ticketing.constants import Field, Limit, Op, Status

from .vectors import load

CONSTANTS = load("constants.json")


@pytest.mark.parametrize(
    ("section", "enum_type"),
    [("ops", Op), ("statuses", Status), ("invalid_fields", Field), ("busy_limits", Limit)],
)
def test_code_table_matches(section: str, enum_type: type[enum.IntEnum]) -> None:
    want = {e["name"]: e["value"] for e in CONSTANTS[section]}
    have = {m.name: m.value for m in enum_type}
    assert have == want


def test_version() -> None:
    assert constants.VERSION == CONSTANTS["version"]


@pytest.mark.parametrize("name", sorted(load("constants.json")["sizes"]))
def test_sizes(name: str) -> None:
    # Frame sizes are NAME_SIZE here (HELLO -> HELLO_SIZE); special values keep their name.
    ours = name if hasattr(constants, name) else f"{name}_SIZE"
    assert getattr(constants, ours) == CONSTANTS["sizes"][name]


def test_every_status_maps_to_an_exception() -> None:
    from ticketing import exceptions as ex

    expected = {
        Status.TIMED_OUT: ex.NotAcquired,
        Status.NOT_HELD: ex.NotHeld,
        Status.INVALID: ex.InvalidRequest,
        Status.NOT_LEADER: ex.NotLeader,
        Status.BUSY: ex.Busy,
        Status.SHUTTING_DOWN: ex.ShuttingDown,
        Status.AUTH_FAILED: ex.AuthFailed,
        Status.UNSUPPORTED_VERSION: ex.UnsupportedVersion,
        Status.CANCELLED: ex.Cancelled,
    }
    assert set(expected) == set(Status) - {Status.OK}
    for status, cls in expected.items():
        err = ex.error_for_status(status, 0, b"msg")
        assert type(err) is cls
        assert isinstance(err, ex.TicketingError)
        assert err.status == status
    unknown = ex.error_for_status(200, 0, b"")
    assert isinstance(unknown, ex.UnknownStatus) and unknown.status == 200
