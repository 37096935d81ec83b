"""Blocking client: a waiting caller on a thread other than the main thread reads its own answer
while no other thread reads the socket (leader/follower, ticketing.connection); the main thread
never reads (a KeyboardInterrupt lands there); the reader thread takes the socket back when
callers stop, for pushes and heartbeats."""

from __future__ import annotations

import _thread
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import ticketing
from ticketing import LostReason, connection
from ticketing.constants import ExpiredReason, Op, Status
from ticketing.protocol import Response

from .fakeserver import FakeConn, FakeServer, leader, serve
from .test_fake import in_thread, wait_for


def _record_readers(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """Record the thread of every read made by a caller (Connection._read_done: after a
    Connection._lead, or a lone caller's read in Connection.solo_round)."""
    seen: list[threading.Thread] = []
    real = connection.Connection._read_done

    def read_done(self: connection.Connection, data: bytes | None, error: Exception | None) -> None:
        seen.append(threading.current_thread())
        real(self, data, error)

    monkeypatch.setattr(connection.Connection, "_read_done", read_done)
    return seen


def test_worker_threads_read_their_answers_and_the_main_thread_never_does(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_readers(monkeypatch)
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        for _ in range(20):
            client.try_acquire("main", 10).release()  # type: ignore[union-attr]
        assert threading.main_thread() not in seen

        def pairs() -> int:
            for _ in range(50):
                client.try_acquire("worker", 10).release()  # type: ignore[union-attr]
            return 50

        t, out = in_thread(pairs)
        t.join(10)
        assert out == [50]
        assert t in seen and threading.main_thread() not in seen
        # right after the workers, a main-thread call is answered at once (the reader thread
        # is told to take the socket back, not left lingering)
        t0 = time.monotonic()
        client.ping()
        assert time.monotonic() - t0 < 1.0
        assert threading.main_thread() not in seen


def test_many_threads_share_the_reading() -> None:
    with FakeServer(leader) as fake, ticketing.Client(fake.addr) as client:
        errors: list[BaseException] = []
        counts = [0] * 16

        def work(i: int) -> None:
            try:
                for _ in range(100):
                    lock = client.try_acquire(f"k{i}", 10)
                    assert lock is not None
                    lock.release()
                    counts[i] += 1
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors and counts == [100] * 16
        ids = [r.id for r in fake.requests if r.op in (Op.ACQUIRE, Op.RELEASE)]
        assert ids == sorted(ids) and len(ids) == 3200  # request ids reach the wire in order


def test_a_reading_thread_times_out_and_the_main_thread_too() -> None:
    def frozen(c: FakeConn) -> None:
        c.handshake()
        c.answer(c.recv(answer_pings=False))  # connect()'s PING
        while True:
            c.recv(answer_pings=False)  # never answers

    with FakeServer(frozen) as fake:
        client = ticketing.Client(fake.addr, request_timeout=0.3, connect_timeout=1, heartbeat=0)
        client.connect()
        t0 = time.monotonic()
        t, out = in_thread(lambda: client.try_acquire("k", 10))
        t.join(5)
        assert len(out) == 1 and isinstance(out[0], ticketing.RequestTimeout)
        assert time.monotonic() - t0 < 2
        t0 = time.monotonic()
        with pytest.raises(ticketing.RequestTimeout):
            client.ping()
        assert time.monotonic() - t0 < 2
        # the abandoned ACQUIRE was withdrawn
        wait_for(lambda: Op.CANCEL in fake.ops())
        client.close()


def test_connection_dropped_under_a_reading_thread_resumes() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        if len(fake.conns) == 1:
            c.recv()  # the ACQUIRE, left unanswered; then the connection drops
            return
        retry = c.recv()
        c.answer(retry, token=77, lease_ms=retry.lease_ms)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr) as client:
        t, out = in_thread(lambda: client.acquire("k", 10))
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.Lock) and out[0].token == 77
        acquires = [r for r in fake.requests if r.op == Op.ACQUIRE]
        assert len(acquires) == 2 and acquires[0] == acquires[1]  # same id: resumed
        t, out = in_thread(lambda: client.try_acquire("k2", 10))
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.Lock)


