"""asyncio client against the real server. Mirrors tests/test_client.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import ticketing
import ticketing.asyncio
from ticketing import InspectFlag, LostReason
from ticketing.constants import Field

from ..proxy import Proxy
from ..server import TOKEN, ServerProcess, TLSFiles


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(coro_fn(), 60)

    asyncio.run(main())


async def wait_for(cond: Callable[[], Awaitable[bool] | bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


async def waiters(client: ticketing.asyncio.Client, key: str) -> int:
    return (await client.inspect(key)).waiters


def test_acquire_extend_release(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client([server.addr]) as client:
            assert await client.ping() >= 0
            lock = await client.acquire(key, lease=5, wait_timeout=1)
            assert lock.key == key and lock.token > 0 and lock.held
            assert 4 < lock.remaining() <= 5 and lock.lease == 5  # counted from the send: load stretches it
            assert await lock.extend(20) == 20
            assert lock.lease == 20 and 19 < lock.remaining() <= 20
            assert await client.extend(key, lock.token, 30) == 30 and lock.lease == 30
            await lock.release()
            assert lock.released and not lock.held and not lock.lost.is_set()
            await lock.release()
            with pytest.raises(ticketing.LockLost, match="released"):
                await lock.extend()
            again = await client.acquire(key, 5)
            assert again.token > lock.token
            await again.release()

    run(main)


def test_context_manager_and_decorator(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            async with client.lock(key, lease=30, wait_timeout=5) as lock:
                assert await client.try_acquire(key, 5) is None
            assert lock.released
            with pytest.raises(RuntimeError):
                async with client.lock(key, lease=30) as lock2:
                    raise RuntimeError("boom")
            assert lock2.released and lock2.token > lock.token
            async with await client.acquire(key, 5) as lock3:
                pass
            assert lock3.released
            tokens: list[int] = []

            @client.lock(key, lease=5)
            async def job() -> None:
                tokens.append((await client.inspect(key)).token or 0)

            await job()
            await job()
            assert len(tokens) == 2 and 0 < tokens[0] < tokens[1]
            assert not (await client.inspect(key)).held

    run(main)


def test_try_acquire_and_wait_timeout(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            lock = await a.acquire(key, 10)
            assert await b.try_acquire(key, 10) is None
            with pytest.raises(ticketing.NotAcquired, match="try once"):
                await b.acquire(key, 10, wait_timeout=0)
            t0 = time.monotonic()
            with pytest.raises(ticketing.NotAcquired, match=f"key '{key}', lease 10 s, wait timeout 0.3 s"):
                await b.acquire(key, 10, wait_timeout=0.3)
            assert 0.29 < time.monotonic() - t0 < 2
            assert await waiters(a, key) == 0
            await lock.release()
            got = await b.try_acquire(key, 10)
            assert got is not None and got.token > lock.token
            await got.release()

    run(main)


def test_waiters_granted_in_arrival_order(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client, \
                ticketing.asyncio.Client(server.addr) as observer:
            holder = await client.acquire(key, 30)
            grants: list[tuple[int, int]] = []

            async def waiter(i: int) -> None:
                lock = await client.acquire(key, 30, wait_timeout=20)
                grants.append((i, lock.token))
                await lock.release()

            tasks = []
            for i in range(10):
                tasks.append(asyncio.create_task(waiter(i)))
                await wait_for(lambda i=i: _is(waiters(observer, key), i + 1))  # type: ignore[misc]
            await holder.release()
            await asyncio.gather(*tasks)
            assert [i for i, _ in grants] == list(range(10))
            tokens = [t for _, t in grants]
            assert tokens == sorted(tokens) and len(set(tokens)) == 10 and tokens[0] > holder.token

    run(main)


async def _is(value: Awaitable[int], want: int) -> bool:
    return await value == want


def test_not_held_and_owner_is_the_token(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            lock = await a.acquire(key, 10)
            reasons: list[LostReason | None] = []
            lock.on_lost(lambda lk: reasons.append(lk.lost_reason))
            assert await lock.verify()
            await b.release(key, lock.token)
            assert not await lock.verify()
            with pytest.raises(ticketing.NotHeld, match=f"token {lock.token}"):
                await b.release(key, lock.token)
            with pytest.raises(ticketing.LockLost) as e:
                await lock.release()
            assert e.value.reason is LostReason.NOT_HELD and reasons == [LostReason.NOT_HELD]
            other = await b.acquire(key, 10)
            with pytest.raises(ticketing.NotHeld):
                await a.release(key, lock.token)
            with pytest.raises(ticketing.NotHeld):
                await a.extend(key, lock.token, 5)
            assert await other.verify() and reasons == [LostReason.NOT_HELD]
            await other.release()

    run(main)


def test_inspect(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            assert await a.inspect(key) == ticketing.KeyInfo(
                held=False, token=None, lease_remaining=0.0, waiters=0, held_for=0.0, lock_delay_remaining=0.0,
                flags=InspectFlag(0))
            holder = await a.acquire(key, lease=10)
            task = asyncio.create_task(b.acquire(key, 10, wait_timeout=20))
            await wait_for(lambda: _is(waiters(a, key), 1))
            mine = await a.inspect(key)
            assert mine.held and mine.token == holder.token and mine.flags & InspectFlag.SESSION
            theirs = await b.inspect(key)
            assert theirs.held and theirs.token is None and theirs.waiters == 1
            assert 0 < theirs.lease_remaining <= 10 and 0 <= theirs.held_for < 10
            await holder.release()
            lock = await task
            assert (await b.inspect(key)).token == lock.token
            await lock.release()
            assert not (await a.inspect(key)).held

    run(main)


def test_lock_delay(server_bin: Path, tmp_path: Path, key: str) -> None:
    srv = ServerProcess(server_bin, tmp_path / "data", env={"TICKETING_LOCK_DELAY": "2s"}).start()

    async def main() -> None:
        async with ticketing.asyncio.Client(srv.addr) as client:
            lock = await client.acquire(key, lease=0.1)
            await asyncio.wait_for(lock.lost.wait(), 3)

            async def delayed() -> bool:
                return (await client.inspect(key)).lock_delay_remaining > 0

            await wait_for(delayed)
            info = await client.inspect(key)
            assert not info.held and 0 < info.lock_delay_remaining <= 2

    try:
        run(main)
    finally:
        srv.stop()


def test_server_rejects_invalid_fields(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            with pytest.raises(ticketing.InvalidRequest) as e:
                await client.acquire("k" * 300, 5)
            assert e.value.field == Field.KEY and isinstance(e.value, ticketing.InvalidArgument)
            with pytest.raises(ticketing.InvalidRequest) as e:
                await client.acquire(key, 30000)
            assert e.value.field == Field.LEASE and "lease 30000 s" in str(e.value)
            await client.ping()

    run(main)


def test_auth(auth_server: ServerProcess, server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(auth_server.addr, token=TOKEN) as client:
            await (await client.acquire(key, 5)).release()
        with pytest.raises(ticketing.AuthFailed, match="rejected the token"):
            await ticketing.asyncio.Client(auth_server.addr, token="wrong token").connect()
        with pytest.raises(ticketing.AuthFailed, match="requires a token"):
            await ticketing.asyncio.Client(auth_server.addr).connect()
        with pytest.raises(ticketing.AuthFailed, match="does not require auth"):
            await ticketing.asyncio.Client(server.addr, token=TOKEN).connect()

    run(main)


def test_tls(tls_server: ServerProcess, server: ServerProcess, tls_files: TLSFiles, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(tls_server.addr, token=TOKEN, ssl=tls_files.client_context()) as client:
            lock = await client.acquire(key, 5)
            await lock.extend(10)
            await lock.release()
            await _hammer(client, key, tasks=4, rounds=20)
        with pytest.raises(ticketing.TLSError, match="certificate verification failed"):
            await ticketing.asyncio.Client(tls_server.addr, token=TOKEN, ssl=True).connect()
        # A TLS/plaintext mismatch, both ways, is a TLSError that says so.
        t0 = time.monotonic()
        with pytest.raises(ticketing.TLSError, match=r"is the server using TLS\?"):
            await ticketing.asyncio.Client(tls_server.addr, token=TOKEN, connect_timeout=3).connect()
        with pytest.raises(ticketing.TLSError, match=r"is the server using TLS\?"):
            await ticketing.asyncio.Client(tls_server.addr, token=TOKEN, connect_timeout=3).ping()
        with pytest.raises(ticketing.TLSError, match=r"is the server using TLS\?"):
            await ticketing.asyncio.Client(server.addr, ssl=tls_files.client_context(), connect_timeout=3).connect()
        assert time.monotonic() - t0 < 3

    run(main)


def test_mutual_tls(mtls_server: ServerProcess, tls_files: TLSFiles, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(mtls_server.addr, ssl=tls_files.client_context(with_cert=True)) as client:
            await (await client.acquire(key, 5)).release()
        with pytest.raises((ticketing.TLSError, ticketing.Unavailable)):
            await ticketing.asyncio.Client(mtls_server.addr, ssl=tls_files.client_context(),
                                           connect_timeout=3).connect()

    run(main)


async def _hammer(client: ticketing.asyncio.Client, key: str, tasks: int, rounds: int) -> None:
    inside = 0
    max_inside = 0
    tokens: list[int] = []

    async def worker(n: int) -> None:
        nonlocal inside, max_inside
        for r in range(rounds):
            async with client.lock(key, lease=10, wait_timeout=30) as lock:
                inside += 1
                max_inside = max(max_inside, inside)
                tokens.append(lock.token)
                await asyncio.sleep(0)
                inside -= 1
            await (await client.acquire(f"{key}-{n}-{r}", 5)).release()
            await client.ping()

    await asyncio.gather(*(worker(n) for n in range(tasks)))
    assert max_inside == 1
    assert tokens == sorted(tokens) and len(set(tokens)) == tasks * rounds


def test_many_tasks_share_one_client(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            await _hammer(client, key, tasks=8, rounds=20)

    run(main)


def test_cancelled_wait_leaves_no_lock_held(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            holder = await a.acquire(key, 30)
            task = asyncio.create_task(b.acquire(key, 30))
            await wait_for(lambda: _is(waiters(a, key), 1))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await waiters(a, key) == 0
            await holder.release()
            assert not (await a.inspect(key)).held
            for delay in (0.0, 0.01, 0.03, 0.06):  # a grant racing the cancel is released
                holder = await a.acquire(key, 0.05)
                task = asyncio.create_task(b.acquire(key, 30))
                await asyncio.sleep(delay)
                task.cancel()
                try:
                    lock = await task
                    await lock.release()
                except asyncio.CancelledError:
                    pass
                await wait_for(lambda: _free(a, key))

    run(main)


async def _free(client: ticketing.asyncio.Client, key: str) -> bool:
    info = await client.inspect(key)
    return not info.held and info.waiters == 0


def test_lost_fires_before_another_client_is_granted(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            lock = await a.acquire(key, lease=0.4)
            fired: list[float] = []
            lock.on_lost(lambda _lk: fired.append(time.monotonic()))
            other = await b.acquire(key, 5, wait_timeout=5)
            granted = time.monotonic()
            assert fired and fired[0] < granted
            assert lock.lost_reason is LostReason.EXPIRED and other.token > lock.token
            with pytest.raises(ticketing.LockLost) as e:
                await lock.release()
            assert e.value.reason is LostReason.EXPIRED
            await other.release()

    run(main)


def test_keepalive_holds_past_the_lease(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client, \
                ticketing.asyncio.Client(server.addr) as other:
            lock = await client.acquire(key, lease=1.5, keepalive=True)
            t_end = time.monotonic() + 2.2  # past the lease granted at first
            while time.monotonic() < t_end:
                assert await other.try_acquire(key, 5) is None
                await asyncio.sleep(0.2)
            assert lock.held and await lock.verify()
            await lock.release()
            assert not (await other.inspect(key)).held
            await asyncio.sleep(0.5)
            assert not (await other.inspect(key)).held and not lock.lost.is_set()

    run(main)


def test_restart_reports_server_restarted(own_server: ServerProcess, key: str) -> None:
    """Issue 7's must-show (see the blocking test)."""
    async def main() -> None:
        async with ticketing.asyncio.Client(own_server.addr) as a, ticketing.asyncio.Client(own_server.addr) as b:
            lock = await a.acquire(key, 30, keepalive=True)
            task = asyncio.create_task(b.acquire(key, 30))
            await wait_for(lambda: _is(waiters(a, key), 1))
            await asyncio.get_running_loop().run_in_executor(None, own_server.restart)
            await asyncio.wait_for(lock.lost.wait(), 5)
            assert lock.lost_reason is LostReason.SERVER_RESTARTED
            with pytest.raises(ticketing.ServerRestarted):
                await task
            with pytest.raises(ticketing.LockLost) as e:
                await lock.release()
            assert e.value.reason is LostReason.SERVER_RESTARTED
            with pytest.raises(ticketing.LockLost):
                await lock.extend()
            assert not await lock.verify()
            with pytest.raises(ticketing.NotHeld):
                await a.release(key, lock.token)
            info = await b.inspect(key)
            assert not info.held and info.waiters == 0
            async with ticketing.asyncio.Client(own_server.addr) as c:
                new = await c.try_acquire(key, 5)
                assert new is not None and new.token > lock.token
                await new.release()

    run(main)


