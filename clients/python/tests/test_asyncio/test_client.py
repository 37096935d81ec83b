"""asyncio client against the real server. Mirrors tests/test_client.py."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import ticketing
import ticketing.asyncio
from ticketing.constants import Field

from ..server import TOKEN, ServerProcess, tls_context


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(coro_fn(), 60)

    asyncio.run(main())


async def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def test_acquire_extend_release(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client([server.addr]) as client:
            assert await client.ping() >= 0
            lock = await client.acquire(key, lease=5, wait_timeout=1)
            assert lock.key == key and lock.token > 0 and lock.held
            assert 4 < lock.remaining() <= 5 and lock.lease == 5
            await lock.extend(20)
            assert lock.lease == 20 and 19 < lock.remaining() <= 20
            assert await client.extend(key, lock.token, 30) == 30
            await lock.release()
            assert lock.released and not lock.held and not lock.lost.is_set()
            await lock.release()
            again = await client.acquire(key, 5)
            assert again.token > lock.token
            await again.release()

    run(main)


def test_lock_context_manager_releases(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            async with client.lock(key, lease=30, wait_timeout=5) as lock:
                token = lock.token
                with pytest.raises(ticketing.NotAcquired):
                    await client.try_acquire(key, 5)
            assert lock.released
            with pytest.raises(RuntimeError):
                async with client.lock(key, lease=30) as lock2:
                    raise RuntimeError("boom")
            assert lock2.released and lock2.token > token
            async with await client.acquire(key, 5) as lock3:
                pass
            assert lock3.released

    run(main)


def test_try_acquire_held_key_not_acquired(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            lock = await a.acquire(key, 10)
            with pytest.raises(ticketing.NotAcquired):
                await b.try_acquire(key, 10)
            t0 = time.monotonic()
            with pytest.raises(ticketing.NotAcquired):
                await b.acquire(key, 10, wait_timeout=0.2)
            assert 0.15 < time.monotonic() - t0 < 2
            await lock.release()
            await (await b.try_acquire(key, 10)).release()

    run(main)


def test_waiters_granted_in_arrival_order(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            holder = await client.acquire(key, 30)
            grants: list[tuple[int, int]] = []

            async def waiter(i: int) -> None:
                lock = await client.acquire(key, 30, wait_timeout=20)
                grants.append((i, lock.token))
                await lock.release()

            tasks = []
            for i in range(20):
                tasks.append(asyncio.create_task(waiter(i)))
                await asyncio.sleep(0)  # each task writes its ACQUIRE before the next starts
            await holder.release()
            await asyncio.gather(*tasks)
            assert [i for i, _ in grants] == list(range(20))
            tokens = [t for _, t in grants]
            assert tokens == sorted(tokens) and len(set(tokens)) == 20 and tokens[0] > holder.token

    run(main)


def test_release_stale_token_not_held(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            lock = await client.acquire(key, 10)
            await lock.release()
            with pytest.raises(ticketing.NotHeld):
                await client.release(key, lock.token)
            with pytest.raises(ticketing.NotHeld):
                await client.extend(key, lock.token, 5)
            other = await client.acquire(key, 10)
            with pytest.raises(ticketing.NotHeld):
                await client.release(key, other.token + 1000)
            with pytest.raises(ticketing.NotHeld):
                await client.release(key, lock.token)
            assert other.held
            await other.release()

    run(main)


def test_release_from_another_client(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            lock = await a.acquire(key, 10)
            await b.release(key, lock.token)
            await (await b.try_acquire(key, 10)).release()
            with pytest.raises(ticketing.NotHeld):
                await lock.extend()
            assert lock.lost.is_set() and lock.lost_reason == "not_held"

    run(main)


def test_inspect_free_key(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            info = await client.inspect(key)
            assert info == ticketing.KeyInfo(token=None, lease_remaining=0.0, waiters=0, held_for=0.0,
                                             lock_delay_remaining=0.0)

    run(main)


def test_inspect_held_key_with_a_waiter(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as a, ticketing.asyncio.Client(server.addr) as b:
            holder = await a.acquire(key, lease=10)
            waiter = asyncio.create_task(b.acquire(key, 10, wait_timeout=20))
            deadline = time.monotonic() + 5
            while (info := await b.inspect(key)).waiters != 1:  # from any client, even the waiter's
                assert time.monotonic() < deadline, "the waiter never queued"
                await asyncio.sleep(0.005)
            assert info.token == holder.token
            assert info.waiters == 1
            assert 0 < info.lease_remaining <= 10
            assert 0 <= info.held_for < 10 and info.lock_delay_remaining == 0
            await holder.release()
            lock = await asyncio.wait_for(waiter, 10)
            info = await a.inspect(key)
            assert info.token == lock.token and info.waiters == 0
            await lock.release()
            assert (await a.inspect(key)).token is None

    run(main)


def test_inspect_lock_delay(server_bin: Path, tmp_path: Path, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(srv.addr) as client:
            lock = await client.acquire(key, lease=0.1)
            await asyncio.wait_for(lock.lost.wait(), 3)
            deadline = time.monotonic() + 5
            while (info := await client.inspect(key)).lock_delay_remaining == 0:  # expired yet?
                assert time.monotonic() < deadline, "no lock-delay after the lease ran out"
                await asyncio.sleep(0.005)
            assert info.token is None and info.lease_remaining == 0 and info.held_for == 0
            assert 0 < info.lock_delay_remaining <= 2

    srv = ServerProcess(server_bin, tmp_path / "data", env={"TICKETING_LOCK_DELAY": "2s"}).start()
    try:
        run(main)
    finally:
        srv.stop()


def test_invalid_requests(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            with pytest.raises(ticketing.InvalidRequest) as e:
                await client.acquire("k" * 300, 5)
            assert e.value.field == Field.KEY
            with pytest.raises(ticketing.InvalidRequest) as e:
                await client.acquire(key, 25 * 3600)
            assert e.value.field == Field.LEASE
            await client.ping()
            with pytest.raises(ValueError):
                await client.acquire("", 5)

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


def test_tls(tls_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(tls_server.addr, token=TOKEN, ssl=tls_context()) as client:
            lock = await client.acquire(key, 5)
            await lock.extend(10)
            await lock.release()
            await _hammer(client, key, tasks=8, rounds=40)
        with pytest.raises(ticketing.ConnectionLost, match="TLS"):
            await ticketing.asyncio.Client(tls_server.addr, token=TOKEN, ssl=True).connect()

    run(main)


def test_many_tasks_share_one_client(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            await _hammer(client, key, tasks=32, rounds=25)

    run(main)


def test_cancelled_wait_leaves_no_lock_held(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client, \
                ticketing.asyncio.Client(server.addr) as other:
            holder = await other.acquire(key, 30)
            task = asyncio.create_task(client.acquire(key, 30))
            await wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.ping()  # same connection, answered in order: the CANCEL was processed
            await holder.release()  # so the withdrawn waiter is not handed the lock
            await (await other.try_acquire(key, 5)).release()

            # And when the hand-off races the cancel: whatever happens, the key ends up free.
            for _ in range(20):
                holder = await other.acquire(key, 30)
                task = asyncio.create_task(client.acquire(key, 30))
                await wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
                release = asyncio.create_task(holder.release())
                await asyncio.sleep(0)
                task.cancel()
                await release
                try:
                    await task
                    raise AssertionError("the task finished although it was cancelled")
                except asyncio.CancelledError:
                    pass
                lock = await other.acquire(key, 5, wait_timeout=5)  # granted: nothing left held
                await lock.release()

    run(main)


def test_lost_signal_fires_at_lease_end(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            lock = await client.acquire(key, lease=0.3)
            fired = asyncio.Event()
            reasons: list[str | None] = []

            async def on_lost(lk: ticketing.asyncio.Lock) -> None:
                reasons.append(lk.lost_reason)
                fired.set()

            lock.on_lost(on_lost)
            t0 = time.monotonic()
            await asyncio.wait_for(lock.lost.wait(), 3)
            await asyncio.wait_for(fired.wait(), 1)
            assert time.monotonic() - t0 < 0.5
            assert lock.lost_reason in ("deadline", "expired") and reasons == [lock.lost_reason]
            with pytest.raises(ticketing.LockLost):
                await lock.extend()
            async with ticketing.asyncio.Client(server.addr) as other:
                await (await other.acquire(key, 5, wait_timeout=2)).release()
            with pytest.raises(ticketing.NotHeld):
                await lock.release()

    run(main)


def test_expired_notice_from_server(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client:
            lock = await client.acquire(key, lease=0.2)
            lock._deadline += 60
            lock._schedule()
            await asyncio.wait_for(lock.lost.wait(), 3)
            assert lock.lost_reason == "expired"

    run(main)


def test_keepalive_holds_short_lease(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(server.addr) as client, \
                ticketing.asyncio.Client(server.addr) as other:
            lock = await client.acquire(key, lease=0.3, keepalive=True)
            keepalive = lock._keepalive
            t_end = time.monotonic() + 1.2
            while time.monotonic() < t_end:
                with pytest.raises(ticketing.NotAcquired):
                    await other.try_acquire(key, 5)
                await asyncio.sleep(0.1)
            assert lock.held and not lock.lost.is_set()
            await lock.release()
            assert keepalive is not None
            await asyncio.sleep(0)
            assert keepalive.done()
            await (await other.try_acquire(key, 5)).release()
            await asyncio.sleep(0.4)
            assert not lock.lost.is_set()

    run(main)


def test_endpoint_list_skips_dead_endpoint(server: ServerProcess, key: str) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()

    async def main() -> None:
        async with ticketing.asyncio.Client([dead, server.addr]) as client:
            assert client.endpoint == server.addr
            await (await client.acquire(key, 5)).release()
        with pytest.raises(ticketing.ConnectionLost, match="could not connect"):
            await ticketing.asyncio.Client([dead]).connect()

    run(main)


def test_reconnect_after_server_restart(own_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(own_server.addr) as client, \
                ticketing.asyncio.Client(own_server.addr) as other:
            lock = await other.acquire(key, 30)
            task = asyncio.create_task(client.acquire(key, 5))
            await wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
            addr = own_server.addr
            await asyncio.to_thread(own_server.kill)
            with pytest.raises(ticketing.ConnectionLost):
                await task
            with pytest.raises(ticketing.ConnectionLost):
                await client.ping()
            await asyncio.to_thread(own_server.start, 15.0, addr)
            session = client.session_id
            await client.ping()
            assert client.session_id == session
            new = await client.acquire(key, 5)
            assert new.token > lock.token
            await new.release()

    run(main)


def test_shutdown_answers_waiters(own_server: ServerProcess, key: str) -> None:
    async def main() -> None:
        async with ticketing.asyncio.Client(own_server.addr) as client:
            await client.acquire(key, 30)
            task = asyncio.create_task(client.acquire(key, 5))
            await wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
            await asyncio.to_thread(own_server.stop)
            with pytest.raises((ticketing.ShuttingDown, ticketing.ConnectionLost)):
                await task

    run(main)


def test_close_fails_calls_in_flight(server: ServerProcess, key: str) -> None:
    async def main() -> None:
        client = ticketing.asyncio.Client(server.addr)
        holder = await client.acquire(key, 30)
        task = asyncio.create_task(client.acquire(key, 5))
        await wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
        await client.close()
        with pytest.raises(ticketing.ConnectionLost):
            await task
        assert holder.lost.is_set() and holder.lost_reason == "closed"
        with pytest.raises(ticketing.ConnectionLost):
            await client.ping()
        async with ticketing.asyncio.Client(server.addr) as other:
            await other.release(key, holder.token)

    run(main)