def test_a_push_after_the_callers_stopped_is_read_by_the_reader_thread() -> None:
    got = threading.Event()

    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=9, lease_ms=acq.lease_ms)
        for _ in range(20):  # the worker's extends
            req = c.recv()
            c.answer(req, token=req.token, lease_ms=req.lease_ms)
        got.wait(5)
        time.sleep(0.2)  # nobody waits for an answer now
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, detail=ExpiredReason.LEASE,
                        data=acq.key))
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        def work() -> ticketing.Lock:
            lock = client.acquire("k", 60)
            for _ in range(20):
                lock.extend()
            return lock

        t, out = in_thread(work)
        t.join(10)
        lock = out[0]
        assert isinstance(lock, ticketing.Lock)
        got.set()
        assert lock.lost.wait(3)
        assert lock.lost_reason is LostReason.EXPIRED
        assert fake.ops()


def test_on_lost_callbacks_found_by_a_reading_caller_run_on_a_client_thread() -> None:
    def script(c: FakeConn) -> None:
        c.handshake()
        acq = c.recv()
        c.answer(acq, token=9, lease_ms=acq.lease_ms)
        ext = c.recv()  # the worker's EXTEND: the push comes just before its answer
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, detail=ExpiredReason.LEASE,
                        data=acq.key))
        c.answer(ext, token=ext.token, lease_ms=ext.lease_ms)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        ran_on: list[threading.Thread] = []
        ran = threading.Event()

        def on_lost(_lk: ticketing.Lock) -> None:
            ran_on.append(threading.current_thread())
            ran.set()

        def work() -> ticketing.Lock:
            lock = client.acquire("k", 60)
            lock.on_lost(on_lost)
            client.extend("other", 12, 30)  # read by this thread, with the push before it
            return lock

        t, out = in_thread(work)
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.Lock)
        assert out[0].lost_reason is LostReason.EXPIRED  # marked lost at once, in order
        assert ran.wait(5)
        assert ran_on[0] is not t and ran_on[0].name.startswith("ticketing-")
        assert fake.ops()


# --- a leading caller blocks in recv() (SO_RCVTIMEO, Linux) -------------------------------------

needs_rcvtimeo = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                    reason="the blocking-recv path needs SO_RCVTIMEO (Linux)")


