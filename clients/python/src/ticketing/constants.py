"""Protocol version 1 code tables: operations, statuses, INVALID field codes, BUSY limit codes,
EXPIRED and GOAWAY reasons, INSPECT flags, frame sizes and the client rules, exactly as in
PROTOCOL.md and ``protocol/constants.json`` (the tests check every name and value here against
that file)."""

from __future__ import annotations

import enum

__all__ = [
    "VERSION",
    "Op",
    "Status",
    "Field",
    "Limit",
    "ExpiredReason",
    "GoawayReason",
    "InspectFlag",
    "LostReason",
    "HEADER_SIZE",
    "HELLO_SIZE",
    "CHALLENGE_SIZE",
    "AUTH_SIZE",
    "WELCOME_SIZE",
    "MAX_KEY_LEN",
    "MAX_DATA_LEN",
    "MAX_CHALLENGE_DATA",
    "SESSION_ID_SIZE",
    "STATE_ID_SIZE",
    "INSPECT_DATA_SIZE",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "WAIT_FOREVER",
    "CHALLENGE_AUTH_REQUIRED",
    "WELCOME_RESUMED",
    "ACK_EVERY",
    "CLOCK_RATE_BOUND_PPM",
    "LOST_MARGIN_MS",
    "LOST_CHECK_MS",
    "DEFAULT_PORT",
]

#: The protocol version this client speaks (sent in HELLO).
VERSION = 1


class Op(enum.IntEnum):
    """A frame's operation code (offset 4 of every frame)."""

    HELLO = 0x01  #: client -> server, first frame: version, session id, client nonce
    CHALLENGE = 0x02  #: server -> client: status, version, flags, detail, server nonce, data
    AUTH = 0x03  #: client -> server: client proof
    WELCOME = 0x04  #: server -> client: status, resumed flag, session grace, state id, server proof
    ACQUIRE = 0x10  #: take key for lease_ms, waiting up to wait_ms in the FIFO queue
    RELEASE = 0x11  #: release key held with token
    EXTEND = 0x12  #: set the lease of key held with token to lease_ms from now
    CANCEL = 0x13  #: withdraw this session's ACQUIRE whose request id is in token
    PING = 0x14  #: liveness; answered OK
    INSPECT = 0x15  #: report a key's state; the holder's token only to its holder
    ACK = 0x16  #: token = the lowest request id still awaited; the server prunes stored outcomes
    EXPIRED = 0x20  #: server push: the lock on key (data) with token is lost; detail is the reason
    GOAWAY = 0x21  #: server push: this node is going away; data is the leader's address


class Status(enum.IntEnum):
    """A response's outcome (offset 5 of every server frame)."""

    OK = 0  #: done
    TIMED_OUT = 1  #: the wait timeout passed (or wait 0 found the key taken); nothing is held
    NOT_HELD = 2  #: the token is not the key's current holder (or a retried ACQUIRE holds nothing)
    INVALID = 3  #: bad request; detail is the field code
    NOT_LEADER = 4  #: not the leader; data is the leader's address (may be empty)
    BUSY = 5  #: a server limit was reached; detail is the limit code
    SHUTTING_DOWN = 6  #: the server is stopping
    AUTH_FAILED = 7  #: the proof did not verify; the connection closes
    UNSUPPORTED_VERSION = 8  #: the server does not speak the client's version
    CANCELLED = 9  #: the ACQUIRE was withdrawn by CANCEL; nothing is held


class Field(enum.IntEnum):
    """``detail`` of an INVALID answer: which field was wrong."""

    LENGTH = 1  #: frame length inconsistent or above the ceiling; the connection closes
    OP = 2  #: unknown operation
    FLAGS = 3  #: reserved flags are not zero
    KEY = 4  #: key empty or longer than the server's max key length
    LEASE = 5  #: lease_ms outside the server's range
    WAIT = 6  #: reserved; never sent in version 1
    TOKEN = 7  #: token is zero
    REQUEST_ID = 8  #: request id zero, already used on this connection, or a retry that differs
    HANDSHAKE = 9  #: reserved: a bad handshake frame closes without an answer
    SESSION = 10  #: HELLO's session id is all zero


