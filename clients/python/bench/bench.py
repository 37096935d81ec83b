"""The Python client's benchmark program (bench/ runs it through bench-run.sh): one client object
shared by N concurrent callers, each acquiring its own key (try once, lease 10 s) and releasing
it, again and again; 1 s of warm-up, then SECONDS counted. Prints one JSON line:
{"pairs_per_sec": R, "errors": E} (exit 1 when more than 1% of the attempts failed).

    python bench.py --addr HOST:PORT --callers N --seconds S [--api sync|asyncio]

--api sync: N threads on one ticketing.Client; --api asyncio: N tasks on one
ticketing.asyncio.Client. Run it only against a server you started for it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

import ticketing
import ticketing.asyncio

WARMUP = 1.0
LEASE = 10


def run_sync(addr: str, callers: int, seconds: float) -> tuple[int, int, int]:
    client = ticketing.Client(addr)
    client.connect()
    stop = False
    counts = [0] * callers
    errors = [0] * callers
    prefix = f"bench-{os.getpid()}-"

    def caller(i: int) -> None:
        key = f"{prefix}{i}"
        n = e = 0
        while not stop:
            try:
                lock = client.try_acquire(key, LEASE)
                if lock is None:
                    e += 1
                else:
                    lock.release()
                    n += 1
            except ticketing.TicketingError:
                e += 1
            counts[i] = n
            errors[i] = e

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(callers)]
    for t in threads:
        t.start()
    time.sleep(WARMUP)
    n0, e0, t0 = sum(counts), sum(errors), time.monotonic()
    time.sleep(seconds)
    n1, e1, t1 = sum(counts), sum(errors), time.monotonic()
    stop = True
    for t in threads:
        t.join(10)
    client.close()
    return n1 - n0, e1 - e0, round((t1 - t0) * 1e9)


async def run_asyncio(addr: str, callers: int, seconds: float) -> tuple[int, int, int]:
    client = ticketing.asyncio.Client(addr)
    await client.connect()
    stop = False
    counts = [0] * callers
    errors = [0] * callers
    prefix = f"bench-{os.getpid()}-"

    async def caller(i: int) -> None:
        key = f"{prefix}{i}"
        n = e = 0
        while not stop:
            try:
                lock = await client.try_acquire(key, LEASE)
                if lock is None:
                    e += 1
                else:
                    await lock.release()
                    n += 1
            except ticketing.TicketingError:
                e += 1
            counts[i] = n
            errors[i] = e

    tasks = [asyncio.create_task(caller(i)) for i in range(callers)]
    await asyncio.sleep(WARMUP)
    n0, e0, t0 = sum(counts), sum(errors), time.monotonic()
    await asyncio.sleep(seconds)
    n1, e1, t1 = sum(counts), sum(errors), time.monotonic()
    stop = True
    await asyncio.wait(tasks, timeout=10)
    await client.close()
    return n1 - n0, e1 - e0, round((t1 - t0) * 1e9)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--addr", default="127.0.0.1:7070")
    p.add_argument("--callers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--api", choices=("sync", "asyncio"), default="sync")
    a = p.parse_args()
    if not 1 <= a.callers <= 100000 or not 0 < a.seconds <= 3600:
        print("bench.py: --callers 1..100000 and --seconds 0..3600", file=sys.stderr)
        return 2
    if a.api == "sync":
        pairs, errs, ns = run_sync(a.addr, a.callers, a.seconds)
    else:
        pairs, errs, ns = asyncio.run(run_asyncio(a.addr, a.callers, a.seconds))
    print(json.dumps({"pairs_per_sec": round(pairs / (ns / 1e9), 1), "errors": errs}), flush=True)
    return 1 if errs > 0.01 * max(1, pairs + errs) else 0


if __name__ == "__main__":
    sys.exit(main())
