"""The client's code tables equal protocol/constants.json, by name and value: every table, the
sizes and the client rules (the file is read at test time, never copied)."""

from __future__ import annotations

import enum

import pytest

from ticketing import constants
from ticketing import exceptions as ex
from ticketing.constants import ExpiredReason, Field, GoawayReason, InspectFlag, Limit, Op, Status

from .vectors import load

CONSTANTS = load("constants.json")

TABLES: list[tuple[str, type[enum.IntEnum] | type[enum.IntFlag]]] = [
    ("ops", Op),
    ("statuses", Status),
    ("invalid_fields", Field),
    ("busy_limits", Limit),
    ("expired_reasons", ExpiredReason),
    ("goaway_reasons", GoawayReason),
    ("inspect_flags", InspectFlag),
]


def test_every_table_is_checked() -> None:
    tables = {k for k, v in CONSTANTS.items() if isinstance(v, list)}
    assert tables == {name for name, _ in TABLES}


@pytest.mark.parametrize(("section", "enum_type"), TABLES, ids=[t[0] for t in TABLES])
def test_code_table_matches(section: str, enum_type: type[enum.IntEnum]) -> None:
    want = {e["name"]: e["value"] for e in CONSTANTS[section]}
    have = {m.name: int(m.value) for m in enum_type}
    assert have == want


def test_version() -> None:
    assert constants.VERSION == CONSTANTS["version"]


@pytest.mark.parametrize("name", sorted(CONSTANTS["sizes"]))
def test_sizes(name: str) -> None:
    # Frame sizes are NAME_SIZE here (HELLO -> HELLO_SIZE); special values keep their name.
    ours = name if hasattr(constants, name) else f"{name}_SIZE"
    assert getattr(constants, ours) == CONSTANTS["sizes"][name]


@pytest.mark.parametrize("name", sorted(CONSTANTS["client_rules"]))
def test_client_rules(name: str) -> None:
    assert getattr(constants, name) == CONSTANTS["client_rules"][name]


def test_every_status_maps_to_an_exception() -> None:
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
        err = ex.error_for_status(status, 0, b"msg\nsecond line", "key 'k'")
        assert type(err) is cls
        assert isinstance(err, ex.TicketingError)
        assert err.status == status
        assert "\n" not in str(err) and "key 'k'" in str(err)
    unknown = ex.error_for_status(200, 0, b"")
    assert isinstance(unknown, ex.UnknownStatus) and unknown.status == 200 and "200" in str(unknown)
