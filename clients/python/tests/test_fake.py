"""Blocking client against a scripted fake server: the cases a real single node cannot produce
on demand (resume with lost answers, a changed state id, GOAWAY, NOT_LEADER, a frozen server,
a grant racing a cancel), plus argument checks and the helpers. Mirrored by
tests/test_asyncio/test_fake.py."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable

import pytest

import ticketing
import ticketing._clock
from ticketing import LostReason
from ticketing._clock import FallbackClock
from ticketing.constants import (
    AUTH_SIZE,
    CLOCK_RATE_BOUND_PPM,
    HELLO_SIZE,
    LOST_CHECK_MS,
    ExpiredReason,
    GoawayReason,
    Op,
    Status,
)
from ticketing.protocol import Challenge, Response, Welcome

from .fakeserver import FakeConn, FakeServer, leader, serve


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run ``fn`` on a thread; the list gets its result or exception."""
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


# --- sessions: resume, restart, not resumed -------------------------------------------------


def test_resume_resends_with_original_ids() -> None:
    """The connection drops while an ACQUIRE waits; the client resumes and re-sends it with
    its id; the server's answer to the retry is the lock."""
    def script(c: FakeConn) -> None:
        c.handshake()
        if len(fake.conns) == 1:
            c.recv()  # the ACQUIRE, left queued; then the connection drops
            return
        retry = c.recv()
        c.answer(retry, token=55, lease_ms=retry.lease_ms)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        t0 = time.monotonic()
        lock = client.acquire("k", 10)
        assert lock.token == 55 and lock.held
        acquires = [r for r in fake.requests if r.op == Op.ACQUIRE]
        assert len(acquires) == 2 and acquires[0] == acquires[1]  # same id, same fields
        assert [h.session_id for h in fake.hellos] == [client.session_id] * 2
        assert lock.deadline > t0 + 9.9  # t_first + lease * (1 - 2 rho) - margin
        client.ping()
        assert fake.requests[-1].id > acquires[0].id
        assert not fake.errors


def test_restart_loses_locks_and_fails_waiters() -> None:
    """A reconnect that finds a different state id: every lock lost "server restarted", the
    queued acquire fails ServerRestarted and is not re-sent; a new session id follows."""
    states = [bytes(16), b"\x01" * 16, b"\x01" * 16]

    def script(c: FakeConn) -> None:
        n = len(fake.conns)
        c.handshake(state_id=states[min(n, 3) - 1], resumed=n == 2)
        if n == 1:
            acq = c.recv()
            c.answer(acq, token=7, lease_ms=acq.lease_ms)
            c.recv()  # the waiter's ACQUIRE; then the server "restarts"
            return
        serve(c, first_token=1000)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        lock = client.acquire("held", 30)
        reasons: list[LostReason | None] = []
        lock.on_lost(lambda lk: reasons.append(lk.lost_reason))
        t, out = in_thread(lambda: client.acquire("queued", 30))
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.ServerRestarted), out
        assert lock.lost.is_set() and lock.lost_reason is LostReason.SERVER_RESTARTED
        assert reasons == [LostReason.SERVER_RESTARTED]
        t0 = time.monotonic()
        with pytest.raises(ticketing.LockLost) as e:
            lock.release()  # reported lost at once; nothing to tell a restarted server
        assert e.value.reason is LostReason.SERVER_RESTARTED and time.monotonic() - t0 < 0.5
        assert client.acquire("new", 5).token == 1001
        assert fake.hellos[0].session_id == fake.hellos[1].session_id != fake.hellos[2].session_id
        assert client.session_id == fake.hellos[2].session_id
        assert [r.op for r in fake.conns[1].requests] == []  # nothing sent on the restarted server's first connection
        assert Op.RELEASE not in fake.ops()
        assert not fake.errors


def test_not_resumed_fails_unanswered_and_keeps_locks() -> None:
    def script(c: FakeConn) -> None:
        c.handshake(resumed=False)
        if len(fake.conns) == 1:
            acq = c.recv()
            c.answer(acq, token=3, lease_ms=acq.lease_ms)
            c.recv(answer_pings=False)  # the PING, unanswered; then the connection drops
            return
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        lock = client.acquire("k", 30)
        with pytest.raises(ticketing.ConnectionLost, match="did not resume"):
            client.ping()
        assert lock.held and not lock.lost.is_set()
        client.ping()


def test_grace_passes_without_reconnect() -> None:
    """The connection drops and no server comes back within the session grace: the waiting call
    fails ConnectionLost. A call made after the grace waits for the reconnect, bounded by its own
    timeout, which it reports as a timeout naming the last connect error."""
    def script(c: FakeConn) -> None:
        c.handshake(grace_ms=300)
        c.recv()
        fake.listener.close()  # nobody to reconnect to

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0, request_timeout=0.5) as client:
        t0 = time.monotonic()
        with pytest.raises(ticketing.ConnectionLost, match="session grace"):
            client.acquire("k", 5)
        assert 0.25 < time.monotonic() - t0 < 3
        t0 = time.monotonic()
        with pytest.raises(ticketing.RequestTimeout, match="no connection to .* within 0.5 s .*refused") as e:
            client.ping()
        assert 0.45 < time.monotonic() - t0 < 2
        assert isinstance(e.value.__cause__, ticketing.Unavailable)


# --- following the leader -------------------------------------------------------------------


