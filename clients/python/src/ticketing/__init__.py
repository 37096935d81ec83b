"""Ticketing: the official Python client of the Ticketing distributed lock server.

Blocking::

    import ticketing

    with ticketing.Client(["127.0.0.1:7070"]) as client:
        with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
            use(lock.token)

asyncio: ``ticketing.asyncio.Client``, the same API with ``await`` / ``async with``.
"""

from ._common import KeyInfo
from .client import Client
from .constants import VERSION, WAIT_FOREVER, Field, Limit, Op, Status
from .exceptions import (
    AuthFailed,
    Busy,
    Cancelled,
    ConnectionLost,
    InvalidRequest,
    LockLost,
    NotAcquired,
    NotHeld,
    NotLeader,
    ProtocolError,
    RequestTimeout,
    ServerError,
    ShuttingDown,
    TicketingError,
    UnknownStatus,
    UnsupportedVersion,
)
from .lock import Lock, LockContext

__version__ = "0.1.0"

__all__ = [
    "Client",
    "KeyInfo",
    "Lock",
    "LockContext",
    "VERSION",
    "WAIT_FOREVER",
    "Op",
    "Status",
    "Field",
    "Limit",
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
]
