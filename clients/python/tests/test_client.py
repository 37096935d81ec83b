"""Blocking client against the real server. Mirrored by tests/test_asyncio/test_client.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import ticketing
from ticketing.constants import Field

from .server import TOKEN, ServerProcess, tls_context


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def test_acquire_extend_release(server: ServerProcess, key: str) -> None:
    with ticketing.Client([server.addr]) as client:
        assert client.ping() >= 0
        lock = client.acquire(key, lease=5, wait_timeout=1)
        assert lock.key == key and lock.token > 0 and lock.held
        assert 4 < lock.remaining() <= 5 and lock.lease == 5
        lock.extend(20)
        assert lock.lease == 20 and 19 < lock.remaining() <= 20
        assert client.extend(key, lock.token, 30) == 30
        lock.release()
        assert lock.released and not lock.held and not lock.lost.is_set()
        lock.release()  # idempotent
        again = client.acquire(key, 5)
        assert again.token > lock.token
        again.release()


def test_lock_context_manager_releases(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        with client.lock(key, lease=30, wait_timeout=5) as lock:
            token = lock.token
            with pytest.raises(ticketing.NotAcquired):
                client.try_acquire(key, 5)
        assert lock.released
        with pytest.raises(RuntimeError):
            with client.lock(key, lease=30) as lock2:
                raise RuntimeError("boom")
        assert lock2.released and lock2.token > token
        with client.acquire(key, 5) as lock3:  # a Lock is a context manager too
            pass
        assert lock3.released


def test_try_acquire_held_key_not_acquired(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        lock = a.acquire(key, 10)
        with pytest.raises(ticketing.NotAcquired):
            b.try_acquire(key, 10)
        t0 = time.monotonic()
        with pytest.raises(ticketing.NotAcquired):
            b.acquire(key, 10, wait_timeout=0.2)
        assert 0.15 < time.monotonic() - t0 < 2
        lock.release()
        b.try_acquire(key, 10).release()


def test_waiters_granted_in_arrival_order(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        holder = client.acquire(key, 30)
        grants: list[tuple[int, int]] = []
        errors: list[BaseException] = []

        def waiter(i: int) -> None:
            try:
                lock = client.acquire(key, 30, wait_timeout=20)
                grants.append((i, lock.token))
                lock.release()
            except BaseException as e:
                errors.append(e)

        conn = client._conn
        assert conn is not None
        threads = []
        for i in range(20):
            t = threading.Thread(target=waiter, args=(i,))
            t.start()
            threads.append(t)
            wait_for(lambda: len(conn._pending) == i + 1)
            time.sleep(0.005)  # registered, then written: let the write finish
        holder.release()
        for t in threads:
            t.join(20)
        assert not errors
        assert [i for i, _ in grants] == list(range(20))
        tokens = [t for _, t in grants]
        assert tokens == sorted(tokens) and len(set(tokens)) == 20 and tokens[0] > holder.token


def test_release_stale_token_not_held(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        lock = client.acquire(key, 10)
        lock.release()
        with pytest.raises(ticketing.NotHeld):
            client.release(key, lock.token)
        with pytest.raises(ticketing.NotHeld):
            client.extend(key, lock.token, 5)
        other = client.acquire(key, 10)
        with pytest.raises(ticketing.NotHeld):
            client.release(key, other.token + 1000)  # never issued
        with pytest.raises(ticketing.NotHeld):
            client.release(key, lock.token)  # stale: must not release the new holder
        assert other.held
        other.release()


def test_release_from_another_client(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        lock = a.acquire(key, 10)
        b.release(key, lock.token)  # the owner is the token
        b.try_acquire(key, 10).release()
        with pytest.raises(ticketing.NotHeld):
            lock.extend()
        assert lock.lost.is_set() and lock.lost_reason == "not_held"


def test_inspect_free_key(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        info = client.inspect(key)
        assert info == ticketing.KeyInfo(token=None, lease_remaining=0.0, waiters=0, held_for=0.0,
                                         lock_delay_remaining=0.0)
        with pytest.raises(AttributeError):
            info.waiters = 1  # type: ignore[misc]  # frozen


def test_inspect_held_key_with_a_waiter(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as a, ticketing.Client(server.addr) as b:
        holder = a.acquire(key, lease=10)
        got: list[ticketing.Lock] = []
        t = threading.Thread(target=lambda: got.append(b.acquire(key, 10, wait_timeout=20)))
        t.start()
        wait_for(lambda: a.inspect(key).waiters == 1)
        info = b.inspect(key)  # from any client, even the waiter's
        assert info.token == holder.token
        assert info.waiters == 1
        assert 0 < info.lease_remaining <= 10
        assert 0 <= info.held_for < 10 and info.lock_delay_remaining == 0
        holder.release()
        t.join(10)
        assert len(got) == 1
        info = a.inspect(key)
        assert info.token == got[0].token and info.waiters == 0
        got[0].release()
        assert a.inspect(key).token is None


def test_inspect_lock_delay(server_bin: Path, tmp_path: Path, key: str) -> None:
    srv = ServerProcess(server_bin, tmp_path / "data", env={"TICKETING_LOCK_DELAY": "2s"}).start()
    try:
        with ticketing.Client(srv.addr) as client:
            lock = client.acquire(key, lease=0.1)
            assert lock.lost.wait(3)
            wait_for(lambda: client.inspect(key).lock_delay_remaining > 0)
            info = client.inspect(key)
            assert info.token is None and info.lease_remaining == 0 and info.held_for == 0
            assert 0 < info.lock_delay_remaining <= 2
    finally:
        srv.stop()


def test_invalid_requests(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        with pytest.raises(ticketing.InvalidRequest) as e:
            client.acquire("k" * 300, 5)
        assert e.value.field == Field.KEY and isinstance(e.value, ValueError)
        with pytest.raises(ticketing.InvalidRequest) as e:
            client.acquire(key, 25 * 3600)
        assert e.value.field == Field.LEASE
        client.ping()  # the connection stays
        with pytest.raises(ValueError):
            client.acquire("", 5)
        with pytest.raises(ValueError):
            client.acquire(key, 0)


def test_auth(auth_server: ServerProcess, server: ServerProcess, key: str) -> None:
    with ticketing.Client(auth_server.addr, token=TOKEN) as client:
        client.acquire(key, 5).release()
    with pytest.raises(ticketing.AuthFailed, match="rejected the token"):
        ticketing.Client(auth_server.addr, token="wrong token").connect()
    with pytest.raises(ticketing.AuthFailed, match="requires a token"):
        ticketing.Client(auth_server.addr).connect()
    with pytest.raises(ticketing.AuthFailed, match="does not require auth"):
        ticketing.Client(server.addr, token=TOKEN).connect()


def test_tls(tls_server: ServerProcess, key: str) -> None:
    with ticketing.Client(tls_server.addr, token=TOKEN, ssl=tls_context()) as client:
        lock = client.acquire(key, 5)
        lock.extend(10)
        lock.release()
        # many threads reading and writing one TLS connection at once
        _hammer(client, key, threads=8, rounds=40)
    with pytest.raises(ticketing.ConnectionLost, match="TLS"):
        ticketing.Client(tls_server.addr, token=TOKEN, ssl=True).connect()  # the test CA is not trusted


def _hammer(client: ticketing.Client, key: str, threads: int, rounds: int) -> None:
    inside = 0
    max_inside = 0
    tokens: list[int] = []
    guard = threading.Lock()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        nonlocal inside, max_inside
        try:
            for r in range(rounds):
                with client.lock(key, lease=10, wait_timeout=30) as lock:
                    with guard:
                        inside += 1
                        max_inside = max(max_inside, inside)
                        tokens.append(lock.token)
                    with guard:
                        inside -= 1
                # and some traffic on keys of its own
                client.acquire(f"{key}-{n}-{r}", 5).release()
                client.ping()
        except BaseException as e:
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    assert max_inside == 1
    assert tokens == sorted(tokens) and len(set(tokens)) == threads * rounds


def test_many_threads_share_one_client(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        _hammer(client, key, threads=16, rounds=40)


def test_lost_signal_fires_at_lease_end(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client:
        lock = client.acquire(key, lease=0.3)
        fired = threading.Event()
        reasons: list[str | None] = []
        def on_lost(lk: ticketing.Lock) -> None:
            reasons.append(lk.lost_reason)
            fired.set()

        lock.on_lost(on_lost)
        t0 = time.monotonic()
        assert lock.lost.wait(3)
        assert fired.wait(1)
        elapsed = time.monotonic() - t0
        assert elapsed < 0.3 + 0.2
        assert lock.lost_reason in ("deadline", "expired") and reasons == [lock.lost_reason]
        assert not lock.held
        with pytest.raises(ticketing.LockLost):
            lock.extend()
        # the server reclaimed it: another client can take it
        with ticketing.Client(server.addr) as other:
            other.acquire(key, 5, wait_timeout=2).release()
        with pytest.raises(ticketing.NotHeld):
            lock.release()


def test_expired_notice_from_server(server: ServerProcess, key: str) -> None:
    """Push the local deadline out of the way: the server's EXPIRED notice alone fires lost."""
    with ticketing.Client(server.addr) as client:
        lock = client.acquire(key, lease=0.2)
        with lock._mutex:
            lock._deadline += 60
            lock._schedule_locked()
        assert lock.lost.wait(3)
        assert lock.lost_reason == "expired"


