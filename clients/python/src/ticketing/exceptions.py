"""The exception tree. Every error this library raises is a :class:`TicketingError`.

::

    TicketingError
    ├── ConnectionLost          the connection dropped (or could not be made); in-flight calls fail
    ├── ProtocolError           the peer sent bytes that break PROTOCOL.md
    ├── RequestTimeout          no answer within the client's request_timeout (also a TimeoutError)
    ├── LockLost                the lock is lost (lease ran out, EXPIRED notice, NOT_HELD)
    │   └── NotHeld             status NOT_HELD: the token is not the key's holder
    └── ServerError             any other status the server answered
        ├── NotAcquired         status TIMED_OUT: the wait timeout passed; nothing is held
        ├── InvalidRequest      status INVALID (``.field``); also a ValueError
        ├── NotLeader           status NOT_LEADER (``.leader``: "host:port" or None)
        ├── Busy                status BUSY (``.limit``)
        ├── ShuttingDown        status SHUTTING_DOWN
        ├── AuthFailed          status AUTH_FAILED, or the server's proof did not verify
        ├── UnsupportedVersion  status UNSUPPORTED_VERSION
        ├── Cancelled           status CANCELLED: the ACQUIRE was withdrawn
        └── UnknownStatus       a status this client does not know (``.status`` is its number)
"""

from __future__ import annotations

from .constants import Field, Limit, Status

__all__ = [
    "TicketingError",
    "ConnectionLost",
    "ProtocolError",
    "RequestTimeout",
    "LockLost",
    "NotHeld",
    "ServerError",
    "NotAcquired",
    "InvalidRequest",
    "NotLeader",
    "Busy",
    "ShuttingDown",
    "AuthFailed",
    "UnsupportedVersion",
    "Cancelled",
    "UnknownStatus",
    "error_for_status",
]


class TicketingError(Exception):
    """Base class of every error raised by this library."""


class ConnectionLost(TicketingError):
    """The connection to the server dropped, or no endpoint could be reached.

    Calls in flight on a dropped connection raise this; the next call reconnects. Locks held stay
    held on the server until released or until their lease ends.
    """


class ProtocolError(TicketingError):
    """The peer sent bytes that do not follow PROTOCOL.md; the connection is closed.

    ``reason`` is one of ``"short"`` (incomplete frame), ``"length"`` (length inconsistent with
    the layout), ``"too_large"`` (length above the ceiling), ``"wrong_op"`` (unexpected operation).
    """

    def __init__(self, message: str, reason: str = "length") -> None:
        super().__init__(message)
        self.reason = reason


class RequestTimeout(TicketingError, TimeoutError):
    """The server did not answer within the client's ``request_timeout``.

    An ACQUIRE abandoned this way is withdrawn with CANCEL, and released if it was granted anyway.
    """


class LockLost(TicketingError):
    """The lock is no longer held: its lease ran out (local deadline or the server's EXPIRED
    notice), or the server answered NOT_HELD. Raised by :meth:`Lock.extend` on a lost lock."""


class ServerError(TicketingError):
    """The server answered a status other than OK.

    Attributes: ``status`` (a :class:`Status`, or an int for an unknown one), ``message`` (the
    server's message for humans, possibly empty) and ``detail`` (the raw detail field).
    """

    status: Status | int = -1
    default_message = ""

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0) -> None:
        if status is not None:
            self.status = status
        self.message = message
        self.detail = detail
        super().__init__(message or self._default_message())

    def _default_message(self) -> str:
        if self.default_message:
            return self.default_message
        st = self.status
        return st.name if isinstance(st, Status) else f"status {st}"


class NotHeld(LockLost, ServerError):
    """Status NOT_HELD: the token is not the key's current holder (expired, already released or
    never issued). Nothing changed on the server; never retry."""

    status = Status.NOT_HELD
    default_message = "the token does not hold the key (expired, released or never issued)"


class NotAcquired(ServerError):
    """Status TIMED_OUT: the lock was not acquired within the wait timeout (or ``try_acquire``
    found the key taken). Nothing is held."""

    status = Status.TIMED_OUT
    default_message = "not acquired: the key is taken and the wait timeout passed"