class _SockSpy:
    """Wraps a connection's socket: records every recv() a caller makes (its flags, and whether
    the receive timeout ended it) and passes everything through."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.recvs: list[tuple[int, str]] = []  # (flags, "data" | "eof" | "timeout")

    def recv(self, n: int, flags: int = 0) -> bytes:
        try:
            data = self._sock.recv(n, flags)
        except BlockingIOError:
            self.recvs.append((flags, "timeout"))
            raise
        self.recvs.append((flags, "data" if data else "eof"))
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def _spy_on(client: ticketing.Client) -> _SockSpy:
    conn = client._conn
    assert conn is not None and conn._direct_sock is not None
    spy = _SockSpy(conn._direct_sock)
    conn._direct_sock = spy  # type: ignore[assignment]
    return spy


@needs_rcvtimeo
def test_a_leading_caller_blocks_in_recv_and_its_timeout_still_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    # A caller with more time left than the socket's receive timeout reads with a blocking recv
    # (flags 0); each receive timeout ends one recv, and the caller's own deadline still ends
    # the call, on time.
    monkeypatch.setattr(connection, "_RCV_TIMEOUT", 0.05)

    def frozen(c: FakeConn) -> None:
        c.handshake()
        c.answer(c.recv(answer_pings=False))  # connect()'s PING
        while True:
            c.recv(answer_pings=False)  # never answers

    with FakeServer(frozen) as fake:
        client = ticketing.Client(fake.addr, request_timeout=0.6, connect_timeout=1, heartbeat=0)
        client.connect()
        assert client._conn is not None and client._conn._blocking_after == 0.05
        spy = _spy_on(client)
        t0 = time.monotonic()
        t, out = in_thread(client.ping)
        t.join(5)
        took = time.monotonic() - t0
        assert len(out) == 1 and isinstance(out[0], ticketing.RequestTimeout)
        assert 0.55 < took < 3
        blocking_timeouts = [r for r in spy.recvs if r == (0, "timeout")]
        assert len(blocking_timeouts) >= 2  # woken by the receive timeout, then read on
        # the last part of the wait (under 50 ms left) polled with the caller's own timeout
        assert not [r for r in spy.recvs if r[1] == "data"]
        client.close()


@needs_rcvtimeo
def test_a_blocking_caller_reads_its_answer_and_others(monkeypatch: pytest.MonkeyPatch) -> None:
    # Answers arriving while a caller blocks in recv are handled as with poll: its own, and
    # a push for a lock held (the lost signal fires).
    monkeypatch.setattr(connection, "_RCV_TIMEOUT", 0.05)
    monkeypatch.setattr(connection, "_LINGER", 5.0)  # the reader thread stays out meanwhile
    go = threading.Event()

    def script(c: FakeConn) -> None:
        c.handshake()
        c.answer(c.recv(answer_pings=False))  # connect()'s PING
        acq = c.recv()
        c.answer(acq, token=9, lease_ms=acq.lease_ms)
        ping = c.recv(answer_pings=False)
        go.wait(5)
        time.sleep(0.2)  # a few receive timeouts pass
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, detail=ExpiredReason.LEASE, data=acq.key))
        c.answer(ping)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        spy = _spy_on(client)

        def work() -> ticketing.Lock:
            lock = client.acquire("k", 60)
            go.set()
            client.ping()
            return lock

        t, out = in_thread(work)
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.Lock)
        assert out[0].lost_reason is LostReason.EXPIRED
        assert (0, "data") in spy.recvs and (0, "timeout") in spy.recvs


@needs_rcvtimeo
def test_close_wakes_a_caller_blocked_in_recv(monkeypatch: pytest.MonkeyPatch) -> None:
    # The receive timeout far away: close() (shutdown of the socket) is what ends the recv.
    monkeypatch.setattr(connection, "_RCV_TIMEOUT", 30.0)
    monkeypatch.setattr(connection, "_LINGER", 5.0)  # the reader thread stays out meanwhile

    answer_acquire = threading.Event()

    def frozen(c: FakeConn) -> None:
        c.handshake()
        c.answer(c.recv(answer_pings=False))  # connect()'s PING
        acq = c.recv(answer_pings=False)
        answer_acquire.wait(10)
        c.answer(acq, token=5, lease_ms=acq.lease_ms)  # read by the reader thread, which then yields
        while True:
            c.recv(answer_pings=False)

    with FakeServer(frozen) as fake:
        client = ticketing.Client(fake.addr, request_timeout=120, heartbeat=0)
        client.connect()
        spy = _spy_on(client)

        def work() -> None:
            client.acquire("k", 60)
            client.ping()

        t, out = in_thread(work)
        conn = client._conn
        assert conn is not None
        # The acquire is answered only once its caller waits behind the reader thread, which then
        # yields the reading role to it. Answered sooner, the answer could be read before the
        # caller waited (nobody asked for the role), the reader thread would keep it and sit in
        # its 30 s recv, and the PING's caller would wait behind it instead of reading itself.
        wait_for(lambda: bool(conn._followers))
        answer_acquire.set()
        wait_for(lambda: fake.ops().count(Op.PING) == 2 and conn._leader == connection._CALLER)
        t0 = time.monotonic()
        client.close()
        t.join(5)
        assert time.monotonic() - t0 < 3
        assert len(out) == 1 and isinstance(out[0], ticketing.ClientClosed)
        assert (0, "eof") in spy.recvs  # the blocking recv ended by the shutdown


@needs_rcvtimeo
def test_the_reader_thread_reads_on_after_receive_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    # An idle connection: the reader thread's blocking recv ends with the receive timeout again
    # and again; it is no error, and the reader goes on serving the main thread and pushes.
    monkeypatch.setattr(connection, "_RCV_TIMEOUT", 0.02)
    timeouts = [0]
    real_recv = connection._PlainTransport.recv

    def recv(self: connection._PlainTransport) -> bytes:
        try:
            return real_recv(self)
        except BlockingIOError:
            timeouts[0] += 1
            raise

    monkeypatch.setattr(connection._PlainTransport, "recv", recv)
    with FakeServer(leader) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        lock = client.acquire("k", 60)  # the main thread: the reader thread reads its answers
        wait_for(lambda: timeouts[0] >= 5)
        assert client.connected and lock.held
        assert client.ping() >= 0
        lock.release()
        assert len(fake.conns) == 1


class _Pending:
    """What wait_for_done / wake_up_lock need of a call."""

    def __init__(self) -> None:
        self.done = False
        self.callbacks: list[Callable[[Any], None]] = []

    def finish(self) -> None:
        """As a session's answer does: done first, then the callbacks run."""
        self.done = True
        for cb in list(self.callbacks):
            cb(self)


