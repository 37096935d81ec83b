"""The session rules without I/O (ticketing._session): request ids, resume, restarts, ACK,
withdrawal of abandoned acquires, pushes; and the local deadline."""

from __future__ import annotations

import pytest

from ticketing import ConnectionLost, LostReason, ServerRestarted
from ticketing._common import lock_deadline, lost_margin
from ticketing._session import Call, Expired, Follow, Restarted, Session
from ticketing.constants import WELCOME_RESUMED, ExpiredReason, GoawayReason, Op, Status
from ticketing.protocol import Request, Response, Welcome, decode_request

STATE = bytes(range(16))


def welcome(resumed: bool = False, state: bytes = STATE, grace_ms: int = 5000) -> Welcome:
    return Welcome(status=Status.OK, proof=bytes(32), flags=WELCOME_RESUMED if resumed else 0,
                   session_grace_ms=grace_ms, state_id=state)


def sent(s: Session) -> list[Request]:
    data = s.take_out()
    out = []
    while data:
        req, size = decode_request(data)
        out.append(req)
        data = data[size:]
    return out


def connected() -> Session:
    s = Session()
    assert s.welcome(welcome(), 1.0)
    return s


def ok(req: Request, token: int = 0, lease_ms: int = 0, detail: int = 0) -> Response:
    return Response(op=req.op, status=Status.OK, id=req.id, token=token, lease_ms=lease_ms, detail=detail)


def test_session_id_is_random_and_non_zero() -> None:
    a, b = Session(), Session()
    assert len(a.session_id) == 16 and any(a.session_id) and a.session_id != b.session_id


def test_ids_in_submit_order_and_backlog_waits_for_the_connection() -> None:
    s = Session()
    early = [Call(Op.PING), Call(Op.INSPECT, key=b"k")]
    for c in early:
        s.submit(c, 0.0)
    assert s.take_out() == b"" and all(c.id == 0 for c in early)
    s.welcome(welcome(), 1.0)
    late = Call(Op.ACQUIRE, key=b"k", lease_ms=10, wait_ms=0)
    s.submit(late, 2.0)
    reqs = sent(s)
    assert [r.id for r in reqs] == [1, 2, 3]
    assert [r.op for r in reqs] == [Op.PING, Op.INSPECT, Op.ACQUIRE]
    assert late.t_first == late.t_send == 2.0


def test_resume_resends_unanswered_in_id_order_before_anything_new() -> None:
    s = connected()
    calls = [Call(Op.ACQUIRE, key=b"a", lease_ms=5, wait_ms=100), Call(Op.PING), Call(Op.RELEASE, key=b"b", token=7)]
    for c in calls:
        s.submit(c, 1.0)
    first = sent(s)
    s.on_response(ok(first[1]), 1.1)  # the PING was answered
    assert [c.done for c in calls] == [False, True, False]
    s.connection_lost()
    new = Call(Op.INSPECT, key=b"c")
    s.submit(new, 2.0)  # while reconnecting: waits in the backlog
    assert s.welcome(welcome(resumed=True), 3.0)
    again = sent(s)
    assert [(r.op, r.id) for r in again] == [(Op.ACQUIRE, 1), (Op.RELEASE, 3), (Op.INSPECT, 4)]
    assert again[0] == first[0] and again[1] == first[2]  # the same fields, the same ids
    assert calls[0].t_first == 1.0 and calls[0].t_send == 3.0  # a re-send keeps its first send
    assert new.t_first == new.t_send == 3.0  # first sent when the connection came


def test_restart_fails_everything_and_starts_a_new_session() -> None:
    s = connected()
    old_sid = s.session_id
    waiter = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0xFFFFFFFF)
    s.submit(waiter, 1.0)
    sent(s)
    s.connection_lost()
    later = Call(Op.PING)
    s.submit(later, 2.0)
    assert not s.welcome(welcome(resumed=True, state=bytes(16)), 3.0)
    assert isinstance(waiter.error, ServerRestarted) and "restarted" in str(waiter.error)
    assert s.take_events() == [Restarted()]
    assert s.session_id != old_sid and s.restarts == 1 and not s.pending
    assert s.take_out() == b""  # nothing is re-queued on the new server
    # the new session (a new connection with the new id) takes the state id it finds
    assert s.welcome(welcome(state=bytes(16)), 4.0)
    assert [r.op for r in sent(s)] == [Op.PING] and not later.done


def test_same_state_not_resumed_fails_what_may_have_run() -> None:
    s = connected()
    acq = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0)
    redirected = Call(Op.PING)
    s.submit(acq, 1.0)
    s.submit(redirected, 1.0)
    reqs = sent(s)
    s.on_response(Response(op=Op.PING, status=Status.NOT_LEADER, id=reqs[1].id, data=b"127.0.0.2:7070"), 1.1)
    assert s.take_events() == [Follow("127.0.0.2:7070", "NOT_LEADER")]
    assert not redirected.done
    s.connection_lost()
    assert s.welcome(welcome(resumed=False), 2.0)
    assert isinstance(acq.error, ConnectionLost)
    assert [(r.op, r.id) for r in sent(s)] == [(Op.PING, 2)]  # never run: sent again