def test_goaway_moves_to_the_hinted_leader_and_resumes() -> None:
    def old_leader(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=11, lease_ms=acq.lease_ms)
        c.recv()  # a waiting ACQUIRE
        c.send(Response(op=Op.GOAWAY, status=Status.OK, id=0, detail=GoawayReason.LEADERSHIP,
                        data=new.addr.encode()))
        c.recv()  # the client closes

    def new_leader(c: FakeConn) -> None:
        c.handshake()
        retry = c.recv()
        assert retry.op == Op.ACQUIRE
        c.answer(retry, token=12, lease_ms=retry.lease_ms)
        serve(c, 100)

    with FakeServer(new_leader) as new, FakeServer(old_leader, state_id=new.state_id) as old:
        old.sessions = new.sessions  # one cluster: the session is known on every node
        with ticketing.Client(old.addr) as client:
            held = client.acquire("a", 30)
            second = client.acquire("b", 30)
            assert second.token == 12 and client.endpoint == new.addr
            assert old.requests[-1] == new.requests[0]  # re-sent with its id and fields
            assert held.held and not held.lost.is_set()  # GOAWAY does not touch held locks
            assert not old.errors and not new.errors


def test_not_leader_answer_is_resent_at_the_leader() -> None:
    with FakeServer(leader) as the_leader:
        def follower(c: FakeConn) -> None:
            c.handshake()
            while True:
                req = c.recv()
                c.answer(req, Status.NOT_LEADER, data=the_leader.addr.encode())

        with FakeServer(follower, state_id=the_leader.state_id) as node:
            the_leader.sessions = node.sessions
            with ticketing.Client([node.addr]) as client:
                lock = client.acquire("k", 5)
                assert lock.token == 101 and client.endpoint == the_leader.addr
                assert node.requests[-1] == the_leader.requests[0]  # the same request, same id
                assert {h.session_id for h in node.hellos + the_leader.hellos} == {client.session_id}


def test_challenge_not_leader_hint_is_followed() -> None:
    with FakeServer(leader) as the_leader:
        hint = Challenge(status=Status.NOT_LEADER, version=1, flags=0, nonce=bytes(32),
                         data=the_leader.addr.encode())

        def follower(c: FakeConn) -> None:
            c.handshake(challenge=hint)

        with FakeServer(follower) as node, ticketing.Client(node.addr) as client:
            client.ping()
            assert client.endpoint == the_leader.addr


def test_shutting_down_single_endpoint_raises() -> None:
    def stopping(c: FakeConn) -> None:
        c.handshake()
        while True:
            c.answer(c.recv(), Status.SHUTTING_DOWN, data=b"server shutting down")

    with FakeServer(stopping) as a, ticketing.Client(a.addr) as client:
        with pytest.raises(ticketing.ShuttingDown, match="shutting down.*key 'k'"):
            client.acquire("k", 5)


def test_shutting_down_moves_to_the_next_endpoint() -> None:
    def stopping(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            c.answer(req, Status.OK if req.op == Op.PING else Status.SHUTTING_DOWN)

    with FakeServer(leader) as b, FakeServer(stopping, state_id=b.state_id) as a:
        b.sessions = a.sessions
        with ticketing.Client([a.addr, b.addr]) as client:
            assert client.acquire("k", 5).token == 101 and client.endpoint == b.addr


# --- refused connects and the reconnect loop (as clients/go and clients/js) ----------------

NOT_LEADER_CHALLENGE = Challenge(status=Status.NOT_LEADER, version=1, flags=0, nonce=bytes(32))
NOT_LEADER_WELCOME = Welcome(status=Status.NOT_LEADER, proof=bytes(32))


def not_leader(where: str, hint: str = "") -> Callable[[FakeConn], None]:
    """A script: refuse the connection NOT_LEADER in CHALLENGE (with ``hint``) or WELCOME."""
    def script(c: FakeConn) -> None:
        if where == "challenge":
            c.handshake(challenge=Challenge(status=Status.NOT_LEADER, version=1, flags=0, nonce=bytes(32),
                                            data=hint.encode()))
        else:
            c.handshake(welcome=NOT_LEADER_WELCOME)
    return script


@pytest.mark.parametrize("where", ["challenge", "welcome"])
def test_connect_refused_not_leader_is_unavailable(where: str) -> None:
    """A lone node that is not the leader and knows none: the first connect retries (an
    election) until the request timeout, then Unavailable, as every client reports a failed
    connect; the NotLeader is its cause."""
    with FakeServer(not_leader(where)) as node:
        t0 = time.monotonic()
        with pytest.raises(ticketing.Unavailable, match=f"{node.addr}: not the leader") as e:
            ticketing.Client(node.addr, connect_timeout=1, request_timeout=0.4).connect()
        assert 0.3 < time.monotonic() - t0 < 2 and len(node.hellos) >= 3
        assert not isinstance(e.value, ticketing.NotLeader)
        cause = e.value.__cause__
        assert isinstance(cause, ticketing.NotLeader) and cause.leader is None


def test_connect_refused_not_leader_follows_the_hint() -> None:
    with FakeServer(not_leader("welcome")) as b, FakeServer(not_leader("challenge", "")) as c:
        with FakeServer(not_leader("challenge", b.addr)) as a:
            with pytest.raises(ticketing.Unavailable, match="not the leader") as e:
                ticketing.Client([a.addr, c.addr], connect_timeout=1, request_timeout=0.2).connect()
            assert len(a.hellos) == len(b.hellos) == len(c.hellos) >= 1  # each round: a, its hint b, then c
            assert isinstance(e.value.__cause__, ticketing.NotLeader)


def test_first_connect_waits_for_the_election() -> None:
    """Before the first connection, a round refused NOT_LEADER (a cluster electing a leader) is
    retried at the shortest pause; the connect succeeds once a leader answers."""
    def script(c: FakeConn) -> None:
        if len(fake.hellos) < 2:
            c.handshake(challenge=NOT_LEADER_CHALLENGE)
        leader(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, request_timeout=5) as client:
        assert len(fake.hellos) == 3
        assert client.acquire("k", 5).token == 101


def test_first_connect_gives_up_after_the_request_timeout() -> None:
    """An election longer than the request timeout: the first connect fails Unavailable, the
    calls waiting for it too; a refused connection (nobody serves) still fails at once."""
    with FakeServer(not_leader("challenge")) as node:
        client = ticketing.Client(node.addr, request_timeout=0.5)
        t, out = in_thread(client.ping)
        t0 = time.monotonic()
        with pytest.raises(ticketing.Unavailable, match="not the leader"):
            client.connect()
        assert 0.4 < time.monotonic() - t0 < 1.5 and len(node.hellos) >= 4
        t.join(2)
        assert isinstance(out[0], (ticketing.Unavailable, ticketing.RequestTimeout))
        client.close()
    with FakeServer(lambda c: c.close()) as closing:
        t0 = time.monotonic()
        with pytest.raises(ticketing.Unavailable):
            ticketing.Client(closing.addr, request_timeout=5).connect()
        # one round: the connection, and the probe asking whether the endpoint speaks TLS
        assert time.monotonic() - t0 < 1 and len(closing.conns) <= 2


@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("when", ["before CHALLENGE", "before WELCOME"])
def test_connection_closed_during_the_handshake_is_unavailable(how: str, when: str) -> None:
    def script(c: FakeConn) -> None:
        c._read(HELLO_SIZE)
        if when == "before WELCOME":
            c.sock.sendall(Challenge(status=Status.OK, version=1, flags=0, nonce=bytes(32)).encode())
            c._read(AUTH_SIZE)
        c.reset() if how == "reset" else c.close()

    with FakeServer(script) as fake:
        with pytest.raises(ticketing.Unavailable, match=fake.addr):
            ticketing.Client(fake.addr, connect_timeout=1).connect()


def test_calls_wait_for_the_reconnect_after_the_grace() -> None:
    """Past the session grace, a failed reconnect round no longer fails the calls waiting: each
    waits, bounded by its own timeout, and goes out once a node answers. An explicit connect()
    still ends with the first round that fails."""
    up = threading.Event()
    up.set()

    def script(c: FakeConn) -> None:
        if not up.is_set():
            c.close()  # closed during the handshake: the round fails
            return
        c.handshake(grace_ms=100)
        if len(fake.conns) == 1:
            c.answer(c.recv(answer_pings=False))  # connect()'s PING
            up.clear()
            return  # the connection drops
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0, request_timeout=0.6) as client:
        wait_for(lambda: not client.connected)
        time.sleep(0.3)  # past the grace
        before = len(fake.conns)
        t0 = time.monotonic()
        with pytest.raises(ticketing.RequestTimeout, match="within 0.6 s.*closed the connection during") as e:
            client.ping()
        assert time.monotonic() - t0 > 0.55 and len(fake.conns) - before >= 3  # it outlived failed rounds
        assert isinstance(e.value.__cause__, ticketing.Unavailable)
        t0 = time.monotonic()
        with pytest.raises(ticketing.Unavailable, match="closed the connection during the handshake"):
            client.connect()
        assert time.monotonic() - t0 < 0.5
        t, out = in_thread(lambda: client.acquire("k", 5, wait_timeout=3))
        wait_for(lambda: len(fake.conns) >= before + 3)  # it waits through more failed rounds
        up.set()
        t.join(5)
        assert isinstance(out[0], ticketing.Lock) and out[0].token == 101
        assert not fake.errors


