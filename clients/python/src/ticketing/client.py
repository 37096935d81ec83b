"""The blocking client: one connection shared by any number of threads."""

from __future__ import annotations

import itertools
import logging
import secrets
import ssl as _ssl
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from ._common import (
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
from ._timers import Scheduler
from .connection import Connection
from .constants import SESSION_ID_SIZE, Op, Status
from .exceptions import (
    AuthFailed,
    ConnectionLost,
    ServerError,
    TicketingError,
    UnsupportedVersion,
    error_for_status,
)
from .lock import Lock, LockContext
from .protocol import Request, Response

__all__ = ["Client"]

log = logging.getLogger("ticketing")


class Client:
    """A Ticketing client for threads. One connection, shared: many threads may call at once and
    their requests pipeline; a background reader thread dispatches answers by request id.

    ::

        with Client(["127.0.0.1:7070"], token="s3cret") as client:
            with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                use(lock.token)

    Arguments (all but ``endpoints`` keyword-only):

    - ``endpoints``: ``"host:port"`` or a list of them, tried in order; default ``127.0.0.1:7070``.
    - ``token``: the shared auth token (str or bytes); default None (no auth). With a token the
      client refuses a server that does not prove it holds the same token.
    - ``ssl``: an ``ssl.SSLContext`` to use TLS (``True``: the system's default trust); default
      None (plain TCP).
    - ``connect_timeout``: seconds to connect and finish the handshake with one endpoint;
      default 5.0; None waits forever.
    - ``request_timeout``: seconds to wait for an answer beyond the request's own wait (RELEASE,
      EXTEND, PING, INSPECT, or an ACQUIRE past its ``wait_timeout``); default 10.0; None waits
      forever.
    - ``max_redirects``: how often one call follows NOT_LEADER / SHUTTING_DOWN to another
      endpoint before giving up; default 8.
    - ``retry_backoff``: seconds slept before the second such retry, doubling up to 1 s;
      default 0.05.

    The client connects on first use (or :meth:`connect`). If the connection drops, calls in
    flight raise :class:`ConnectionLost` and the next call reconnects, trying the endpoints in
    order. A 16-byte random session id (:attr:`session_id`) is kept across reconnects.
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
        self._id_lock = threading.Lock()
        self._preferred = 0
        self._hint: Endpoint | None = None
        self._conn: Connection | None = None
        self._connect_lock = threading.Lock()
        self._locks_mutex = threading.Lock()
        self._locks: dict[int, Lock] = {}
        self._early_expired = RecentTokens()
        self._timers = Scheduler()
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect now (otherwise the first call does)."""
        self._connection()

    def close(self) -> None:
        """Close the connection. Calls in flight raise :class:`ConnectionLost`; locks still held
        stay held on the server until their lease ends, and are reported lost here (reason
        ``"closed"``) since this client can no longer extend or watch them."""
        with self._connect_lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close("client closed")
        with self._locks_mutex:
            locks = list(self._locks.values())
        for lock in locks:
            lock._set_lost("closed")
        self._timers.close()

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

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # --- locks --------------------------------------------------------------------------------

    def acquire(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *,
                keepalive: bool = False) -> Lock:
        """Acquire ``key`` for ``lease`` seconds, waiting in the key's FIFO queue up to
        ``wait_timeout`` seconds (None: without limit; 0: try once).

        Returns the held :class:`Lock`. Raises :class:`NotAcquired` when the wait timeout passed.
        With ``keepalive=True`` a background thread extends the lease every ~lease/3 until the
        lock is released or lost.
        """
        k = key_bytes(key)
        lm = lease_ms(lease)
        req = Request(op=Op.ACQUIRE, id=self._next_id(), lease_ms=lm, wait_ms=wait_ms(wait_timeout), key=k)
        resp, t_send = self._call(req, call_timeout(wait_timeout, self._request_timeout))
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        lock = Lock(self, key, k, resp.token, lm, resp.lease_ms,
                    t_send + (resp.detail + resp.lease_ms) / 1000)
        self._register(lock)
        lock._start(keepalive)
        return lock

    def try_acquire(self, key: KeyLike, lease: float, *, keepalive: bool = False) -> Lock:
        """Acquire ``key`` only if it is free now; raises :class:`NotAcquired` otherwise."""
        return self.acquire(key, lease, 0, keepalive=keepalive)

    def lock(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *,
             keepalive: bool = False) -> LockContext:
        """A context manager that acquires on entry and releases on exit::

            with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                use(lock.token)
        """
        return LockContext(self, key, lease, wait_timeout, keepalive)

    def release(self, key: KeyLike, token: int) -> None:
        """Release ``key`` held with ``token`` (from any client or thread). Raises
        :class:`NotHeld` when that token does not hold the key."""
        with self._locks_mutex:
            lock = self._locks.get(token)
        if lock is not None and lock._key_bytes == key_bytes(key):
            lock.release()
            return
        self._release(key_bytes(key), token)

    def extend(self, key: KeyLike, token: int, lease: float) -> float:
        """Set the lease of ``key`` held with ``token`` to ``lease`` seconds from now; returns the
        lease granted, in seconds. Raises :class:`NotHeld` when that token does not hold the key."""
        with self._locks_mutex:
            lock = self._locks.get(token)
        if lock is not None and lock._key_bytes == key_bytes(key):
            lock.extend(lease)
            return lock.lease
        resp, _ = self._extend(key_bytes(key), token, lease_ms(lease))
        return resp.lease_ms / 1000

    def ping(self) -> float:
        """Round trip to the server, in seconds."""
        resp, t_send = self._call(Request(op=Op.PING, id=self._next_id()), self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return time.monotonic() - t_send

    def inspect(self, key: KeyLike) -> KeyInfo:
        """What the server knows about ``key`` now: the holder's token (None when nobody holds
        it), the lease left, the acquires queued, how long it has been held, and the lock-delay
        left. Changes nothing; meant for operators and tests, not for deciding whether to acquire
        (the answer is stale the moment it arrives)."""
        req = Request(op=Op.INSPECT, id=self._next_id(), key=key_bytes(key))
        resp, _ = self._call(req, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return key_info(resp)

    # --- internals used by Lock ---------------------------------------------------------------

    def _release(self, key: bytes, token: int) -> None:
        req = Request(op=Op.RELEASE, id=self._next_id(), token=token, key=key)
        resp, _ = self._call(req, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)

    def _extend(self, key: bytes, token: int, ms: int) -> tuple[Response, float]:
        req = Request(op=Op.EXTEND, id=self._next_id(), token=token, lease_ms=ms, key=key)
        resp, t_send = self._call(req, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return resp, t_send

    def _register(self, lock: Lock) -> None:
        with self._locks_mutex:
            self._locks[lock.token] = lock
            expired = self._early_expired.pop(lock.token)
        if expired:
            lock._set_lost("expired")

    def _unregister(self, lock: Lock) -> None:
        with self._locks_mutex:
            if self._locks.get(lock.token) is lock:
                del self._locks[lock.token]

    def _on_expired(self, token: int, key: bytes) -> None:
        """EXPIRED notice (reader thread)."""
        with self._locks_mutex:
            lock = self._locks.get(token)
            if lock is None:
                self._early_expired.add(token)
        if lock is not None:
            lock._set_lost("expired")

    # --- requests, connections, failover ------------------------------------------------------

    def _next_id(self) -> int:
        with self._id_lock:
            return next(self._ids)

    def _call(self, req: Request, timeout: float | None) -> tuple[Response, float]:
        """Send ``req`` and wait for its answer, following NOT_LEADER and SHUTTING_DOWN (with the
        same request id, so a cluster can recognise the retry). Returns the answer and the
        monotonic time it was sent."""
        delay = self._retry_backoff
        attempt = 0
        while True:
            conn = self._connection()
            waiter = conn.send(req)
            try:
                resp = waiter.wait(timeout)
            except BaseException:
                conn.abandon(waiter)
                raise
            if resp.status == Status.NOT_LEADER:
                leader = resp.data.decode("utf-8", "replace")
                self._redirect(conn, leader)
            elif resp.status == Status.SHUTTING_DOWN:
                self._failover(conn)
            else:
                return resp, waiter.t_send
            attempt += 1
            if attempt > self._max_redirects:
                raise error_for_status(resp.status, resp.detail, resp.data)
            if attempt > 1:
                time.sleep(delay)
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
        with self._connect_lock:
            if hint is not None and hint in self._endpoints:
                self._preferred = self._endpoints.index(hint)
                self._hint = None
            elif hint is not None:
                self._hint = hint
            else:
                self._advance_locked(conn.endpoint)
            if self._conn is conn:
                self._conn = None
        conn.retire()

    def _failover(self, conn: Connection) -> None:
        """SHUTTING_DOWN: move on to the next endpoint."""
        with self._connect_lock:
            self._advance_locked(conn.endpoint)
            if self._conn is conn:
                self._conn = None
        conn.retire()

    def _advance_locked(self, current: Endpoint) -> None:
        """Prefer the endpoint after ``current``. self._connect_lock must be held."""
        if current in self._endpoints:
            self._preferred = (self._endpoints.index(current) + 1) % len(self._endpoints)
        self._hint = None

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        with self._connect_lock:
            if self._closed:
                raise ConnectionLost("the client is closed")
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            conn = self._dial_locked()
            self._conn = conn
            return conn

    def _dial_locked(self) -> Connection:
        """Try the leader hint, then every endpoint from the preferred one on, in order.
        self._connect_lock must be held."""
        n = len(self._endpoints)
        candidates = [self._endpoints[(self._preferred + i) % n] for i in range(n)]
        if self._hint is not None and self._hint not in candidates[:1]:
            candidates.insert(0, self._hint)
        errors: list[str] = []
        last: TicketingError | None = None
        for ep in candidates:
            try:
                conn = Connection.open(
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
        # Called from whichever thread closed it; a later call reconnects.
        if self._conn is conn:
            self._conn = None