class InvalidRequest(ServerError, ValueError):
    """Status INVALID: the request was malformed. ``field`` names the field (a :class:`Field`,
    or an int for an unknown code). Do not retry unchanged."""

    status = Status.INVALID

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0) -> None:
        self.field: Field | int = _enum_or_int(Field, detail)
        super().__init__(message, status=status, detail=detail)

    def __str__(self) -> str:
        name = self.field.name if isinstance(self.field, Field) else str(self.field)
        return f"invalid {name}: {self.message}" if self.message else f"invalid {name}"


class NotLeader(ServerError):
    """Status NOT_LEADER: this cluster node is not the leader. ``leader`` is the leader's
    ``host:port`` or None when unknown. The client follows it by itself; this is raised only when
    it could not find the leader within its retries."""

    status = Status.NOT_LEADER

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0,
                 leader: str | None = None) -> None:
        self.leader = leader
        super().__init__(message or (f"not the leader; leader is {leader}" if leader else "not the leader"),
                         status=status, detail=detail)


class Busy(ServerError):
    """Status BUSY: a server limit was reached; ``limit`` says which (a :class:`Limit`, or an
    int for an unknown code). Retry later with backoff."""

    status = Status.BUSY

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0) -> None:
        self.limit: Limit | int = _enum_or_int(Limit, detail)
        super().__init__(message, status=status, detail=detail)

    def __str__(self) -> str:
        name = self.limit.name if isinstance(self.limit, Limit) else str(self.limit)
        return f"busy ({name}): {self.message}" if self.message else f"busy ({name})"


class ShuttingDown(ServerError):
    """Status SHUTTING_DOWN: the server is stopping. The client retries on the next endpoint by
    itself; this is raised only when no endpoint took the request within its retries."""

    status = Status.SHUTTING_DOWN
    default_message = "the server is shutting down"


class AuthFailed(ServerError):
    """Authentication failed: the server rejected our proof (wrong or missing token), the
    server's proof did not verify, or the server does not require auth although a token is
    configured. Do not retry with the same token."""

    status = Status.AUTH_FAILED
    default_message = "authentication failed"


class UnsupportedVersion(ServerError):
    """Status UNSUPPORTED_VERSION: the server does not speak protocol version 1."""

    status = Status.UNSUPPORTED_VERSION
    default_message = "the server does not speak this protocol version"


class Cancelled(ServerError):
    """Status CANCELLED: the ACQUIRE was withdrawn by CANCEL; nothing is held."""

    status = Status.CANCELLED
    default_message = "the acquire was cancelled"


class UnknownStatus(ServerError):
    """A status code this client does not know; ``status`` is its number."""


_BY_STATUS: dict[int, type[ServerError]] = {
    Status.TIMED_OUT: NotAcquired,
    Status.NOT_HELD: NotHeld,
    Status.INVALID: InvalidRequest,
    Status.NOT_LEADER: NotLeader,
    Status.BUSY: Busy,
    Status.SHUTTING_DOWN: ShuttingDown,
    Status.AUTH_FAILED: AuthFailed,
    Status.UNSUPPORTED_VERSION: UnsupportedVersion,
    Status.CANCELLED: Cancelled,
}


def error_for_status(status: int, detail: int = 0, data: bytes = b"") -> ServerError:
    """The exception for a non-OK ``status`` with its ``detail`` and ``data`` fields."""
    if status == Status.NOT_LEADER:
        leader = data.decode("utf-8", "replace") or None
        return NotLeader(status=Status.NOT_LEADER, detail=detail, leader=leader)
    message = data.decode("utf-8", "replace")
    cls = _BY_STATUS.get(status)
    if cls is None:
        return UnknownStatus(message, status=status, detail=detail)
    return cls(message, status=Status(status), detail=detail)


def _enum_or_int(enum_type: type[Field] | type[Limit], value: int) -> Field | Limit | int:
    try:
        return enum_type(value)
    except ValueError:
        return value