def test_auth_failure_while_reconnecting_fails_waiting_calls_at_once() -> None:
    """An error no retry fixes (here AUTH_FAILED) fails what waits at once: the call in flight
    and those made meanwhile."""
    def script(c: FakeConn) -> None:
        if len(fake.conns) == 1:
            c.handshake()
            c.recv()  # connect()'s PING answered, then an ACQUIRE, left queued; the connection drops
            return
        c.handshake(welcome=Welcome(status=Status.AUTH_FAILED, proof=bytes(32)))

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0, request_timeout=5) as client:
        t0 = time.monotonic()
        with pytest.raises(ticketing.AuthFailed):
            client.acquire("k", 5)
        with pytest.raises(ticketing.AuthFailed):
            client.ping()
        assert time.monotonic() - t0 < 3


@pytest.mark.parametrize("refusal, rounds", [("not leader", (10, 100)), ("closed", (2, 8))])
def test_election_retries_at_the_shortest_backoff(refusal: str, rounds: tuple[int, int]) -> None:
    """While a node answers NOT_LEADER (an election), rounds come at the shortest pause (50 ms,
    with jitter) instead of a backoff doubling to 2 s, which a refused connection still gets."""
    def script(c: FakeConn) -> None:
        if len(fake.conns) == 1:
            c.handshake()
            c.answer(c.recv(answer_pings=False))  # connect()'s PING, then the connection drops
        elif refusal == "closed":
            c.close()
        else:
            c.handshake(challenge=NOT_LEADER_CHALLENGE)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0, request_timeout=1) as client:
        wait_for(lambda: not client.connected)
        before = len(fake.conns)
        with pytest.raises(ticketing.RequestTimeout):
            client.ping()
        assert rounds[0] <= len(fake.conns) - before <= rounds[1]


# --- timeouts, heartbeat, clean-up ----------------------------------------------------------


def test_frozen_server_request_timeout_and_heartbeat() -> None:
    def frozen(c: FakeConn) -> None:
        c.handshake()
        if len(fake.conns) == 1:
            c.answer(c.recv(answer_pings=False))  # connect()'s PING
        while True:
            c.recv(answer_pings=False)  # never answers

    with FakeServer(frozen) as fake:
        client = ticketing.Client(fake.addr, request_timeout=0.3, heartbeat=0.1, connect_timeout=1)
        client.connect()
        t0 = time.monotonic()
        with pytest.raises(ticketing.RequestTimeout, match="within 0.3 s"):
            client.ping()
        assert time.monotonic() - t0 < 2
        # the heartbeat PING goes unanswered too: the connection is given up and redialled
        wait_for(lambda: len(fake.hellos) >= 2)
        assert any(r.op == Op.PING for r in fake.requests)
        t0 = time.monotonic()
        with pytest.raises(ticketing.RequestTimeout):
            client.acquire("k", 5, wait_timeout=0.1)
        assert time.monotonic() - t0 < 2
        t0 = time.monotonic()
        client.close()
        assert time.monotonic() - t0 < 2


