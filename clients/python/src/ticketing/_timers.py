"""One timer thread per blocking client: fires each held lock's local deadline (the lost signal)
without a thread per lock."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("ticketing")


class Timer:
    __slots__ = ("when", "fn", "cancelled")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when = when
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Runs callbacks at ``time.monotonic()`` instants on one daemon thread, started on first use.
    Callbacks must be short; they run one after another."""

    def __init__(self, name: str = "ticketing-timers") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def call_at(self, when: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(when, fn)
        with self._cond:
            if self._closed:
                return timer
            heapq.heappush(self._heap, (when, next(self._seq), timer))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return timer

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    heap = self._heap
                    while heap and heap[0][2].cancelled:
                        heapq.heappop(heap)
                    if heap:
                        wait = heap[0][0] - time.monotonic()
                        if wait <= 0:
                            timer = heapq.heappop(heap)[2]
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait()
            if not timer.cancelled:
                try:
                    timer.fn()
                except Exception:
                    log.exception("ticketing: timer callback failed")