def test_keepalive_holds_short_lease(server: ServerProcess, key: str) -> None:
    with ticketing.Client(server.addr) as client, ticketing.Client(server.addr) as other:
        lock = client.acquire(key, lease=0.3, keepalive=True)
        t_end = time.monotonic() + 1.2  # four lease periods
        while time.monotonic() < t_end:
            with pytest.raises(ticketing.NotAcquired):
                other.try_acquire(key, 5)
            time.sleep(0.1)
        assert lock.held and not lock.lost.is_set()
        lock.release()
        assert lock._keepalive is not None
        lock._keepalive.join(2)
        assert not lock._keepalive.is_alive()  # stopped the moment it was released
        other.try_acquire(key, 5).release()
        time.sleep(0.4)
        assert not lock.lost.is_set()


def test_endpoint_list_skips_dead_endpoint(server: ServerProcess, key: str) -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    with ticketing.Client([dead, server.addr]) as client:
        assert client.endpoint == server.addr
        client.acquire(key, 5).release()
    with pytest.raises(ticketing.ConnectionLost, match="could not connect"):
        ticketing.Client([dead]).connect()


def test_reconnect_after_server_restart(own_server: ServerProcess, key: str) -> None:
    with ticketing.Client(own_server.addr) as client, ticketing.Client(own_server.addr) as other:
        lock = other.acquire(key, 30)
        errors: list[BaseException] = []

        def waiter() -> None:
            try:
                client.acquire(key, 5)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
        addr = own_server.addr
        own_server.kill()
        t.join(5)
        assert len(errors) == 1 and isinstance(errors[0], ticketing.ConnectionLost)
        with pytest.raises(ticketing.ConnectionLost):
            client.ping()  # nobody listens
        own_server.start(addr=addr)
        session = client.session_id
        client.ping()  # reconnected
        assert client.session_id == session
        new = client.acquire(key, 5)
        assert new.token > lock.token  # tokens never go backwards across a restart
        new.release()


def test_shutdown_answers_waiters(own_server: ServerProcess, key: str) -> None:
    with ticketing.Client(own_server.addr) as client:
        client.acquire(key, 30)
        errors: list[BaseException] = []

        def waiter() -> None:
            try:
                client.acquire(key, 5)
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
        own_server.stop()
        t.join(10)
        assert len(errors) == 1
        assert isinstance(errors[0], (ticketing.ShuttingDown, ticketing.ConnectionLost))


def test_close_fails_calls_in_flight(server: ServerProcess, key: str) -> None:
    client = ticketing.Client(server.addr)
    holder = client.acquire(key, 30)
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            client.acquire(key, 5)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    wait_for(lambda: client._conn is not None and len(client._conn._pending) == 1)
    client.close()
    t.join(5)
    assert len(errors) == 1 and isinstance(errors[0], ticketing.ConnectionLost)
    assert holder.lost.is_set() and holder.lost_reason == "closed"
    with pytest.raises(ticketing.ConnectionLost):
        client.ping()
    with ticketing.Client(server.addr) as other:
        other.release(key, holder.token)  # still held on the server until released