def test_silent_connection_is_replaced_and_the_call_goes_on() -> None:
    """Default options: while a request waits, a PING goes after 250 ms of silence; unanswered
    within 750 ms, the connection is given up and replaced, and the session resumes: the queued
    ACQUIRE is re-sent with its id on the new connection and granted there (it is not failed).
    The heartbeat waited 2 s, then the request timeout (10 s) for the PING's answer."""
    def script(c: FakeConn) -> None:
        c.handshake()
        if len(fake.conns) == 1:
            c.answer(c.recv(answer_pings=False))  # connect()'s PING
            while True:
                c.recv(answer_pings=False)  # frozen from now on
        retry = c.recv()
        c.answer(retry, token=31, lease_ms=retry.lease_ms)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        t0 = time.monotonic()
        lock = client.acquire("k", 30)
        took = time.monotonic() - t0
        assert lock.token == 31 and 0.9 < took < 3, took
        first = fake.conns[0].requests
        assert [r.op for r in first[1:]] == [Op.ACQUIRE, Op.PING]  # one heartbeat, never answered
        assert fake.conns[1].requests[0] == first[1]  # re-sent with its id and fields
        assert fake.hellos[1].session_id == fake.hellos[0].session_id
        assert not fake.errors


def test_silent_node_is_tried_last() -> None:
    """After a node stopped answering, the next round starts at the next endpoint: a frozen
    node's kernel still accepts connections (here: the frozen node never answers a HELLO)."""
    def frozen_later(c: FakeConn) -> None:
        if len(frozen.conns) > 1:
            c._read(1 << 20)  # accepts, never answers
        c.handshake()
        c.answer(c.recv(answer_pings=False))  # connect()'s PING
        while True:
            c.recv(answer_pings=False)

    def other(c: FakeConn) -> None:
        c.handshake(resumed=True)
        retry = c.recv()
        c.answer(retry, token=41, lease_ms=retry.lease_ms)
        serve(c)

    with FakeServer(other) as live, FakeServer(frozen_later, state_id=live.state_id) as frozen:
        with ticketing.Client([frozen.addr, live.addr], heartbeat=0.2) as client:
            t0 = time.monotonic()
            lock = client.acquire("k", 30)
            assert lock.token == 41 and client.endpoint == live.addr
            assert time.monotonic() - t0 < 2
            assert len(frozen.conns) == 1  # the silent node was not dialled again first
        assert not live.errors and not frozen.errors


def test_silent_node_is_not_followed_as_a_hint() -> None:
    """The other nodes keep naming a frozen leader until they elect another one: for 2 s the
    client neither dials the node it just found silent nor follows a NOT_LEADER hint to it (it
    accepts TCP and would cost the 2 s handshake wait), and goes on to the next endpoint."""
    def frozen_later(c: FakeConn) -> None:
        if len(frozen.conns) > 1:
            c._read(1 << 20)  # accepts, never answers
        c.handshake()
        c.answer(c.recv(answer_pings=False))  # connect()'s PING
        while True:
            c.recv(answer_pings=False)

    def follower(c: FakeConn) -> None:
        not_leader("challenge", frozen.addr)(c)  # still names the frozen leader

    def other(c: FakeConn) -> None:
        c.handshake(resumed=True)
        retry = c.recv()
        c.answer(retry, token=43, lease_ms=retry.lease_ms)
        serve(c)

    with FakeServer(other) as live, FakeServer(frozen_later, state_id=live.state_id) as frozen, \
            FakeServer(follower) as hinting:
        with ticketing.Client([frozen.addr, hinting.addr, live.addr]) as client:
            client.connect()
            lock = client.acquire("k", 30)
            assert lock.token == 43 and client.endpoint == live.addr
            assert len(hinting.conns) >= 1  # the round asked the follower first...
            time.sleep(0.1)
            assert len(frozen.conns) == 1  # ...and did not follow its hint to the silent node
        assert not live.errors and not frozen.errors and not hinting.errors


def test_handshake_gets_two_seconds_after_tcp() -> None:
    """Once TCP is connected, TLS and the handshake must finish within 2 s whatever the connect
    timeout (a frozen node's kernel accepts connections; the next endpoint should not wait)."""
    def silent(c: FakeConn) -> None:
        c._read(1 << 20)

    with FakeServer(silent) as fake:
        t0 = time.monotonic()
        with pytest.raises(ticketing.Unavailable, match="handshake timed out after 2 s"):
            ticketing.Client(fake.addr, connect_timeout=5).connect()
        assert 1.5 < time.monotonic() - t0 < 3.5


