"""The exception tree. Every error this library raises is a :class:`TicketingError`; messages are
one line and carry their context (key, token, timeout, limit, endpoint).

::

    TicketingError
    ├── InvalidArgument         rejected before anything was sent (also ValueError and TypeError)
    │   └── InvalidRequest      status INVALID: the server rejected a field (.field)
    ├── AlreadyHeld             refuse_held=True and this client already holds the key
    ├── LockLost                an operation on a lost lock (.reason, .key, .token)
    ├── Unavailable             no endpoint could be connected to (also ConnectionError)
    ├── TLSError                the TLS handshake failed, or TLS met plaintext (also ConnectionError)
    ├── ConnectionLost          the connection dropped and the session could not be resumed
    ├── ServerRestarted         the server's state changed (a restart) while the call was in flight
    ├── RequestTimeout          no answer within request_timeout (also TimeoutError)
    ├── ClientClosed            the client was closed
    ├── ProtocolError           the server broke PROTOCOL.md
    └── ServerError             any other non-OK status (.status, .message, .detail)
        ├── NotAcquired         TIMED_OUT: the wait timeout passed; nothing is held
        ├── NotHeld             NOT_HELD: the token does not hold the key
        ├── NotLeader           NOT_LEADER (.leader)
        ├── Busy                BUSY (.limit)
        ├── ShuttingDown        SHUTTING_DOWN
        ├── AuthFailed          wrong or missing token, or a server that cannot prove it holds it
        ├── UnsupportedVersion  UNSUPPORTED_VERSION
        ├── Cancelled           CANCELLED: the ACQUIRE was withdrawn
        └── UnknownStatus       a status this client does not know (.status is its number)

asyncio task cancellation raises :class:`asyncio.CancelledError`, as everywhere in asyncio.
"""

from __future__ import annotations

from .constants import Field, Limit, LostReason, Status

__all__ = [
    "TicketingError",
    "InvalidArgument",
    "InvalidRequest",
    "AlreadyHeld",
    "LockLost",
    "Unavailable",
    "TLSError",
    "ConnectionLost",
    "ServerRestarted",
    "RequestTimeout",
    "ClientClosed",
    "ProtocolError",
    "ServerError",
    "NotAcquired",
    "NotHeld",
    "NotLeader",
    "Busy",
    "ShuttingDown",
    "AuthFailed",
    "UnsupportedVersion",
    "Cancelled",
    "UnknownStatus",
    "error_for_status",
    "describe_key",
]


#: A message shows at most this many bytes of a key (as the Go client does).
MAX_KEY_IN_MESSAGE = 64


def describe_key(key: bytes) -> str:
    """A key for messages: quoted text when it is printable UTF-8, else ``0x`` and its hex; a key
    longer than 64 bytes is cut (never inside a character) and its length added, so a message
    never echoes a long key whole: ``'kkkk…'…(300 bytes)``."""
    cut = key[:MAX_KEY_IN_MESSAGE]
    suffix = f"…({len(key)} bytes)" if len(key) > MAX_KEY_IN_MESSAGE else ""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + cut.hex() + suffix
    if not text.isprintable():
        return "0x" + cut.hex() + suffix
    return repr(cut.decode("utf-8", "ignore")) + suffix  # "ignore": a character cut at the end


class TicketingError(Exception):
    """Base class of every error raised by this library."""


class InvalidArgument(TicketingError, ValueError, TypeError):
    """An argument was rejected before anything was sent: a key that is not a non-empty ``str``
    or bytes of at most 65,535 bytes, a lease below 1 ms or not a finite number of seconds, a
    negative wait timeout, a token that is not a positive 64-bit integer, a bad option.

    It is both a :class:`ValueError` and a :class:`TypeError`, so either ``except`` catches it.
    """


class AlreadyHeld(TicketingError):
    """``acquire(..., refuse_held=True)`` of a key this client already holds: without the option
    the acquire would queue behind this client's own lock."""


