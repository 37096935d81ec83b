"""The asyncio client: ``ticketing.asyncio.Client``, mirroring the blocking ``ticketing.Client``.

::

    import ticketing.asyncio

    async with ticketing.asyncio.Client(["127.0.0.1:7070"]) as client:
        async with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
            await use(lock.token)
"""

from .client import Client
from .lock import Lock, LockContext

__all__ = ["Client", "Lock", "LockContext"]
