"""The clock of lock deadlines (PROTOCOL.md, "The lost signal"): it keeps counting while the host
is suspended, as the server's leases do, so that a client waking from a suspend never believes it
still holds a lock whose lease ran out while it slept. ``time.monotonic()`` stops during a
suspend on Linux.

:func:`now` is ``CLOCK_BOOTTIME`` where the system has it (Linux; read through the vDSO, about as
cheap as ``time.monotonic()``), else a :class:`FallbackClock`. The session's times (``t_first``,
``t_send``, the heartbeat) and every lock deadline are on this clock; call and connect timeouts
and backoffs stay on ``time.monotonic()``. Callers look ``now`` up on this module at each call
(``_clock.now()``), so that tests can replace it.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable

__all__ = ["FallbackClock", "now", "to_monotonic"]


class FallbackClock:
    """The clock where the system offers no ``CLOCK_BOOTTIME``: each interval between two reads
    counts as the larger of the monotonic and the wall clock's advance. A suspend shows as the
    wall clock running ahead of the monotonic clock; a wall clock stepped back is ignored; one
    stepped forward only makes deadlines earlier. Never goes backwards; thread-safe."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._mu = threading.Lock()
        self._last_mono = monotonic()
        self._last_wall = wall()
        self._now = self._last_mono

    def __call__(self) -> float:
        with self._mu:
            mono, wall = self._monotonic(), self._wall()
            self._now += max(mono - self._last_mono, wall - self._last_wall)
            self._last_mono, self._last_wall = mono, wall
            return self._now

    def after_fork(self) -> None:
        """In a forked child: a new mutex (another thread may have held it at the fork)."""
        self._mu = threading.Lock()


def _boottime() -> Callable[[], float] | None:
    clock_id: int | None = getattr(time, "CLOCK_BOOTTIME", None)
    if clock_id is None:
        return None
    try:
        time.clock_gettime(clock_id)
    except OSError:  # a kernel without it (Linux before 2.6.39)
        return None
    return functools.partial(time.clock_gettime, clock_id)


def _fallback() -> Callable[[], float]:
    clock = FallbackClock()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=clock.after_fork)
    return clock


#: Seconds on the lock clock (an arbitrary zero).
now: Callable[[], float] = _boottime() or _fallback()


def to_monotonic(t: float) -> float:
    """``t`` on the lock clock as a ``time.monotonic()`` instant: the one at which the lock
    clock reaches ``t`` if the host is not suspended meanwhile."""
    return t - now() + time.monotonic()
