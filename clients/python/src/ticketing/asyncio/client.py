"""The asyncio client: one session and one connection shared by any number of tasks. Mirrors
:mod:`ticketing.client` of the blocking client."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl as _ssl
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType

from .. import _clock
from .._common import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    BUSY_HEARTBEAT,
    DEFAULT_CLEANUP_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_ENDPOINTS,
    DEFAULT_HEARTBEAT,
    DEFAULT_REQUEST_TIMEOUT,
    MAX_PING_WAIT,
    SILENT_SKIP,
    Endpoint,
    ForkAware,
    KeyInfo,
    KeyLike,
    RecentTokens,
    check_token,
    describe_wait,
    format_endpoint,
    heartbeat_due,
    key_bytes,
    key_info,
    lease_ms,
    lock_deadline,
    parse_endpoint,
    parse_endpoints,
    register_for_fork,
    seconds_option,
    seconds_required,
    ssl_context,
    token_bytes,
    wait_ms,
)
from .._session import Call, Event, Expired, Follow, Restarted, Session, release_in_background, run_callbacks
from ..client import (
    _MAX_HINTS,
    _after_failed_round,
    _election,
    _hint_of,
    _round_candidates,
    _needs_connection,
    _round_error,
    _round_text,
    _timeout_error,
)
from ..constants import LOST_CHECK_MS, InspectFlag, LostReason, Op, Status
from ..exceptions import (
    AlreadyHeld,
    ClientClosed,
    RequestTimeout,
    TicketingError,
    describe_key,
    error_for_status,
)
from ..protocol import Response, Welcome
from .connection import Connection, dial
from .lock import Lock, LockContext

__all__ = ["Client"]

log = logging.getLogger("ticketing")

#: Enum members as module globals: a class attribute of an Enum costs several times a global
#: lookup, and these are read for every request.
_ACQUIRE = Op.ACQUIRE
_OK = Status.OK
_TIMED_OUT = Status.TIMED_OUT


class Client(ForkAware):
    """A Ticketing client for asyncio: one session and one connection, shared by any number of
    tasks; requests pipeline and a reader task matches answers by request id.

    ::

        async with ticketing.asyncio.Client("127.0.0.1:7070", token="s3cret") as client:
            async with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                await use(lock.token)

    Arguments are those of the blocking :class:`ticketing.Client`, with the same defaults:
    ``endpoints`` (``"127.0.0.1:7070"``), ``token`` (None), ``ssl`` (None), ``server_hostname``
    (the endpoint's host), ``connect_timeout`` (5.0 s), ``request_timeout`` (10.0 s; None: no
    limit), ``heartbeat`` (2.0 s, 0.25 s while a request waits; a PING unanswered within
    min(heartbeat, 0.75 s) replaces the connection; 0 or None disables it), ``release_on_close``
    (False), ``cleanup_timeout`` (5.0 s: how long a cancelled acquire waits for its CANCEL
    answer and the release of a grant that raced it before the cancellation propagates, and how
    long :meth:`close` waits for the withdrawal of queued acquires).

    Cancelling a task that waits in :meth:`acquire` withdraws its place in the queue (CANCEL);
    if the lock was granted anyway, the client releases it: a cancelled wait never leaves a lock
    held. Use one client from one event loop. After ``os.fork()`` the child starts a new session
    and must use the client from a new event loop.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str] = DEFAULT_ENDPOINTS,
        *,
        token: str | bytes | None = None,
        ssl: _ssl.SSLContext | bool | None = None,
        server_hostname: str | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        request_timeout: float | None = DEFAULT_REQUEST_TIMEOUT,
        heartbeat: float | None = DEFAULT_HEARTBEAT,
        release_on_close: bool = False,
        cleanup_timeout: float = DEFAULT_CLEANUP_TIMEOUT,
    ) -> None:
        self._endpoints = parse_endpoints(endpoints)
        self._token = token_bytes(token)
        self._ssl = ssl_context(ssl)
        self._server_hostname = server_hostname
        self._connect_timeout = seconds_required("connect_timeout", connect_timeout)
        self._request_timeout = seconds_option("request_timeout", request_timeout)
        self._heartbeat = seconds_option("heartbeat", heartbeat, allow_zero=True) or 0.0
        self._close_timeout = self._request_timeout or DEFAULT_REQUEST_TIMEOUT  # release_on_close's bound
        self._release_on_close = bool(release_on_close)
        self._cleanup_timeout = seconds_required("cleanup_timeout", cleanup_timeout, allow_zero=True)
        self._init_state()
        register_for_fork(self)

    def _init_state(self) -> None:
        self._deadlines = _Deadlines()  # the calls' timeouts
        self._lost_timers = _Deadlines()  # the locks' lost signals
        self._session = Session()
        self._session.failover_limit = len(self._endpoints) - 1
        self._conn: Connection | None = None
        self._connector: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._settle: asyncio.Event | None = None  # close() waiting for withdrawn acquires
        self._preferred = 0
        self._hint: Endpoint | None = None
        self._silent: Endpoint | None = None  # the node whose connection was last found silent...
        self._silent_till = 0.0  # ...left out of connect rounds until then (time.monotonic())
        self._ever_connected = False
        self._down = False  # the session grace passed without a reconnect: nothing left to resume
        self._last_error = ""  # why the connection was lost or the last connect round failed
        self._last_round: TicketingError | None = None  # the last failed round's error; None after a success
        self._connect_calls: list[Call] = []  # connect()'s PINGs waiting for the next round
        self._grace_timer: asyncio.TimerHandle | None = None
        self._locks: dict[int, Lock] = {}
        self._lost_watch: asyncio.TimerHandle | None = None
        self._early_lost = RecentTokens()
        self._closed = False
        self._closing = False

    # --- lifecycle ----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect now (otherwise the first call does). Raises :class:`Unavailable`,
        :class:`AuthFailed`, :class:`TLSError`... when no endpoint can be connected to: the
        first connect round that fails ends it, also while the client is reconnecting (other
        calls then wait for the reconnect, each bounded by its own timeout). Before the first
        connection, a round in which a node answered NOT_LEADER (a cluster electing a leader, as
        when the application and the cluster start together) is retried at the shortest backoff
        until it connects or ``request_timeout`` has passed since the first such round began
        (then :class:`Unavailable`, the last round's error)."""
        await self._request(Call(Op.PING), self._connect_budget(), connect=True)

    async def close(self) -> None:
        """Close the client; bounded in time even when the server is frozen. Calls in flight
        raise :class:`ClientClosed`. Acquires still queued on the server are withdrawn first
        (CANCEL; a grant that races the withdrawal is released), waiting at most
        ``cleanup_timeout``: a closed client is never granted a lock it would hold until its
        session ends. Locks still held are *not* released (unless ``release_on_close``): the
        server keeps them until their lease ends, and their lost signal still fires at their
        local deadline."""
        if self._closed or self._closing:
            return
        self._closing = True
        held = [lk for lk in self._locks.values() if lk._is_held()]
        withdrawn = self._session.withdraw_acquires(
            lambda c: ClientClosed(f"the client was closed; the queued acquire was withdrawn ({c.describe()})"),
            _clock.now())
        self._flush_and_handle()
        if withdrawn:
            await self._wait_settled(withdrawn)
        if self._release_on_close and held:
            await self._release_all(held)
        self._closed = True
        self._session.close(lambda c: ClientClosed(f"the client was closed ({c.describe()})"))
        conn, self._conn = self._conn, None
        if self._grace_timer is not None:
            self._grace_timer.cancel()
        connector, self._connector = self._connector, None
        if connector is not None and connector is not asyncio.current_task():
            connector.cancel()
        for lock in list(self._locks.values()):
            lock._stop_keepalive()
        self._handle(self._session.take_finished(), [], None)
        if conn is not None:
            conn.close("client closed")
            try:
                await asyncio.wait_for(conn.wait_closed(), 1.0)
            except TimeoutError:
                pass

    aclose = close

    async def _wait_settled(self, calls: list[Call]) -> None:
        """Wait until the outcome of every withdrawn acquire in ``calls`` is known (and a raced
        grant released), at most ``cleanup_timeout``; the clean-up then goes on until the
        connection closes."""
        deadline = time.monotonic() + self._cleanup_timeout
        while not all(self._session.settled(c) for c in calls):
            if time.monotonic() >= deadline or self._conn is None:
                log.debug("close: %d withdrawn acquire(s) not settled", len(calls))
                return
            if self._settle is None:
                self._settle = asyncio.Event()
            self._settle.clear()
            try:
                await asyncio.wait_for(self._settle.wait(), min(deadline - time.monotonic(), 0.05))
            except TimeoutError:
                pass

    async def _release_all(self, locks: list[Lock]) -> None:
        """Release ``locks`` at once (pipelined), bounded by the request timeout in all (10 s
        when it is None: close is always bounded)."""
        calls: list[tuple[Lock, Call]] = []
        futs: list[asyncio.Future[None]] = []
        for lock in locks:
            call = Call(Op.RELEASE, key=lock._key_bytes, token=lock.token)
            try:
                futs.append(self._future_of(call))
                self._submit(call)
            except TicketingError:
                continue
            calls.append((lock, call))
        if futs:
            await asyncio.wait(futs, timeout=self._close_timeout)
        for lock, call in calls:
            if call.response is not None and call.response.status == Status.OK:
                lock._mark_released()
            else:
                log.warning("release on close of %s (token %d) did not finish", describe_key(lock._key_bytes),
                            lock.token)

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> bool:
        """A connection is up and its handshake done."""
        return self._conn is not None and self._session.ready

    @property
    def endpoint(self) -> str | None:
        """The ``host:port`` of the current connection, if any."""
        conn = self._conn
        return format_endpoint(conn.endpoint) if conn is not None else None

    @property
    def session_id(self) -> bytes:
        """This client's session id (16 random bytes; new after a server restart and in a
        forked child)."""
        return self._session.session_id

    @property
    def locks(self) -> list[Lock]:
        """The locks this client holds now (neither released nor lost)."""
        return [lk for lk in self._locks.values() if lk._is_held()]

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"connected to {self.endpoint}" if self.connected else "not connected"
        return f"<ticketing.asyncio.Client {state} session={self.session_id.hex()}>"

    # --- locks --------------------------------------------------------------------------------

    async def acquire(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *,
                      keepalive: bool = False, max_hold: float | None = None, refuse_held: bool = False) -> Lock:
        """Acquire ``key`` for ``lease`` seconds, waiting in the key's FIFO queue up to
        ``wait_timeout`` seconds (None: without limit; 0: try once).

        Returns the held :class:`Lock`. Raises :class:`NotAcquired` when the wait timeout passed,
        :class:`AlreadyHeld` with ``refuse_held=True`` when this client already holds ``key``
        (without it the call queues behind this client's own lock: the owner is the token, not
        the task). ``keepalive=True`` extends the lease every lease/3 in a background task until
        the lock is released or lost, for at most ``max_hold`` seconds (None: no cap).
        Cancelling the task withdraws the wait (see the class doc).

        Leases are float seconds: ``lease=30`` is 30 s (1 ms at least).
        """
        k = key_bytes(key)
        lm = lease_ms(lease)
        wm = wait_ms(wait_timeout)
        cap = seconds_option("max_hold", max_hold)
        if refuse_held and self._holds(k):
            raise AlreadyHeld(f"this client already holds key {describe_key(k)} (refuse_held=True)")
        call = Call(_ACQUIRE, k, 0, lm, wm)
        timeout = None if wait_timeout is None or self._request_timeout is None else wait_timeout + self._request_timeout
        resp = await self._request(call, timeout, cleanup_on_cancel=True)
        if resp.status != _OK:
            raise error_for_status(resp.status, resp.detail, resp.data,
                                   f"key {describe_key(k)}, lease {lm / 1000:g} s, {describe_wait(wait_timeout)}")
        return self._new_lock(key, k, call, resp, lm, keepalive, cap)

    async def try_acquire(self, key: KeyLike, lease: float, *, keepalive: bool = False,
                          max_hold: float | None = None, refuse_held: bool = False) -> Lock | None:
        """Acquire ``key`` only if it is free now: the :class:`Lock`, or None when it is taken."""
        k = key_bytes(key)
        lm = lease_ms(lease)
        cap = seconds_option("max_hold", max_hold)
        if refuse_held and self._holds(k):
            raise AlreadyHeld(f"this client already holds key {describe_key(k)} (refuse_held=True)")
        call = Call(_ACQUIRE, k, 0, lm, 0)
        resp = await self._request(call, self._request_timeout, cleanup_on_cancel=True)
        if resp.status == _TIMED_OUT:
            return None
        if resp.status != _OK:
            raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}, try once")
        return self._new_lock(key, k, call, resp, lm, keepalive, cap)

    def lock(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *, keepalive: bool = False,
             max_hold: float | None = None, refuse_held: bool = False, raise_on_lost: bool = True) -> LockContext:
        """An async context manager (and decorator of coroutine functions) that acquires on
        entry and releases on exit::

            async with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                await use(lock.token)

            @client.lock("daily-batch", lease=60, keepalive=True)
            async def batch() -> None: ...

        If the lock was lost while the body ran, leaving raises :class:`LockLost` (naming the
        reason) after the release. Pass ``raise_on_lost=False`` to opt out. An exception from
        the body wins over the lost report.
        """
        return LockContext(self, key, lease, wait_timeout, keepalive=keepalive, max_hold=max_hold,
                           refuse_held=refuse_held, raise_on_lost=raise_on_lost)

    async def release(self, key: KeyLike, token: int) -> None:
        """Release ``key`` held with ``token``, from any client or task (the owner is the
        token). Raises :class:`NotHeld` when that token does not hold the key."""
        k = key_bytes(key)
        check_token(token)
        resp = await self._request(Call(Op.RELEASE, key=k, token=token), self._request_timeout)
        lock = self._lock_for(k, token)
        if resp.status == Status.OK:
            if lock is not None:
                lock._mark_released()
            return
        if resp.status == Status.NOT_HELD and lock is not None:
            lock._set_lost(LostReason.NOT_HELD)
        raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}, token {token}")

    async def extend(self, key: KeyLike, token: int, lease: float) -> float:
        """Set the lease of ``key`` held with ``token`` to ``lease`` seconds from now, from any
        client; returns the lease granted, in seconds. Raises :class:`NotHeld` when that token
        does not hold the key."""
        k = key_bytes(key)
        check_token(token)
        lm = lease_ms(lease)
        call = Call(Op.EXTEND, key=k, token=token, lease_ms=lm)
        resp = await self._request(call, self._request_timeout)
        lock = self._lock_for(k, token)
        if resp.status == Status.OK:
            if lock is not None:
                lock._extended(call, resp)
            return resp.lease_ms / 1000
        if resp.status == Status.NOT_HELD and lock is not None:
            lock._set_lost(LostReason.NOT_HELD)
        raise error_for_status(resp.status, resp.detail, resp.data,
                               f"key {describe_key(k)}, token {token}, lease {lm / 1000:g} s")

    async def verify(self, key: KeyLike, token: int) -> bool:
        """Ask the server whether ``token`` holds ``key`` now (INSPECT with the token)."""
        k = key_bytes(key)
        check_token(token)
        resp = await self._request(Call(Op.INSPECT, key=k, token=token), self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}, token {token}")
        return bool(key_info(resp).flags & InspectFlag.TOKEN_MATCH)

    async def ping(self) -> float:
        """Round trip to the server, in seconds."""
        call = Call(Op.PING)
        resp = await self._request(call, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return max(0.0, _clock.now() - call.t_send)

    async def inspect(self, key: KeyLike) -> KeyInfo:
        """What the server knows about ``key`` now (see :class:`KeyInfo`). Changes nothing;
        meant for operators and tests, not for deciding whether to acquire (the answer is stale
        the moment it arrives). The holder's token is shown only to the session holding it."""
        k = key_bytes(key)
        resp = await self._request(Call(Op.INSPECT, key=k), self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}")
        return key_info(resp)

    # --- locks: internals ---------------------------------------------------------------------

    def _new_lock(self, key: KeyLike, k: bytes, call: Call, resp: Response, requested_ms: int, keepalive: bool,
                  max_hold: float | None) -> Lock:
        deadline = lock_deadline(call.t_first, resp.detail, resp.lease_ms)
        lock = Lock(self, key, k, resp.token, requested_ms, resp.lease_ms, deadline)
        if self._session.restarts != call.epoch:
            reason: str | None = LostReason.SERVER_RESTARTED
        else:
            reason = self._early_lost.pop(resp.token) if self._early_lost else None
        self._locks[resp.token] = lock
        if self._lost_watch is None:
            self._lost_watch = asyncio.get_running_loop().call_later(LOST_CHECK_MS / 1000, self._watch_locks)
        lock._start(keepalive and not self._closed, max_hold)
        if reason is not None:
            lock._set_lost(LostReason(reason))
        return lock

    def _watch_locks(self) -> None:
        """Every LOST_CHECK_MS while a lock is held: the loop's timers run on the monotonic
        clock, which stops while the host is suspended, so each lock's own timer may fire late
        after a resume; this look at the lock clock fires the lost signals due within that."""
        now = _clock.now()
        for lock in list(self._locks.values()):
            lock._watch(now)  # fires the lost signals due, arms the lost timers due soon
        self._lost_watch = None
        if self._locks:
            self._lost_watch = asyncio.get_running_loop().call_later(LOST_CHECK_MS / 1000, self._watch_locks)

    def _release_in_background(self, k: bytes, token: int) -> None:
        release_in_background(self._submit, k, token)

    def _holds(self, k: bytes) -> bool:
        return any(lk._key_bytes == k and lk._is_held() for lk in self._locks.values())

    def _lock_for(self, k: bytes, token: int) -> Lock | None:
        lock = self._locks.get(token)
        return lock if lock is not None and lock._key_bytes == k else None

    def _unregister(self, lock: Lock) -> None:
        if self._locks.get(lock.token) is lock:
            del self._locks[lock.token]

    # --- requests -----------------------------------------------------------------------------

    def _future_of(self, call: Call) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(_call: Call) -> None:
            if not fut.done():
                fut.set_result(None)

        call.callbacks.append(done)
        if call.done:
            done(call)
        return fut

    async def _request(self, call: Call, timeout: float | None, *, cleanup_on_cancel: bool = False,
                       connect: bool = False) -> Response:
        """Submit ``call`` and wait for its answer up to ``timeout`` seconds (``connect``: fail
        it with the next connect round that fails, see :meth:`connect`)."""
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        # _future_of, inlined for every request (the call is not done before its submit)
        fut: asyncio.Future[None] = loop.create_future()

        def done(_call: Call) -> None:
            if not fut.done():
                fut.set_result(None)

        call.callbacks.append(done)
        self._submit(call, connect=connect)
        conn = self._conn
        try:
            if conn is not None and conn.write_paused:
                async with asyncio.timeout_at(end):
                    await conn.drain()
            if not call.done:
                # One loop timer for every call's timeout (_Deadlines), not one per call: it
                # resolves ``fut`` at ``end``, and a call still not done then has timed out.
                if end is not None:
                    self._deadlines.add(loop, end, fut)
                await fut
                if not call.done:
                    raise TimeoutError
        except TimeoutError:
            if not call.done:
                self._session.abandon(call, _clock.now())
                self._flush_and_handle()
                err = self._timeout_error(call, timeout)
                raise err from err.__cause__  # the last connect error, if any; not asyncio's TimeoutError
        except asyncio.CancelledError:  # withdraw it, release a grant that raced it
            self._session.abandon(call, _clock.now())
            self._flush_and_handle()
            if cleanup_on_cancel:
                await self._wait_cleanup(call)
            raise
        if call.error is not None:
            raise call.error
        assert call.response is not None
        return call.response

    async def _wait_cleanup(self, call: Call) -> None:
        try:
            async with asyncio.timeout(self._cleanup_timeout):
                await self._future_of(call)
                if call.cleanup is not None:
                    await self._future_of(call.cleanup)
        except TimeoutError:
            log.debug("clean-up of a cancelled %s continues in the background", call.describe())

    def _timeout_error(self, call: Call, timeout: float | None) -> RequestTimeout:
        return _timeout_error(call, timeout, self.endpoint, self._endpoints, self._last_error, self._last_round)

    def _submit(self, call: Call, *, connect: bool = False) -> None:
        if self._closed or (self._closing and call.op != Op.RELEASE):
            raise ClientClosed(f"the client is closed ({call.describe()})")
        session = self._session
        conn = self._conn
        if conn is not None and session.ready and not session.out:
            # The usual request: its bytes straight to the transport (Session.submit_data).
            conn.write(session.submit_data(call, _clock.now()))
            if session.finished or session.events:  # as below (submit_data itself adds neither)
                self._handle(session.take_finished(), session.take_events(), conn)
            return
        session.submit(call, _clock.now())
        if not session.ready:
            # Before the first connection a call starts a round at once (and fails with it,
            # unless a node answered NOT_LEADER: an election, see _election_pause);
            # later it waits for the reconnect loop, which keeps its backoff (connect() excepted).
            if connect:
                self._connect_calls.append(call)
            self._ensure_connector(wake=connect or not self._ever_connected)
        # _flush_and_handle, inlined: usually only the write.
        conn = self._conn
        if session.out and conn is not None:
            conn.write(session.take_out())
        if session.finished or session.events:
            self._handle(session.take_finished(), session.take_events(), conn)

    def _flush_and_handle(self) -> None:
        """Write what the session queued, then run what finished."""
        self._flush()
        self._handle(self._session.take_finished(), self._session.take_events(), self._conn)

    def _flush(self) -> None:
        if self._session.out and self._conn is not None:
            self._conn.write(self._session.take_out())

    def _handle(self, finished: list[Call], events: list[Event], conn: Connection | None) -> None:
        """Act on session events, then run the callbacks of finished calls: locks are marked
        lost before the callers whose calls failed with them wake up."""
        for ev in events:
            if isinstance(ev, Expired):
                lock = self._locks.get(ev.token)
                if lock is None:
                    self._early_lost.add(ev.token, ev.reason)
                else:
                    lock._set_lost(ev.reason)
            elif isinstance(ev, Follow):
                self._follow(ev, conn)
            elif isinstance(ev, Restarted):
                locks = list(self._locks.values())
                self._early_lost.clear()
                log.warning("the server restarted (new state id): %d lock(s) lost", len(locks))
                for lock in locks:
                    lock._set_lost(LostReason.SERVER_RESTARTED)
        run_callbacks(finished)

    # --- the connection -----------------------------------------------------------------------

    def _on_frames(self, conn: Connection, frames: list[Response]) -> None:
        """Reader task: frames received on ``conn``."""
        if self._conn is not conn:
            return
        session = self._session
        now = conn.last_received  # when these frames arrived: one clock read per answer saved
        for frame in frames:
            session.on_response(frame, now)
        if session.out:
            conn.write(session.take_out())
        finished = session.finished
        session.finished = []
        if session.events:
            self._handle(finished, session.take_events(), conn)
        else:
            # Without events, only the callbacks (this runs for every answer).
            run_callbacks(finished)
        if self._settle is not None:
            self._settle.set()

    def _on_conn_closed(self, conn: Connection, reason: str) -> None:
        if self._conn is not conn:
            return
        self._conn = None
        self._session.connection_lost()
        self._last_error = f"{format_endpoint(conn.endpoint)}: {reason}"
        log.info("connection to %s lost: %s", format_endpoint(conn.endpoint), reason)
        if not self._closed:
            grace = self._session.grace
            if grace <= 0:
                self._session.grace_expired(f"connection lost ({reason}); the server keeps no session")
                self._down = True
            else:
                self._grace_timer = asyncio.get_running_loop().call_later(grace, self._grace_expired)
            self._ensure_connector(wake=True)
        self._handle(self._session.take_finished(), self._session.take_events(), None)

    def _grace_expired(self) -> None:
        if self._conn is not None or self._closed:
            return
        self._grace_timer = None
        self._down = True
        self._session.grace_expired(f"connection lost and not resumed within the session grace of "
                                    f"{self._session.grace:g} s (last error: {self._last_error})")
        self._handle(self._session.take_finished(), [], None)

    def _heartbeat_check(self, conn: Connection) -> None:
        """Timer: PING after ``heartbeat`` s of silence (at most BUSY_HEARTBEAT while any request
        waits); when a PING stays unanswered for min(heartbeat, MAX_PING_WAIT) the connection is
        given up as silent (a frozen node, a cut network): the client reconnects, trying the
        node just left last, and resumes; calls in flight keep waiting."""
        if self._conn is not conn or self._closed:
            return
        now = _clock.now()
        hb = self._session.heartbeat
        ping_wait = min(self._heartbeat, MAX_PING_WAIT)
        if hb is not None and now - hb.t_send >= ping_wait:
            dead = f"silent: no answer to a heartbeat PING within {ping_wait:g} s"
            self._advance(conn.endpoint)
            self._silent, self._silent_till = conn.endpoint, time.monotonic() + SILENT_SKIP
            log.info("connection to %s %s; reconnecting", format_endpoint(conn.endpoint), dead)
            conn.close(dead)
            return
        left = BUSY_HEARTBEAT
        if hb is None:
            left = heartbeat_due(self._heartbeat, bool(self._session.pending), now - conn.last_received)
            if left <= 0:
                hb = self._session.send_heartbeat(now)
                self._flush()
        # Look again at most BUSY_HEARTBEAT from now: a request made meanwhile shortens the interval.
        due = hb.t_send + ping_wait if hb is not None else now + min(left or BUSY_HEARTBEAT, BUSY_HEARTBEAT)
        asyncio.get_running_loop().call_later(max(due - now, 0.01), self._heartbeat_check, conn)

    def _follow(self, ev: Follow, conn: Connection | None) -> None:
        """GOAWAY, NOT_LEADER, or SHUTTING_DOWN with another endpoint: reconnect elsewhere."""
        if self._closed or conn is None or self._conn is not conn:
            return
        hint = None
        if ev.leader:
            try:
                hint = parse_endpoint(ev.leader)
            except TicketingError:
                log.warning("unusable leader address %r", ev.leader)
        if hint is not None:
            self._hint = hint
        else:
            self._advance(conn.endpoint)
        log.info("%s from %s: reconnecting to %s", ev.why, format_endpoint(conn.endpoint),
                 ev.leader or "the next endpoint")
        conn.close(f"{ev.why}: moving to {ev.leader or 'the next endpoint'}")

    def _advance(self, current: Endpoint) -> None:
        if current in self._endpoints:
            self._preferred = (self._endpoints.index(current) + 1) % len(self._endpoints)
        self._hint = None

    def _needs_connection(self) -> bool:
        """Somebody waits for the connection: a call, a held lock (to watch its state id), or,
        until the session grace has passed, the clean-up of abandoned calls."""
        return _needs_connection(self._session, self._locks.values(), self._down)

    def _ensure_connector(self, *, wake: bool) -> None:
        if self._closed:
            return
        if self._connector is None:
            self._wake = asyncio.Event()
            self._connector = asyncio.get_running_loop().create_task(self._connector_loop(),
                                                                    name="ticketing-connector")
        elif wake and self._wake is not None:
            self._wake.set()

    def _connect_budget(self) -> float | None:
        rt = self._request_timeout
        return None if rt is None else self._connect_timeout * (len(self._endpoints) + _MAX_HINTS) + rt

    async def _connector_loop(self) -> None:
        delay = BACKOFF_MIN
        electing_since: float | None = None  # when the first connect's rounds refused NOT_LEADER began
        try:
            while True:
                if self._closed or self._conn is not None or not self._needs_connection():
                    return
                started = time.monotonic()
                result = await self._dial_round()
                if isinstance(result, tuple):
                    if self._install(*result):
                        delay = BACKOFF_MIN
                    continue
                errors = result
                if self._closed:
                    return
                self._last_error = _round_text(errors)
                self._last_round = _round_error(errors)
                pause, electing_since = _after_failed_round(self._session, errors, self._ever_connected,
                                                            self._connect_calls, started, electing_since,
                                                            self._request_timeout)
                self._handle(self._session.take_finished(), [], None)
                if _election(errors):
                    delay = BACKOFF_MIN
                if pause is None:
                    pause = delay * random.uniform(0.5, 1.0)
                log.debug("connect round failed (%s); next in %.3f s", self._last_error, pause)
                if not self._closed and self._needs_connection() and self._wake is not None:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), pause)
                    except TimeoutError:
                        pass
                delay = min(delay * 2, BACKOFF_MAX)
        finally:
            if self._connector is asyncio.current_task():
                self._connector = None

    async def _dial_round(self) -> (tuple[Endpoint, asyncio.StreamReader, asyncio.StreamWriter, Welcome]
                                    | list[tuple[Endpoint, TicketingError]]):
        """Try the leader hint, then every endpoint from the preferred one on, once each (the
        node found silent lately left out)."""
        candidates, skip = _round_candidates(self._endpoints, self._preferred, self._hint,
                                             self._silent, self._silent_till)
        errors: list[tuple[Endpoint, TicketingError]] = []
        hints = 0
        i = 0
        while i < len(candidates):
            ep = candidates[i]
            i += 1
            if self._closed:
                return errors
            try:
                reader, writer, welcome = await dial(
                    ep, session_id=self._session.session_id, token=self._token, ssl_context=self._ssl,
                    server_hostname=self._server_hostname, timeout=self._connect_timeout,
                    probe_tls=not self._ever_connected)
            except TicketingError as e:
                log.debug("connecting to %s failed: %s", format_endpoint(ep), e)
                errors.append((ep, e))
                hint = _hint_of(e, ep) if hints < _MAX_HINTS else None
                if hint is not None and hint != skip:
                    candidates.insert(i, hint)
                    hints += 1
                continue
            return ep, reader, writer, welcome
        return errors

    def _install(self, ep: Endpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 welcome: Welcome) -> bool:
        """A handshake succeeded: apply the WELCOME and make the connection current. Returns
        False when the state id changed (redial at once with the new session id)."""
        if self._closed:
            writer.transport.abort()
            return True
        ok = self._session.welcome(welcome, _clock.now())
        conn: Connection | None = None
        if ok:
            conn = Connection(ep, reader, writer, welcome, on_frames=self._on_frames, on_closed=self._on_conn_closed)
            self._conn = conn
            if ep in self._endpoints:
                self._preferred = self._endpoints.index(ep)
            self._hint = None
            self._ever_connected = True
            self._down = False
            self._last_round = None
            self._connect_calls.clear()
            if self._grace_timer is not None:
                self._grace_timer.cancel()
                self._grace_timer = None
            conn.write(self._session.take_out())
            conn.start()
            if self._heartbeat > 0:
                asyncio.get_running_loop().call_later(min(self._heartbeat, BUSY_HEARTBEAT), self._heartbeat_check, conn)
            log.debug("connected to %s (resumed: %s)", format_endpoint(ep), welcome.resumed)
        else:
            writer.transport.abort()
        self._handle(self._session.take_finished(), self._session.take_events(), conn)
        return ok

    # --- fork ---------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """In a forked child: a new session; the parent's connection, tasks and locks stay the
        parent's (the child closes its copy of the socket without shutting it down)."""
        conn = self._conn
        closed = self._closed
        self._init_state()
        self._closed = closed
        if conn is not None:
            conn.forget_after_fork()