def test_release_of_a_lost_lock_answers_at_once_with_the_server_silent() -> None:
    """Leaving ``with client.lock(...)`` after the lock was lost (the server's EXPIRED) while
    the server answers nothing: LockLost at once, not a RequestTimeout after the request
    timeout; the RELEASE still goes out, in the background."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=51, lease_ms=acq.lease_ms)
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=51, detail=ExpiredReason.LEASE, data=acq.key))
        while True:
            c.recv(answer_pings=False)  # silent from now on

    with FakeServer(script) as fake:
        client = ticketing.Client(fake.addr, request_timeout=3, heartbeat=0)
        t0 = time.monotonic()
        with pytest.raises(ticketing.LockLost, match="lost: expired") as e:
            with client.lock("k", 30) as lock:
                assert lock.lost.wait(5)
                t0 = time.monotonic()
        assert time.monotonic() - t0 < 0.5 and e.value.reason is LostReason.EXPIRED
        wait_for(lambda: fake.ops() == [Op.ACQUIRE, Op.RELEASE])
        t0 = time.monotonic()
        client.close()
        assert time.monotonic() - t0 < 1
        assert not fake.errors


@pytest.mark.parametrize("outcome", ["cancelled", "granted"])
def test_close_withdraws_a_queued_acquire(outcome: str) -> None:
    """close() withdraws a queued ACQUIRE (CANCEL): its caller fails ClientClosed at once; a
    grant that raced the CANCEL is released before close returns."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        cancel = c.recv()
        assert cancel.op == Op.CANCEL and cancel.token == acq.id
        if outcome == "cancelled":
            c.answer(acq, Status.CANCELLED)
            c.answer(cancel, detail=1)
        else:
            c.answer(acq, token=61, lease_ms=acq.lease_ms)
            c.answer(cancel, detail=0)
            rel = c.recv()
            assert rel.op == Op.RELEASE and rel.token == 61
            time.sleep(0.2)  # close() waits for the answer
            c.answer(rel)
        c.recv()  # the client closes

    with FakeServer(script) as fake:
        client = ticketing.Client(fake.addr, heartbeat=0)
        t, out = in_thread(lambda: client.acquire("k", 30))
        wait_for(lambda: fake.ops() == [Op.ACQUIRE])
        t0 = time.monotonic()
        client.close()
        took = time.monotonic() - t0
        assert took < 2 and (outcome == "cancelled" or took >= 0.2), took
        t.join(2)
        assert len(out) == 1 and isinstance(out[0], ticketing.ClientClosed) and "withdrawn" in str(out[0]), out
        want = [Op.ACQUIRE, Op.CANCEL] + ([Op.RELEASE] if outcome == "granted" else [])
        assert fake.ops() == want and client.locks == []
        assert not fake.errors


def test_close_with_a_frozen_server_is_bounded_by_the_cleanup_timeout() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        while True:
            c.recv(answer_pings=False)

    with FakeServer(script) as fake:
        client = ticketing.Client(fake.addr, heartbeat=0, cleanup_timeout=0.3)
        t, out = in_thread(lambda: client.acquire("k", 30))
        wait_for(lambda: fake.ops() == [Op.ACQUIRE])
        t0 = time.monotonic()
        client.close()
        assert 0.25 < time.monotonic() - t0 < 1.5
        t.join(2)
        assert isinstance(out[0], ticketing.ClientClosed)
        assert fake.ops() == [Op.ACQUIRE, Op.CANCEL]


def test_abandoned_acquire_granted_anyway_is_released() -> None:
    """The wait is given up (request timeout) and CANCEL sent, but the server had granted it
    already: the client releases that token."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        assert acq.op == Op.ACQUIRE
        cancel = c.recv()
        assert cancel.op == Op.CANCEL and cancel.token == acq.id
        c.answer(acq, token=77, lease_ms=acq.lease_ms)
        c.answer(cancel, detail=0)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, request_timeout=0.1) as client:
        with pytest.raises(ticketing.RequestTimeout):
            client.acquire("k1", 10, wait_timeout=0.1)
        wait_for(lambda: any(r.op == Op.RELEASE and r.token == 77 and r.key == b"k1" for r in fake.requests))
        assert not fake.errors


def test_abandoned_acquire_cancelled_is_not_released() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        cancel = c.recv()
        c.answer(acq, Status.CANCELLED)
        c.answer(cancel, detail=1)
        serve(c)

    # request_timeout 0.3 s, not less: the closing PING must be answered within it on a loaded
    # machine. Heartbeat PINGs may come between the ops (one is due after 0.25 s of silence while
    # the acquire waits), so the check is on the other ops: a CANCEL and no RELEASE.
    with FakeServer(script) as fake, ticketing.Client(fake.addr, request_timeout=0.3) as client:
        with pytest.raises(ticketing.RequestTimeout):
            client.acquire("k1", 10, wait_timeout=0.1)
        client.ping()
        ops = fake.ops()
        assert [op for op in ops if op != Op.PING] == [Op.ACQUIRE, Op.CANCEL] and ops[-1] == Op.PING


def test_request_ids_reach_the_wire_in_order() -> None:
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        threads = [threading.Thread(target=lambda: [client.ping() for _ in range(50)]) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ids = [r.id for r in fake.requests]
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 401
        assert any(r.op == Op.ACK for r in fake.requests) is False  # 401 answers: no ACK due yet


def test_ack_after_many_answers() -> None:
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        for _ in range(600):
            client.ping()
        acks = [r for r in fake.requests if r.op == Op.ACK]
        assert len(acks) == 1 and acks[0].token == acks[0].id


# --- the lost signal ------------------------------------------------------------------------


@pytest.mark.parametrize(("reason", "want"), [(ExpiredReason.LEASE, LostReason.EXPIRED),
                                              (ExpiredReason.STOPPING, LostReason.SERVER_STOPPING),
                                              (99, LostReason.EXPIRED)])
def test_expired_push_fires_lost(reason: int, want: LostReason) -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=9, lease_ms=acq.lease_ms)
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, detail=reason, data=acq.key))
        while True:
            c.answer(c.recv(), Status.NOT_HELD)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        lock = client.acquire("k", 60)
        seen: list[LostReason | None] = []
        lock.on_lost(lambda lk: seen.append(lk.lost_reason))
        assert lock.lost.wait(5)
        assert lock.lost_reason is want and seen == [want] and not lock.held
        with pytest.raises(ticketing.LockLost) as e:
            lock.extend()
        assert e.value.reason is want and "token 9" in str(e.value) and "'k'" in str(e.value)
        t0 = time.monotonic()
        with pytest.raises(ticketing.LockLost) as e:
            lock.release()  # at once, without waiting for the server's answer
        assert e.value.reason is want and seen == [want]  # fired once
        assert time.monotonic() - t0 < 0.5
        wait_for(lambda: fake.ops()[-1] == Op.RELEASE)  # still told to the server, in the background
        with pytest.raises(ticketing.LockLost):
            lock.release()  # again: lost, and nothing more sent
        time.sleep(0.1)
        assert fake.ops().count(Op.RELEASE) == 1


def test_lost_fires_before_the_server_expiry() -> None:
    """The local deadline: t_first + (queued + lease) * (1 - 2 rho) - min(5 ms, lease/10). The
    server's lease ends no earlier than t_first + queued + lease."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=5, lease_ms=acq.lease_ms, detail=100)  # 100 ms queued
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        t0 = time.monotonic()
        lock = client.acquire("k", 0.3)
        fired: list[float] = []
        lock.on_lost(lambda _lk: fired.append(time.monotonic()))
        assert lock.lost.wait(3)
        assert lock.lost_reason is LostReason.EXPIRED
        want = (0.1 + 0.3) * 0.998 - 0.005
        assert lock.deadline - t0 <= want + 0.001
        # The deadline (checked above) is before the earliest moment the server can expire it;
        # the timer fires at it plus its latency, which a loaded machine stretches.
        assert fired[0] - t0 < 0.4 + 1.5  # the same margin as the asyncio test's (load)
        assert fired[0] >= lock.deadline