class LockLost(TicketingError):
    """An operation on a lock that is lost, or a scoped helper (``with client.lock(...)``)
    whose lock was lost while its body ran.

    ``reason`` is a :class:`LostReason` (``"expired"``, ``"not held"``, ``"server restarted"``,
    ``"server stopping"``); ``key`` (bytes) and ``token`` name the lock.
    """

    def __init__(self, reason: LostReason, key: bytes, token: int, message: str = "") -> None:
        self.reason = reason
        self.key = key
        self.token = token
        super().__init__(message or f"lock on key {describe_key(key)} (token {token}) lost: {reason}")


class Unavailable(TicketingError, ConnectionError):
    """No endpoint could be connected to: refused, unreachable, the connect timeout passed, the
    connection closed or reset during the handshake, or a node that is not the leader refused it
    (then ``__cause__`` is the :class:`NotLeader` with its hint, which the client follows by
    itself). The message names every endpoint tried and why it failed."""


class TLSError(TicketingError, ConnectionError):
    """The TLS handshake failed (untrusted certificate, a client certificate the server wants,
    or TLS spoken to a plaintext server and back: the message then asks whether the server uses
    TLS)."""


class ConnectionLost(TicketingError):
    """The connection dropped and the session could not be resumed (the session grace passed,
    or the server started a new session): the answer to the call is unknown. An ACQUIRE may have
    been granted; that lock then runs out its lease. Locks held stay held until their lease ends.
    """


class ServerRestarted(TicketingError):
    """The server's state id changed while the call was in flight: the server restarted and
    forgot every lock. Every held lock is lost (reason ``"server restarted"``); a queued acquire
    fails with this error and is never re-queued on the new server by itself."""


class RequestTimeout(TicketingError, TimeoutError):
    """No answer within the client's ``request_timeout`` (a frozen or unreachable server). The
    time an ACQUIRE spends queued does not count; its wait timeout bounds that. An ACQUIRE given
    up this way is withdrawn with CANCEL, and released if it was granted anyway."""


class ClientClosed(TicketingError):
    """The client was closed (before or during the call)."""


class ProtocolError(TicketingError):
    """The server sent bytes that break PROTOCOL.md; the connection is closed.

    ``reason`` is one of ``"short"`` (incomplete frame), ``"length"`` (length inconsistent with
    the layout), ``"too_large"`` (length above the ceiling), ``"wrong_op"`` (unexpected
    operation).
    """

    def __init__(self, message: str, reason: str = "length") -> None:
        super().__init__(message)
        self.reason = reason


class ServerError(TicketingError):
    """The server answered a status other than OK.

    Attributes: ``status`` (a :class:`Status`, or an int for an unknown one), ``message`` (the
    server's own message, possibly empty) and ``detail`` (the raw detail field).
    """

    status: Status | int = -1
    default_message = ""

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0,
                 context: str = "") -> None:
        if status is not None:
            self.status = status
        self.message = message
        self.detail = detail
        self.context = context
        super().__init__(self._format())

    def _summary(self) -> str:
        if self.default_message:
            return self.default_message
        st = self.status
        return f"status {st.name}" if isinstance(st, Status) else f"status {st}"

    def _format(self) -> str:
        text = self._summary()
        if self.message and self.message not in text:
            text = f"{text}: {self.message}"
        if self.context:
            text = f"{text} ({self.context})"
        return text


class NotAcquired(ServerError):
    """Status TIMED_OUT: the key was taken and the wait timeout passed (or a try found it
    taken). Nothing is held."""

    status = Status.TIMED_OUT
    default_message = "not acquired: the key is held and the wait timeout passed"

    def _format(self) -> str:
        # The server's own reason, when it gives one, replaces the usual one (during its
        # start-up wait the key is not held: "the server is in its start-up wait...").
        text = f"not acquired: {self.message}" if self.message else self.default_message
        return f"{text} ({self.context})" if self.context else text


class NotHeld(ServerError):
    """Status NOT_HELD: the token is not the key's current holder (expired, already released or
    never issued). Nothing changed on the server; never retry. (A :class:`Lock` reports this as
    :class:`LockLost` with reason ``"not held"``.)"""

    status = Status.NOT_HELD
    default_message = "not held: the token does not hold the key"


