"""Ticketing: the official Python client of the Ticketing distributed lock server.

Blocking::

    import ticketing

    with ticketing.Client("127.0.0.1:7070") as client:
        with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
            use(lock.token)

asyncio: ``ticketing.asyncio.Client``, the same API with ``await`` / ``async with``.

The library logs to the ``ticketing`` logger and is silent until the application configures
logging (a :class:`logging.NullHandler` keeps Python's last-resort handler from printing).
"""

import logging as _logging

from ._common import KeyInfo, KeyLike
from .client import Client
from .constants import (
    VERSION,
    WAIT_FOREVER,
    ExpiredReason,
    Field,
    GoawayReason,
    InspectFlag,
    Limit,
    LostReason,
    Op,
    Status,
)
from .exceptions import (
    AlreadyHeld,
    AuthFailed,
    Busy,
    Cancelled,
    ClientClosed,
    ConnectionLost,
    InvalidArgument,
    InvalidRequest,
    LockLost,
    NotAcquired,
    NotHeld,
    NotLeader,
    ProtocolError,
    RequestTimeout,
    ServerError,
    ServerRestarted,
    ShuttingDown,
    TicketingError,
    TLSError,
    Unavailable,
    UnknownStatus,
    UnsupportedVersion,
)
from .lock import Lock, LockContext

__version__ = "0.3.0"

# A library never prints by itself: without this, Python's last-resort handler would write the
# client's warnings (a server restart, a lock released on close that did not finish) to stderr.
_logging.getLogger("ticketing").addHandler(_logging.NullHandler())

__all__ = [
    "Client",
    "KeyInfo",
    "KeyLike",
    "Lock",
    "LockContext",
    "LostReason",
    "VERSION",
    "WAIT_FOREVER",
    "Op",
    "Status",
    "Field",
    "Limit",
    "ExpiredReason",
    "GoawayReason",
    "InspectFlag",
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
]