class Limit(enum.IntEnum):
    """``detail`` of a BUSY answer: which server limit was reached."""

    CONNECTIONS = 1  #: too many connections (CHALLENGE status BUSY, then close)
    WAITERS_PER_KEY = 2  #: the key's queue is full
    WAITERS_TOTAL = 3  #: the server's total number of queued acquires is reached
    LOCKS = 4  #: the server's number of distinct keys is reached
    INFLIGHT = 5  #: the session has too many queued acquires or stored outcomes
    STORAGE = 6  #: tokens or the restart horizon cannot be made durable now
    SESSIONS = 7  #: too many sessions (WELCOME status BUSY, then close)


class ExpiredReason(enum.IntEnum):
    """``detail`` of an EXPIRED push."""

    LEASE = 1  #: the lease ran out and the server reclaimed the lock (lost reason "expired")
    STOPPING = 2  #: the server is stopping (lost reason "server stopping")


class GoawayReason(enum.IntEnum):
    """``detail`` of a GOAWAY push."""

    LEADERSHIP = 1  #: this node is no longer the leader
    STOPPING = 2  #: this cluster node is stopping for maintenance


class InspectFlag(enum.IntFlag):
    """The flags word of an INSPECT answer's data."""

    HELD = 0x1  #: somebody holds the key
    TOKEN_MATCH = 0x2  #: the request's token is the holder's token
    SESSION = 0x4  #: the asking session holds the key
    STALLED = 0x8  #: the key waits for storage before its next grant
    STARTUP = 0x10  #: the server is in its start-up wait: no grant before it ends (lock-delay left: when)


HEADER_SIZE = 32  #: request and response header
HELLO_SIZE = 56  #: whole HELLO frame
CHALLENGE_SIZE = 48  #: CHALLENGE frame without its data
AUTH_SIZE = 40  #: whole AUTH frame
WELCOME_SIZE = 64  #: whole WELCOME frame
MAX_KEY_LEN = 0xFFFF  #: the format's ceiling for a key; servers set a lower limit (default 256)
MAX_DATA_LEN = 0xFFFF  #: the format's ceiling for response data
MAX_CHALLENGE_DATA = 1024  #: the most data a CHALLENGE carries
SESSION_ID_SIZE = 16
STATE_ID_SIZE = 16
INSPECT_DATA_SIZE = 12  #: INSPECT data: u32 ms held, u32 ms of lock-delay left, u32 flags
NONCE_SIZE = 32
PROOF_SIZE = 32
WAIT_FOREVER = 0xFFFFFFFF  #: ACQUIRE wait_ms meaning "wait without limit"
CHALLENGE_AUTH_REQUIRED = 0x01  #: CHALLENGE flag bit: the server requires auth
WELCOME_RESUMED = 0x01  #: WELCOME flag bit: the session named in HELLO was resumed
ACK_EVERY = 1024  #: the client sends ACK at least once per this many answers
CLOCK_RATE_BOUND_PPM = 1000  #: bound on each clock's rate error, parts per million (rho = 0.001)
LOST_MARGIN_MS = 5  #: the lost signal fires min(5 ms, lease / 10) before the local deadline
LOST_CHECK_MS = 250  #: while holding a lock, compare its deadline with the clock at least this often
DEFAULT_PORT = 7070  #: the server's default port


class LostReason(enum.StrEnum):
    """Why a lock was lost: the same names in every Ticketing client (docs/clients.md)."""

    EXPIRED = "expired"  #: the local deadline passed, or EXPIRED with reason LEASE
    NOT_HELD = "not held"  #: NOT_HELD answer to an extend or release of the lock
    SERVER_RESTARTED = "server restarted"  #: a reconnect found a different state id
    SERVER_STOPPING = "server stopping"  #: EXPIRED with reason STOPPING
