"""Protocol version 1 code tables: operations, statuses, INVALID field codes, BUSY limit codes and
frame sizes, exactly as in PROTOCOL.md and ``protocol/constants.json`` (the tests check that every
name and value here equals that file's)."""

from __future__ import annotations

import enum

__all__ = [
    "VERSION",
    "Op",
    "Status",
    "Field",
    "Limit",
    "HEADER_SIZE",
    "HELLO_SIZE",
    "CHALLENGE_SIZE",
    "AUTH_SIZE",
    "WELCOME_SIZE",
    "MAX_KEY_LEN",
    "MAX_DATA_LEN",
    "MAX_FRAME_SIZE",
    "SESSION_ID_SIZE",
    "INSPECT_DATA_SIZE",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "WAIT_FOREVER",
    "CHALLENGE_AUTH_REQUIRED",
    "DEFAULT_PORT",
]

#: The protocol version this client speaks (sent in HELLO).
VERSION = 1


class Op(enum.IntEnum):
    """A frame's operation code (offset 4 of every frame)."""

    HELLO = 0x01  #: client -> server, first frame: version, session id, client nonce
    CHALLENGE = 0x02  #: server -> client: status, server version, flags, server nonce
    AUTH = 0x03  #: client -> server: client proof
    WELCOME = 0x04  #: server -> client: status, server proof; the handshake is done
    ACQUIRE = 0x10  #: take key for lease_ms, waiting up to wait_ms in the FIFO queue
    RELEASE = 0x11  #: release key held with token
    EXTEND = 0x12  #: set the lease of key held with token to lease_ms from now
    CANCEL = 0x13  #: withdraw this connection's pending ACQUIRE whose request id is in token
    PING = 0x14  #: liveness; answered OK
    INSPECT = 0x15  #: report key's holder token, lease left, queue length, held-for and lock-delay left
    EXPIRED = 0x20  #: server push: the lease of key (data) with token ran out


class Status(enum.IntEnum):
    """A response's outcome (offset 5 of every server frame)."""

    OK = 0  #: done
    TIMED_OUT = 1  #: the wait timeout passed (or wait 0 found the key taken); nothing is held
    NOT_HELD = 2  #: the token is not the key's current holder; nothing changed
    INVALID = 3  #: bad request; detail is the field code
    NOT_LEADER = 4  #: not the leader; data is the leader's address (may be empty)
    BUSY = 5  #: a server limit was reached; detail is the limit code
    SHUTTING_DOWN = 6  #: the server is stopping; reconnect (another endpoint) and retry
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
    WAIT = 6  #: wait_ms above the server's max wait
    TOKEN = 7  #: token is zero
    REQUEST_ID = 8  #: request id zero or already used by a pending ACQUIRE
    HANDSHAKE = 9  #: a handshake frame was malformed or out of order


class Limit(enum.IntEnum):
    """``detail`` of a BUSY answer: which server limit was reached."""

    CONNECTIONS = 1  #: too many connections (CHALLENGE status BUSY, then close)
    WAITERS_PER_KEY = 2  #: the key's queue is full
    WAITERS_TOTAL = 3  #: the server's total number of queued acquires is reached
    LOCKS = 4  #: the server's number of distinct keys is reached
    INFLIGHT = 5  #: this connection has too many pending acquires


HEADER_SIZE = 32  #: request and response header
HELLO_SIZE = 56  #: whole HELLO frame
CHALLENGE_SIZE = 40  #: whole CHALLENGE frame
AUTH_SIZE = 40  #: whole AUTH frame
WELCOME_SIZE = 40  #: whole WELCOME frame
MAX_KEY_LEN = 0xFFFF  #: the format's ceiling for a key; servers set a lower limit (default 256)
MAX_DATA_LEN = 0xFFFF  #: the format's ceiling for response data
MAX_FRAME_SIZE = HEADER_SIZE + MAX_KEY_LEN
SESSION_ID_SIZE = 16
INSPECT_DATA_SIZE = 8  #: INSPECT answer data: u32 ms since the grant, u32 ms of lock-delay left
NONCE_SIZE = 32
PROOF_SIZE = 32
WAIT_FOREVER = 0xFFFFFFFF  #: ACQUIRE wait_ms meaning "wait without limit"
CHALLENGE_AUTH_REQUIRED = 0x01  #: CHALLENGE flag bit: the server requires auth
DEFAULT_PORT = 7070  #: the server's default port