class NotLeader(ServerError):
    """Status NOT_LEADER: this cluster node is not the leader; ``leader`` is the leader's
    ``host:port`` or None when unknown. The client follows it by itself; this is raised only
    where it cannot. A connect refused with NOT_LEADER is an :class:`Unavailable` with this as
    its ``__cause__``."""

    status = Status.NOT_LEADER
    default_message = "not the leader"

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0,
                 context: str = "", leader: str | None = None) -> None:
        self.leader = leader
        super().__init__(message, status=status, detail=detail, context=context)

    def _summary(self) -> str:
        return f"not the leader; leader is {self.leader}" if self.leader else "not the leader; leader unknown"

    def _format(self) -> str:
        text = self._summary()
        return f"{text} ({self.context})" if self.context else text


class Busy(ServerError):
    """Status BUSY: a server limit was reached; ``limit`` says which (a :class:`Limit`, or an
    int for an unknown code). Retry later with backoff."""

    status = Status.BUSY

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0,
                 context: str = "") -> None:
        self.limit: Limit | int = _enum_or_int(Limit, detail)
        super().__init__(message, status=status, detail=detail, context=context)

    def _summary(self) -> str:
        name = self.limit.name if isinstance(self.limit, Limit) else str(self.limit)
        return f"busy: server limit {name} reached"


class ShuttingDown(ServerError):
    """Status SHUTTING_DOWN: the server is stopping. With several endpoints the client moves to
    the next one by itself; this is raised where it cannot."""

    status = Status.SHUTTING_DOWN
    default_message = "the server is shutting down"


class AuthFailed(ServerError):
    """Authentication failed: the server rejected the proof (wrong token, or none configured
    while the server requires one), the server's proof did not verify, or a token is configured
    and the server does not require auth. Do not retry with the same token."""

    status = Status.AUTH_FAILED
    default_message = "authentication failed"


class UnsupportedVersion(ServerError):
    """Status UNSUPPORTED_VERSION: the server does not speak protocol version 1."""

    status = Status.UNSUPPORTED_VERSION
    default_message = "the server does not speak protocol version 1"


class Cancelled(ServerError):
    """Status CANCELLED: the ACQUIRE was withdrawn by CANCEL; nothing is held."""

    status = Status.CANCELLED
    default_message = "the acquire was cancelled"


class InvalidRequest(InvalidArgument, ServerError):
    """Status INVALID: the server rejected a field; ``field`` names it (a :class:`Field`, or an
    int for an unknown code). Do not retry unchanged."""

    status = Status.INVALID

    def __init__(self, message: str = "", *, status: Status | int | None = None, detail: int = 0,
                 context: str = "") -> None:
        self.field: Field | int = _enum_or_int(Field, detail)
        ServerError.__init__(self, message, status=status, detail=detail, context=context)

    def _summary(self) -> str:
        name = self.field.name if isinstance(self.field, Field) else str(self.field)
        return f"invalid {name}"


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


def error_for_status(status: int, detail: int = 0, data: bytes = b"", context: str = "") -> ServerError:
    """The exception for a non-OK ``status`` with its ``detail`` and ``data`` fields; ``context``
    (the key, token, timeout, endpoint...) is appended to the message."""
    if status == Status.NOT_LEADER:
        leader = " ".join(data.decode("utf-8", "replace").split()) or None
        return NotLeader(status=Status.NOT_LEADER, detail=detail, leader=leader, context=context)
    message = " ".join(data.decode("utf-8", "replace").split())  # one line
    cls = _BY_STATUS.get(status)
    if cls is None:
        return UnknownStatus(message, status=status, detail=detail, context=context)
    return cls(message, status=Status(status), detail=detail, context=context)


def _enum_or_int(enum_type: type[Field] | type[Limit], value: int) -> Field | Limit | int:
    try:
        return enum_type(value)
    except ValueError:
        return value
