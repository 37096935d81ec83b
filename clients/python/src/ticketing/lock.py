"""A held lock of the blocking client: its fencing token, release, extend, verify, the lost
signal and the opt-in keep-alive; and :class:`LockContext`, the ``with`` / decorator form."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from . import _clock
from ._common import KeyLike, lease_ms, lock_deadline, lost_margin
from ._session import Call
from .connection import handling_on_caller
from .constants import LostReason, Op, Status
from .exceptions import ClientClosed, LockLost, TicketingError, describe_key, error_for_status
from .protocol import Response

if TYPE_CHECKING:
    from ._timers import Timer
    from .client import Client

__all__ = ["Lock", "LockContext"]

log = logging.getLogger("ticketing")

#: Enum members as module globals: a class attribute of an Enum costs several times a global
#: lookup, and these are read for every request.
_RELEASE = Op.RELEASE
_OK = Status.OK


class _Releasing(Protocol):
    """What :func:`release_outcome` needs of a lock (this module's and the asyncio one's)."""

    @property
    def _key_bytes(self) -> bytes: ...
    @property
    def _token(self) -> int: ...
    @property
    def _lost_reason(self) -> LostReason | None: ...
    def _end_release(self, *, ok: bool) -> LostReason | None: ...
    def _set_lost(self, reason: LostReason) -> None: ...
    def _context(self) -> str: ...


def release_outcome(lock: _Releasing, resp: Response) -> None:
    """Ends a RELEASE that the server answered, for the sync and the asyncio lock alike: returns
    on OK (raising LockLost if the lock was lost meanwhile), else raises what the answer says."""
    if resp.status == _OK:
        reason = lock._end_release(ok=True)
        if reason is not None:
            raise LockLost(reason, lock._key_bytes, lock._token)
        return
    lock._end_release(ok=False)
    if resp.status == Status.NOT_HELD:
        lock._set_lost(LostReason.NOT_HELD)
        raise LockLost(lock._lost_reason or LostReason.NOT_HELD, lock._key_bytes, lock._token)
    raise error_for_status(resp.status, resp.detail, resp.data, lock._context())


class Lock:
    """A lock held with fencing token :attr:`token`, returned by :meth:`Client.acquire`. Used
    as a context manager it releases on exit (and raises :class:`LockLost` if it was lost).

    The lock is *lost* — :attr:`lost` is set, :attr:`lost_reason` says why and the
    :meth:`on_lost` callbacks run, once — at the first of: its local deadline (:attr:`deadline`,
    before the server's expiry even with clocks that drift or a host that was suspended), the
    server's EXPIRED notice for the token, a NOT_HELD answer to :meth:`extend` or
    :meth:`release`, or a reconnect to a server that restarted. Once lost it stays lost; a
    successful :meth:`release` never makes it lost. A dropped connection does not lose it: the
    server keeps it until its lease ends.

    Any thread may call any method: the owner is the token, not a thread.
    """

    def __init__(self, client: Client, key: KeyLike, key_bytes: bytes, token: int, requested_ms: int,
                 granted_ms: int, deadline: float) -> None:
        self._client = client
        self._key = key
        self._key_bytes = key_bytes
        self._token = token
        self._lease_ms = requested_ms  # what keep-alive and extend() ask for
        self._granted_ms = granted_ms  # the lease the server last granted
        self._deadline = deadline  # on the lock clock (ticketing._clock)
        self._fire_at = deadline - lost_margin(granted_ms)  # when the lost signal fires
        self._extend_id = 0  # the request id of the EXTEND whose answer set the deadline
        # threading.Events are made on first use (each costs a Condition): ``lost`` when asked
        # for, the keep-alive's stop signal with the keep-alive.
        self._lost: threading.Event | None = None
        self._lost_reason: LostReason | None = None
        self._deferred_lost: LostReason | None = None
        self._released = False
        self._releasing = False
        self._told_server = False  # release() of the lost lock sent its RELEASE in the background
        self._mutex = threading.Lock()  # guards the state above and below
        self._release_mutex = threading.Lock()
        self._callbacks: list[Callable[[Lock], object]] = []
        self._timer: Timer | None = None
        self._stop: threading.Event | None = None
        self._stop_requested = False
        self._keepalive: threading.Thread | None = None
        self._hold_until: float | None = None

    # --- properties ---------------------------------------------------------------------------

    @property
    def key(self) -> KeyLike:
        """The key, as given to acquire."""
        return self._key

    @property
    def token(self) -> int:
        """The fencing token: pass it to the protected resource, which rejects lower ones."""
        return self._token

    @property
    def lease(self) -> float:
        """The lease the server last granted, in seconds."""
        return self._granted_ms / 1000

    @property
    def deadline(self) -> float:
        """When the lost signal fires unless the lease is extended, as a ``time.monotonic()``
        instant (should the host not be suspended meanwhile): ``t_first + (queued + lease) *
        (1 - 0.002) - min(5 ms, lease / 10)``, where ``t_first`` is when the ACQUIRE (or the
        EXTEND with the highest request id answered) was first sent, re-sends aside."""
        return _clock.to_monotonic(self._fire_at)

    @property
    def lost(self) -> threading.Event:
        """Set when the lock is lost (never by a release)."""
        self._check_deadline()
        with self._mutex:
            ev = self._lost
            if ev is None:
                ev = self._lost = threading.Event()
                if self._lost_reason is not None:
                    ev.set()
        return ev

    @property
    def lost_reason(self) -> LostReason | None:
        """Why the lock was lost (a :class:`LostReason`: ``"expired"``, ``"not held"``,
        ``"server restarted"``, ``"server stopping"``); None while not lost."""
        self._check_deadline()
        return self._lost_reason

    @property
    def released(self) -> bool:
        """:meth:`release` succeeded."""
        return self._released

    @property
    def held(self) -> bool:
        """Neither released nor lost."""
        self._check_deadline()
        return self._is_held()

    def remaining(self) -> float:
        """Seconds until :attr:`deadline` (0.0 once passed, released or lost)."""
        self._check_deadline()
        if not self._is_held():
            return 0.0
        return max(0.0, self._fire_at - _clock.now())

    # --- operations ---------------------------------------------------------------------------

    def release(self) -> None:
        """Release the lock; the next waiter gets it at once. Does nothing once it succeeded.

        A lock lost earlier raises :class:`LockLost` at once, without waiting for the server
        (which may be unreachable): the work done under it was not protected to the end. The
        server is still told, in the background, so that the next waiter need not wait for the
        lease (not after a restart or a NOT_HELD answer: nothing is left to release). A NOT_HELD
        answer raises :class:`LockLost` (reason ``"not held"``, unless it was lost earlier for
        another reason).
        """
        with self._release_mutex:
            if self._released:
                return
            with self._mutex:
                # Held and before its deadline (the usual case): release now, in one turn of the
                # mutex (_check_deadline, then the look at the lost reason, and _stop_keepalive).
                fast = self._lost_reason is None and _clock.now() < self._fire_at
                if fast:
                    self._releasing = True
                    self._stop_requested = True
                    stop = self._stop
            if fast:
                if stop is not None:
                    stop.set()
            else:
                self._check_deadline()
                with self._mutex:
                    lost = self._lost_reason
                    tell = lost is not None and not self._told_server
                    if tell:
                        self._told_server = True
                    if lost is None:
                        self._releasing = True
                if lost is not None:
                    if tell and lost not in (LostReason.SERVER_RESTARTED, LostReason.NOT_HELD):
                        self._client._release_in_background(self._key_bytes, self._token)
                    raise LockLost(lost, self._key_bytes, self._token)
                self._stop_keepalive()
            try:
                resp = self._client._request(Call(_RELEASE, self._key_bytes, self._token),
                                             self._client._request_timeout)
            except BaseException:
                self._end_release(ok=False)
                raise
            release_outcome(self, resp)

    def extend(self, lease: float | None = None) -> float:
        """Set the lease to ``lease`` seconds from now (default: the lease asked for at acquire);
        returns the lease granted, in seconds.

        Raises :class:`LockLost` when the lock is lost or released, or when the server answers
        NOT_HELD (the lock is then lost with reason ``"not held"``).
        """
        ms = self._lease_ms if lease is None else lease_ms(lease)
        self._check_usable()
        call = Call(Op.EXTEND, key=self._key_bytes, token=self._token, lease_ms=ms)
        resp = self._client._request(call, self._client._request_timeout)
        if resp.status == Status.NOT_HELD:
            self._set_lost(LostReason.NOT_HELD)
            raise LockLost(self._lost_reason or LostReason.NOT_HELD, self._key_bytes, self._token)
        if resp.status != Status.OK:
            raise error_for_status(resp.status, resp.detail, resp.data, self._context())
        if lease is not None:
            self._lease_ms = ms
        self._extended(call, resp)
        self._check_usable()
        return resp.lease_ms / 1000

    def verify(self) -> bool:
        """Ask the server whether this token still holds the key (INSPECT with the token)."""
        return self._client.verify(self._key_bytes, self._token)

    def owned(self) -> bool:
        """The same as :meth:`verify` (the name redis-py uses)."""
        return self.verify()

    def on_lost(self, callback: Callable[[Lock], object]) -> None:
        """Call ``callback(lock)`` once when the lock is lost (at once if it already is).
        Callbacks run on a client thread (reader or timer; never on another caller's thread
        that happened to read the news for the client), or on the thread whose call on the
        lock found its deadline passed: keep them short, and hand any call on the client
        (``release``, ``acquire``...) to another thread: the reader thread cannot read that
        call's answer while it waits for it."""
        with self._mutex:
            if self._lost_reason is None:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _release_on_exit(self, exc is not None, raise_on_lost=True)

    def __repr__(self) -> str:
        state = "released" if self._released else f"lost ({self._lost_reason})" if self._lost_reason else "held"
        return f"<Lock key={describe_key(self._key_bytes)} token={self._token} {state}>"

    # --- internals ----------------------------------------------------------------------------

    def _context(self) -> str:
        return f"key {describe_key(self._key_bytes)}, token {self._token}"

    def _is_held(self) -> bool:
        return not self._released and self._lost_reason is None

    def _check_usable(self) -> None:
        self._check_deadline()
        if self._lost_reason is not None:
            raise LockLost(self._lost_reason, self._key_bytes, self._token)
        if self._released:
            raise LockLost(LostReason.NOT_HELD, self._key_bytes, self._token,
                           f"lock on key {describe_key(self._key_bytes)} (token {self._token}) was released")

    def _start(self, keepalive: bool, max_hold: float | None, arm: bool = True) -> None:
        """After the lock is registered: arm the lost timer (unless ``arm`` is False: the
        client's lost watch arms it later, :meth:`_arm`), start the keep-alive."""
        with self._mutex:
            if not arm:
                pass
            elif self._timer is None:  # _schedule_locked, inlined
                self._timer = self._client._timers.call_at(self._fire_at, self._on_deadline)
            else:
                self._schedule_locked()
            if keepalive:
                self._stop = threading.Event()
                if self._stop_requested:
                    self._stop.set()
        if keepalive:
            self._hold_until = None if max_hold is None else time.monotonic() + max_hold
            self._keepalive = threading.Thread(target=self._keepalive_loop, daemon=True,
                                               name=f"ticketing-keepalive-{self._token}")
            self._keepalive.start()

    def _arm(self) -> None:
        """The client's lost watch: the lost signal is due soon; arm its timer unless it is armed
        (an extend arms it at once) or the lock is released or lost."""
        with self._mutex:
            if self._timer is None and self._lost_reason is None and not self._released:
                self._timer = self._client._timers.call_at(self._fire_at, self._on_deadline)

    def _schedule_locked(self) -> None:
        """Arm the lost timer. self._mutex must be held."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._client._timers.call_at(self._fire_at, self._on_deadline)

    def _on_deadline(self) -> None:
        with self._mutex:
            early = _clock.now() < self._fire_at
            if early and self._lost_reason is None and not self._released:
                self._schedule_locked()
        if not early:
            self._set_lost(LostReason.EXPIRED)

    def _check_deadline(self) -> None:
        """Fire the lost signal now if its time has passed: after a suspend, the timer may not
        have looked at the clock yet."""
        with self._mutex:
            due = self._is_held() and _clock.now() >= self._fire_at
        if due:
            self._set_lost(LostReason.EXPIRED)

    def _extended(self, call: Call, resp: Response) -> None:
        """EXTEND ``call`` was answered OK: move the deadline, unless the answer to a later
        EXTEND (a higher request id: the server applies them in id order) has moved it."""
        with self._mutex:
            if self._lost_reason is not None or self._released or call.id < self._extend_id:
                return
            self._extend_id = call.id
            self._granted_ms = resp.lease_ms
            self._deadline = lock_deadline(call.t_first, 0, resp.lease_ms)
            self._fire_at = self._deadline - lost_margin(resp.lease_ms)
            self._schedule_locked()

    def _end_release(self, *, ok: bool) -> LostReason | None:
        """The RELEASE finished. Returns the lost reason of a lock lost before the release."""
        with self._mutex:
            self._releasing = False
            deferred, self._deferred_lost = self._deferred_lost, None
            earlier = self._lost_reason
            if ok:
                self._released = True
                timer, self._timer = self._timer, None
        if ok:
            if timer is not None:
                timer.cancel()
            self._client._unregister(self)
            return earlier
        if deferred is not None:
            self._set_lost(deferred)
        return None

    def _mark_released(self) -> None:
        """Released by token through the client (or on close)."""
        with self._mutex:
            if self._released:
                return
            self._released = True
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._stop_keepalive()
        self._client._unregister(self)

    def _set_lost(self, reason: LostReason) -> None:
        with self._mutex:
            if self._lost_reason is not None or self._released:
                return
            if self._releasing:
                self._deferred_lost = self._deferred_lost or reason  # the release in flight decides
                return
            self._lost_reason = reason
            timer, self._timer = self._timer, None
            callbacks, self._callbacks = self._callbacks, []
        if timer is not None:
            timer.cancel()
        self._stop_keepalive()
        self._client._unregister(self)
        with self._mutex:
            ev = self._lost
        if ev is not None:
            ev.set()
        log.info("lock on %s (token %d) lost: %s", describe_key(self._key_bytes), self._token, reason)
        if callbacks and handling_on_caller():
            # Found by a caller's thread reading the answers to its own call: the callbacks run
            # on the timer thread, a client thread, as they would on the reader thread.
            self._client._timers.call_later(0.0, lambda: self._run_callbacks(callbacks))
            return
        self._run_callbacks(callbacks)

    def _run_callbacks(self, callbacks: list[Callable[[Lock], object]]) -> None:
        for cb in callbacks:
            self._run_callback(cb)

    def _run_callback(self, callback: Callable[[Lock], object]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("on_lost callback failed")

    def _stop_keepalive(self) -> None:
        with self._mutex:
            self._stop_requested = True
            stop = self._stop
        if stop is not None:
            stop.set()

    def _keepalive_loop(self) -> None:
        retry = False
        while True:
            interval = self._granted_ms / 3000
            if retry:  # a failed extend is retried well before the deadline
                interval = min(interval, max(self.remaining() / 3, 0.01))
            if self._hold_until is not None:
                left = self._hold_until - time.monotonic()
                if left <= 0:
                    log.info("keep-alive of %s stopped after max_hold", describe_key(self._key_bytes))
                    return
                interval = min(interval, left)
            assert self._stop is not None
            if self._stop.wait(max(interval, 0.001)):
                return
            if self._hold_until is not None and time.monotonic() >= self._hold_until:
                continue
            try:
                self.extend()
                retry = False
            except (LockLost, ClientClosed):
                return
            except TicketingError as e:
                retry = True
                log.debug("keep-alive of %s failed: %s", describe_key(self._key_bytes), e)


class LockContext(contextlib.ContextDecorator):
    """``with client.lock(key, lease) as lock:`` acquires on entry and releases on exit; also a
    decorator (``@client.lock(key, lease)``), acquiring around every call.

    If the lock was lost while the body ran, leaving raises :class:`LockLost` naming the reason
    (unless ``raise_on_lost=False``); an exception from the body wins.
    """

    def __init__(self, client: Client, key: KeyLike, lease: float, wait_timeout: float | None, *,
                 keepalive: bool, max_hold: float | None, refuse_held: bool, raise_on_lost: bool) -> None:
        self._client = client
        self._key = key
        self._lease = lease
        self._wait_timeout = wait_timeout
        self._keepalive = keepalive
        self._max_hold = max_hold
        self._refuse_held = refuse_held
        self._raise_on_lost = raise_on_lost
        self._lock: Lock | None = None

    def _recreate_cm(self) -> LockContext:
        # A decorated function may run in many threads at once: one context per call.
        return copy.copy(self)

    def __enter__(self) -> Lock:
        self._lock = self._client.acquire(self._key, self._lease, self._wait_timeout, keepalive=self._keepalive,
                                          max_hold=self._max_hold, refuse_held=self._refuse_held)
        return self._lock

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            _release_on_exit(lock, exc is not None, raise_on_lost=self._raise_on_lost)


def _release_on_exit(lock: Lock, body_failed: bool, *, raise_on_lost: bool) -> None:
    """Release at the end of a ``with`` block. A lost lock raises :class:`LockLost` when the
    block itself succeeded (and ``raise_on_lost``); when the block raised, its exception wins."""
    try:
        lock.release()
    except LockLost:
        if raise_on_lost and not body_failed:
            raise
        log.warning("the lock on %s (token %d) was lost before the end of its block (%s)",
                    describe_key(lock._key_bytes), lock.token, lock.lost_reason)
    except TicketingError:
        if not body_failed:
            raise
        log.warning("releasing %s after an error failed", describe_key(lock._key_bytes), exc_info=True)
