"""Cross-language FIFO test: one Python waiter. Usage: waiter.py ADDR KEY
Prints "granted TOKEN" once it holds KEY, releases on a line on stdin, then prints "released"."""
import sys

import ticketing

addr, key = sys.argv[1], sys.argv[2]
with ticketing.Client([addr]) as client:
    lock = client.acquire(key, lease=60)  # waits without limit, FIFO
    print(f"granted {lock.token}", flush=True)
    sys.stdin.readline()
    lock.release()
    print("released", flush=True)
