"""The asyncio client: one connection shared by any number of tasks. Mirrors
:mod:`ticketing.client` of the blocking client."""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import ssl as _ssl
import time
from collections.abc import Sequence
from types import TracebackType

from .._common import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_ENDPOINTS,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_REQUEST_TIMEOUT,
    DEFAULT_RETRY_BACKOFF,
    Endpoint,
    KeyInfo,
    KeyLike,
    RecentTokens,
    call_timeout,
    format_endpoint,
    key_bytes,
    key_info,
    lease_ms,
    parse_endpoint,
    parse_endpoints,
    ssl_context,
    token_bytes,
    wait_ms,
)
from ..constants import SESSION_ID_SIZE, Op, Status
from ..exceptions import (
    AuthFailed,
    ConnectionLost,
    RequestTimeout,
    ServerError,
    TicketingError,
    UnsupportedVersion,
    error_for_status,
)
from ..protocol import Request, Response
from .connection import Connection
from .lock import Lock, LockContext

__all__ = ["Client"]

log = logging.getLogger("ticketing")


class Client:
    """A Ticketing client for asyncio. One connection, shared: many tasks may call at once and
    their requests pipeline; one reader task dispatches answers by request id.

    ::

        async with Client(["127.0.0.1:7070"], token="s3cret") as client:
            async with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                await use(lock.token)

    Arguments are those of the blocking :class:`ticketing.Client`, with the same defaults:
    ``endpoints`` (default ``127.0.0.1:7070``), ``token`` (None), ``ssl`` (None),
    ``connect_timeout`` (5.0 s), ``request_timeout`` (10.0 s), ``max_redirects`` (8),
    ``retry_backoff`` (0.05 s). Timeouts are float seconds; None waits forever.

    Cancelling a task that waits in :meth:`acquire` withdraws its place in the queue (CANCEL);
    if the lock was granted anyway, the client releases it: a cancelled wait never leaves a lock
    held. Use the client from one event loop.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] = DEFAULT_ENDPOINTS,
        *,
        token: str | bytes | None = None,
        ssl: _ssl.SSLContext | bool | None = None,
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
        retry_backoff: float = DEFAULT_RETRY_BACKOFF,
    ) -> None:
        self._endpoints = parse_endpoints(endpoints)
        self._token = token_bytes(token)
        self._ssl = ssl_context(ssl)
        self._connect_timeout = connect_timeout
        self._request_timeout = request_timeout
        self._max_redirects = max_redirects
        self._retry_backoff = retry_backoff
        #: The session id sent in every HELLO, random per client instance.
        self.session_id = secrets.token_bytes(SESSION_ID_SIZE)
        self._ids = itertools.count(1)
        self._preferred = 0
        self._hint: Endpoint | None = None
        self._conn: Connection | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._locks: dict[int, Lock] = {}
        self._early_expired = RecentTokens()
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect now (otherwise the first call does)."""
        await self._connection()

    async def close(self) -> None:
        """Close the connection. Calls in flight raise :class:`ConnectionLost`; locks still held
        stay held on the server until their lease ends, and are reported lost here (reason
        ``"closed"``) since this client can no longer extend or watch them."""
        self._closed = True
        conn, self._conn = self._conn, None
        for lock in list(self._locks.values()):
            lock._set_lost("closed")
        if conn is not None:
            conn.close("client closed")
            await conn.wait_closed()

    aclose = close

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and conn.usable

    @property
    def endpoint(self) -> str | None:
        """The ``host:port`` of the current connection, if any."""
        conn = self._conn
        return format_endpoint(conn.endpoint) if conn is not None and conn.usable else None

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # --- locks --------------------------------------------------------------------------------

    async def acquire(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *,
                      keepalive: bool = False) -> Lock:
        """Acquire ``key`` for ``lease`` seconds, waiting in the key's FIFO queue up to
        ``wait_timeout`` seconds (None: without limit; 0: try once).

        Returns the held :class:`Lock`. Raises :class:`NotAcquired` when the wait timeout passed.
        With ``keepalive=True`` a background task extends the lease every ~lease/3 until the
        lock is released or lost.
        """
        k = key_bytes(key)
        lm = lease_ms(lease)
        req = Request(op=Op.ACQUIRE, id=self._next_id(), lease_ms=lm, wait_ms=wait_ms(wait_timeout), key=k)
        resp, t_send = await self._call(req, call_timeout(wait_timeout, self._request_timeout))
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        lock = Lock(self, key, k, resp.token, lm, resp.lease_ms,
                    t_send + (resp.detail + resp.lease_ms) / 1000)
        self._register(lock)
        lock._start(keepalive)
        return lock

    async def try_acquire(self, key: KeyLike, lease: float, *, keepalive: bool = False) -> Lock:
        """Acquire ``key`` only if it is free now; raises :class:`NotAcquired` otherwise."""
        return await self.acquire(key, lease, 0, keepalive=keepalive)

    def lock(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *,
             keepalive: bool = False) -> LockContext:
        """An async context manager that acquires on entry and releases on exit::

            async with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                await use(lock.token)
        """
        return LockContext(self, key, lease, wait_timeout, keepalive)

    async def release(self, key: KeyLike, token: int) -> None:
        """Release ``key`` held with ``token`` (from any client or task). Raises
        :class:`NotHeld` when that token does not hold the key."""
        lock = self._locks.get(token)
        if lock is not None and lock._key_bytes == key_bytes(key):
            await lock.release()
            return
        await self._release(key_bytes(key), token)

    async def extend(self, key: KeyLike, token: int, lease: float) -> float:
        """Set the lease of ``key`` held with ``token`` to ``lease`` seconds from now; returns the
        lease granted, in seconds. Raises :class:`NotHeld` when that token does not hold the key."""
        lock = self._locks.get(token)
        if lock is not None and lock._key_bytes == key_bytes(key):
            await lock.extend(lease)
            return lock.lease
        resp, _ = await self._extend(key_bytes(key), token, lease_ms(lease))
        return resp.lease_ms / 1000

    async def ping(self) -> float:
        """Round trip to the server, in seconds."""
        resp, t_send = await self._call(Request(op=Op.PING, id=self._next_id()), self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return time.monotonic() - t_send

    async def inspect(self, key: KeyLike) -> KeyInfo:
        """What the server knows about ``key`` now: the holder's token (None when nobody holds
        it), the lease left, the acquires queued, how long it has been held, and the lock-delay
        left. Changes nothing; meant for operators and tests, not for deciding whether to acquire
        (the answer is stale the moment it arrives)."""
        req = Request(op=Op.INSPECT, id=self._next_id(), key=key_bytes(key))
        resp, _ = await self._call(req, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return key_info(resp)

    # --- internals used by Lock ---------------------------------------------------------------

    async def _release(self, key: bytes, token: int) -> None:
        req = Request(op=Op.RELEASE, id=self._next_id(), token=token, key=key)
        resp, _ = await self._call(req, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)

    async def _extend(self, key: bytes, token: int, ms: int) -> tuple[Response, float]:
        req = Request(op=Op.EXTEND, id=self._next_id(), token=token, lease_ms=ms, key=key)
        resp, t_send = await self._call(req, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return resp, t_send

    def _register(self, lock: Lock) -> None:
        self._locks[lock.token] = lock
        if self._early_expired.pop(lock.token):
            lock._set_lost("expired")

    def _unregister(self, lock: Lock) -> None:
        if self._locks.get(lock.token) is lock:
            del self._locks[lock.token]

    def _on_expired(self, token: int, key: bytes) -> None:
        """EXPIRED notice (reader task)."""
        lock = self._locks.get(token)
        if lock is None:
            self._early_expired.add(token)
        else:
            lock._set_lost("expired")

    # --- requests, connections, failover ------------------------------------------------------

    def _next_id(self) -> int:
        return next(self._ids)

    async def _call(self, req: Request, timeout: float | None) -> tuple[Response, float]:
        """Send ``req`` and wait for its answer, following NOT_LEADER and SHUTTING_DOWN (with the
        same request id, so a cluster can recognise the retry). Returns the answer and the
        monotonic time it was sent."""
        delay = self._retry_backoff
        attempt = 0
        while True:
            conn = await self._connection()
            fut, t_send = conn.send(req)
            try:
                async with asyncio.timeout(timeout):
                    await conn.drain()
                    resp = await fut
            except BaseException as e:
                conn.abandon(req, fut)
                if isinstance(e, TimeoutError) and not isinstance(e, TicketingError):
                    raise RequestTimeout(f"no answer within {timeout:.3f} s") from None
                raise
            if resp.status == Status.NOT_LEADER:
                self._redirect(conn, resp.data.decode("utf-8", "replace"))
            elif resp.status == Status.SHUTTING_DOWN:
                self._failover(conn)
            else:
                return resp, t_send
            attempt += 1
            if attempt > self._max_redirects:
                raise error_for_status(resp.status, resp.detail, resp.data)
            if attempt > 1:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _redirect(self, conn: Connection, leader: str) -> None:
        """NOT_LEADER: go to the hinted leader, or else to the next endpoint."""
        hint: Endpoint | None = None
        if leader:
            try:
                hint = parse_endpoint(leader)
            except ValueError:
                log.warning("ticketing: unusable leader hint %r", leader)
        log.debug("ticketing: %s is not the leader; leader hint %r", format_endpoint(conn.endpoint), leader)
        if hint is not None and hint in self._endpoints:
            self._preferred = self._endpoints.index(hint)
            self._hint = None
        elif hint is not None:
            self._hint = hint
        else:
            self._advance(conn.endpoint)
        if self._conn is conn:
            self._conn = None
        conn.retire()

    def _failover(self, conn: Connection) -> None:
        """SHUTTING_DOWN: move on to the next endpoint."""
        self._advance(conn.endpoint)
        if self._conn is conn:
            self._conn = None
        conn.retire()

    def _advance(self, current: Endpoint) -> None:
        if current in self._endpoints:
            self._preferred = (self._endpoints.index(current) + 1) % len(self._endpoints)
        self._hint = None

    async def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._closed:
                raise ConnectionLost("the client is closed")
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            conn = await self._dial()
            self._conn = conn
            return conn

    async def _dial(self) -> Connection:
        """Try the leader hint, then every endpoint from the preferred one on, in order."""
        n = len(self._endpoints)
        candidates = [self._endpoints[(self._preferred + i) % n] for i in range(n)]
        if self._hint is not None and self._hint not in candidates[:1]:
            candidates.insert(0, self._hint)
        errors: list[str] = []
        last: TicketingError | None = None
        for ep in candidates:
            try:
                conn = await Connection.open(
                    ep, session_id=self.session_id, token=self._token, ssl_context=self._ssl,
                    timeout=self._connect_timeout, next_id=self._next_id,
                    on_expired=self._on_expired, on_close=self._on_connection_closed)
            except (AuthFailed, UnsupportedVersion):
                raise
            except TicketingError as e:
                errors.append(f"{format_endpoint(ep)}: {e}")
                last = e
                continue
            if ep in self._endpoints:
                self._preferred = self._endpoints.index(ep)
            self._hint = None
            return conn
        if isinstance(last, ServerError):
            raise last
        raise ConnectionLost("could not connect to any endpoint: " + "; ".join(errors))

    def _on_connection_closed(self, conn: Connection) -> None:
        if self._conn is conn:
            self._conn = None
