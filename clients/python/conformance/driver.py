"""The Python client's conformance driver (tests/conformance/DRIVER.md).

Reads one JSON command per line on stdin and writes one JSON reply or event per line on stdout.
It drives the asyncio client, ``ticketing.asyncio.Client``: every command runs as its own task,
so commands run concurrently and a waiting ``acquire`` never holds up the next command, and
``cancel`` is asyncio's own cancellation of that task (the client then withdraws the wait with
CANCEL and releases a grant that raced it). Logs go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import ticketing
import ticketing._clock
import ticketing.asyncio

FEATURES = ["locks", "cancel", "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls",
            "request_timeout", "lost_events", "connect_election"]

log = logging.getLogger("ticketing.conformance")

Json = dict[str, Any]


def error_kind(e: BaseException) -> tuple[str, str | None]:
    """DRIVER.md's error kind (and lost reason) for an exception of the client."""
    if isinstance(e, asyncio.CancelledError):
        return "cancelled", None
    if isinstance(e, ticketing.LockLost):
        return "lock_lost", reason_name(e.reason)
    table: list[tuple[type[BaseException], str]] = [
        (ticketing.NotAcquired, "not_acquired"),
        (ticketing.Cancelled, "cancelled"),
        (ticketing.NotHeld, "not_held"),
        (ticketing.InvalidArgument, "invalid_argument"),
        (ticketing.AlreadyHeld, "already_held"),
        (ticketing.AuthFailed, "auth_failed"),
        (ticketing.UnsupportedVersion, "unsupported_version"),
        (ticketing.TLSError, "tls"),
        (ticketing.Unavailable, "unavailable"),
        (ticketing.RequestTimeout, "timeout"),
        (ticketing.ConnectionLost, "connection_lost"),
        (ticketing.ServerRestarted, "server_restarted"),
        (ticketing.Busy, "busy"),
        (ticketing.ShuttingDown, "shutting_down"),
        (ticketing.ClientClosed, "closed"),
    ]
    for cls, kind in table:
        if isinstance(e, cls):
            return kind, None
    return "other", None


def reason_name(reason: ticketing.LostReason | str | None) -> str | None:
    """``"server restarted"`` -> ``"server_restarted"``."""
    return None if reason is None else str(reason).replace(" ", "_")


def seconds(ms: Any) -> Any:
    """Integer milliseconds -> float seconds, passing anything else through unchanged (so the
    client's own argument checks decide)."""
    if ms is None or isinstance(ms, bool) or not isinstance(ms, (int, float)):
        return ms
    return ms / 1000


def token_int(text: Any) -> Any:
    """A decimal-string token -> int (anything else passes through to the client's checks)."""
    if isinstance(text, str):
        try:
            return int(text)
        except ValueError:
            return text
    return text


