"""One timer thread per blocking client: fires each held lock's lost signal, the heartbeat and the
session grace without a thread per timer. The thread starts on first use and ends after a second
with nothing scheduled. Timers run on the lock clock (:mod:`._clock`), which counts the time the
host was suspended; the thread's waits run on the monotonic clock, which stops during a suspend,
so the client keeps a timer due within LOST_CHECK_MS while it holds a lock (its lost watch)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable

from . import _clock

log = logging.getLogger("ticketing")

_IDLE_EXIT = 1.0  # seconds with an empty heap after which the thread ends


class Timer:
    """A scheduled callback; :meth:`cancel` stops it from running."""

    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        """Do not run the callback (if it has not run yet)."""
        self.cancelled = True


class Scheduler:
    """Runs callbacks at instants of the lock clock on one daemon thread. Callbacks must be
    short; they run one after another."""

    def __init__(self, name: str = "ticketing-timers") -> None:
        self._name = name
        self._lock = threading.Lock()  # entered as ``with self._lock`` (cheaper than the Condition)
        self._cond = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Timer]] = []
        # Timers that come in time order (most: every lock's lost timer with the same lease) go
        # to a FIFO instead of the heap, and cancelled ones at its head are dropped at once: a
        # lock acquired and released costs no heap push, and no cancelled timer waits there.
        self._fifo: deque[Timer] = deque()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = float("inf")  # when the thread's current wait ends (inf: idle)

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn()`` at ``when`` on the lock clock (at once if it has passed)."""
        timer = Timer(when, fn)
        with self._lock:
            fifo = self._fifo
            while fifo and fifo[0].cancelled:
                fifo.popleft()
            heap = self._heap
            if not fifo or fifo[-1].when <= when:
                fifo.append(timer)
            else:
                heapq.heappush(heap, (when, next(self._seq), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif when < self._wake_at:
                # The thread sleeps until the earliest timer it saw: wake it only when this one
                # is earlier (a wake-up per lock would cost a thread switch per acquire).
                self._cond.notify()
        return timer

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Run ``fn()`` in ``delay`` seconds."""
        return self.call_at(_clock.now() + delay, fn)

    def _run(self) -> None:
        while True:
            with self._lock:
                while True:
                    heap, fifo = self._heap, self._fifo
                    while heap and heap[0][2].cancelled:
                        heapq.heappop(heap)
                    while fifo and fifo[0].cancelled:
                        fifo.popleft()
                    if not heap and not fifo:
                        self._wake_at = float("inf")
                        self._cond.wait(_IDLE_EXIT)
                        if not self._heap and not self._fifo:
                            self._thread = None
                            return
                        continue
                    from_heap = not fifo or (bool(heap) and heap[0][0] < fifo[0].when)
                    when = heap[0][0] if from_heap else fifo[0].when
                    wait = when - _clock.now()
                    if wait <= 0:
                        timer = heapq.heappop(heap)[2] if from_heap else fifo.popleft()
                        break
                    self._wake_at = when
                    self._cond.wait(wait)
            if not timer.cancelled:
                try:
                    timer.fn()
                except Exception:
                    log.exception("timer callback failed")