def test_abandoned_acquire_is_cancelled_and_a_racing_grant_released() -> None:
    s = connected()
    acq = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0xFFFFFFFF)
    s.submit(acq, 1.0)
    (req,) = sent(s)
    s.abandon(acq, 1.5)
    (cancel,) = sent(s)
    assert cancel.op == Op.CANCEL and cancel.token == req.id
    s.on_response(ok(req, token=77, lease_ms=5), 1.6)  # granted before the CANCEL arrived
    (release,) = sent(s)
    assert release.op == Op.RELEASE and release.token == 77 and release.key == b"k"
    assert acq.cleanup is not None and not acq.cleanup.done
    s.on_response(ok(cancel), 1.7)
    s.on_response(ok(release), 1.8)
    assert acq.cleanup.done and not s.pending


def test_close_withdraws_queued_acquires_and_settles_them() -> None:
    """Session.withdraw_acquires (close): each ACQUIRE still awaited fails its caller now and
    gets a CANCEL; it is settled once its answer came and a raced grant's RELEASE is answered.
    An abandoned ACQUIRE, a try and internal calls are left alone."""
    s = connected()
    queued = Call(Op.ACQUIRE, key=b"q", lease_ms=5, wait_ms=0xFFFFFFFF)
    raced = Call(Op.ACQUIRE, key=b"r", lease_ms=5, wait_ms=0xFFFFFFFF)
    ping = Call(Op.PING)
    for c in (queued, raced, ping):
        s.submit(c, 1.0)
    reqs = sent(s)
    withdrawn = s.withdraw_acquires(lambda c: ConnectionLost(f"closed ({c.describe()})"), 2.0)
    assert withdrawn == [queued, raced]
    assert [(r.op, r.token) for r in sent(s)] == [(Op.CANCEL, queued.id), (Op.CANCEL, raced.id)]
    assert queued.done and str(queued.error) == "closed (ACQUIRE 'q')"
    assert s.take_finished() == [queued, raced] and not ping.done
    assert not s.settled(queued) and not s.settled(raced)
    s.on_response(Response(op=Op.ACQUIRE, status=Status.CANCELLED, id=reqs[0].id), 2.1)
    s.on_response(ok(reqs[1], token=9, lease_ms=5), 2.1)  # granted before the CANCEL arrived
    (release,) = sent(s)
    assert release.op == Op.RELEASE and release.token == 9
    assert s.settled(queued) and not s.settled(raced)
    s.on_response(ok(release), 2.2)
    assert s.settled(raced)
    assert s.withdraw_acquires(lambda c: ConnectionLost("again"), 3.0) == []  # nothing left to withdraw


def test_withdraw_without_a_connection_does_nothing() -> None:
    s = connected()
    acq = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0xFFFFFFFF)
    s.submit(acq, 1.0)
    sent(s)
    s.connection_lost()
    assert s.withdraw_acquires(lambda c: ConnectionLost("closed"), 2.0) == []
    assert not acq.done and s.take_out() == b""


def test_abandoned_while_disconnected_is_retried_then_cancelled() -> None:
    s = connected()
    acq = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0xFFFFFFFF)
    s.submit(acq, 1.0)
    sent(s)
    s.connection_lost()
    s.abandon(acq, 2.0)
    assert s.take_out() == b""
    s.welcome(welcome(resumed=True), 3.0)
    reqs = sent(s)
    assert [(r.op, r.token) for r in reqs] == [(Op.ACQUIRE, 0), (Op.CANCEL, acq.id)]
    assert reqs[0].id == acq.id


def test_backlog_call_abandoned_never_goes_out() -> None:
    s = Session()
    c = Call(Op.PING)
    s.submit(c, 0.0)
    s.abandon(c, 0.5)
    s.welcome(welcome(), 1.0)
    assert sent(s) == []


def test_ack_every_half_of_ack_every_one_at_a_time() -> None:
    s = connected()
    waiting = Call(Op.ACQUIRE, key=b"q", lease_ms=5, wait_ms=0xFFFFFFFF)
    s.submit(waiting, 1.0)
    sent(s)
    acks: list[Request] = []
    for _ in range(1100):
        c = Call(Op.PING)
        s.submit(c, 1.0)
        for r in sent(s):
            if r.op == Op.ACK:
                acks.append(r)
            else:
                s.on_response(ok(r), 1.0)
        for r in sent(s):
            acks.append(r)
    assert len(acks) == 1  # the first ACK is unanswered: no second one
    # after 512 answers; nothing but the queued ACQUIRE awaited: x = the next id (the ACK's own)
    assert acks[0].id == 514 and acks[0].token == acks[0].id
    s.on_response(ok(acks[0], detail=0), 2.0)
    (second,) = sent(s)  # 588 more answers came meanwhile: the next ACK goes at once
    assert second.op == Op.ACK and second.token == second.id
    assert s.pending.keys() == {waiting.id, second.id}


