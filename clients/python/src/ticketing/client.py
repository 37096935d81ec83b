"""The blocking client: one session and one connection shared by any number of threads."""

from __future__ import annotations

import _thread
import logging
import os
import random
import ssl as _ssl
import threading
import time
from _thread import get_ident as _get_ident
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Protocol, TypeVar

from . import _clock
from ._common import (
    BACKOFF_MAX,
    BACKOFF_MIN,
    BUSY_HEARTBEAT,
    DEFAULT_CLEANUP_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_ENDPOINTS,
    DEFAULT_HEARTBEAT,
    DEFAULT_REQUEST_TIMEOUT,
    LOST_ARM_WITHIN,
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
    refused_not_leader,
    register_for_fork,
    seconds_option,
    seconds_required,
    ssl_context,
    token_bytes,
    wait_ms,
)
from ._session import Call, Event, Expired, Follow, Restarted, Session, release_in_background, run_callbacks
from ._timers import Scheduler, Timer
from .connection import Connection, _Transport, dial, releaser as _releaser, wait_for_done
from .constants import LOST_CHECK_MS, InspectFlag, LostReason, Op, Status
from .exceptions import (
    AlreadyHeld,
    AuthFailed,
    ClientClosed,
    NotHeld,
    NotLeader,
    RequestTimeout,
    TicketingError,
    TLSError,
    Unavailable,
    UnsupportedVersion,
    describe_key,
    error_for_status,
)
from .lock import Lock, LockContext
from .protocol import Response, Welcome

__all__ = ["Client"]

log = logging.getLogger("ticketing")

#: Enum members as module globals: a class attribute of an Enum costs several times a global
#: lookup, and these are read for every request.
_ACQUIRE = Op.ACQUIRE
_OK = Status.OK
_TIMED_OUT = Status.TIMED_OUT

T = TypeVar("T")

#: The main thread's id (``threading.main_thread().ident``, two Python calls per request saved):
#: a forked child's main thread is the thread that forked, so the child sets it anew.
_main_ident = threading.main_thread().ident


def _set_main_ident() -> None:
    global _main_ident
    _main_ident = threading.main_thread().ident


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_set_main_ident)

#: How many leader hints one reconnect round follows.
_MAX_HINTS = 3


