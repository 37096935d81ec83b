"""A held lock of the asyncio client: its fencing token, release, extend, verify, the lost
signal and the opt-in keep-alive; and :class:`LockContext`, the ``async with`` / decorator form.
Mirrors :mod:`ticketing.lock` of the blocking client."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from .. import _clock
from .._common import LOST_ARM_WITHIN as _ARM_WITHIN, KeyLike, lease_ms, lock_deadline, lost_margin
from .._session import Call
from ..constants import LostReason, Op, Status
from ..exceptions import ClientClosed, LockLost, TicketingError, describe_key, error_for_status
from ..lock import release_outcome
from ..protocol import Response

if TYPE_CHECKING:
    from .client import Client, _Timed

__all__ = ["Lock", "LockContext"]

log = logging.getLogger("ticketing")

#: Enum members as module globals: a class attribute of an Enum costs several times a global
#: lookup, and these are read for every request.
_RELEASE = Op.RELEASE
_OK = Status.OK



class Lock:
    """A lock held with fencing token :attr:`token`, returned by :meth:`Client.acquire`. Used
    with ``async with`` it releases on exit (and raises :class:`LockLost` if it was lost).

    The lock is *lost* — :attr:`lost` (an :class:`asyncio.Event`) is set, :attr:`lost_reason`
    says why and the :meth:`on_lost` callbacks run, once — at the first of: its local deadline
    (:attr:`deadline`, before the server's expiry even with clocks that drift or a host that was
    suspended), the server's EXPIRED notice for the token, a NOT_HELD answer to :meth:`extend`
    or :meth:`release`, or a reconnect to a server that restarted. Once lost it stays lost; a
    successful :meth:`release` never makes it lost. A dropped connection does not lose it.

    Any task may call any method: the owner is the token, not a task.
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
        # Made on first use (``lost``): most locks are released without anybody asking.
        self._lost: asyncio.Event | None = None
        self._lost_reason: LostReason | None = None
        self._deferred_lost: LostReason | None = None
        self._released = False
        self._releasing = False
        self._told_server = False  # release() of the lost lock sent its RELEASE in the background
        # One release() at a time (as an asyncio.Lock would, without its cost per release when
        # nobody else releases the lock): the tasks that find one running wait for it to end.
        self._in_release = False
        self._release_waiters: list[asyncio.Future[None]] | None = None
        self._callbacks: list[Callable[[Lock], object]] = []
        self._timer: _Timed | None = None
        self._keepalive: asyncio.Task[None] | None = None
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
    def lost(self) -> asyncio.Event:
        """Set when the lock is lost (never by a release)."""
        self._check_deadline()
        ev = self._lost
        if ev is None:
            ev = self._lost = asyncio.Event()
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

    async def release(self) -> None:
        """Release the lock; the next waiter gets it at once. Does nothing once it succeeded.

        A lock lost earlier raises :class:`LockLost` at once, without waiting for the server
        (which may be unreachable): the work done under it was not protected to the end. The
        server is still told, in the background, so that the next waiter need not wait for the
        lease (not after a restart or a NOT_HELD answer: nothing is left to release). A NOT_HELD
        answer raises :class:`LockLost` (reason ``"not held"``, unless it was lost earlier for
        another reason).
        """
        while self._in_release:  # another task's release() runs: wait for its end, then look again
            fut = asyncio.get_running_loop().create_future()
            if self._release_waiters is None:
                self._release_waiters = []
            self._release_waiters.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    fut.cancel()
        self._in_release = True
        # The body of one release, in this coroutine (not a nested one: a frame less per release).
        try:
            if self._released:
                return
            if self._lost_reason is None and _clock.now() >= self._fire_at:  # _check_deadline
                self._set_lost(LostReason.EXPIRED)
            lost = self._lost_reason
            if lost is not None:
                if not self._told_server and lost not in (LostReason.SERVER_RESTARTED, LostReason.NOT_HELD):
                    self._client._release_in_background(self._key_bytes, self._token)
                self._told_server = True
                raise LockLost(lost, self._key_bytes, self._token)
            self._releasing = True
            if self._keepalive is not None:
                self._stop_keepalive()
            try:
                resp = await self._client._request(Call(_RELEASE, self._key_bytes, self._token),
                                                   self._client._request_timeout)
            except BaseException:
                self._end_release(ok=False)
                raise
            release_outcome(self, resp)
        finally:
            self._in_release = False
            waiters, self._release_waiters = self._release_waiters, None
            for w in waiters or ():
                if not w.done():
                    w.set_result(None)

    async def extend(self, lease: float | None = None) -> float:
        """Set the lease to ``lease`` seconds from now (default: the lease asked for at acquire);
        returns the lease granted, in seconds.

        Raises :class:`LockLost` when the lock is lost or released, or when the server answers
        NOT_HELD (the lock is then lost with reason ``"not held"``).
        """
        ms = self._lease_ms if lease is None else lease_ms(lease)
        self._check_usable()
        call = Call(Op.EXTEND, key=self._key_bytes, token=self._token, lease_ms=ms)
        resp = await self._client._request(call, self._client._request_timeout)
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

    async def verify(self) -> bool:
        """Ask the server whether this token still holds the key (INSPECT with the token)."""
        return await self._client.verify(self._key_bytes, self._token)

    async def owned(self) -> bool:
        """The same as :meth:`verify` (the name redis-py uses)."""
        return await self.verify()

    def on_lost(self, callback: Callable[[Lock], object]) -> None:
        """Call ``callback(lock)`` once when the lock is lost (soon, if it already is). A
        coroutine function's coroutine runs as a task."""
        if self._lost_reason is None:
            self._callbacks.append(callback)
        else:
            asyncio.get_running_loop().call_soon(self._run_callback, callback)

    async def __aenter__(self) -> Lock:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await _release_on_exit(self, exc is not None, raise_on_lost=True)

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

    def _start(self, keepalive: bool, max_hold: float | None) -> None:
        if self._fire_at - _clock.now() < _ARM_WITHIN:
            self._schedule()  # else the lost watch arms it in time (_watch; _common.LOST_ARM_WITHIN)
        if keepalive:
            self._hold_until = None if max_hold is None else time.monotonic() + max_hold
            self._keepalive = asyncio.get_running_loop().create_task(
                self._keepalive_loop(), name=f"ticketing-keepalive-{self._token}")

    def _schedule(self) -> None:
        """Arm the lost timer (the loop's clock is ``time.monotonic()``, which stops during a
        suspend: the client's lost watch covers that)."""
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # on the client's shared timer (a loop timer per lock would cost a heap push and leave a
        # cancelled handle in the loop's heap at every release)
        self._timer = self._client._lost_timers.call_at(
            loop, loop.time() + max(0.0, self._fire_at - _clock.now()), self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        if _clock.now() < self._fire_at:  # the loop's clock ran a hair early
            if self._is_held():
                self._schedule()
            return
        self._set_lost(LostReason.EXPIRED)

    def _check_deadline(self) -> None:
        """Fire the lost signal now if its time has passed: after a suspend, the timer may not
        have run yet."""
        if self._is_held() and _clock.now() >= self._fire_at:
            self._set_lost(LostReason.EXPIRED)

    def _watch(self, now: float) -> None:
        """The client's lost watch, every LOST_CHECK_MS: fire the lost signal if its time has
        passed (:meth:`_check_deadline`), else arm the lost timer once the signal is due within
        _ARM_WITHIN (:meth:`_start` leaves it unarmed until then)."""
        if not self._is_held():
            return
        if now >= self._fire_at:
            self._set_lost(LostReason.EXPIRED)
        elif self._timer is None and self._fire_at - now < _ARM_WITHIN:
            self._schedule()

    def _extended(self, call: Call, resp: Response) -> None:
        """EXTEND ``call`` was answered OK: move the deadline, unless the answer to a later
        EXTEND (a higher request id: the server applies them in id order) has moved it."""
        if self._lost_reason is not None or self._released or call.id < self._extend_id:
            return
        self._extend_id = call.id
        self._granted_ms = resp.lease_ms
        self._deadline = lock_deadline(call.t_first, 0, resp.lease_ms)
        self._fire_at = self._deadline - lost_margin(resp.lease_ms)
        self._schedule()

    def _end_release(self, *, ok: bool) -> LostReason | None:
        """The RELEASE finished. Returns the lost reason of a lock lost before the release."""
        self._releasing = False
        deferred, self._deferred_lost = self._deferred_lost, None
        if ok:
            self._released = True
            self._cancel_timer()
            self._client._unregister(self)
            return self._lost_reason
        if deferred is not None:
            self._set_lost(deferred)
        return None

    def _mark_released(self) -> None:
        """Released by token through the client (or on close)."""
        if self._released:
            return
        self._released = True
        self._cancel_timer()
        self._stop_keepalive()
        self._client._unregister(self)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _set_lost(self, reason: LostReason) -> None:
        if self._lost_reason is not None or self._released:
            return
        if self._releasing:
            self._deferred_lost = self._deferred_lost or reason  # the release in flight decides
            return
        self._lost_reason = reason
        self._cancel_timer()
        self._stop_keepalive()
        self._client._unregister(self)
        if self._lost is not None:
            self._lost.set()
        log.info("lock on %s (token %d) lost: %s", describe_key(self._key_bytes), self._token, reason)
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            self._run_callback(cb)

    def _run_callback(self, callback: Callable[[Lock], object]) -> None:
        try:
            result = callback(self)
            if inspect.isawaitable(result):
                asyncio.ensure_future(result)
        except Exception:
            log.exception("on_lost callback failed")

    def _stop_keepalive(self) -> None:
        task, self._keepalive = self._keepalive, None
        # done() first: a lock asked about after its loop ended (and found lost) has no running
        # loop for current_task().
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()

    async def _keepalive_loop(self) -> None:
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
            await asyncio.sleep(max(interval, 0.001))
            if self._hold_until is not None and time.monotonic() >= self._hold_until:
                continue
            try:
                await self.extend()
                retry = False
            except (LockLost, ClientClosed):
                return
            except TicketingError as e:
                retry = True
                log.debug("keep-alive of %s failed: %s", describe_key(self._key_bytes), e)


class LockContext(contextlib.AsyncContextDecorator):
    """``async with client.lock(key, lease) as lock:`` acquires on entry and releases on exit;
    also a decorator of coroutine functions (``@client.lock(key, lease)``).

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
        # A decorated coroutine function may run in many tasks at once: one context per call.
        return copy.copy(self)

    async def __aenter__(self) -> Lock:
        self._lock = await self._client.acquire(self._key, self._lease, self._wait_timeout,
                                                keepalive=self._keepalive, max_hold=self._max_hold,
                                                refuse_held=self._refuse_held)
        return self._lock

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            await _release_on_exit(lock, exc is not None, raise_on_lost=self._raise_on_lost)


async def _release_on_exit(lock: Lock, body_failed: bool, *, raise_on_lost: bool) -> None:
    """Release at the end of an ``async with`` block. A lost lock raises :class:`LockLost` when
    the block itself succeeded (and ``raise_on_lost``); when the block raised, its exception
    wins."""
    try:
        await lock.release()
    except LockLost:
        if raise_on_lost and not body_failed:
            raise
        log.warning("the lock on %s (token %d) was lost before the end of its block (%s)",
                    describe_key(lock._key_bytes), lock.token, lock.lost_reason)
    except TicketingError:
        if not body_failed:
            raise
        log.warning("releasing %s after an error failed", describe_key(lock._key_bytes), exc_info=True)
