"""Blocking client against a scripted fake server: the cases a real single node cannot produce on
demand. Mirrored by tests/test_asyncio/test_fake.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import ticketing
from ticketing.constants import Op, Status
from ticketing.protocol import Response

from .fakeserver import FakeConn, FakeServer


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def serve(c: FakeConn, first_token: int = 100) -> None:
    """A well-behaved responder: every ACQUIRE granted, every other request OK."""
    token = first_token
    while True:
        req = c.recv()
        if req.op == Op.ACQUIRE:
            token += 1
            c.send(Response(op=req.op, status=Status.OK, id=req.id, token=token, lease_ms=req.lease_ms))
        elif req.op == Op.EXTEND:
            c.send(Response(op=req.op, status=Status.OK, id=req.id, token=req.token, lease_ms=req.lease_ms))
        else:
            c.send(Response(op=req.op, status=Status.OK, id=req.id))


def leader(c: FakeConn) -> None:
    c.handshake()
    serve(c)


def released(server: FakeServer, token: int) -> bool:
    return any(r.op == Op.RELEASE and r.token == token for r in server.requests)


def test_abandoned_acquire_granted_anyway_is_released() -> None:
    """The wait is abandoned (request timeout) and CANCEL sent, but the server had granted it
    already: the client releases that token."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        assert acq.op == Op.ACQUIRE
        cancel = c.recv()
        assert cancel.op == Op.CANCEL and cancel.token == acq.id
        c.send(Response(op=Op.ACQUIRE, status=Status.OK, id=acq.id, token=77, lease_ms=acq.lease_ms))
        c.send(Response(op=Op.CANCEL, status=Status.OK, id=cancel.id, detail=0))
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, request_timeout=0.1) as client:
        with pytest.raises(ticketing.RequestTimeout):
            client.acquire("k1", 10, wait_timeout=0.1)
        wait_for(lambda: released(fake, 77))
        rel = [r for r in fake.requests if r.op == Op.RELEASE][0]
        assert rel.key == b"k1"
        assert not fake.errors


def test_abandoned_acquire_cancelled_is_not_released() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        cancel = c.recv()
        c.send(Response(op=Op.ACQUIRE, status=Status.CANCELLED, id=acq.id))
        c.send(Response(op=Op.CANCEL, status=Status.OK, id=cancel.id, detail=1))
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, request_timeout=0.1) as client:
        with pytest.raises(ticketing.RequestTimeout):
            client.acquire("k1", 10, wait_timeout=0.1)
        client.ping()  # answered after the CANCELLED: nothing else was sent in between
        assert [r.op for r in fake.requests] == [Op.ACQUIRE, Op.CANCEL, Op.PING]


def test_not_leader_moves_to_the_hinted_leader_and_retries() -> None:
    with FakeServer(leader) as the_leader:
        def follower(c: FakeConn) -> None:
            c.handshake()
            while True:
                req = c.recv()
                c.send(Response(op=req.op, status=Status.NOT_LEADER, id=req.id, data=the_leader.addr.encode()))

        with FakeServer(follower) as node, ticketing.Client([node.addr]) as client:
            lock = client.acquire("k", 5)
            assert lock.token == 101
            assert client.endpoint == the_leader.addr
            # the same request, same id, retried at the leader; the same session id on both
            assert node.requests[0].id == the_leader.requests[0].id == 1
            assert node.hellos[0].session_id == the_leader.hellos[0].session_id == client.session_id
            lock.release()


def test_not_leader_without_hint_tries_next_endpoint() -> None:
    def follower(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.NOT_LEADER, id=req.id))

    with FakeServer(follower) as a, FakeServer(leader) as b:
        with ticketing.Client([a.addr, b.addr]) as client:
            assert client.acquire("k", 5).token == 101
            assert client.endpoint == b.addr


def test_not_leader_everywhere_gives_up() -> None:
    def follower(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.NOT_LEADER, id=req.id))

    with FakeServer(follower) as a:
        with ticketing.Client([a.addr], max_redirects=2, retry_backoff=0.001) as client:
            with pytest.raises(ticketing.NotLeader):
                client.ping()
            assert len(a.requests) == 3


def test_shutting_down_moves_to_next_endpoint() -> None:
    def stopping(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.send(Response(op=req.op, status=Status.SHUTTING_DOWN, id=req.id))

    with FakeServer(stopping) as a, FakeServer(leader) as b:
        with ticketing.Client([a.addr, b.addr]) as client:
            lock = client.acquire("k", 5, wait_timeout=None)
            assert lock.token == 101 and client.endpoint == b.addr
            assert a.requests[0].id == b.requests[0].id


def test_server_without_the_token_is_refused() -> None:
    def script(c: FakeConn) -> None:
        c.handshake(token=b"secret", proof_token=b"not the secret")

    with FakeServer(script) as fake:
        client = ticketing.Client(fake.addr, token="secret")
        with pytest.raises(ticketing.AuthFailed, match="proof did not verify"):
            client.connect()
        client.close()


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

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        lock = client.acquire("k", 60)
        seen: list[str | None] = []
        lock.on_lost(lambda lk: seen.append(lk.lost_reason))
        assert lock.lost.wait(5)
        assert lock.lost_reason == "expired" and seen == ["expired"]
        with pytest.raises(ticketing.LockLost):
            lock.extend()
        with pytest.raises(ticketing.NotHeld):
            lock.release()


def test_session_id_and_request_ids_survive_reconnect() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        req = c.recv()
        c.send(Response(op=req.op, status=Status.OK, id=req.id))
        # then drop the connection

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        client.ping()
        wait_for(lambda: not client.connected)
        client.ping()
        assert [h.session_id for h in fake.hellos] == [client.session_id] * 2
        assert [r.id for r in fake.requests] == [1, 2]


def test_connection_drop_fails_calls_in_flight() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        c.recv()
        c.recv()

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        errors: list[BaseException] = []

        def waiter() -> None:
            try:
                client.acquire("k", 5)
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=waiter) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(5)
        assert len(errors) == 2 and all(isinstance(e, ticketing.ConnectionLost) for e in errors)