class _Timed:
    """A callback on :class:`_Deadlines` (:meth:`_Deadlines.call_at`); :meth:`cancel` stops it."""

    __slots__ = ("fn", "off")

    def __init__(self, fn: Callable[[], object]) -> None:
        self.fn = fn
        self.off = False  # cancelled or run

    def done(self) -> bool:
        return self.off

    def cancel(self) -> None:
        """Do not run the callback (if it has not run yet)."""
        self.off = True


class _Deadlines:
    """Instants on one loop timer, where a ``call_at`` per call or per lock would cost a timer
    handle, a heap push and a cancelled handle left in the loop's heap: :meth:`add` resolves a
    future at an instant (a call's timeout), :meth:`call_at` runs a callback (a lock's lost
    signal). Most instants come in order (the same request timeout, the same lease), so they go
    to a FIFO, the others to a heap. Entries done meanwhile are dropped lazily (from the FIFO's
    head at every add, and by a compaction when it grows)."""

    def __init__(self) -> None:
        self._fifo: deque[tuple[float, asyncio.Future[None] | _Timed]] = deque()
        self._heap: list[tuple[float, int, asyncio.Future[None] | _Timed]] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self._at = float("inf")  # when the timer fires
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it is on
        self._compact_at = 1024

    def add(self, loop: asyncio.AbstractEventLoop, when: float, fut: asyncio.Future[None] | _Timed) -> None:
        """Resolve ``fut`` (result None) at ``when`` on ``loop``'s clock unless it is done by
        then (a :class:`_Timed`: run its callback unless cancelled)."""
        fifo = self._fifo
        while fifo and fifo[0][1].done():
            fifo.popleft()
        if not fifo or fifo[-1][0] <= when:
            fifo.append((when, fut))
            if len(fifo) >= self._compact_at:
                self._fifo = fifo = deque(e for e in fifo if not e[1].done())
                self._compact_at = max(1024, 2 * len(fifo))
        else:
            heapq.heappush(self._heap, (when, next(self._seq), fut))
        if when < self._at or loop is not self._loop:
            self._schedule(loop, min(when, self._at))

    def call_at(self, loop: asyncio.AbstractEventLoop, when: float, fn: Callable[[], object]) -> _Timed:
        """Run ``fn()`` at ``when`` on ``loop``'s clock unless cancelled first."""
        timed = _Timed(fn)
        self.add(loop, when, timed)
        return timed

    def _schedule(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._loop = loop
        self._handle = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handle = None
        self._at = float("inf")
        now = loop.time()
        fifo, heap = self._fifo, self._heap
        due: list[asyncio.Future[None] | _Timed] = []
        while fifo and (fifo[0][0] <= now or fifo[0][1].done()):
            due.append(fifo.popleft()[1])
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            due.append(heapq.heappop(heap)[2])
        nxt = min(fifo[0][0] if fifo else float("inf"), heap[0][0] if heap else float("inf"))
        if nxt != float("inf"):
            self._schedule(loop, nxt)
        for item in due:
            if item.done():
                continue
            if isinstance(item, _Timed):
                item.off = True
                try:
                    item.fn()
                except Exception:
                    log.exception("timer callback failed")
            else:
                item.set_result(None)