#: (1 - 2 rho): the share of a lease a client counts (PROTOCOL.md, "The lost signal").
SPAN = 1 - 2 * CLOCK_RATE_BOUND_PPM / 1_000_000

#: (hold, wait_after_resend) of :func:`resent_acquire`.
RESENT = [pytest.param(0.3, 0.0, id="granted-before-the-resend"),
          pytest.param(0.0, 1.0, id="granted-long-after-the-resend")]


def resent_acquire(hold: float, wait_after_resend: float, seen: dict[str, float]) -> Callable[[FakeConn], None]:
    """A server that loses the answer to an ACQUIRE: it drops the connection ``hold`` s after the
    ACQUIRE arrived (``seen["arrived"]``, on the lock clock), then answers the re-send on the
    resumed session ``wait_after_resend`` s after it arrives, with ``detail`` (``seen["detail"]``)
    the ms from the first arrival to the grant: 50 when the grant was decided before the re-send
    went out (its answer is read after it), else the time queued since the first arrival."""
    def script(c: FakeConn) -> None:
        c.handshake()
        if len(c.server.conns) == 1:
            c.recv()
            seen["arrived"] = ticketing._clock.now()
            time.sleep(hold)
            return
        retry = c.recv()
        c.idle(wait_after_resend)  # queued: the heartbeat's PINGs are answered meanwhile
        seen["detail"] = round((ticketing._clock.now() - seen["arrived"]) * 1000) if wait_after_resend else 50
        c.answer(retry, token=7, lease_ms=retry.lease_ms, detail=int(seen["detail"]))
        serve(c)

    return script


def crossed_extends(go: threading.Event) -> Callable[[FakeConn], None]:
    """A server that grants the ACQUIRE, takes two EXTENDs and answers the later one (the higher
    request id) first, and the earlier one once ``go`` is set."""
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=9, lease_ms=acq.lease_ms)
        older, newer = c.recv(), c.recv()
        c.answer(newer, token=9, lease_ms=newer.lease_ms)
        go.wait(5)
        c.answer(older, token=9, lease_ms=older.lease_ms)
        serve(c)

    return script


@pytest.mark.parametrize(("hold", "wait_after_resend"), RESENT)
def test_deadline_counts_from_the_first_send(hold: float, wait_after_resend: float) -> None:
    """Every ACQUIRE OK sets deadline = t_first + (detail + lease) * (1 - 2 rho), t_first the first
    send of the request id: a grant decided before the re-send must not count from the re-send
    (300 ms late: two holders), and a waiter granted long after its re-send counts its time
    queued (else a second early)."""
    seen: dict[str, float] = {}
    with FakeServer(resent_acquire(hold, wait_after_resend, seen)) as fake, ticketing.Client(fake.addr) as client:
        t0 = ticketing._clock.now()
        lock = client.acquire("k", 10)
        assert fake.ops().count(Op.ACQUIRE) == 2
        span = (seen["detail"] + 10_000) * SPAN / 1000
        assert t0 + span <= lock._deadline <= seen["arrived"] + span
        assert not fake.errors


def test_an_older_extend_answered_later_does_not_move_the_deadline() -> None:
    """The server applies EXTENDs in request-id order: the deadline follows the answer with the
    highest id, even when an older one's (here longer) is processed after it."""
    go = threading.Event()
    with FakeServer(crossed_extends(go)) as fake, ticketing.Client(fake.addr) as client:
        lock = client.acquire("k", 30)
        older, older_out = in_thread(lambda: lock.extend(60))
        wait_for(lambda: fake.ops().count(Op.EXTEND) == 1)
        newer, newer_out = in_thread(lambda: lock.extend(10))
        newer.join(5)
        assert newer_out == [10.0]
        go.set()
        older.join(5)
        assert older_out == [60.0]
        assert lock.lease == 10.0 and lock.remaining() <= 10 * SPAN
        assert not fake.errors


