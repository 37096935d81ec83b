"""asyncio client against a scripted fake server. Mirrors tests/test_fake.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

import ticketing
import ticketing.asyncio
from ticketing.constants import Op, Status
from ticketing.protocol import Response

from ..fakeserver import FakeConn, FakeServer
from ..test_fake import leader, released, serve


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await asyncio.wait_for(coro_fn(), 30)

    asyncio.run(main())


async def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


def test_cancelled_task_granted_anyway_releases() -> None:
    """The waiting task is cancelled, so the client sends CANCEL; the server had granted the
    lock already and answers OK: the client releases that token."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        cancel = c.recv()
        assert cancel.op == Op.CANCEL and cancel.token == acq.id
        c.send(Response(op=Op.ACQUIRE, status=Status.OK, id=acq.id, token=77, lease_ms=acq.lease_ms))
        c.send(Response(op=Op.CANCEL, status=Status.OK, id=cancel.id, detail=0))
        serve(c)

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr) as client:
                task = asyncio.create_task(client.acquire("k1", 10))
                await wait_for(lambda: len(fake.requests) == 1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await wait_for(lambda: released(fake, 77))
                rel = [r for r in fake.requests if r.op == Op.RELEASE][0]
                assert rel.key == b"k1"
                assert not fake.errors

    run(main)


def test_cancel_after_answer_arrived_releases() -> None:
    """The answer OK is already in the future when the task is cancelled: released too."""
    def script(c: FakeConn) -> None:
        c.handshake()
        serve(c)

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr) as client:
                await client.ping()
                conn = client._conn
                assert conn is not None
                task: asyncio.Task[ticketing.asyncio.Lock] | None = None
                dispatch = conn._dispatch

                def dispatch_then_cancel(resp: Response) -> None:
                    dispatch(resp)  # the answer is now the future's result...
                    if resp.op == Op.ACQUIRE and task is not None:
                        task.cancel()  # ...and the task is cancelled before it resumes

                conn._dispatch = dispatch_then_cancel  # type: ignore[method-assign]
                task = asyncio.create_task(client.acquire("k2", 10))
                with pytest.raises(asyncio.CancelledError):
                    await task
                await wait_for(lambda: released(fake, 101))

    run(main)


def test_cancelled_task_withdrawn_is_not_released() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        cancel = c.recv()
        c.send(Response(op=Op.ACQUIRE, status=Status.CANCELLED, id=acq.id))
        c.send(Response(op=Op.CANCEL, status=Status.OK, id=cancel.id, detail=1))
        serve(c)

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr) as client:
                task = asyncio.create_task(client.acquire("k1", 10))
                await wait_for(lambda: len(fake.requests) == 1)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                await client.ping()
                assert [r.op for r in fake.requests] == [Op.ACQUIRE, Op.CANCEL, Op.PING]

    run(main)


def test_request_timeout_abandons_and_releases() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        cancel = c.recv()
        c.send(Response(op=Op.ACQUIRE, status=Status.OK, id=acq.id, token=77, lease_ms=acq.lease_ms))
        c.send(Response(op=Op.CANCEL, status=Status.OK, id=cancel.id, detail=0))
        serve(c)

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr, request_timeout=0.1) as client:
                with pytest.raises(ticketing.RequestTimeout):
                    await client.acquire("k1", 10, wait_timeout=0.1)
                await wait_for(lambda: released(fake, 77))

    run(main)


def test_not_leader_moves_to_the_hinted_leader_and_retries() -> None:
    async def main() -> None:
        with FakeServer(leader) as the_leader:
            def follower(c: FakeConn) -> None:
                c.handshake()
                while True:
                    req = c.recv()
                    c.send(Response(op=req.op, status=Status.NOT_LEADER, id=req.id, data=the_leader.addr.encode()))

            with FakeServer(follower) as node:
                async with ticketing.asyncio.Client([node.addr]) as client:
                    lock = await client.acquire("k", 5)
                    assert lock.token == 101
                    assert client.endpoint == the_leader.addr
                    assert node.requests[0].id == the_leader.requests[0].id == 1
                    assert node.hellos[0].session_id == the_leader.hellos[0].session_id == client.session_id
                    await lock.release()

    run(main)


def test_not_leader_without_hint_tries_next_endpoint() -> None:
    def follower(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.NOT_LEADER, id=req.id))

    async def main() -> None:
        with FakeServer(follower) as a, FakeServer(leader) as b:
            async with ticketing.asyncio.Client([a.addr, b.addr]) as client:
                assert (await client.acquire("k", 5)).token == 101
                assert client.endpoint == b.addr

    run(main)


def test_not_leader_everywhere_gives_up() -> None:
    def follower(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.NOT_LEADER, id=req.id))

    async def main() -> None:
        with FakeServer(follower) as a:
            async with ticketing.asyncio.Client([a.addr], max_redirects=2, retry_backoff=0.001) as client:
                with pytest.raises(ticketing.NotLeader):
                    await client.ping()
                assert len(a.requests) == 3

    run(main)


def test_shutting_down_moves_to_next_endpoint() -> None:
    def stopping(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.SHUTTING_DOWN, id=req.id))

    async def main() -> None:
        with FakeServer(stopping) as a, FakeServer(leader) as b:
            async with ticketing.asyncio.Client([a.addr, b.addr]) as client:
                lock = await client.acquire("k", 5, wait_timeout=None)
                assert lock.token == 101 and client.endpoint == b.addr
                assert a.requests[0].id == b.requests[0].id

    run(main)


def test_server_without_the_token_is_refused() -> None:
    def script(c: FakeConn) -> None:
        c.handshake(token=b"secret", proof_token=b"not the secret")

    async def main() -> None:
        with FakeServer(script) as fake:
            client = ticketing.asyncio.Client(fake.addr, token="secret")
            with pytest.raises(ticketing.AuthFailed, match="proof did not verify"):
                await client.connect()
            await client.close()

    run(main)


def test_expired_push_fires_lost() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.send(Response(op=Op.ACQUIRE, status=Status.OK, id=acq.id, token=9, lease_ms=acq.lease_ms))
        time.sleep(0.05)
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, data=acq.key))
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.NOT_HELD, id=req.id))

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr) as client:
                lock = await client.acquire("k", 60)
                seen: list[str | None] = []
                lock.on_lost(lambda lk: seen.append(lk.lost_reason))
                await asyncio.wait_for(lock.lost.wait(), 5)
                assert lock.lost_reason == "expired" and seen == ["expired"]
                with pytest.raises(ticketing.LockLost):
                    await lock.extend()
                with pytest.raises(ticketing.NotHeld):
                    await lock.release()

    run(main)


def test_session_id_and_request_ids_survive_reconnect() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        req = c.recv()
        c.send(Response(op=req.op, status=Status.OK, id=req.id))

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr) as client:
                await client.ping()
                await wait_for(lambda: not client.connected)
                await client.ping()
                assert [h.session_id for h in fake.hellos] == [client.session_id] * 2
                assert [r.id for r in fake.requests] == [1, 2]

    run(main)


def test_connection_drop_fails_calls_in_flight() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        c.recv()
        c.recv()

    async def main() -> None:
        with FakeServer(script) as fake:
            async with ticketing.asyncio.Client(fake.addr) as client:
                results = await asyncio.gather(client.acquire("k", 5), client.acquire("k", 5),
                                               return_exceptions=True)
                assert all(isinstance(r, ticketing.ConnectionLost) for r in results), results

    run(main)
