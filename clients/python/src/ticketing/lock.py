"""A held lock of the blocking client: its fencing token, release, extend, the lost signal and
the opt-in keep-alive."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from ._common import KeyLike, lease_ms
from .exceptions import LockLost, NotHeld, TicketingError

if TYPE_CHECKING:
    from ._timers import Timer
    from .client import Client

__all__ = ["Lock", "LockContext"]

log = logging.getLogger("ticketing")


class Lock:
    """A lock held with fencing token :attr:`token`. Returned by :meth:`Client.acquire`; used as a
    context manager it releases on exit.

    The lock is *lost* — :attr:`lost` is set and the :meth:`on_lost` callbacks run — at the first
    of: the local deadline (:attr:`deadline`, never later than the server's), the server's
    EXPIRED notice for this token, or a NOT_HELD answer to :meth:`extend`. Once lost it stays
    lost. Releasing never sets :attr:`lost`.

    Any thread may call any method: the owner is the token, not a thread.
    """

    def __init__(self, client: Client, key: KeyLike, key_bytes: bytes, token: int, lease_ms: int,
                 granted_ms: int, deadline: float) -> None:
        self._client = client
        self._key = key
        self._key_bytes = key_bytes
        self._token = token
        self._lease_ms = lease_ms  # what keep-alive and extend() ask for
        self._granted_ms = granted_ms  # the lease the server last granted
        self._deadline = deadline
        #: Set when the lock is lost (never by a release).
        self.lost = threading.Event()
        self._lost_reason: str | None = None
        self._deferred_lost: str | None = None
        self._released = False
        self._releasing = False
        self._mutex = threading.Lock()
        self._release_mutex = threading.Lock()
        self._callbacks: list[Callable[[Lock], object]] = []
        self._timer: Timer | None = None
        self._stop_keepalive = threading.Event()
        self._keepalive: threading.Thread | None = None

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
        """The local deadline, in ``time.monotonic()`` seconds: the lock is certainly held until
        then (unless released); after it, it is treated as lost."""
        return self._deadline

    @property
    def lost_reason(self) -> str | None:
        """Why the lock was lost: ``"expired"`` (server notice), ``"deadline"`` (local deadline),
        ``"not_held"`` (NOT_HELD answer), ``"closed"`` (the client was closed); None while not lost."""
        return self._lost_reason

    @property
    def released(self) -> bool:
        return self._released

    @property
    def held(self) -> bool:
        """Neither released nor lost, and the local deadline has not passed."""
        return not self._released and self._lost_reason is None and time.monotonic() < self._deadline

    def remaining(self) -> float:
        """Seconds left until the local deadline (0 when passed)."""
        return max(0.0, self._deadline - time.monotonic())

    # --- operations ---------------------------------------------------------------------------

    def release(self) -> None:
        """Release the lock; the next waiter gets it at once. Idempotent once it succeeded.

        Raises :class:`NotHeld` when the server says this token no longer holds the key (its
        lease ran out): the work done under the lock was not protected to the end.
        """
        with self._release_mutex:
            if self._released:
                return
            self._releasing = True
            self._stop_keepalive.set()
            try:
                self._client._release(self._key_bytes, self._token)
            except NotHeld:
                self._releasing = False
                self._set_lost("not_held")
                raise
            except BaseException:
                self._releasing = False
                if self._deferred_lost is not None:
                    self._set_lost(self._deferred_lost)
                raise
            with self._mutex:
                self._released = True
                self._releasing = False
                timer, self._timer = self._timer, None
            if timer is not None:
                timer.cancel()
            self._client._unregister(self)

    def extend(self, lease: float | None = None) -> None:
        """Set the lease to ``lease`` seconds from now (default: the lease asked for at acquire).

        Raises :class:`NotHeld` (and the lock is lost) when the server says the token no longer
        holds the key, :class:`LockLost` when the lock was already lost or released.
        """
        if lease is not None:
            self._lease_ms = lease_ms(lease)
        ms = self._lease_ms
        self._check_usable()
        try:
            resp, t_send = self._client._extend(self._key_bytes, self._token, ms)
        except NotHeld:
            self._set_lost("not_held")
            raise
        with self._mutex:
            if self._lost_reason is not None or self._released:
                pass
            else:
                self._granted_ms = resp.lease_ms
                self._deadline = t_send + resp.lease_ms / 1000
                self._schedule_locked()
                return
        self._check_usable()

    def on_lost(self, callback: Callable[[Lock], object]) -> None:
        """Call ``callback(lock)`` when the lock is lost (at once if it already is). Callbacks run
        on the client's reader or timer thread: keep them short."""
        with self._mutex:
            if self._lost_reason is None:
                self._callbacks.append(callback)
                return
        self._run_callback(callback)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _release_on_exit(self, exc is not None)

    def __repr__(self) -> str:
        state = "released" if self._released else f"lost ({self._lost_reason})" if self._lost_reason else "held"
        return f"<Lock key={self._key!r} token={self._token} {state}>"

    # --- internals ----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._released:
            raise LockLost("the lock was released")
        if self._lost_reason is not None:
            raise LockLost(f"the lock was lost ({self._lost_reason})")

    def _start(self, keepalive: bool) -> None:
        with self._mutex:
            self._schedule_locked()
        if keepalive:
            self._keepalive = threading.Thread(target=self._keepalive_loop, daemon=True,
                                               name=f"ticketing-keepalive-{self._token}")
            self._keepalive.start()

    def _schedule_locked(self) -> None:
        """Arm the local deadline. self._mutex must be held."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._client._timers.call_at(self._deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        if time.monotonic() >= self._deadline:
            self._set_lost("deadline")

    def _set_lost(self, reason: str) -> None:
        with self._mutex:
            if self._lost_reason is not None or self._released:
                return
            if self._releasing:
                self._deferred_lost = reason  # the release in flight decides
                return
            self._lost_reason = reason
            timer, self._timer = self._timer, None
            callbacks, self._callbacks = self._callbacks, []
        if timer is not None:
            timer.cancel()
        self._stop_keepalive.set()
        self._client._unregister(self)
        self.lost.set()
        log.debug("ticketing: lock %r token %d lost (%s)", self._key, self._token, reason)
        for cb in callbacks:
            self._run_callback(cb)

    def _run_callback(self, callback: Callable[[Lock], object]) -> None:
        try:
            callback(self)
        except Exception:
            log.exception("ticketing: on_lost callback failed")

    def _keepalive_loop(self) -> None:
        while True:
            interval = max(self._lease_ms / 3000, 0.001)
            # Never sleep past a third of what is left, so a failed extend is retried in time.
            interval = min(interval, max(self.remaining() / 3, 0.001))
            if self._stop_keepalive.wait(interval):
                return
            try:
                self.extend()
            except LockLost:
                return
            except TicketingError as e:
                log.debug("ticketing: keep-alive of %r failed: %s", self._key, e)


class LockContext:
    """``with client.lock(key, lease, wait_timeout) as lock:`` acquires on entry and releases on
    exit."""

    def __init__(self, client: Client, key: KeyLike, lease: float, wait_timeout: float | None,
                 keepalive: bool) -> None:
        self._client = client
        self._args = (key, lease, wait_timeout, keepalive)
        self._lock: Lock | None = None

    def __enter__(self) -> Lock:
        key, lease, wait_timeout, keepalive = self._args
        self._lock = self._client.acquire(key, lease, wait_timeout, keepalive=keepalive)
        return self._lock

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._lock is not None:
            _release_on_exit(self._lock, exc is not None)


def _release_on_exit(lock: Lock, body_failed: bool) -> None:
    """Release at the end of a ``with`` block. A NotHeld (the lease ran out during the block) is
    raised when the block itself succeeded; when the block raised, its exception wins."""
    try:
        lock.release()
    except TicketingError:
        if not body_failed:
            raise
        log.warning("ticketing: releasing %r after an error failed", lock.key, exc_info=True)