class Client(ForkAware):
    """A Ticketing client for threads: one session and one connection, shared by any number of
    threads; requests pipeline and answers are matched by request id. A waiting thread other
    than the main thread reads the connection itself while no other thread does (no hand-off
    between threads per call); otherwise, and for the main thread, a reader thread reads.

    ::

        with ticketing.Client("127.0.0.1:7070", token="s3cret") as client:
            with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                use(lock.token)

    Arguments (all but ``endpoints`` keyword-only; durations are float seconds):

    - ``endpoints``: ``"host:port"`` or a list of them, tried in order (a leader hint first when
      the server gives one). Default ``"127.0.0.1:7070"``.
    - ``token``: the shared auth token (str or bytes). Default None (no auth). With a token the
      client refuses a server that cannot prove it holds the same token.
    - ``ssl``: an :class:`ssl.SSLContext` for TLS (``True``: the system's default trust); load a
      client certificate into it for mutual TLS. Default None (plain TCP).
    - ``server_hostname``: the name to verify the server's certificate against. Default: the
      endpoint's host.
    - ``connect_timeout``: TCP + TLS + handshake, per endpoint; once TCP is connected, TLS and
      the handshake get at most 2 s of it (a frozen node's kernel still accepts connections).
      Default 5.0.
    - ``request_timeout``: how long any call waits for its answer, not counting the time an
      ACQUIRE spends queued (its ``wait_timeout`` bounds that); a call made while the client
      has no connection waits for one within it (a short one fails fast). Default 10.0; None:
      no limit.
    - ``heartbeat``: after this long without receiving anything, send PING (after 0.25 s while
      any request waits); a PING unanswered within min(``heartbeat``, 0.75 s) gives the
      connection up as silent: the client reconnects and resumes, the calls in flight keep
      waiting; for 2 s that node is neither dialled nor followed as a leader hint (unless it is
      the only endpoint), then it is tried last. Default 2.0; 0 or None disables it.
    - ``release_on_close``: :meth:`close` releases every lock still held. Default False: locks
      stay held on the server until their lease ends.
    - ``cleanup_timeout``: how long an acquire interrupted while it waits (KeyboardInterrupt)
      waits for its CANCEL answer and the release of a grant that raced it, and how long
      :meth:`close` waits for the withdrawal of queued acquires. Default 5.0.

    The client connects on first use (or :meth:`connect`). If the connection drops it reconnects
    by itself (50 ms backoff doubling to 2 s, with jitter) and resumes its session: calls in
    flight are re-sent with their original request ids and a queued acquire keeps its place.
    A server that restarted (a new state id) loses every lock (reason ``"server restarted"``)
    and fails calls in flight with :class:`ServerRestarted`. After ``os.fork()`` the child
    starts a new session of its own.
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
        self._mu = threading.Lock()  # guards everything below, the session and the lock registry
        self._wake = threading.Condition(self._mu)  # the connector's backoff wait
        self._settle = threading.Condition(self._mu)  # close() waiting for withdrawn acquires
        self._session = Session()
        self._session.failover_limit = len(self._endpoints) - 1
        self._conn: Connection | None = None
        self._connector: threading.Thread | None = None
        self._dial_sock: object | None = None
        self._preferred = 0
        self._hint: Endpoint | None = None
        self._silent: Endpoint | None = None  # the node whose connection was last found silent...
        self._silent_till = 0.0  # ...left out of connect rounds until then (time.monotonic())
        self._ever_connected = False
        self._down = False  # the session grace passed without a reconnect: nothing left to resume
        self._last_error = ""  # why the connection was lost or the last connect round failed
        self._last_round: TicketingError | None = None  # the last failed round's error; None after a success
        self._connect_calls: list[Call] = []  # connect()'s PINGs waiting for the next round
        self._grace_timer: Timer | None = None
        self._locks: dict[int, Lock] = {}
        self._lost_watch: Timer | None = None
        # Locks whose lost timer is not armed yet, with their lost signal's time, in that order
        # (_new_lock): the lost watch arms each once it is due within LOST_ARM_WITHIN.
        self._unarmed: deque[tuple[float, Lock]] = deque()
        self._early_lost = RecentTokens()
        self._timers = Scheduler()
        self._closed = False
        self._closing = False

    # --- lifecycle ----------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect now (otherwise the first call does). Raises :class:`Unavailable`,
        :class:`AuthFailed`, :class:`TLSError`... when no endpoint can be connected to: the
        first connect round that fails ends it, also while the client is reconnecting (other
        calls then wait for the reconnect, each bounded by its own timeout). Before the first
        connection, a round in which a node answered NOT_LEADER (a cluster electing a leader, as
        when the application and the cluster start together) is retried at the shortest backoff
        until it connects or ``request_timeout`` has passed since the first such round began
        (then :class:`Unavailable`, the last round's error)."""
        self._request(Call(Op.PING), self._connect_budget(), connect=True)

    def close(self) -> None:
        """Close the client; bounded in time even when the server is frozen. Calls in flight
        raise :class:`ClientClosed`. Acquires still queued on the server are withdrawn first
        (CANCEL; a grant that races the withdrawal is released), waiting at most
        ``cleanup_timeout``: a closed client is never granted a lock it would hold until its
        session ends. Locks still held are *not* released (unless ``release_on_close``): the
        server keeps them until their lease ends, and their lost signal still fires at their
        local deadline."""
        with self._mu:
            if self._closed or self._closing:
                return
            self._closing = True
            held = [lk for lk in self._locks.values() if lk._is_held()]
            withdrawn = self._session.withdraw_acquires(
                lambda c: ClientClosed(f"the client was closed; the queued acquire was withdrawn ({c.describe()})"),
                _clock.now())
            self._flush_locked()
            finished = self._session.take_finished()
        self._handle(finished, [], None)
        if withdrawn:
            self._wait_settled(withdrawn)
        if self._release_on_close and held:
            self._release_all(held)
        with self._mu:
            self._closed = True
            self._session.close(lambda c: ClientClosed(f"the client was closed ({c.describe()})"))
            conn, self._conn = self._conn, None
            dial_sock, self._dial_sock = self._dial_sock, None
            if self._grace_timer is not None:
                self._grace_timer.cancel()
            self._wake.notify_all()
            locks = list(self._locks.values())
            finished = self._session.take_finished()
        _shutdown_any(dial_sock)
        if conn is not None:
            conn.close("client closed")
        for lock in locks:
            lock._stop_keepalive()
        self._handle(finished, [], None)

    def _wait_settled(self, calls: list[Call]) -> None:
        """Wait until the outcome of every withdrawn acquire in ``calls`` is known (and a raced
        grant released), at most ``cleanup_timeout``; the clean-up then goes on until the
        connection closes."""
        deadline = time.monotonic() + self._cleanup_timeout
        with self._mu:
            while not all(self._session.settled(c) for c in calls):
                left = deadline - time.monotonic()
                if left <= 0 or self._conn is None:
                    log.debug("close: %d withdrawn acquire(s) not settled", len(calls))
                    return
                self._settle.wait(min(left, 0.05))

    def _release_all(self, locks: list[Lock]) -> None:
        """Release ``locks`` at once (pipelined), bounded by the request timeout in all (10 s
        when it is None: close is always bounded)."""
        deadline = time.monotonic() + self._close_timeout
        pending: list[tuple[Lock, Call, threading.Event]] = []
        for lock in locks:
            call = Call(Op.RELEASE, key=lock._key_bytes, token=lock.token)
            ev = threading.Event()
            call.callbacks.append(_setter(ev))
            try:
                self._submit(call)
            except TicketingError:
                continue
            pending.append((lock, call, ev))
        for lock, call, ev in pending:
            if ev.wait(max(0.0, deadline - time.monotonic())) and call.response is not None and call.response.status == Status.OK:
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
        with self._mu:
            return [lk for lk in self._locks.values() if lk._is_held()]

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"connected to {self.endpoint}" if self.connected else "not connected"
        return f"<ticketing.Client {state} session={self.session_id.hex()}>"

    # --- locks --------------------------------------------------------------------------------

    def acquire(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *, keepalive: bool = False,
                max_hold: float | None = None, refuse_held: bool = False) -> Lock:
        """Acquire ``key`` for ``lease`` seconds, waiting in the key's FIFO queue up to
        ``wait_timeout`` seconds (None: without limit; 0: try once).

        Returns the held :class:`Lock`. Raises :class:`NotAcquired` when the wait timeout passed,
        :class:`AlreadyHeld` with ``refuse_held=True`` when this client already holds ``key``
        (without it the call queues behind this client's own lock: the owner is the token, not
        the thread). ``keepalive=True`` extends the lease every lease/3 in the background until
        the lock is released or lost, for at most ``max_hold`` seconds (None: no cap).

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
        resp = self._request(call, timeout, interruptible_cleanup=True)
        if resp.status != _OK:
            raise error_for_status(resp.status, resp.detail, resp.data,
                                   f"key {describe_key(k)}, lease {lm / 1000:g} s, {describe_wait(wait_timeout)}")
        return self._new_lock(key, k, call, resp, lm, keepalive, cap)

    def try_acquire(self, key: KeyLike, lease: float, *, keepalive: bool = False, max_hold: float | None = None,
                    refuse_held: bool = False) -> Lock | None:
        """Acquire ``key`` only if it is free now: the :class:`Lock`, or None when it is taken."""
        k = key_bytes(key)
        lm = lease_ms(lease)
        cap = None if max_hold is None else seconds_option("max_hold", max_hold)
        if refuse_held and self._holds(k):
            raise AlreadyHeld(f"this client already holds key {describe_key(k)} (refuse_held=True)")
        call = Call(_ACQUIRE, k, 0, lm, 0)
        resp = self._request(call, self._request_timeout, interruptible_cleanup=True)
        if resp.status == _TIMED_OUT:
            return None
        if resp.status != _OK:
            raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}, try once")
        return self._new_lock(key, k, call, resp, lm, keepalive, cap)

    def lock(self, key: KeyLike, lease: float, wait_timeout: float | None = None, *, keepalive: bool = False,
             max_hold: float | None = None, refuse_held: bool = False, raise_on_lost: bool = True) -> LockContext:
        """A context manager (and decorator) that acquires on entry and releases on exit::

            with client.lock("order-1234", lease=30, wait_timeout=5) as lock:
                use(lock.token)

            @client.lock("daily-batch", lease=60, keepalive=True)
            def batch() -> None: ...

        If the lock was lost while the body ran, leaving raises :class:`LockLost` (naming the
        reason) after the release: work that outlived its lock does not pass silently. Pass
        ``raise_on_lost=False`` to opt out (check ``lock.lost`` yourself). An exception from the
        body wins over the lost report.
        """
        return LockContext(self, key, lease, wait_timeout, keepalive=keepalive, max_hold=max_hold,
                           refuse_held=refuse_held, raise_on_lost=raise_on_lost)

    def release(self, key: KeyLike, token: int) -> None:
        """Release ``key`` held with ``token``, from any client or thread (the owner is the
        token). Raises :class:`NotHeld` when that token does not hold the key."""
        k = key_bytes(key)
        check_token(token)
        resp = self._request(Call(Op.RELEASE, key=k, token=token), self._request_timeout)
        lock = self._lock_for(k, token)
        if resp.status == Status.OK:
            if lock is not None:
                lock._mark_released()
            return
        if resp.status == Status.NOT_HELD and lock is not None:
            lock._set_lost(LostReason.NOT_HELD)
        raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}, token {token}")

    def extend(self, key: KeyLike, token: int, lease: float) -> float:
        """Set the lease of ``key`` held with ``token`` to ``lease`` seconds from now, from any
        client; returns the lease granted, in seconds. Raises :class:`NotHeld` when that token
        does not hold the key."""
        k = key_bytes(key)
        check_token(token)
        lm = lease_ms(lease)
        call = Call(Op.EXTEND, key=k, token=token, lease_ms=lm)
        resp = self._request(call, self._request_timeout)
        lock = self._lock_for(k, token)
        if resp.status == Status.OK:
            if lock is not None:
                lock._extended(call, resp)
            return resp.lease_ms / 1000
        if resp.status == Status.NOT_HELD and lock is not None:
            lock._set_lost(LostReason.NOT_HELD)
        raise error_for_status(resp.status, resp.detail, resp.data,
                               f"key {describe_key(k)}, token {token}, lease {lm / 1000:g} s")

    def verify(self, key: KeyLike, token: int) -> bool:
        """Ask the server whether ``token`` holds ``key`` now (INSPECT with the token)."""
        k = key_bytes(key)
        check_token(token)
        resp = self._request(Call(Op.INSPECT, key=k, token=token), self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}, token {token}")
        return bool(key_info(resp).flags & InspectFlag.TOKEN_MATCH)

    def ping(self) -> float:
        """Round trip to the server, in seconds."""
        call = Call(Op.PING)
        resp = self._request(call, self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data)
        return max(0.0, _clock.now() - call.t_send)

    def inspect(self, key: KeyLike) -> KeyInfo:
        """What the server knows about ``key`` now (see :class:`KeyInfo`). Changes nothing;
        meant for operators and tests, not for deciding whether to acquire (the answer is stale
        the moment it arrives). The holder's token is shown only to the session holding it."""
        k = key_bytes(key)
        resp = self._request(Call(Op.INSPECT, key=k), self._request_timeout)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data, f"key {describe_key(k)}")
        return key_info(resp)

    # --- locks: internals ---------------------------------------------------------------------

    def _new_lock(self, key: KeyLike, k: bytes, call: Call, resp: Response, requested_ms: int, keepalive: bool,
                  max_hold: float | None) -> Lock:
        deadline = lock_deadline(call.t_first, resp.detail, resp.lease_ms)
        lock = Lock(self, key, k, resp.token, requested_ms, resp.lease_ms, deadline)
        with self._mu:
            if self._session.restarts != call.epoch:
                reason: str | None = LostReason.SERVER_RESTARTED
            else:
                reason = self._early_lost.pop(resp.token) if self._early_lost else None
            self._locks[resp.token] = lock
            if self._lost_watch is None:
                self._lost_watch = self._timers.call_later(LOST_CHECK_MS / 1000, self._watch_locks)
            # The lost timer waits for the lost watch when the signal is further away than
            # LOST_ARM_WITHIN (most locks are released before: no timer entry, no cancellation)
            # and comes no earlier than the last unarmed lock's (the watch looks at the head
            # only); else it is armed now. Locks released or lost leave from the head.
            unarmed = self._unarmed
            while unarmed and not unarmed[0][1]._is_held():
                unarmed.popleft()
            fire = lock._fire_at
            arm = fire - _clock.now() < LOST_ARM_WITHIN or bool(unarmed and unarmed[-1][0] > fire)
            if not arm:
                unarmed.append((fire, lock))
            keepalive = keepalive and not self._closed
        if arm or keepalive:  # (else _start has nothing to do: the usual lock)
            lock._start(keepalive, max_hold, arm)
        if reason is not None:
            lock._set_lost(LostReason(reason))
        return lock

    def _watch_locks(self) -> None:
        """Every LOST_CHECK_MS while a lock is held. The timer thread waits on the monotonic
        clock, which stops while the host is suspended; this timer keeps its waits that short, so
        that after a resume the thread sees the lock clock's jump and fires the lost signals
        that came due (each lock's own timer) within LOST_CHECK_MS. It also arms the lost timer
        of each lock left unarmed (_new_lock) once its signal is due within LOST_ARM_WITHIN."""
        due: list[Lock] = []
        with self._mu:
            self._lost_watch = None
            if self._locks:
                self._lost_watch = self._timers.call_later(LOST_CHECK_MS / 1000, self._watch_locks)
            unarmed = self._unarmed
            if unarmed:
                now = _clock.now()
                while unarmed:
                    fire, lock = unarmed[0]
                    held = lock._is_held()
                    if held and fire - now >= LOST_ARM_WITHIN:
                        break
                    unarmed.popleft()
                    if held:
                        due.append(lock)
        for lock in due:
            lock._arm()

    def _release_in_background(self, k: bytes, token: int) -> None:
        release_in_background(self._submit, k, token)

    def _holds(self, k: bytes) -> bool:
        with self._mu:
            return any(lk._key_bytes == k and lk._is_held() for lk in self._locks.values())

    def _lock_for(self, k: bytes, token: int) -> Lock | None:
        with self._mu:
            lock = self._locks.get(token)
        return lock if lock is not None and lock._key_bytes == k else None

    def _unregister(self, lock: Lock) -> None:
        with self._mu:
            if self._locks.get(lock.token) is lock:
                del self._locks[lock.token]

    # --- requests -----------------------------------------------------------------------------

    def _request(self, call: Call, timeout: float | None, *, interruptible_cleanup: bool = False,
                 connect: bool = False) -> Response:
        """Submit ``call`` and wait for its answer up to ``timeout`` seconds (``connect``: fail
        it with the next connect round that fails, see :meth:`connect`)."""
        # A thread other than the main thread reads its own answer while no other thread reads
        # (Connection.wait_answer): no hand-off from the reader thread. The main thread, where a
        # KeyboardInterrupt lands, leaves the reading to the reader thread.
        done: _thread.LockType | None = None
        solo: Connection | None = None
        if _get_ident() == _main_ident:
            # A plain lock taken once and released by the answer's callback: a cheaper wake-up
            # than threading.Event (no Condition, no waiter list). Registered before the submit:
            # the main thread wakes only once the callbacks run, after the answer's events (a
            # lock lost) were handled.
            done = _thread.allocate_lock()
            done.acquire()
            call.callbacks.append(_releaser(done))
            conn = self._submit(call, connect=connect)
        else:
            # Other threads make their wake-up lock only when they have to wait for another
            # thread (wait_for_done, Connection.wait_answer): a caller that reads its own answer,
            # as every caller does while it is alone, needs none. A lone caller (nobody sends,
            # nobody reads, nothing queued) claims both roles with its request id, under the
            # lock (Connection.claim_solo), then sends and reads in one step (solo_round).
            with self._mu:
                self._refuse_closed_locked(call)
                session = self._session
                current = self._conn
                if current is not None and session.ready and not session.out and current.claim_solo():
                    try:
                        data = session.submit_data(call, _clock.now())
                    except BaseException:  # (the arguments were checked: not expected)
                        current.abort_solo()
                        raise
                    solo = current
            if solo is None:
                conn = self._submit(call, connect=connect, lead=True)
        try:
            if solo is not None:
                answered = solo.solo_round(call, data, timeout)
            elif conn is not None:
                answered = conn.wait_answer(call, timeout)
            elif done is not None:
                answered = done.acquire(True, -1 if timeout is None else timeout)
            else:
                answered = wait_for_done(call, timeout)
        except BaseException:  # KeyboardInterrupt: withdraw it, release a grant that raced it
            self._locked(lambda: self._session.abandon(call, _clock.now()))
            if interruptible_cleanup:
                self._wait_cleanup(call)
            raise
        if not answered:
            gave_up = self._locked(lambda: self._give_up(call))
            if gave_up:
                raise self._timeout_error(call, timeout)
        if call.error is not None:
            raise call.error
        assert call.response is not None
        return call.response

    def _give_up(self, call: Call) -> bool:
        """With the lock held: abandon ``call`` unless it finished meanwhile."""
        if call.done:
            return False
        self._session.abandon(call, _clock.now())
        return True

    def _wait_cleanup(self, call: Call) -> None:
        deadline = time.monotonic() + self._cleanup_timeout
        ev = threading.Event()
        call.callbacks.append(lambda _c: ev.set())
        if call.done:
            ev.set()
        if not ev.wait(max(0.0, deadline - time.monotonic())):
            return
        cleanup = call.cleanup
        if cleanup is not None:
            ev2 = threading.Event()
            cleanup.callbacks.append(lambda _c: ev2.set())
            if cleanup.done:
                ev2.set()
            ev2.wait(max(0.0, deadline - time.monotonic()))

    def _timeout_error(self, call: Call, timeout: float | None) -> RequestTimeout:
        with self._mu:
            return _timeout_error(call, timeout, self.endpoint, self._endpoints, self._last_error, self._last_round)

    def _refuse_closed_locked(self, call: Call) -> None:
        """Raise ClientClosed for ``call`` once the client is closed (or closing: a RELEASE still
        goes out). The lock must be held."""
        if self._closed or (self._closing and call.op != Op.RELEASE):
            raise ClientClosed(f"the client is closed ({call.describe()})")

    def _submit(self, call: Call, *, connect: bool = False, lead: bool = False) -> Connection | None:
        """Queue ``call`` and send it from this thread when possible. With ``lead`` (the caller
        waits for the answer on a thread that may read), returns the connection to read it on
        with :meth:`Connection.wait_answer` (None: wait for the callback); else the reader
        thread is told that an answer is coming."""
        with self._mu:
            self._refuse_closed_locked(call)
            session = self._session
            current = self._conn
            if current is not None and session.ready and not session.out:
                # The usual request: its bytes go straight to the connection, in id order (this
                # thread holds the lock until write_claim has them), without passing through
                # session.out (Session.submit_data).
                data = current.write_claim(session.submit_data(call, _clock.now()))
            else:
                session.submit(call, _clock.now())
                if not session.ready:
                    # Before the first connection a call starts a round at once (and fails with
                    # it, unless a node answered NOT_LEADER: an election, see _election_pause);
                    # later it waits for the reconnect loop, which keeps its backoff (connect()
                    # excepted).
                    if connect:
                        self._connect_calls.append(call)
                    self._ensure_connector_locked(wake=connect or not self._ever_connected)
                data = None
                if current is not None and session.out:
                    data = current.write_claim(session.take_out())
        if data is not None:
            assert current is not None
            current.send_claimed(data)  # from this thread, outside the lock (Connection.write_claim)
        if current is None:
            return None
        if lead and current.shared_reading:
            return current
        current.kick()
        return None

    def _locked(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the lock, write what it queued, then run what finished."""
        with self._mu:
            result = fn()
            self._flush_locked()
            finished = self._session.take_finished()
            events = self._session.take_events()
            conn = self._conn
        self._handle(finished, events, conn)
        return result

    def _flush_locked(self) -> None:
        if self._session.out and self._conn is not None:
            self._conn.write(self._session.take_out())

    def _handle(self, finished: list[Call], events: list[Event], conn: Connection | None) -> None:
        """Act on session events, then run the callbacks of finished calls (never under the lock):
        locks are marked lost before the callers whose calls failed with them wake up."""
        for ev in events:
            if isinstance(ev, Expired):
                with self._mu:
                    lock = self._locks.get(ev.token)
                    if lock is None:
                        self._early_lost.add(ev.token, ev.reason)
                if lock is not None:
                    lock._set_lost(ev.reason)
            elif isinstance(ev, Follow):
                self._follow(ev, conn)
            elif isinstance(ev, Restarted):
                with self._mu:
                    locks = list(self._locks.values())
                    self._early_lost.clear()
                log.warning("the server restarted (new state id): %d lock(s) lost", len(locks))
                for lock in locks:
                    lock._set_lost(LostReason.SERVER_RESTARTED)
        run_callbacks(finished)

    # --- the connection -----------------------------------------------------------------------

    def _on_frames(self, conn: Connection, frames: list[Response]) -> None:
        """Reader thread: frames received on ``conn``."""
        with self._mu:
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
            events = session.events
            if events:
                session.events = []
            if self._closing:
                self._settle.notify_all()
        if events:
            self._handle(finished, events, conn)
            return
        # Without events, only the callbacks (this runs for every answer); a caller that read
        # its own answer registered none (Connection.wait_answer).
        for call in finished:
            if call.callbacks:
                run_callbacks(finished)
                return

    def _on_conn_closed(self, conn: Connection, reason: str) -> None:
        with self._mu:
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
                    self._grace_timer = self._timers.call_later(grace, self._grace_expired)
                self._ensure_connector_locked(wake=True)
            finished = self._session.take_finished()
            events = self._session.take_events()
        self._handle(finished, events, None)

    def _grace_expired(self) -> None:
        with self._mu:
            if self._conn is not None or self._closed:
                return
            self._grace_timer = None
            self._down = True
            self._session.grace_expired(f"connection lost and not resumed within the session grace of "
                                        f"{self._session.grace:g} s (last error: {self._last_error})")
            finished = self._session.take_finished()
        self._handle(finished, [], None)

    def _heartbeat_check(self, conn: Connection) -> None:
        """Timer: PING after ``heartbeat`` s of silence (at most BUSY_HEARTBEAT while any request
        waits); when a PING stays unanswered for min(heartbeat, MAX_PING_WAIT) the connection is
        given up as silent (a frozen node, a cut network): the client reconnects, trying the
        node just left last, and resumes; calls in flight keep waiting."""
        dead = ""
        with self._mu:
            if self._conn is not conn or self._closed:
                return
            now = _clock.now()
            hb = self._session.heartbeat
            ping_wait = min(self._heartbeat, MAX_PING_WAIT)
            if hb is not None and now - hb.t_send >= ping_wait:
                dead = f"silent: no answer to a heartbeat PING within {ping_wait:g} s"
                self._advance_locked(conn.endpoint)
                self._silent, self._silent_till = conn.endpoint, time.monotonic() + SILENT_SKIP
            else:
                left = BUSY_HEARTBEAT
                if hb is None:
                    left = heartbeat_due(self._heartbeat, bool(self._session.pending), now - conn.last_received)
                    if left <= 0:
                        hb = self._session.send_heartbeat(now)
                        self._flush_locked()
                # Look again at most BUSY_HEARTBEAT from now: a request made meanwhile shortens
                # the interval.
                due = hb.t_send + ping_wait if hb is not None else now + min(left or BUSY_HEARTBEAT, BUSY_HEARTBEAT)
                self._timers.call_at(max(due, now + 0.01), lambda: self._heartbeat_check(conn))
        if dead:
            log.info("connection to %s %s; reconnecting", format_endpoint(conn.endpoint), dead)
            conn.close(dead)

    def _follow(self, ev: Follow, conn: Connection | None) -> None:
        """GOAWAY, NOT_LEADER, or SHUTTING_DOWN with another endpoint: reconnect elsewhere."""
        with self._mu:
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
                self._advance_locked(conn.endpoint)
        log.info("%s from %s: reconnecting to %s", ev.why, format_endpoint(conn.endpoint),
                 ev.leader or "the next endpoint")
        conn.close(f"{ev.why}: moving to {ev.leader or 'the next endpoint'}")

    def _advance_locked(self, current: Endpoint) -> None:
        if current in self._endpoints:
            self._preferred = (self._endpoints.index(current) + 1) % len(self._endpoints)
        self._hint = None

    def _needs_connection_locked(self) -> bool:
        """Somebody waits for the connection: a call, a held lock (to watch its state id), or,
        until the session grace has passed, the clean-up of abandoned calls."""
        return _needs_connection(self._session, self._locks.values(), self._down)

    def _ensure_connector_locked(self, *, wake: bool) -> None:
        if self._closed:
            return
        if self._connector is None:
            self._connector = threading.Thread(target=self._connector_loop, name="ticketing-connector", daemon=True)
            self._connector.start()
        elif wake:
            self._wake.notify_all()

    def _connect_budget(self) -> float | None:
        rt = self._request_timeout
        return None if rt is None else self._connect_timeout * (len(self._endpoints) + _MAX_HINTS) + rt

    def _connector_loop(self) -> None:
        delay = BACKOFF_MIN
        electing_since: float | None = None  # when the first connect's rounds refused NOT_LEADER began
        while True:
            with self._mu:
                if self._closed or self._conn is not None or not self._needs_connection_locked():
                    self._connector = None
                    return
            started = time.monotonic()
            result = self._dial_round()
            if isinstance(result, tuple):
                if self._install(*result):
                    delay = BACKOFF_MIN
                continue
            errors = result
            with self._mu:
                if self._closed:
                    self._connector = None
                    return
                self._last_error = _round_text(errors)
                self._last_round = _round_error(errors)
                pause, electing_since = _after_failed_round(self._session, errors, self._ever_connected,
                                                            self._connect_calls, started, electing_since,
                                                            self._request_timeout)
                finished = self._session.take_finished()
            self._handle(finished, [], None)
            if _election(errors):
                delay = BACKOFF_MIN
            if pause is None:
                pause = delay * random.uniform(0.5, 1.0)
            log.debug("connect round failed (%s); next in %.3f s", self._last_error, pause)
            with self._mu:
                if not self._closed and self._needs_connection_locked():
                    self._wake.wait(pause)
            delay = min(delay * 2, BACKOFF_MAX)

    def _dial_round(self) -> tuple[Endpoint, _Transport, bytes, Welcome] | list[tuple[Endpoint, TicketingError]]:
        """Try the leader hint, then every endpoint from the preferred one on, once each (the
        node found silent lately left out)."""
        with self._mu:
            candidates, skip = _round_candidates(self._endpoints, self._preferred, self._hint,
                                                 self._silent, self._silent_till)
        errors: list[tuple[Endpoint, TicketingError]] = []
        hints = 0
        i = 0
        while i < len(candidates):
            ep = candidates[i]
            i += 1
            with self._mu:
                if self._closed:
                    return errors
                sid = self._session.session_id
            try:
                transport, leftover, welcome = dial(
                    ep, session_id=sid, token=self._token, ssl_context=self._ssl,
                    server_hostname=self._server_hostname, timeout=self._connect_timeout,
                    on_socket=self._set_dial_sock, probe_tls=not self._ever_connected)
            except TicketingError as e:
                log.debug("connecting to %s failed: %s", format_endpoint(ep), e)
                errors.append((ep, e))
                hint = _hint_of(e, ep) if hints < _MAX_HINTS else None
                if hint is not None and hint != skip:
                    candidates.insert(i, hint)
                    hints += 1
                continue
            return ep, transport, leftover, welcome
        return errors

    def _set_dial_sock(self, sock: object | None) -> None:
        with self._mu:
            self._dial_sock = sock
            closed = self._closed
        if closed:
            _shutdown_any(sock)

    def _install(self, ep: Endpoint, transport: _Transport, leftover: bytes, welcome: Welcome) -> bool:
        """A handshake succeeded: apply the WELCOME and make the connection current. Returns
        False when the state id changed (redial at once with the new session id)."""
        with self._mu:
            if self._closed:
                _shutdown_any(transport.sock)
                return True
            now = _clock.now()
            ok = self._session.welcome(welcome, now)
            conn: Connection | None = None
            if ok:
                conn = Connection(ep, transport, leftover, welcome, on_frames=self._on_frames,
                                  on_closed=self._on_conn_closed)
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
                    self._timers.call_later(min(self._heartbeat, BUSY_HEARTBEAT), lambda: self._heartbeat_check(conn))
                log.debug("connected to %s (resumed: %s)", format_endpoint(ep), welcome.resumed)
            finished = self._session.take_finished()
            events = self._session.take_events()
        if not ok:
            _shutdown_any(transport.sock)
        self._handle(finished, events, conn)
        return ok

    # --- fork ---------------------------------------------------------------------------------

    def _after_fork_in_child(self) -> None:
        """In a forked child: a new session; the parent's connection, threads and locks stay the
        parent's (the child closes its copy of the socket without shutting it down)."""
        conn = self._conn
        closed = self._closed
        self._init_state()
        self._closed = closed
        if conn is not None:
            conn.forget_after_fork()


def _setter(ev: threading.Event) -> Callable[[Call], None]:
    return lambda _call: ev.set()


def _shutdown_any(sock: object | None) -> None:
    import socket

    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            sock.close()
        except OSError:
            pass


# --- shared by the blocking and the asyncio client -------------------------------------------


def _round_candidates(endpoints: Sequence[Endpoint], preferred: int, hint: Endpoint | None,
                      silent: Endpoint | None, silent_till: float) -> tuple[list[Endpoint], Endpoint | None]:
    """A connect round's targets: the leader hint, then every endpoint from the preferred one
    on; and the node to skip, as a target and as a hint met in the round: the one found silent
    less than SILENT_SKIP ago (docs/clients.md, rule 1), unless it is the only endpoint."""
    skip = silent if len(endpoints) > 1 and time.monotonic() < silent_till else None
    n = len(endpoints)
    candidates = [ep for ep in (endpoints[(preferred + i) % n] for i in range(n)) if ep != skip and ep != hint]
    if hint is not None and hint != skip:
        candidates.insert(0, hint)
    return candidates, skip


def _hint_of(e: TicketingError, ep: Endpoint) -> Endpoint | None:
    """The leader hint of a connect refused NOT_LEADER by ``ep``, if it names another node."""
    nl = refused_not_leader(e)
    if nl is None or not nl.leader:
        return None
    try:
        hint = parse_endpoint(nl.leader)
    except TicketingError:
        log.warning("unusable leader address %r from %s", nl.leader, format_endpoint(ep))
        return None
    return hint if hint != ep else None


def _election(errors: list[tuple[Endpoint, TicketingError]]) -> bool:
    """A node of the round answered "not the leader": the cluster is electing one, which takes
    well under a second, so the next round comes after the shortest pause rather than a backoff
    grown as from a dead server (as clients/go does)."""
    return any(refused_not_leader(e) is not None for _ep, e in errors)


def _election_pause(errors: list[tuple[Endpoint, TicketingError]], ever_connected: bool, since: float,
                    request_timeout: float | None) -> float | None:
    """Before the first connection, a failed round in which a node answered NOT_LEADER (and no
    error that no retry fixes) is a cluster electing a leader, as when the application and the
    cluster start together: the calls waiting for the first connection keep waiting, and the next
    round comes after the shortest pause (with jitter), until ``request_timeout`` (None: no
    limit) has passed since the first such round began (``since``). Returns that pause, or None
    when the round fails what waits for it (see :func:`_round_failed`). As clients/go Dial."""
    if ever_connected or not _election(errors) or not isinstance(_round_error(errors), Unavailable):
        return None
    pause = BACKOFF_MIN * random.uniform(0.5, 1.0)
    if request_timeout is not None and time.monotonic() + pause - since >= request_timeout:
        return None
    return pause


def _round_failed(session: Session, errors: list[tuple[Endpoint, TicketingError]], ever_connected: bool,
                  connect_calls: list[Call]) -> None:
    """A connect round failed. Once connected, calls keep waiting for the reconnect (the loop
    retries with backoff), each bounded by its own timeout (docs/clients.md, rule 1); only an
    error that no retry fixes (auth, protocol version) fails them, those sent too, and an
    explicit ``connect()`` (``connect_calls``) ends with the round. Before the first connection,
    a failed round fails the calls waiting for it at once: the endpoints are wrong or down, and
    there is no session to resume (a round in which a node answered NOT_LEADER excepted, until
    the request timeout: see :func:`_election_pause`)."""
    fatal = any(isinstance(e, (AuthFailed, UnsupportedVersion)) for _ep, e in errors)
    if fatal or not ever_connected:
        session.fail_waiting(lambda _call: _round_error(errors), backlog=True)
    for call in connect_calls:
        session.fail_unsent(call, _round_error(errors))
    connect_calls.clear()


def _after_failed_round(session: Session, errors: list[tuple[Endpoint, TicketingError]], ever_connected: bool,
                        connect_calls: list[Call], started: float, electing_since: float | None,
                        request_timeout: float | None) -> tuple[float | None, float | None]:
    """A connect round that began at ``started`` failed: either the calls keep waiting out an
    election (:func:`_election_pause`) or the round fails what waits for it (:func:`_round_failed`).
    Returns the election's pause (None: none) and when the election's first round began (None:
    no election), for the next round."""
    since = started if electing_since is None else electing_since
    pause = _election_pause(errors, ever_connected, since, request_timeout)
    if pause is None:
        _round_failed(session, errors, ever_connected, connect_calls)
        return None, None
    return pause, since


class _Held(Protocol):
    def _is_held(self) -> bool: ...


def _needs_connection(session: Session, locks: Iterable[_Held], down: bool) -> bool:
    """Somebody waits for the connection: a call, a held lock (to watch its state id), or,
    until the session grace has passed (``down``), the clean-up of abandoned calls."""
    def wanted(c: Call) -> bool:
        return not (c.abandoned or c.internal) or not down

    return bool(any(lk._is_held() for lk in locks) or any(wanted(c) for c in session.backlog)
                or any(wanted(c) for c in session.pending.values()))


def _round_text(errors: list[tuple[Endpoint, TicketingError]]) -> str:
    return "; ".join(f"{format_endpoint(ep)}: {e}" if format_endpoint(ep) not in str(e) else str(e)
                     for ep, e in errors) or "closed"


def _timeout_error(call: Call, timeout: float | None, endpoint: str | None, endpoints: list[Endpoint],
                   last_error: str, last_round: TicketingError | None) -> RequestTimeout:
    """A call's own timeout passed. Connected: no answer from the server. Not connected (the
    client is reconnecting): still a timeout, naming the last connect error (its ``__cause__``
    when a connect round failed)."""
    within = f"within {timeout:g} s ({call.describe()})"
    if endpoint is not None:
        return RequestTimeout(f"no answer from {endpoint} {within}")
    why = f"; last error: {last_error}" if last_error else ""
    if call.id == 0:
        where = ", ".join(format_endpoint(ep) for ep in endpoints)
        err = RequestTimeout(f"no connection to {where} {within}{why}")
    else:
        err = RequestTimeout(f"no answer {within}: the connection was lost and not re-established{why}")
    err.__cause__ = last_round
    return err


def _round_error(errors: list[tuple[Endpoint, TicketingError]]) -> TicketingError:
    """The error for a failed connect round: the most telling kind, with every endpoint's error.
    An :class:`Unavailable` has as its ``__cause__`` the last :class:`NotLeader` refusal if a
    node refused as not the leader, else the last endpoint's error."""
    if not errors:
        return ClientClosed("the client is closed")
    for kind in (AuthFailed, UnsupportedVersion, TLSError):
        for _ep, e in errors:
            if isinstance(e, kind):
                return _rebuild(e)
    if len(errors) == 1 and not isinstance(errors[0][1], Unavailable):
        return _rebuild(errors[0][1])
    text = "; ".join(str(e) if isinstance(e, Unavailable) else f"{format_endpoint(ep)}: {e}" for ep, e in errors)
    err = Unavailable(f"could not connect to any endpoint: {text}")
    refusals = [nl for _ep, e in errors if (nl := refused_not_leader(e)) is not None]
    err.__cause__ = refusals[-1] if refusals else errors[-1][1]
    return err


def _rebuild(e: TicketingError) -> TicketingError:
    """A fresh exception equal to ``e`` (one per waiting caller, never shared between threads)."""
    from .exceptions import ServerError

    if isinstance(e, NotLeader):
        return NotLeader(e.message, status=e.status, detail=e.detail, context=e.context, leader=e.leader)
    if isinstance(e, ServerError):
        return type(e)(e.message, status=e.status, detail=e.detail, context=e.context)
    return type(e)(str(e))
