"""Blocking client against the real server. Mirrored by tests/test_asyncio/test_client.py."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import ticketing
from ticketing import InspectFlag, LostReason
from ticketing.constants import Field

from .proxy import Proxy
from .server import TOKEN, ServerProcess, TLSFiles


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


def test_acquire_extend_release(server: ServerProcess, key: str) -> None:
    with ticketing.Client([server.addr]) as client:
        assert client.ping() >= 0
        lock = client.acquire(key, lease=5, wait_timeout=1)
        assert lock.key == key and lock.token > 0 and lock.held
        assert 4 < lock.remaining() <= 5 and lock.lease == 5  # counted from the send: load stretches it
        assert lock.extend(20) == 20
        assert lock.lease == 20 and 19 < lock.remaining() <= 20
        assert client.extend(key, lock.token, 30) == 30 and lock.lease == 30
        lock.release()
        assert lock.released and not lock.held and not lock.lost.is_set()
        lock.release()  # does nothing once released
        with pytest.raises(ticketing.LockLost, match="released"):
            lock.extend()
        again = client.acquire(key, 5)
        assert again.token > lock.token
        again.release()


def test_context_manager_and_decorator(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        with client.lock(key, lease=30, wait_timeout=5) as lock:
            assert client.try_acquire(key, 5) is None  # queued behind nobody: taken, so None
        assert lock.released
        with pytest.raises(RuntimeError):
            with client.lock(key, lease=30) as lock2:
                raise RuntimeError("boom")
        assert lock2.released and lock2.token > lock.token
        with client.acquire(key, 5) as lock3:  # a Lock is a context manager too
            pass
        assert lock3.released
        tokens: list[int] = []

        @client.lock(key, lease=5)
        def job() -> None:
            tokens.append(client.inspect(key).token or 0)

        job()
        job()
        assert len(tokens) == 2 and 0 < tokens[0] < tokens[1]  # our session holds it: token shown
        assert not client.inspect(key).held


def test_try_acquire_and_wait_timeout(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        lock = a.acquire(key, 10)
        assert b.try_acquire(key, 10) is None
        with pytest.raises(ticketing.NotAcquired, match="try once"):
            b.acquire(key, 10, wait_timeout=0)
        t0 = time.monotonic()
        with pytest.raises(ticketing.NotAcquired, match=f"key '{key}', lease 10 s, wait timeout 0.3 s"):
            b.acquire(key, 10, wait_timeout=0.3)
        assert 0.29 < time.monotonic() - t0 < 2
        assert a.inspect(key).waiters == 0
        lock.release()
        got = b.try_acquire(key, 10)
        assert got is not None and got.token > lock.token
        got.release()


def test_waiters_granted_in_arrival_order(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client, ticketing.Client(server.addr) as observer:
        holder = client.acquire(key, 30)
        grants: list[tuple[int, int]] = []

        def waiter(i: int) -> None:
            lock = client.acquire(key, 30, wait_timeout=20)
            grants.append((i, lock.token))
            lock.release()

        threads = []
        for i in range(10):
            t, _ = in_thread(lambda i=i: waiter(i))  # type: ignore[misc]
            threads.append(t)
            wait_for(lambda: observer.inspect(key).waiters == i + 1)
        holder.release()
        for t in threads:
            t.join(20)
        assert [i for i, _ in grants] == list(range(10))
        tokens = [t for _, t in grants]
        assert tokens == sorted(tokens) and len(set(tokens)) == 10 and tokens[0] > holder.token


def test_not_held_and_owner_is_the_token(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        lock = a.acquire(key, 10)
        reasons: list[LostReason | None] = []
        lock.on_lost(lambda lk: reasons.append(lk.lost_reason))
        assert lock.verify()
        b.release(key, lock.token)  # any client may release by token
        assert not lock.verify()
        with pytest.raises(ticketing.NotHeld, match=f"token {lock.token}"):
            b.release(key, lock.token)  # stale: changes nothing
        with pytest.raises(ticketing.LockLost) as e:
            lock.release()
        assert e.value.reason is LostReason.NOT_HELD and reasons == [LostReason.NOT_HELD]
        other = b.acquire(key, 10)
        with pytest.raises(ticketing.NotHeld):
            a.release(key, lock.token)  # never releases somebody else's lock
        with pytest.raises(ticketing.NotHeld):
            a.extend(key, lock.token, 5)
        assert other.verify() and reasons == [LostReason.NOT_HELD]
        other.release()


def test_inspect(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        free = a.inspect(key)
        assert free == ticketing.KeyInfo(held=False, token=None, lease_remaining=0.0, waiters=0, held_for=0.0,
                                         lock_delay_remaining=0.0, flags=InspectFlag(0))
        holder = a.acquire(key, lease=10)
        t, got = in_thread(lambda: b.acquire(key, 10, wait_timeout=20))
        wait_for(lambda: a.inspect(key).waiters == 1)
        mine = a.inspect(key)
        assert mine.held and mine.token == holder.token and mine.flags & InspectFlag.SESSION
        theirs = b.inspect(key)  # another session: the token is not handed out
        assert theirs.held and theirs.token is None and theirs.waiters == 1
        assert 0 < theirs.lease_remaining <= 10 and 0 <= theirs.held_for < 10
        holder.release()
        t.join(10)
        lock = got[0]
        assert isinstance(lock, ticketing.Lock) and b.inspect(key).token == lock.token
        lock.release()
        assert not a.inspect(key).held


def test_lock_delay(server_bin: Path, tmp_path: Path, key: str) -> None:
    srv = ServerProcess(server_bin, tmp_path / "data", env={"TICKETING_LOCK_DELAY": "2s"}).start()
    try:
        with ticketing.Client(srv.addr) as client:
            lock = client.acquire(key, lease=0.1)
            assert lock.lost.wait(3)
            wait_for(lambda: client.inspect(key).lock_delay_remaining > 0)
            info = client.inspect(key)
            assert not info.held and 0 < info.lock_delay_remaining <= 2
    finally:
        srv.stop()


def test_server_rejects_invalid_fields(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        with pytest.raises(ticketing.InvalidRequest) as e:
            client.acquire("k" * 300, 5)
        assert e.value.field == Field.KEY and isinstance(e.value, ticketing.InvalidArgument)
        with pytest.raises(ticketing.InvalidRequest) as e:
            client.acquire(key, 30000)  # a unit slip: 30000 s is above the server's 1 h maximum
        assert e.value.field == Field.LEASE and "lease 30000 s" in str(e.value)
        client.ping()  # the connection stays


def test_auth(auth_server: ServerProcess, server: ServerProcess, key: str) -> None:
    with ticketing.Client(auth_server.addr, token=TOKEN) as client:
        client.acquire(key, 5).release()
    with pytest.raises(ticketing.AuthFailed, match="rejected the token"):
        ticketing.Client(auth_server.addr, token="wrong token").connect()
    with pytest.raises(ticketing.AuthFailed, match="requires a token"):
        ticketing.Client(auth_server.addr).connect()
    with pytest.raises(ticketing.AuthFailed, match="does not require auth"):
        ticketing.Client(server.addr, token=TOKEN).connect()


def test_tls(tls_server: ServerProcess, server: ServerProcess, tls_files: TLSFiles, key: str) -> None:
    with ticketing.Client(tls_server.addr, token=TOKEN, ssl=tls_files.client_context()) as client:
        lock = client.acquire(key, 5)
        lock.extend(10)
        lock.release()
        _hammer(client, key, threads=4, rounds=20)  # threads reading and writing one TLS connection
    with pytest.raises(ticketing.TLSError, match="certificate verification failed"):
        ticketing.Client(tls_server.addr, token=TOKEN, ssl=True).connect()  # the test CA is not trusted
    # A TLS/plaintext mismatch, both ways, is a TLSError that says so.
    t0 = time.monotonic()
    with pytest.raises(ticketing.TLSError, match=r"is the server using TLS\?"):
        ticketing.Client(tls_server.addr, token=TOKEN, connect_timeout=3).connect()  # plaintext to TLS
    with pytest.raises(ticketing.TLSError, match=r"is the server using TLS\?"):
        ticketing.Client(tls_server.addr, token=TOKEN, connect_timeout=3).ping()  # the first call connects
    with pytest.raises(ticketing.TLSError, match=r"is the server using TLS\?"):
        ticketing.Client(server.addr, ssl=tls_files.client_context(), connect_timeout=3).connect()
    assert time.monotonic() - t0 < 3


def test_mutual_tls(mtls_server: ServerProcess, tls_files: TLSFiles, key: str) -> None:
    with ticketing.Client(mtls_server.addr, ssl=tls_files.client_context(with_cert=True)) as client:
        client.acquire(key, 5).release()
    with pytest.raises((ticketing.TLSError, ticketing.Unavailable)):
        ticketing.Client(mtls_server.addr, ssl=tls_files.client_context(), connect_timeout=3).connect()


def _hammer(client: ticketing.Client, key: str, threads: int, rounds: int) -> None:
    inside = 0
    max_inside = 0
    tokens: list[int] = []
    guard = threading.Lock()

    def worker(n: int) -> None:
        nonlocal inside, max_inside
        for r in range(rounds):
            with client.lock(key, lease=10, wait_timeout=30) as lock:
                with guard:
                    inside += 1
                    max_inside = max(max_inside, inside)
                    tokens.append(lock.token)
                with guard:
                    inside -= 1
            client.acquire(f"{key}-{n}-{r}", 5).release()
            client.ping()

    ts = [in_thread(lambda n=n: worker(n)) for n in range(threads)]  # type: ignore[misc]
    for t, _ in ts:
        t.join(60)
    assert all(out == [None] for _, out in ts), [out for _, out in ts]
    assert max_inside == 1
    assert tokens == sorted(tokens) and len(set(tokens)) == threads * rounds


def test_many_threads_share_one_client(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        _hammer(client, key, threads=8, rounds=20)


def test_lost_fires_before_another_client_is_granted(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        lock = a.acquire(key, lease=0.4)
        fired: list[float] = []
        lock.on_lost(lambda _lk: fired.append(time.monotonic()))
        other = b.acquire(key, 5, wait_timeout=5)  # granted when the server expires the lease
        granted = time.monotonic()
        assert fired and fired[0] < granted
        assert lock.lost_reason is LostReason.EXPIRED and other.token > lock.token
        with pytest.raises(ticketing.LockLost) as e:
            lock.release()
        assert e.value.reason is LostReason.EXPIRED
        other.release()


def test_keepalive_holds_past_the_lease(server: ServerProcess, key: str) -> None:
    """A 1.5 s lease (EXTEND every 0.5 s: about 1 s of slack for a loaded machine) held with
    keep-alive well past the lease: nobody else gets the key meanwhile, and it stays free once
    released."""
    with ticketing.Client(server.addr) as client, ticketing.Client(server.addr) as other:
        lock = client.acquire(key, lease=1.5, keepalive=True)
        t_end = time.monotonic() + 2.2  # past the lease granted at first
        while time.monotonic() < t_end:
            assert other.try_acquire(key, 5) is None
            time.sleep(0.2)
        assert lock.held and lock.verify()
        lock.release()
        assert not other.inspect(key).held
        time.sleep(0.5)  # no extend after the release: it stays free
        assert not other.inspect(key).held and not lock.lost.is_set()


def test_restart_reports_server_restarted(own_server: ServerProcess, key: str) -> None:
    """Issue 7's must-show: with TICKETING_STARTUP_GRACE=0, after a restart the client reports its
    lock lost with reason "server restarted" on reconnect, and no operation on the old lock
    succeeds; a queued acquire fails and is not re-queued."""
    with ticketing.Client(own_server.addr) as a, ticketing.Client(own_server.addr) as b:
        lock = a.acquire(key, 30, keepalive=True)
        t, out = in_thread(lambda: b.acquire(key, 30))
        wait_for(lambda: a.inspect(key).waiters == 1)
        own_server.restart()
        assert lock.lost.wait(5)
        assert lock.lost_reason is LostReason.SERVER_RESTARTED
        t.join(5)
        assert len(out) == 1 and isinstance(out[0], ticketing.ServerRestarted), out
        for op in (lock.release, lock.extend):
            with pytest.raises(ticketing.LockLost) as e:
                op()
            assert e.value.reason is LostReason.SERVER_RESTARTED
        assert not lock.verify()
        with pytest.raises(ticketing.NotHeld):
            a.release(key, lock.token)
        info = b.inspect(key)
        assert not info.held and info.waiters == 0  # the waiter was not re-queued
        with ticketing.Client(own_server.addr) as c:
            new = c.try_acquire(key, 5)
            assert new is not None and new.token > lock.token  # tokens never go backwards
            new.release()


def test_calls_wait_for_a_server_that_comes_back(server_bin: Path, tmp_path: Path, key: str) -> None:
    """The server dies and stays down past the session grace: calls keep waiting through the
    failed reconnect rounds, each bounded by its own timeout (reported as a timeout naming the
    last connect error), and go out once the server is back."""
    s = ServerProcess(server_bin, tmp_path / "data", env={"TICKETING_SESSION_GRACE": "200ms"}).start()
    try:
        with ticketing.Client(s.addr, heartbeat=0, request_timeout=0.6) as client:
            addr = s.addr
            s.kill()
            wait_for(lambda: not client.connected)
            time.sleep(0.4)  # past the grace
            with pytest.raises(ticketing.RequestTimeout, match="within 0.6 s.*Connection refused") as e:
                client.ping()
            assert isinstance(e.value.__cause__, ticketing.Unavailable)
            t, out = in_thread(lambda: client.acquire(key, 5, wait_timeout=8))
            time.sleep(0.5)  # failed rounds
            assert not out
            s.start(addr=addr)
            t.join(10)
            assert len(out) == 1 and isinstance(out[0], ticketing.Lock), out
            out[0].release()
    finally:
        s.stop()


def test_graceful_stop_reports_server_stopping(own_server: ServerProcess, key: str) -> None:
    with ticketing.Client(own_server.addr) as a, ticketing.Client(own_server.addr) as b:
        with pytest.raises(ticketing.LockLost, match="server stopping") as e:
            with a.lock(key, 30) as lock:
                t, out = in_thread(lambda: b.acquire(key, 30))
                wait_for(lambda: a.inspect(key).waiters == 1)
                own_server.stop()
                assert lock.lost.is_set() and lock.lost_reason is LostReason.SERVER_STOPPING
                t0 = time.monotonic()
        # Leaving the block reports the loss at once: the server is gone, and the release of a
        # lock known lost does not wait for it (it waited out the request timeout, 10 s).
        assert time.monotonic() - t0 < 1 and e.value.reason is LostReason.SERVER_STOPPING
        t.join(5)
        assert len(out) == 1 and isinstance(out[0], ticketing.ShuttingDown), out


def test_close_withdraws_a_queued_acquire(server: ServerProcess, key: str) -> None:
    """Closing a client withdraws its queued acquire from the server (it was left queued, to be
    granted to the closed client later)."""
    with ticketing.Client(server.addr) as r:
        holder = r.acquire(key, 30)
        a = ticketing.Client(server.addr)
        t, out = in_thread(lambda: a.acquire(key, 30))
        wait_for(lambda: r.inspect(key).waiters == 1)
        t0 = time.monotonic()
        a.close()
        assert time.monotonic() - t0 < 2
        t.join(2)
        assert len(out) == 1 and isinstance(out[0], ticketing.ClientClosed), out
        assert "withdrawn" in str(out[0])
        assert r.inspect(key).waiters == 0  # withdrawn before close returned
        holder.release()
        assert r.try_acquire(key, 5) is not None


def test_resume_keeps_the_queue_place(own_server: ServerProcess, key: str) -> None:
    """The waiter's connection is cut (RST) and it reconnects within the grace: it keeps its
    place in the queue, ahead of a later waiter."""
    with Proxy(own_server.addr) as proxy, ticketing.Client(own_server.addr) as r, \
            ticketing.Client(proxy.addr) as a, ticketing.Client(own_server.addr) as c:
        holder = r.acquire(key, 30)
        ta, out_a = in_thread(lambda: a.acquire(key, 3))
        wait_for(lambda: r.inspect(key).waiters == 1)
        tc, out_c = in_thread(lambda: c.acquire(key, 30, wait_timeout=10))
        wait_for(lambda: r.inspect(key).waiters == 2)
        proxy.cut()
        wait_for(lambda: proxy.accepted >= 2 and a.connected)
        time.sleep(1.5)  # the resumed waiter stays queued a while: its lease starts at the grant
        holder.release()
        ta.join(5)
        lock_a = out_a[0]
        assert isinstance(lock_a, ticketing.Lock) and lock_a.token == holder.token + 1
        assert lock_a.remaining() > 2.5 and not lock_a.lost.is_set()
        assert not tc.is_alive() or r.inspect(key).waiters == 1  # c is still behind a
        lock_a.release()
        tc.join(5)
        lock_c = out_c[0]
        assert isinstance(lock_c, ticketing.Lock) and lock_c.token == lock_a.token + 1
        lock_c.release()


def test_retried_acquire_and_release_are_idempotent(own_server: ServerProcess, key: str) -> None:
    with Proxy(own_server.addr) as proxy, ticketing.Client(proxy.addr) as a, \
            ticketing.Client(own_server.addr) as r:
        proxy.hold_back.set()  # the answer is lost with the connection
        t, out = in_thread(lambda: a.acquire(key, 30))
        wait_for(lambda: r.inspect(key).held)
        proxy.cut()
        t.join(10)
        lock = out[0]
        assert isinstance(lock, ticketing.Lock)
        proxy.hold_back.set()
        t, out = in_thread(lock.release)
        wait_for(lambda: not r.inspect(key).held)
        proxy.cut()
        t.join(10)
        assert out == [None] and lock.released and not lock.lost.is_set()
        after = r.acquire(key, 5)
        assert after.token == lock.token + 1  # no grant happened in between
        after.release()


def test_frozen_server(own_server: ServerProcess, key: str) -> None:
    client = ticketing.Client(own_server.addr, request_timeout=0.5, heartbeat=0.2, connect_timeout=1)
    client.connect()
    own_server.signal(signal.SIGSTOP)
    try:
        for call in (client.ping, lambda: client.inspect(key), lambda: client.release(key, 1),
                     lambda: client.acquire(key, 5, wait_timeout=0.1)):
            t0 = time.monotonic()
            with pytest.raises((ticketing.RequestTimeout, ticketing.ConnectionLost)):
                call()
            assert time.monotonic() - t0 < 3
        t0 = time.monotonic()
        client.close()
        assert time.monotonic() - t0 < 5
    finally:
        own_server.signal(signal.SIGCONT)


def test_close_releases_only_when_asked(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as observer:
        client = ticketing.Client(server.addr)
        kept = client.acquire(key, 30)
        client.close()
        assert observer.inspect(key).held and kept.held  # close does not release
        observer.release(key, kept.token)
        client = ticketing.Client(server.addr, release_on_close=True)
        lock = client.acquire(key, 30)
        client.close()
        assert lock.released and not observer.inspect(key).held
