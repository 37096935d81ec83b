"""The lock clock (ticketing._clock): CLOCK_BOOTTIME on Linux, which counts a suspend as the
server's leases do, and the fallback that counts each interval as the larger of the monotonic
and the wall clock's advance."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

import ticketing._clock
from ticketing._clock import FallbackClock


class Clocks:
    """The fallback's inputs, moved by hand."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_700_000_000.0

    def advance(self, mono: float, wall: float) -> None:
        self.mono += mono
        self.wall += wall


def test_fallback_counts_the_larger_advance() -> None:
    src = Clocks()
    clock = FallbackClock(monotonic=lambda: src.mono, wall=lambda: src.wall)
    t0 = clock()
    src.advance(1, 1)
    assert clock() == pytest.approx(t0 + 1)
    src.advance(0.01, 60)  # a 60 s suspend: the monotonic clock stopped, the wall clock did not
    assert clock() == pytest.approx(t0 + 61)
    src.advance(1, -3600)  # the wall clock stepped back an hour: ignored
    assert clock() == pytest.approx(t0 + 62)
    src.advance(1, 1)  # and the next interval counts from the stepped-back wall clock
    assert clock() == pytest.approx(t0 + 63)
    src.advance(1, 0.5)  # the wall clock running slow: the monotonic clock counts
    assert clock() == pytest.approx(t0 + 64)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="CLOCK_BOOTTIME is Linux's")
def test_linux_reads_boottime() -> None:
    """In a time namespace whose boot time is 100,000 s ahead of the monotonic clock (as after
    that much suspend), the clock reads /proc/uptime's BOOTTIME, not CLOCK_MONOTONIC."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = ("import time, ticketing._clock as c; "
             "print(c.now(), time.monotonic(), open('/proc/uptime').read().split()[0])")
    run = subprocess.run([unshare, "--time", "--boottime", "100000", sys.executable, "-c", probe],
                         capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        pytest.skip(f"unshare --time is refused here (needs root and Linux 5.6+): {run.stderr.strip()}")
    now, mono, uptime = (float(x) for x in run.stdout.split())
    assert now - mono > 99_000
    assert abs(now - uptime) < 1


def test_to_monotonic() -> None:
    t = ticketing._clock.now() + 5
    assert ticketing._clock.to_monotonic(t) == pytest.approx(time.monotonic() + 5, abs=0.01)
