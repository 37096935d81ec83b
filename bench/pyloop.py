"""The failover workload's looping client in Python (bench/faults.go runs it with the venv of
clients/python/test.sh): the same loop as bench/goclient -loop. One client with default options
on every endpoint acquires a new key (lease 10 s, waiting up to 10 s) and releases it, for at
most SECONDS or until stdin closes, printing "ok START_NS END_NS" after each acquire and
"err UNIX_NS MESSAGE" after each failure.

    python pyloop.py host:port,host:port,host:port SECONDS
"""

import os
import sys
import threading
import time

import ticketing


def main() -> int:
    endpoints = sys.argv[1].split(",")
    end = time.monotonic() + float(sys.argv[2])
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read(1)
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    with ticketing.Client(endpoints) as client:
        n = 0
        while not stop.is_set() and time.monotonic() < end:
            n += 1
            start = time.time_ns()
            try:
                lock = client.acquire(f"fo-py-{os.getpid()}-{n}", lease=10, wait_timeout=10)
            except ticketing.TicketingError as e:
                print(f"err {time.time_ns()} {str(e).replace(chr(10), ' ')}", flush=True)
                time.sleep(0.02)
                continue
            print(f"ok {start} {time.time_ns()}", flush=True)
            try:
                lock.release()
            except ticketing.TicketingError as e:
                print(f"err {time.time_ns()} release: {str(e).replace(chr(10), ' ')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