def test_calls_wait_for_a_server_that_comes_back(server_bin: Path, tmp_path: Path, key: str) -> None:
    """See the blocking test."""
    s = ServerProcess(server_bin, tmp_path / "data", env={"TICKETING_SESSION_GRACE": "200ms"}).start()

    async def main() -> None:
        async with ticketing.asyncio.Client(s.addr, heartbeat=0, request_timeout=0.6) as client:
            addr = s.addr
            s.kill()
            await wait_for(lambda: not client.connected)
            await asyncio.sleep(0.4)  # past the grace
            with pytest.raises(ticketing.RequestTimeout, match="within 0.6 s.*Connection refused") as e:
                await client.ping()
            assert isinstance(e.value.__cause__, ticketing.Unavailable)
            task = asyncio.create_task(client.acquire(key, 5, wait_timeout=8))
            await asyncio.sleep(0.5)  # failed rounds
            assert not task.done()
            await asyncio.get_running_loop().run_in_executor(None, lambda: s.start(addr=addr))
            lock = await asyncio.wait_for(task, 10)
            await lock.release()

    try:
        run(main)
    finally:
        s.stop()


def test_graceful_stop_reports_server_stopping(own_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(own_server.addr) as a, ticketing.asyncio.Client(own_server.addr) as b:
            with pytest.raises(ticketing.LockLost, match="server stopping") as e:
                async with a.lock(key, 30) as lock:
                    task = asyncio.create_task(b.acquire(key, 30))
                    await wait_for(lambda: _is(waiters(a, key), 1))
                    stop = asyncio.get_running_loop().run_in_executor(None, own_server.stop)
                    with pytest.raises(ticketing.ShuttingDown):
                        await task
                    await asyncio.wait_for(lock.lost.wait(), 5)
                    assert lock.lost_reason is LostReason.SERVER_STOPPING
                    await stop
                    t0 = time.monotonic()
            # Leaving the block reports the loss at once: the server is gone, and the release of
            # a lock known lost does not wait for it (it waited out the request timeout, 10 s).
            assert time.monotonic() - t0 < 1 and e.value.reason is LostReason.SERVER_STOPPING

    run(main)


def test_close_withdraws_a_queued_acquire(server: ServerProcess, key: str) -> None:
    """Closing a client withdraws its queued acquire from the server (it was left queued, to be
    granted to the closed client later)."""
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as r:
            holder = await r.acquire(key, 30)
            a = ticketing.asyncio.Client(server.addr)
            task = asyncio.create_task(a.acquire(key, 30))
            await wait_for(lambda: _is(waiters(r, key), 1))
            t0 = time.monotonic()
            await a.close()
            assert time.monotonic() - t0 < 2
            with pytest.raises(ticketing.ClientClosed, match="withdrawn"):
                await asyncio.wait_for(task, 2)
            assert await waiters(r, key) == 0  # withdrawn before close returned
            await holder.release()
            assert await r.try_acquire(key, 5) is not None

    run(main)


def test_resume_keeps_the_queue_place(own_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        with Proxy(own_server.addr) as proxy:
            async with ticketing.asyncio.Client(own_server.addr) as r, ticketing.asyncio.Client(proxy.addr) as a, \
                    ticketing.asyncio.Client(own_server.addr) as c:
                holder = await r.acquire(key, 30)
                ta = asyncio.create_task(a.acquire(key, 3))
                await wait_for(lambda: _is(waiters(r, key), 1))
                tc = asyncio.create_task(c.acquire(key, 30, wait_timeout=10))
                await wait_for(lambda: _is(waiters(r, key), 2))
                proxy.cut()
                await wait_for(lambda: proxy.accepted >= 2 and a.connected)
                await asyncio.sleep(1.5)  # the resumed waiter stays queued a while
                await holder.release()
                lock_a = await asyncio.wait_for(ta, 5)
                assert lock_a.token == holder.token + 1
                assert lock_a.remaining() > 2.5 and not lock_a.lost.is_set()
                await lock_a.release()
                lock_c = await asyncio.wait_for(tc, 5)
                assert lock_c.token == lock_a.token + 1
                await lock_c.release()

    run(main)


def test_retried_acquire_and_release_are_idempotent(own_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        with Proxy(own_server.addr) as proxy:
            async with ticketing.asyncio.Client(proxy.addr) as a, ticketing.asyncio.Client(own_server.addr) as r:
                proxy.hold_back.set()
                task = asyncio.create_task(a.acquire(key, 30))

                async def held() -> bool:
                    return (await r.inspect(key)).held

                await wait_for(held)
                proxy.cut()
                lock = await asyncio.wait_for(task, 10)
                proxy.hold_back.set()
                release = asyncio.create_task(lock.release())

                async def free() -> bool:
                    return not (await r.inspect(key)).held

                await wait_for(free)
                proxy.cut()
                await asyncio.wait_for(release, 10)
                assert lock.released and not lock.lost.is_set()
                after = await r.acquire(key, 5)
                assert after.token == lock.token + 1
                await after.release()

    run(main)


def test_frozen_server(own_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        client = ticketing.asyncio.Client(own_server.addr, request_timeout=0.5, heartbeat=0.2, connect_timeout=1)
        await client.connect()
        own_server.signal(signal.SIGSTOP)
        try:
            calls: list[Callable[[], Awaitable[object]]] = [
                client.ping, lambda: client.inspect(key), lambda: client.release(key, 1),
                lambda: client.acquire(key, 5, wait_timeout=0.1)]
            for call in calls:
                t0 = time.monotonic()
                with pytest.raises((ticketing.RequestTimeout, ticketing.ConnectionLost)):
                    await call()
                assert time.monotonic() - t0 < 3
            t0 = time.monotonic()
            await client.close()
            assert time.monotonic() - t0 < 5
        finally:
            own_server.signal(signal.SIGCONT)

    run(main)


def test_close_releases_only_when_asked(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as observer:
            client = ticketing.asyncio.Client(server.addr)
            kept = await client.acquire(key, 30)
            await client.close()
            assert (await observer.inspect(key)).held and kept.held
            await observer.release(key, kept.token)
            client = ticketing.asyncio.Client(server.addr, release_on_close=True)
            lock = await client.acquire(key, 30)
            await client.close()
            assert lock.released and not (await observer.inspect(key)).held

    run(main)