def test_a_suspend_makes_the_lock_lost_within_lost_check_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the fallback clock a suspend shows as the wall clock running ahead of the monotonic
    clock, whose timers stopped: the timer thread looks at the clock every LOST_CHECK_MS, so a
    lock whose lease ran out during the suspend is lost within that of the resume."""
    suspended = [0.0]
    monkeypatch.setattr(ticketing._clock, "now", FallbackClock(wall=lambda: time.time() + suspended[0]))
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        lock = client.acquire("k", 30)
        fired = threading.Event()
        lock.on_lost(lambda _lk: fired.set())
        suspended[0] = 60.0
        resumed = time.monotonic()
        assert fired.wait(5)
        assert time.monotonic() - resumed < LOST_CHECK_MS / 1000 + 0.1
        assert lock.lost_reason is LostReason.EXPIRED
        assert not fake.errors


def test_scoped_helper_raises_when_the_lock_was_lost() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            if req.op == Op.ACQUIRE:
                c.answer(req, token=21, lease_ms=req.lease_ms)
                c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=21, detail=1, data=req.key))
            else:
                c.answer(req, Status.NOT_HELD)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        with pytest.raises(ticketing.LockLost, match="lost: expired") as e:
            with client.lock("k", 30) as lock:
                assert lock.lost.wait(5)
        assert e.value.reason is LostReason.EXPIRED
        with client.lock("k", 30, raise_on_lost=False) as lock:  # the opt-out
            assert lock.lost.wait(5)
        with pytest.raises(KeyError):  # the body's exception wins
            with client.lock("k", 30) as lock:
                assert lock.lost.wait(5)
                raise KeyError("body")
        wait_for(lambda: fake.ops().count(Op.RELEASE) == 3)  # each told to the server in the background


# --- helpers and options --------------------------------------------------------------------


def test_try_acquire_returns_none_and_acquire_zero_raises() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        while True:
            c.answer(c.recv(), Status.TIMED_OUT)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        assert client.try_acquire("k", 5) is None
        with pytest.raises(ticketing.NotAcquired, match="key 'k', lease 5 s, try once"):
            client.acquire("k", 5, wait_timeout=0)
        assert [r.wait_ms for r in fake.requests if r.op == Op.ACQUIRE] == [0, 0]


def test_refuse_held_and_decorator_and_release_on_close() -> None:
    with FakeServer(leader) as fake:
        client = ticketing.Client(fake.addr, release_on_close=True)
        lock = client.acquire("k", 30)
        n = len(fake.requests)
        with pytest.raises(ticketing.AlreadyHeld, match="already holds key 'k'"):
            client.acquire("k", 30, refuse_held=True)
        assert len(fake.requests) == n  # refused before anything was sent

        calls: list[int] = []

        @client.lock("job", lease=5)
        def job(x: int) -> int:
            calls.append(x)
            return x * 2

        assert job(2) == 4 and job(3) == 6 and calls == [2, 3]
        assert [r.op for r in fake.requests[n:]] == [Op.ACQUIRE, Op.RELEASE] * 2
        assert client.locks == [lock]
        client.close()
        assert fake.requests[-1].op == Op.RELEASE and fake.requests[-1].token == lock.token
        assert lock.released and not lock.lost.is_set()


def test_close_does_not_release_by_default() -> None:
    with FakeServer(leader) as fake:
        client = ticketing.Client(fake.addr)
        lock = client.acquire("k", 30)
        client.close()
        assert Op.RELEASE not in fake.ops() and lock.held
        with pytest.raises(ticketing.ClientClosed):
            client.ping()


def test_keepalive_extends_until_max_hold() -> None:
    """A 1.5 s lease (EXTEND every 0.5 s, about 1 s of slack) kept alive for max_hold 1.2 s:
    the lock outlives its first lease, then the keep-alive stops and the lease runs out."""
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        t0 = time.monotonic()
        lock = client.acquire("k", 1.5, keepalive=True, max_hold=1.2)
        assert lock.lost.wait(10)  # keep-alive stopped at max_hold; the lease then ran out
        assert time.monotonic() - t0 > 1.5  # extended past the first lease
        extends = [r for r in fake.requests if r.op == Op.EXTEND]
        assert 1 <= len(extends) <= 3 and all(r.lease_ms == 1500 and r.token == lock.token for r in extends)
        assert lock.lost_reason is LostReason.EXPIRED


def test_verify_and_owned() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        while True:
            req = c.recv()
            if req.op == Op.ACQUIRE:
                c.answer(req, token=8, lease_ms=req.lease_ms)
            else:  # INSPECT: TOKEN_MATCH only for token 8
                flags = 0x7 if req.token == 8 else 0x1
                c.answer(req, token=req.token if flags & 2 else 0, data=bytes(8) + flags.to_bytes(4, "big"))

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        lock = client.acquire("k", 5)
        assert lock.verify() and lock.owned()
        assert not client.verify("k", 9)
        assert [(r.op, r.token) for r in fake.requests[-3:]] == [(Op.INSPECT, 8)] * 2 + [(Op.INSPECT, 9)]


def test_server_without_the_token_is_refused() -> None:
    def script(c: FakeConn) -> None:
        c.handshake(token=b"secret", proof_token=b"not the secret")

    with FakeServer(script) as fake:
        client = ticketing.Client(fake.addr, token="secret")
        with pytest.raises(ticketing.AuthFailed, match="proof did not verify"):
            client.connect()
        client.close()


def test_tls_answer_to_plaintext_says_so() -> None:
    def tls_server(c: FakeConn) -> None:
        c._read(56)
        c.sock.sendall(bytes.fromhex("15030300020232"))  # a TLS alert

    with FakeServer(tls_server) as fake:
        with pytest.raises(ticketing.TLSError, match="is the server using TLS"):
            ticketing.Client(fake.addr).connect()


def test_unreachable_is_unavailable() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    t0 = time.monotonic()
    with pytest.raises(ticketing.Unavailable, match=dead):
        ticketing.Client(dead, connect_timeout=1).connect()
    # before the first connection, a failed round fails the calls waiting for it at once
    with pytest.raises(ticketing.Unavailable, match=dead):
        ticketing.Client(dead, connect_timeout=1).ping()
    assert time.monotonic() - t0 < 2


def test_half_open_server_fails_within_the_connect_timeout() -> None:
    def silent(c: FakeConn) -> None:
        c._read(1 << 20)  # accepts, reads, never answers

    with FakeServer(silent) as fake:
        t0 = time.monotonic()
        with pytest.raises(ticketing.Unavailable, match="handshake timed out after 0.5 s"):
            ticketing.Client(fake.addr, connect_timeout=0.5).connect()
        assert time.monotonic() - t0 < 2


BAD_KEYS: list[object] = [5, ["k"], None, b"", "", "x" * 65536, "\ud800", 1.5]
BAD_LEASES: list[object] = [0, -5, -0.005, 0.0004, math.nan, math.inf, -math.inf, "30", True, None, 2.0**32]
BAD_WAITS: list[object] = [-1, -0.005, math.nan, math.inf, "1", True]
BAD_TOKENS: list[object] = [0, -1, 2**64, "5", True, 1.0, None]


def test_argument_checks_before_anything_is_sent() -> None:
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        n = len(fake.requests)

        def rejects(fn: Callable[[], object]) -> None:
            with pytest.raises(ticketing.InvalidArgument) as e:
                fn()
            assert isinstance(e.value, ValueError) and isinstance(e.value, TypeError)
            assert "\n" not in str(e.value)

        for key in BAD_KEYS:
            rejects(lambda: client.acquire(key, 5))  # type: ignore[arg-type]
            rejects(lambda: client.try_acquire(key, 5))  # type: ignore[arg-type]
            rejects(lambda: client.inspect(key))  # type: ignore[arg-type]
            rejects(lambda: client.release(key, 1))  # type: ignore[arg-type]
        for lease in BAD_LEASES:
            rejects(lambda: client.acquire("k", lease))  # type: ignore[arg-type]
            rejects(lambda: client.extend("k", 1, lease))  # type: ignore[arg-type]
        for wait in BAD_WAITS:
            rejects(lambda: client.acquire("k", 5, wait))  # type: ignore[arg-type]
        for token in BAD_TOKENS:
            rejects(lambda: client.release("k", token))  # type: ignore[arg-type]
            rejects(lambda: client.extend("k", token, 5))  # type: ignore[arg-type]
        rejects(lambda: client.acquire("k", 5, max_hold=-1))
        assert len(fake.requests) == n
        with pytest.raises(ticketing.InvalidArgument, match="below 1 ms: leases are float seconds"):
            client.acquire("k", 0.0001)
    for endpoints in ([], 5, [5], "", ["h:0"], ["h:x"], None):
        with pytest.raises(ticketing.InvalidArgument):
            ticketing.Client(endpoints)  # type: ignore[arg-type]
    options: list[dict[str, object]] = [{"request_timeout": -1}, {"connect_timeout": math.nan}, {"heartbeat": "2"},
                                        {"token": ""}, {"token": 5}, {"ssl": "yes"}]
    for option in options:
        with pytest.raises(ticketing.InvalidArgument):
            ticketing.Client("127.0.0.1:1", **option)  # type: ignore[arg-type]


def test_keys_are_str_or_bytes() -> None:
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        keys: list[tuple[ticketing.KeyLike, bytes]] = [
            ("ключ", "ключ".encode()), (b"\x00\xff", b"\x00\xff"), (bytearray(b"ba"), b"ba"), (memoryview(b"mv"), b"mv")]
        for key, want in keys:
            lock = client.acquire(key, 5)
            assert fake.requests[-1].key == want and lock.key == key
        with pytest.raises(ticketing.NotHeld, match=r"key 0x00ff, token 1"):
            def refuse(c: FakeConn) -> None:
                c.handshake()
                while True:
                    c.answer(c.recv(), Status.NOT_HELD)

            with FakeServer(refuse) as other, ticketing.Client(other.addr) as c2:
                c2.release(b"\x00\xff", 1)


def test_fork_starts_a_new_session_in_the_child() -> None:
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        client.ping()
        parent_sid = client.session_id
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: a new session on a new connection of its own
            code = 1
            try:
                client.ping()
                code = 0 if client.session_id != parent_sid else 2
                os.write(w, client.session_id)
            finally:
                os._exit(code)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        child_sid = os.read(r, 16)
        os.close(r)
        assert os.waitstatus_to_exitcode(status) == 0
        assert child_sid != parent_sid and len(child_sid) == 16
        client.ping()  # the parent's connection was not touched
        assert client.session_id == parent_sid
        assert {h.session_id for h in fake.hellos} == {parent_sid, child_sid}
        assert len([h for h in fake.hellos if h.session_id == parent_sid]) == 1


def test_a_lock_far_from_its_deadline_gets_its_lost_timer_from_the_watch() -> None:
    """A lock whose lost signal is due later than LOST_ARM_WITHIN gets no timer at acquire
    (most are released before); the lost watch arms it while the signal is still ahead, and the
    signal fires at the deadline as ever. A lock due sooner, or due before an unarmed one, is
    armed at once."""
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        far = client.acquire("far", 1.0)
        assert far._timer is None and [lk for _f, lk in client._unarmed] == [far]
        near = client.acquire("near", 0.3)  # due within LOST_ARM_WITHIN: armed at once
        assert near._timer is not None
        near.release()
        assert near._timer is None
        earlier = client.acquire("earlier", 0.9)  # due before "far" (the watch looks at the head)
        assert earlier._timer is not None
        earlier.release()
        wait_for(lambda: far._timer is not None, 3)  # armed by the watch, not yet fired
        fired: list[float] = []
        far.on_lost(lambda _lk: fired.append(time.monotonic()))
        assert far.lost.wait(3)
        assert far.lost_reason is LostReason.EXPIRED
        assert fired and fired[0] >= far.deadline
        released = client.acquire("released", 1.0)
        released.release()  # released before its timer was armed: nothing to cancel
        assert released._timer is None and released.released and not released.lost.is_set()
        after = client.acquire("after", 1.0)  # the released ones ahead of it left the queue
        assert [lk for _f, lk in client._unarmed] == [after]
        after.release()