class Driver:
    def __init__(self) -> None:
        self.clients: dict[str, ticketing.asyncio.Client] = {}
        self.locks: dict[str, ticketing.asyncio.Lock] = {}
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.done = asyncio.Event()
        self.exited = False  # after the exit reply nothing more is written

    # --- output -------------------------------------------------------------------------------

    def emit(self, obj: Json) -> None:
        if self.exited:
            return
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    # --- dispatch -----------------------------------------------------------------------------

    def handle_line(self, line: str) -> None:
        try:
            cmd = json.loads(line)
            cid = cmd["id"]
            op = cmd["op"]
        except (ValueError, KeyError, TypeError) as e:
            log.error("bad command %r: %s", line, e)
            return
        fn: Callable[[Json], Awaitable[Json | None]] | None = getattr(self, f"op_{op}", None)
        if fn is None:
            self.emit({"id": cid, "ok": False, "error": {"kind": "other", "message": f"unknown op {op!r}"}})
            return
        task = asyncio.get_running_loop().create_task(self.run(cid, fn, cmd))
        self.tasks[cid] = task
        task.add_done_callback(lambda _t: self.tasks.pop(cid, None))

    async def run(self, cid: int, fn: Callable[[Json], Awaitable[Json | None]], cmd: Json) -> None:
        try:
            result = await fn(cmd)
        except BaseException as e:  # every error becomes a reply; CancelledError too
            kind, reason = error_kind(e)
            error: Json = {"kind": kind, "message": str(e) or type(e).__name__}
            if reason is not None:
                error["reason"] = reason
            if kind == "other":
                log.error("command %s failed", cmd, exc_info=e)
            self.emit({"id": cid, "ok": False, "error": error})
            return
        self.emit({"id": cid, "ok": True, **(result or {})})

    # --- commands -----------------------------------------------------------------------------

    async def op_hello(self, cmd: Json) -> Json:
        return {"language": "python", "client_version": ticketing.__version__, "features": FEATURES}

    async def op_connect(self, cmd: Json) -> Json:
        kwargs: dict[str, Any] = {"token": cmd.get("token")}
        tls = cmd.get("tls")
        if tls:
            ctx = ssl.create_default_context(cafile=tls.get("ca"))
            if tls.get("cert"):
                ctx.load_cert_chain(tls["cert"], tls.get("key"))
            kwargs["ssl"] = ctx
            if tls.get("server_name"):
                kwargs["server_hostname"] = tls["server_name"]
        for name, option in (("request_timeout_ms", "request_timeout"), ("heartbeat_ms", "heartbeat"),
                             ("dial_timeout_ms", "connect_timeout")):
            if cmd.get(name) is not None:
                kwargs[option] = seconds(cmd[name])
        client = ticketing.asyncio.Client(cmd["endpoints"], **kwargs)
        try:
            await client.connect()
        except BaseException:
            await client.close()
            raise
        old = self.clients.pop(cmd["client"], None)
        if old is not None:
            await old.close()
        self.clients[cmd["client"]] = client
        return {"session_id": client.session_id.hex()}

    async def op_close(self, cmd: Json) -> None:
        client = self.clients.pop(cmd["client"], None)
        if client is not None:
            await client.close()  # bounded by itself (the withdrawal of queued acquires: cleanup_timeout)

    def _client(self, cmd: Json) -> ticketing.asyncio.Client:
        return self.clients[cmd["client"]]

    def _key(self, cmd: Json) -> Any:
        return bytes.fromhex(cmd["key_hex"]) if "key_hex" in cmd else cmd.get("key")

    def _track(self, name: str, lock: ticketing.asyncio.Lock) -> None:
        self.locks[name] = lock
        lock.on_lost(lambda lk: self.emit({"event": "lost", "lock": name, "reason": reason_name(lk.lost_reason)}))

    async def op_acquire(self, cmd: Json) -> Json:
        lock = await self._client(cmd).acquire(
            self._key(cmd), seconds(cmd.get("lease_ms")), seconds(cmd.get("wait_ms")),
            keepalive=bool(cmd.get("keepalive")), refuse_held=bool(cmd.get("refuse_held")))
        self._track(cmd["lock"], lock)
        return {"token": str(lock.token), "lease_ms": round(lock.lease * 1000)}

    async def op_try_acquire(self, cmd: Json) -> Json:
        lock = await self._client(cmd).try_acquire(self._key(cmd), seconds(cmd.get("lease_ms")))
        if lock is None:
            return {"acquired": False}
        self._track(cmd["lock"], lock)
        return {"acquired": True, "token": str(lock.token)}

    async def op_cancel(self, cmd: Json) -> None:
        task = self.tasks.get(cmd["target"])
        if task is not None:
            task.cancel()

    async def op_release(self, cmd: Json) -> None:
        await self.locks[cmd["lock"]].release()

    async def op_extend(self, cmd: Json) -> Json:
        lease = await self.locks[cmd["lock"]].extend(seconds(cmd.get("lease_ms")))
        return {"lease_ms": round(lease * 1000)}

    async def op_lock_state(self, cmd: Json) -> Json:
        lock = self.locks[cmd["lock"]]
        # The deadline itself, not the lost signal's earlier moment (DRIVER.md).
        deadline_in_ms = (lock._deadline - ticketing._clock.now()) * 1000
        state: Json = {"lost": lock.lost.is_set(), "token": str(lock.token), "deadline_in_ms": deadline_in_ms}
        if lock.lost_reason is not None:
            state["reason"] = reason_name(lock.lost_reason)
        return state

    async def op_verify(self, cmd: Json) -> Json:
        return {"held": await self.locks[cmd["lock"]].verify()}

    async def op_release_token(self, cmd: Json) -> None:
        await self._client(cmd).release(self._key(cmd), token_int(cmd.get("token")))

    async def op_inspect(self, cmd: Json) -> Json:
        info = await self._client(cmd).inspect(self._key(cmd))
        return {"held": info.held, "waiters": info.waiters, "lease_left_ms": round(info.lease_remaining * 1000)}

    async def op_ping(self, cmd: Json) -> None:
        await self._client(cmd).ping()

    async def op_with_lock(self, cmd: Json) -> None:
        async with self._client(cmd).lock(self._key(cmd), seconds(cmd.get("lease_ms"))):
            await asyncio.sleep(cmd.get("hold_ms", 0) / 1000)

    async def op_reset(self, cmd: Json) -> None:
        await self.close_all()
        self.locks.clear()

    async def op_exit(self, cmd: Json) -> None:
        self.done.set()

    async def close_all(self) -> None:
        clients = list(self.clients.values())
        self.clients.clear()
        if clients:
            await asyncio.wait([asyncio.ensure_future(c.close()) for c in clients], timeout=5)


def _read_stdin(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
    for raw in sys.stdin:
        loop.call_soon_threadsafe(lines.put_nowait, raw)
    loop.call_soon_threadsafe(lines.put_nowait, None)


async def main() -> None:
    driver = Driver()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    threading.Thread(target=_read_stdin, args=(loop, lines), daemon=True, name="stdin").start()

    async def pump() -> None:
        while True:
            line = await lines.get()
            if line is None:
                driver.done.set()
                return
            if line.strip():
                driver.handle_line(line)

    reader = asyncio.create_task(pump())
    await driver.done.wait()
    reader.cancel()
    await asyncio.sleep(0)  # let the exit reply go out first
    driver.exited = True
    for task in list(driver.tasks.values()):
        task.cancel()
    await driver.close_all()


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("TICKETING_DRIVER_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(main())
    sys.exit(0)