def test_pushes_become_events() -> None:
    s = connected()
    s.on_response(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=7, detail=ExpiredReason.LEASE, data=b"k"), 1)
    s.on_response(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=8, detail=ExpiredReason.STOPPING), 1)
    s.on_response(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, detail=77), 1)
    s.on_response(Response(op=Op.GOAWAY, status=Status.OK, id=0, detail=GoawayReason.LEADERSHIP, data=b"h:1"), 1)
    s.on_response(Response(op=0x7E, status=Status.OK, id=0), 1)  # an unknown push: ignored
    assert s.take_events() == [
        Expired(7, b"k", LostReason.EXPIRED),
        Expired(8, b"", LostReason.SERVER_STOPPING),
        Expired(9, b"", LostReason.EXPIRED),  # unknown reason: its nearest meaning, lost
        Follow("h:1", "GOAWAY LEADERSHIP"),
    ]


def test_grace_expiry_fails_callers_and_keeps_acquires_for_cleanup() -> None:
    s = connected()
    acq = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0xFFFFFFFF)
    ping = Call(Op.PING)
    s.submit(acq, 1.0)
    s.submit(ping, 1.0)
    sent(s)
    s.connection_lost()
    s.grace_expired("no reconnect within the grace")
    assert isinstance(acq.error, ConnectionLost) and isinstance(ping.error, ConnectionLost)
    assert list(s.pending) == [acq.id] and acq.abandoned
    # the server still knew the session after all: the acquire is retried and withdrawn
    s.welcome(welcome(resumed=True), 9.0)
    assert [r.op for r in sent(s)] == [Op.ACQUIRE, Op.CANCEL]


def test_shutting_down_moves_to_the_next_endpoint_when_there_is_one() -> None:
    s = connected()
    s.failover_limit = 1
    c = Call(Op.ACQUIRE, key=b"k", lease_ms=5, wait_ms=0)
    s.submit(c, 1.0)
    (req,) = sent(s)
    s.on_response(Response(op=Op.ACQUIRE, status=Status.SHUTTING_DOWN, id=req.id), 1.1)
    assert not c.done and s.take_events() == [Follow(None, "SHUTTING_DOWN", next_endpoint=True)]
    s.connection_lost()
    s.welcome(welcome(resumed=True), 2.0)
    (again,) = sent(s)
    assert again.op == Op.ACQUIRE and again.id > req.id  # a new request: the old id has its outcome
    s.on_response(Response(op=Op.ACQUIRE, status=Status.SHUTTING_DOWN, id=again.id), 2.1)
    assert c.done and c.response is not None and c.response.status == Status.SHUTTING_DOWN


@pytest.mark.parametrize(("detail", "lease", "deadline", "margin"), [
    (0, 30_000, 30 * 0.998, 0.005),
    (1500, 1, (1500 + 1) * 0.998 / 1000, 0.0001),  # margin lease/10 for short leases
    (0, 400, 0.4 * 0.998, 0.005),
    (8_000, 10_000, 18 * 0.998, 0.005),  # a waiter granted after 8 s queued, or a retry 8 s after the first arrival
])
def test_lock_deadline(detail: int, lease: int, deadline: float, margin: float) -> None:
    assert lock_deadline(100.0, detail, lease) == pytest.approx(100.0 + deadline)
    assert lost_margin(lease) == pytest.approx(margin)


def test_submit_data_is_submit_without_the_queue() -> None:
    """Session.submit_data (a ready session with nothing queued) returns the bytes submit would
    queue, with the same id, pending entry and times."""
    a, b = connected(), connected()
    for i in range(3):
        ca = Call(Op.ACQUIRE, b"k%d" % i, 0, 5000, 0)
        cb = Call(Op.ACQUIRE, b"k%d" % i, 0, 5000, 0)
        a.submit(ca, 2.0 + i)
        data = b.submit_data(cb, 2.0 + i)
        assert data == a.take_out() and b.out == bytearray()
        assert (cb.id, cb.t_first, cb.t_send, cb.may_have_run, cb.epoch) == \
            (ca.id, ca.t_first, ca.t_send, ca.may_have_run, ca.epoch) == (i + 1, 2.0 + i, 2.0 + i, True, 0)
        assert b.pending[cb.id] is cb
    b.on_response(Response(op=Op.ACQUIRE, status=Status.OK, id=2, token=5, lease_ms=5000), 3.0)
    assert [c.id for c in b.take_finished()] == [2] and sorted(b.pending) == [1, 3]