def test_wait_for_done_when_the_answer_came_before_the_wake_up_lock() -> None:
    # The answer's callbacks ran (none registered) before the caller made its wake-up lock:
    # the look at ``done`` after the registration sees it, no wait.
    call = _Pending()
    call.finish()
    t0 = time.monotonic()
    assert connection.wait_for_done(call, 30.0)
    assert time.monotonic() - t0 < 5
    assert connection.wake_up_lock(call).acquire(False)  # released already


def test_wait_for_done_is_woken_by_the_callback_and_times_out_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    call = _Pending()
    assert not connection.wait_for_done(call, 0.05)
    assert len(call.callbacks) == 1  # its wake-up lock's callback
    call2 = _Pending()
    registered = threading.Event()
    real = connection.wake_up_lock

    def spy(c: connection._Waitable) -> _thread.LockType:
        lock = real(c)
        registered.set()
        return lock

    def finisher() -> None:
        registered.wait(10)
        call2.finish()

    monkeypatch.setattr(connection, "wake_up_lock", spy)
    t = threading.Thread(target=finisher, daemon=True)
    t.start()
    assert connection.wait_for_done(call2, 30.0)
    t.join(10)


def test_a_caller_that_finds_the_reading_role_held_is_woken_by_its_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller whose answer another thread reads makes its wake-up lock only then
    (Connection.wait_answer): the reading thread's callbacks wake it, while the first caller's
    own answer is still held back by the server."""
    made: list[threading.Thread] = []
    real = connection.wake_up_lock

    def spy(c: connection._Waitable) -> _thread.LockType:
        made.append(threading.current_thread())
        return real(c)

    monkeypatch.setattr(connection, "wake_up_lock", spy)
    leading: list[threading.Thread] = []
    real_lead = connection.Connection._lead

    def lead(self: connection.Connection, left: float | None) -> None:
        leading.append(threading.current_thread())
        real_lead(self, left)

    monkeypatch.setattr(connection.Connection, "_lead", lead)
    second_back = threading.Event()
    conns: list[connection.Connection] = []

    def script(c: FakeConn) -> None:
        c.handshake()
        first = c.recv()  # "a": held back until "b" returned to its caller
        assert first.key == b"a"
        second = c.recv()
        assert second.key == b"b"
        # answered once "b"'s caller waits behind "a"'s (answered sooner, "a"'s caller could
        # read it before "b"'s caller looked, and "b"'s would find it done, never waiting)
        wait_for(lambda: bool(conns and conns[0]._followers), timeout=10)
        c.answer(second, token=2, lease_ms=second.lease_ms)
        assert second_back.wait(10)
        c.answer(first, token=1, lease_ms=first.lease_ms)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, request_timeout=60, heartbeat=0) as client:
        client.connect()
        conn = client._conn
        assert conn is not None
        # "a"'s caller must keep the role until its answer comes. A leading caller's blocking recv
        # ends at the socket's receive timeout (1 s), and on a loaded machine that came between
        # the steps below: "b"'s caller found the role free and read its own answer (seen once in
        # CI). Without the blocking recv a leading caller polls with its own timeout (60 s).
        conn._blocking_after = None
        conns.append(conn)
        ta, out_a = in_thread(lambda: client.try_acquire("a", 10))
        wait_for(lambda: ta in leading)  # "a"'s caller holds the reading role (in recv) till data comes
        wait_for(lambda: any(r.key == b"a" for r in fake.requests))
        tb, out_b = in_thread(lambda: client.try_acquire("b", 10))
        tb.join(10)
        assert len(out_b) == 1 and isinstance(out_b[0], ticketing.Lock) and out_b[0].token == 2
        assert not out_a  # "a" still waits: "b" was woken by the thread that read its answer
        assert tb in made
        second_back.set()
        ta.join(10)
        assert len(out_a) == 1 and isinstance(out_a[0], ticketing.Lock) and out_a[0].token == 1


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_child_forked_from_a_worker_thread_knows_its_main_thread() -> None:
    """The client caches the main thread's id (the main thread never reads); in a forked child
    the thread that forked is the main thread."""
    import os

    from ticketing import client as client_module

    assert client_module._main_ident == threading.main_thread().ident
    status: list[int] = []

    def fork() -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os._exit(0 if client_module._main_ident == threading.get_ident() else 3)
        status.append(os.waitpid(pid, 0)[1])

    t = threading.Thread(target=fork)
    t.start()
    t.join(30)
    assert status == [0]
    assert client_module._main_ident == threading.main_thread().ident


# --- a lone caller sends and reads in one step (Connection.claim_solo / solo_round) -------------


def _worker_pings(client: ticketing.Client, n: int) -> None:
    t, out = in_thread(lambda: [client.ping() for _ in range(n)])
    t.join(10)
    assert len(out) == 1 and isinstance(out[0], list), out


def test_a_lone_caller_claims_both_roles_and_reads_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    # Alone, a worker thread's request takes the send and the read role at once: it sends and
    # reads its own answer without the wait loop (wait_answer) or the send queue.
    claims: list[bool] = []
    waits: list[int] = []
    real_claim = connection.Connection.claim_solo
    real_wait = connection.Connection.wait_answer

    def claim(self: connection.Connection) -> bool:
        ok = real_claim(self)
        claims.append(ok)
        return ok

    def wait(self: connection.Connection, call: Any, timeout: float | None) -> bool:
        waits.append(1)
        return real_wait(self, call, timeout)

    monkeypatch.setattr(connection.Connection, "claim_solo", claim)
    monkeypatch.setattr(connection.Connection, "wait_answer", wait)
    monkeypatch.setattr(connection, "_LINGER", 5.0)  # the reader thread stays out once it yielded
    seen = _record_readers(monkeypatch)
    with FakeServer(leader) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        client.connect()  # (the main thread: the reader thread reads its answer)

        def pairs() -> int:
            for _ in range(30):
                client.try_acquire("solo", 10).release()  # type: ignore[union-attr]
            return 30

        t, out = in_thread(pairs)
        t.join(10)
        assert out == [30]
        # the first request finds the reader thread reading (it yields the role); the others
        # go solo, none of them waiting in wait_answer
        assert claims.count(True) >= 55 and len(waits) == claims.count(False)
        assert t in seen and threading.main_thread() not in seen
        ids = [r.id for r in fake.requests]
        assert ids == sorted(ids)
        assert client._conn is not None and not client._conn._sending and client._conn._leader != connection._CALLER


def test_claim_solo_refuses_while_another_thread_sends_reads_or_the_connection_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "_LINGER", 5.0)  # the reader thread stays out once it yielded
    with FakeServer(leader) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        _worker_pings(client, 3)  # the reader thread yielded the role to the worker
        conn = client._conn
        assert conn is not None and conn._leader == 0
        with client._mu:
            assert conn.claim_solo()
            assert conn._sending and conn._leader == connection._CALLER
            assert not conn.claim_solo()  # both roles are taken
            conn.abort_solo()
            assert not conn._sending and conn._leader == 0
            conn._sending = True  # another thread sends
            assert not conn.claim_solo() and conn._leader == 0
            conn._sending = False
            conn._out += b"x"  # bytes queued for the sender
            assert not conn.claim_solo() and not conn._sending and conn._leader == 0
            conn._out.clear()
            conn._leader = connection._READER  # the reader thread reads
            assert not conn.claim_solo() and not conn._sending
            conn._leader = 0
        _worker_pings(client, 3)
        conn.close("test")
        with client._mu:
            assert not conn.claim_solo()
        assert len(fake.conns) >= 1


def test_a_lone_callers_partial_send_goes_to_the_writer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # The socket takes part of the request: the rest is queued for the writer thread, and the
    # caller still reads its answer.
    monkeypatch.setattr(connection, "_LINGER", 5.0)
    with FakeServer(leader) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        _worker_pings(client, 2)
        conn = client._conn
        assert conn is not None and conn._direct_sock is not None
        real = conn._direct_sock
        sends: list[int] = []

        class Short:
            def send(self, data: bytes, flags: int = 0) -> int:
                n = real.send(data[:5] if not sends else data, flags)
                sends.append(n)
                return n

            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

        conn._direct_sock = Short()  # type: ignore[assignment]
        t, out = in_thread(lambda: client.try_acquire("part", 10))
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.Lock), out
        assert sends[0] == 5
        assert [r.key for r in fake.requests if r.op == Op.ACQUIRE] == [b"part"]
        conn._direct_sock = real
        out[0].release()


def test_a_lone_caller_whose_first_read_is_not_its_answer_waits_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # The solo read brings a push, not the answer: the caller keeps waiting (wait_answer) and
    # reads its answer when it comes; the push is handled on the way.
    monkeypatch.setattr(connection, "_LINGER", 5.0)

    def script(c: FakeConn) -> None:
        c.handshake()
        for _ in range(2):
            c.answer(c.recv(answer_pings=False))
        acq = c.recv()
        c.answer(acq, token=9, lease_ms=acq.lease_ms)
        ping = c.recv(answer_pings=False)
        c.send(Response(op=Op.EXPIRED, status=Status.OK, id=0, token=9, detail=ExpiredReason.LEASE, data=acq.key))
        time.sleep(0.2)
        c.answer(ping)
        serve(c)

    with FakeServer(script) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        _worker_pings(client, 2)
        claims: list[bool] = []
        real_claim = client._conn.claim_solo  # type: ignore[union-attr]

        def claim() -> bool:
            ok = real_claim()
            claims.append(ok)
            return ok

        client._conn.claim_solo = claim  # type: ignore[method-assign, union-attr]

        def work() -> ticketing.Lock:
            lock = client.acquire("k", 60)
            client.ping()
            return lock

        t, out = in_thread(work)
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], ticketing.Lock), out
        assert out[0].lost_reason is LostReason.EXPIRED
        assert claims == [True, True]
        ops = fake.ops()
        assert ops[ops.index(Op.ACQUIRE) + 1:] == [Op.PING]


def test_a_lone_caller_with_no_time_left_gives_the_reading_role_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # solo_round with a timeout already spent sends, reads nothing and frees both roles; the
    # answer is then read by whoever reads next.
    monkeypatch.setattr(connection, "_LINGER", 5.0)
    with FakeServer(leader) as fake, ticketing.Client(fake.addr, heartbeat=0) as client:
        _worker_pings(client, 2)
        conn = client._conn
        assert conn is not None
        call = ticketing._session.Call(Op.PING)

        def run() -> bool:
            with client._mu:
                assert conn.claim_solo()
                data = client._session.submit_data(call, 0.0)
            return conn.solo_round(call, data, 0.0)

        t, out = in_thread(run)
        t.join(10)
        assert len(out) == 1 and isinstance(out[0], bool)
        assert not conn._sending and conn._leader != connection._CALLER
        _worker_pings(client, 1)  # the next caller reads (and handles) the PING's answer too
        wait_for(lambda: call.done)
        assert fake.ops().count(Op.PING) >= 4
