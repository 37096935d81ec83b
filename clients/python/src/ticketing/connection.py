"""One connection of the blocking client: the socket (plain or TLS), the handshake, a reader
thread that hands every received frame to the client, and a writer thread that sends what the
client queued, in order, never holding the client's lock during I/O. On a plain connection a
caller's own thread may send instead (:meth:`Connection.write_claim` under the client's lock,
then :meth:`Connection.send_claimed` once it is released): without blocking (``MSG_DONTWAIT``),
everything queued so far, one sender at a time; what the socket does not take goes to the writer
thread. A request then costs no hand-off to another thread, and with many
callers one send carries the requests of several.

On a plain connection a waiting caller may also read the socket itself while no other thread
reads it (:meth:`Connection.wait_answer`, leader/follower): it handles every frame that arrives,
and once its own answer is in it hands the reading role to another waiting caller, or leaves it
free. A lone caller (nobody sends, nobody reads, nothing queued: :meth:`Connection.claim_solo`,
under the client's lock, with its request id) takes the sending and the reading role at once and
then sends and reads in one step (:meth:`Connection.solo_round`): one ``send``, one ``recv``, no
queue, no wait for another thread; anything unusual (a partial send, a push before its answer, the
receive timeout) goes on as above. On Linux the socket has a receive timeout (``SO_RCVTIMEO``,
``_RCV_TIMEOUT``): a caller whose deadline is further away than that blocks in ``recv`` itself,
one system call instead of ``poll`` then ``recv`` (the timeout bounds the wait, and it looks at its deadline again); a
caller with less time left polls with its own timeout. The reader thread takes the timeout as a
quiet interval and reads on. The reader thread then stays out of the socket while callers keep coming (it takes the role
back after ``_LINGER`` without a reading caller, or at once when :meth:`Connection.write` queues
bytes that no caller waits for: heartbeats, ACKs, clean-up), so a call costs no thread hand-off
at all. Only threads other than the main thread read: a ``KeyboardInterrupt`` (or any exception
a Python signal handler raises) lands on the main thread only, and could otherwise cut the
handling of a frame in half; the main thread waits for its answer from the reader as before.

TLS runs through an ``ssl.SSLObject`` over memory BIOs, so the reader thread and the writer
thread never call into the same ``SSLSocket`` at once (OpenSSL objects are not safe for that).
"""

from __future__ import annotations

import _thread
import logging
import select
import socket
import ssl as _ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from . import _clock
from ._common import (
    HANDSHAKE_WAIT,
    PLAINTEXT_TO_TLS,
    TLS_PROBE_WAIT,
    Endpoint,
    format_endpoint,
    not_leader_unavailable,
    speaks_tls,
    tls_client_hello,
)
from .constants import WELCOME_SIZE
from .exceptions import NotLeader, ProtocolError, TicketingError, TLSError, Unavailable
from .protocol import ClientHandshake, FrameBuffer, Response, Welcome, challenge_size

__all__ = ["Connection", "dial"]

log = logging.getLogger("ticketing")

_RECV_SIZE = 65536
#: ``send`` that never blocks, where the platform has it (not Windows): the fast path of
#: :meth:`Connection.write`.
_DONTWAIT: int = getattr(socket, "MSG_DONTWAIT", 0)
#: How long the reader thread stays out of the socket after a caller read it (callers that keep
#: coming read their own answers); it then takes the reading role back when it is free.
_LINGER = 0.02
_POLLIN = getattr(select, "POLLIN", 1)
#: The socket's receive timeout (``SO_RCVTIMEO``, Linux only), seconds: a leading caller with more
#: time left than this reads with a blocking ``recv``, woken by the timeout at the latest. It also
#: wakes the reader thread of an idle connection this often.
_RCV_TIMEOUT = 1.0
#: The reading role's holders (Connection._leader).
_READER = 1
_CALLER = 2
#: ``.on`` while this thread, a caller's, handles frames it read (see :func:`handling_on_caller`).
_caller_handling = threading.local()


def handling_on_caller() -> bool:
    """This thread is a caller's, handling frames it read for the client (:meth:`Connection.
    wait_answer`): what runs user code (a lock's ``on_lost`` callbacks) goes to a client
    thread instead, as when the reader thread handles them."""
    return getattr(_caller_handling, "on", False)


class _PlainTransport:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> bytes:
        return self.sock.recv(_RECV_SIZE)


class _TLSTransport:
    """TLS over memory BIOs. ``_ssl_lock`` guards the SSLObject and both BIOs and is never held
    during socket I/O; ``_send_lock`` keeps ciphertext in the order it was produced."""

    def __init__(self, sock: socket.socket, context: _ssl.SSLContext, hostname: str) -> None:
        self.sock = sock
        self._in = _ssl.MemoryBIO()
        self._out = _ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=False, server_hostname=hostname)
        self._ssl_lock = threading.Lock()
        self._send_lock = threading.Lock()
        while True:
            try:
                self._obj.do_handshake()
                break
            except _ssl.SSLWantReadError:
                self._flush()
                data = self.sock.recv(_RECV_SIZE)
                if not data:
                    raise _ssl.SSLEOFError("the server closed the connection during the TLS handshake") from None
                self._in.write(data)
        self._flush()

    def _flush(self) -> None:
        with self._send_lock:
            with self._ssl_lock:
                out = self._out.read()
            if out:
                self.sock.sendall(out)

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            with self._ssl_lock:
                self._obj.write(data)
                out = self._out.read()
            self.sock.sendall(out)

    def recv(self) -> bytes:
        while True:
            data: bytes | None
            with self._ssl_lock:
                try:
                    data = self._obj.read(_RECV_SIZE)
                except _ssl.SSLWantReadError:
                    data = None
                except _ssl.SSLZeroReturnError:
                    data = b""
                pending_out = self._out.pending
            if pending_out:
                self._flush()
            if data is not None:
                return data
            raw = self.sock.recv(_RECV_SIZE)
            if not raw:
                return b""
            with self._ssl_lock:
                self._in.write(raw)


_Transport = _PlainTransport | _TLSTransport


class _Waitable(Protocol):
    @property
    def done(self) -> bool: ...
    @property
    def callbacks(self) -> list[Callable[[Any], None]]: ...


def releaser(lock: _thread.LockType) -> Callable[[object], None]:
    """A call's callback that releases ``lock``, already released or not (Connection.wait_answer
    may have woken its waiter to read). One closure: a Python frame less per answer than a
    lambda calling a helper (and cheaper to call than an object with ``__call__``)."""
    def release(_call: object) -> None:
        try:
            lock.release()
        except RuntimeError:
            pass

    return release


def wake_up_lock(call: _Waitable) -> _thread.LockType:
    """A lock, taken, that ``call``'s callback releases once it is done (or that is released
    already when ``call`` is done). Made when a caller has to wait for another thread, after the
    submit: the callback goes on the list before ``call.done`` is looked at, so a callback run
    that missed it (it ended before the append) began after ``done`` was set, and the look
    sees it. (Under the GIL, the append and the run's iteration of the list are ordered.)"""
    lock = _thread.allocate_lock()
    lock.acquire()
    call.callbacks.append(releaser(lock))
    if call.done:
        try:
            lock.release()
        except RuntimeError:  # the callback released it just now
            pass
    return lock


def wait_for_done(call: _Waitable, timeout: float | None) -> bool:
    """Wait until ``call.done`` (its callbacks run), at most ``timeout`` seconds (None: no
    limit); returns whether it is done."""
    if call.done:
        return True
    return wake_up_lock(call).acquire(True, -1 if timeout is None else timeout)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def dial(endpoint: Endpoint, *, session_id: bytes, token: bytes | None, ssl_context: _ssl.SSLContext | None,
         server_hostname: str | None, timeout: float | None,
         on_socket: Callable[[socket.socket | None], None],
         probe_tls: bool = True) -> tuple[_Transport, bytes, Welcome]:
    """Connect to ``endpoint`` and run TLS and the handshake within ``timeout`` seconds. Returns
    the transport, bytes received after WELCOME, and the WELCOME. ``on_socket`` is told the
    socket while it is being dialed (so that closing the client can interrupt it), then None.
    With ``probe_tls`` (the client's first connection), a plaintext handshake closed before
    any byte of the CHALLENGE asks the endpoint whether it speaks TLS (then :class:`TLSError`).

    Raises :class:`Unavailable` (refused, unreachable, timed out, closed or reset during the
    handshake, or not the leader: then its ``__cause__`` is the :class:`NotLeader` with the
    hint), :class:`TLSError`, or what the handshake raises (:class:`AuthFailed`,
    :class:`Busy`...)."""
    where = format_endpoint(endpoint)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        sock = socket.create_connection(endpoint, timeout=timeout)
    except (TimeoutError, socket.timeout):
        raise Unavailable(f"{where}: connect timed out after {timeout:g} s") from None
    except OSError as e:
        raise Unavailable(f"{where}: {e.strerror or e}") from None
    on_socket(sock)
    # TLS and the handshake get at most HANDSHAKE_WAIT once TCP is connected: a frozen node's
    # kernel still accepts connections, and the next endpoint should not wait behind it.
    hs_limit = HANDSHAKE_WAIT if timeout is None else min(HANDSHAKE_WAIT, timeout)
    hs_deadline = time.monotonic() + HANDSHAKE_WAIT
    deadline = hs_deadline if deadline is None else min(deadline, hs_deadline)
    tls_phase = ssl_context is not None
    buf = bytearray()
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _set_remaining(sock, deadline)
        transport: _Transport
        if ssl_context is not None:
            transport = _TLSTransport(sock, ssl_context, server_hostname or endpoint[0])
        else:
            transport = _PlainTransport(sock)
        tls_phase = False
        hs = ClientHandshake(session_id, token)
        transport.sendall(hs.hello())
        _fill(transport, sock, buf, 4, deadline)
        try:
            size = challenge_size(buf)
        except ProtocolError as e:
            if "TLS" in str(e):
                raise TLSError(f"{where}: the server answered with TLS: is the server using TLS? "
                               "(pass ssl= to connect with TLS)") from None
            raise
        assert size is not None
        _fill(transport, sock, buf, size, deadline)
        challenge = bytes(buf[:size])
        del buf[:size]
        transport.sendall(hs.on_challenge(challenge))
        _fill(transport, sock, buf, WELCOME_SIZE, deadline)
        welcome = hs.on_welcome(bytes(buf[:WELCOME_SIZE]))
        del buf[:WELCOME_SIZE]
        sock.settimeout(None)
    except NotLeader as e:
        _shutdown(sock)
        raise not_leader_unavailable(where, e) from e
    except TicketingError:
        _shutdown(sock)
        raise
    except (TimeoutError, socket.timeout):
        _shutdown(sock)
        what = "TLS handshake" if tls_phase else "handshake"
        raise Unavailable(f"{where}: {what} timed out after {hs_limit:g} s of the TCP connection "
                          "(is the server frozen, or not a Ticketing server?)") from None
    except _ssl.SSLCertVerificationError as e:
        _shutdown(sock)
        raise TLSError(f"{where}: TLS certificate verification failed: {e.verify_message or e.reason}") from None
    except _ssl.SSLError as e:
        _shutdown(sock)
        hint = " (is the server using TLS?)" if tls_phase else ""
        raise TLSError(f"{where}: TLS failed: {e.reason or e}{hint}") from None
    except EOFError:
        _shutdown(sock)
        if tls_phase:
            raise TLSError(f"{where}: the server closed the connection during the TLS handshake "
                           "(is the server using TLS?)") from None
        if probe_tls and ssl_context is None and not buf and _probe_tls(endpoint, deadline):
            raise TLSError(f"{where}: {PLAINTEXT_TO_TLS}") from None
        raise Unavailable(f"{where}: the server closed the connection during the handshake") from None
    except OSError as e:
        _shutdown(sock)
        if tls_phase:
            raise TLSError(f"{where}: TLS failed: {e.strerror or e} (is the server using TLS?)") from None
        if probe_tls and ssl_context is None and not buf and _probe_tls(endpoint, deadline):
            raise TLSError(f"{where}: {PLAINTEXT_TO_TLS}") from None
        raise Unavailable(f"{where}: {e.strerror or e}") from None
    except BaseException:
        _shutdown(sock)
        raise
    finally:
        on_socket(None)
    return transport, bytes(buf), welcome


def _probe_tls(endpoint: Endpoint, deadline: float | None) -> bool:
    """A plaintext handshake was closed (or reset) before any byte of a CHALLENGE: does the
    endpoint speak TLS? A second connection sends a TLS ClientHello and looks at the first bytes
    of the answer (at most TLS_PROBE_WAIT, within ``deadline``). A Ticketing server closes it
    without an answer."""
    left = TLS_PROBE_WAIT if deadline is None else min(TLS_PROBE_WAIT, deadline - time.monotonic())
    if left <= 0:
        return False
    end = time.monotonic() + left
    try:
        with socket.create_connection(endpoint, timeout=left) as probe:
            probe.sendall(tls_client_hello())
            answer = b""
            while len(answer) < 2:
                rest = end - time.monotonic()
                if rest <= 0:
                    break
                probe.settimeout(rest)
                data = probe.recv(16)
                if not data:
                    break
                answer += data
    except OSError:
        return False
    return speaks_tls(answer)


def _set_recv_timeout(sock: socket.socket, seconds: float) -> float | None:
    """Give ``sock`` a receive timeout (``SO_RCVTIMEO``) of ``seconds``: a blocking recv then
    raises BlockingIOError after that long without data. Returns ``seconds``, or None where it
    is not set (not Linux, where the option's ``struct timeval`` layout is known, or refused)."""
    if not sys.platform.startswith("linux"):
        return None
    sec = int(seconds)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("@ll", sec, int((seconds - sec) * 1_000_000)))
    except OSError:
        return None
    return seconds


def _set_remaining(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


def _fill(transport: _Transport, sock: socket.socket, buf: bytearray, n: int, deadline: float | None) -> None:
    while len(buf) < n:
        _set_remaining(sock, deadline)
        data = transport.recv()
        if not data:
            raise EOFError
        buf += data


class Connection:
    """A handshaken connection with its reader and writer threads.

    ``on_frames(conn, frames)`` runs on the reader thread for every batch of frames received;
    ``on_closed(conn, reason)`` runs once, on whichever thread closed the connection.
    """

    def __init__(self, endpoint: Endpoint, transport: _Transport, leftover: bytes, welcome: Welcome, *,
                 on_frames: Callable[[Connection, list[Response]], None],
                 on_closed: Callable[[Connection, str], None]) -> None:
        self.endpoint = endpoint
        self.welcome = welcome
        #: When anything was last received, on the lock clock (for the heartbeat).
        self.last_received = _clock.now()
        self._transport = transport
        self._on_frames = on_frames
        self._on_closed = on_closed
        # _lock guards _out, _sending and _closed (``with self._lock``: a plain lock is cheaper
        # to enter than the Condition around it).
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._out = bytearray()
        self._sending = False  # a thread (the writer or a flush) is sending what it took from _out
        self._closed = False
        # Plain TCP: write() may send at once without blocking (TLS goes through the writer).
        self._direct_sock = transport.sock if _DONTWAIT and isinstance(transport, _PlainTransport) else None
        self._frames = FrameBuffer()
        self._leftover = leftover
        # The reading role (leader/follower, see the module doc): guarded by _rl, which is taken
        # last (never while waiting for another lock). The reader thread holds it first.
        self._rl = threading.Lock()
        self._rcond = threading.Condition(self._rl)  # the reader thread's linger
        self._leader = _READER  # 0: nobody reads; _READER; _CALLER
        self._recent = False  # a caller took the role since the reader thread last looked
        self._want = False  # a waiting caller found the role held: the reader thread yields it
        self._followers: dict[_Waitable, _thread.LockType] = {}  # waiting callers: call -> wake-up
        self._poller: select.poll | None = None
        if self._direct_sock is not None and hasattr(select, "poll"):
            self._poller = select.poll()
            self._poller.register(self._direct_sock, _POLLIN)
        #: Callers may read their own answers (:meth:`wait_answer`): plain TCP with ``poll``. (An
        #: attribute, not a property: read for every request.)
        self.shared_reading = self._poller is not None
        # A caller may block in recv() when its deadline is further away than this (None: always
        # poll first): see the module doc.
        self._blocking_after: float | None = None
        if self._poller is not None and self._direct_sock is not None:
            self._blocking_after = _set_recv_timeout(self._direct_sock, _RCV_TIMEOUT)
        name = format_endpoint(endpoint)
        self._reader = threading.Thread(target=self._read_loop, name=f"ticketing-reader-{name}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"ticketing-writer-{name}", daemon=True)

    def start(self) -> None:
        """Start the reader and writer threads."""
        self._reader.start()
        self._writer.start()

    @property
    def closed(self) -> bool:
        """The connection was closed (by either side)."""
        return self._closed

    def write(self, data: bytes) -> None:
        """Queue ``data`` for the writer thread, after everything written before (the caller
        serialises its calls, in the order of the bytes); never blocks on the socket."""
        with self._lock:
            if self._closed:
                return
            self._out += data
            self._cond.notify()
        self.kick()

    def kick(self) -> None:
        """Something was queued that no caller will read the answer of (or a caller that does
        not read waits): the reader thread takes the reading role now if it is free, rather
        than after its linger."""
        if self._poller is None:
            return
        with self._rcond:
            if self._leader == 0:
                self._recent = False
                self._rcond.notify()

    def wait_answer(self, call: _Waitable, timeout: float | None) -> bool:
        """Wait until ``call.done``, at most ``timeout`` seconds (None: no limit), reading the
        socket from this thread while no other thread reads it (see the module doc); returns
        ``call.done``. A caller that has to wait for another thread waits on a lock that
        ``call``'s callback releases (:func:`wake_up_lock`, made then), which also hands it the
        reading role. Never call it from the main thread (see the module doc). Does not raise."""
        end = None if timeout is None else time.monotonic() + timeout
        rl = self._rl
        left = timeout  # the first turn's; later ones look at the clock again (one read saved per call)
        done: _thread.LockType | None = None
        while True:
            if left is not None and left <= 0:
                return call.done
            follow = False
            with rl:
                if call.done:
                    return True
                lead = self._leader == 0 and not self._closed
                if lead:
                    self._leader = _CALLER
                    self._recent = True
                else:
                    # About to wait for another thread (the reader, a caller, or the next
                    # connection's answer): the wake-up lock, made once (see wake_up_lock).
                    if done is None:
                        done = wake_up_lock(call)
                    if not self._closed:
                        self._followers[call] = done
                        self._want = True
                        follow = True
            if lead:
                self._lead(left)
            else:
                assert done is not None
                done.acquire(True, -1 if left is None else left)
                if follow:
                    with rl:
                        self._followers.pop(call, None)
            if call.done:
                return True
            if end is not None:
                left = end - time.monotonic()

    def _lead(self, left: float | None) -> None:
        """Holding the reading role: wait up to ``left`` seconds for bytes, handle every frame
        they complete, then give the role up (to a waiting caller whose answer is still out)."""
        sock = self._direct_sock
        assert sock is not None
        blocking_after = self._blocking_after
        data: bytes | None
        try:
            if blocking_after is not None and (left is None or left > blocking_after):
                # Blocking recv: returns what arrives, b"" at the end (also once close() shut
                # the socket down), or raises BlockingIOError when the receive timeout passed.
                data = sock.recv(_RECV_SIZE)
            else:
                poller = self._poller
                assert poller is not None
                # (at most a minute per poll: the caller's loop looks at its deadline again)
                if poller.poll(-1 if left is None else int(min(left, 60.0) * 1000) + 1):
                    data = sock.recv(_RECV_SIZE, _DONTWAIT)
                else:
                    data = None
        except Exception as e:
            self._read_done(None, e)
        except BaseException:
            self._read_done(None, None)
            raise
        else:
            self._read_done(data, None)

    def _read_done(self, data: bytes | None, error: Exception | None) -> None:
        """The reading role's read returned ``data`` (None: nothing within the wait; b"": the end)
        or failed with ``error``: handle every frame completed, give the role up (to a waiting
        caller whose answer is still out), close the connection if the read says so."""
        reason = ""
        try:
            if error is not None:
                raise error
            if data is not None:
                if not data:
                    reason = "the server closed the connection"
                else:
                    self.last_received = _clock.now()
                    frames = self._frames.feed(data)
                    if frames:
                        handling = _caller_handling
                        handling.on = True
                        try:
                            self._on_frames(self, frames)
                        finally:
                            handling.on = False
        except BlockingIOError:  # the socket's receive timeout passed
            pass
        except ProtocolError as e:
            reason = f"protocol error from the server: {e}"
            log.error("%s", reason)
        except OSError as e:
            reason = f"connection lost: {e}"
        except Exception as e:  # pragma: no cover - defensive
            reason = f"reader failed: {e!r}"
            log.exception("reading on a caller's thread failed")
        finally:
            rl = self._rl
            rl.acquire()
            self._leader = 0
            if self._followers:
                self._hand_off_locked()  # (does not raise)
            rl.release()
        if reason:
            self.close(reason)

    def _hand_off_locked(self) -> None:
        """With ``_rl`` held and the role free: wake a waiting caller whose answer is still out,
        to read (it takes the role if nobody took it meanwhile)."""
        followers = self._followers
        while followers:
            call, wake = followers.popitem()
            if not call.done:
                try:
                    wake.release()
                except RuntimeError:  # its answer's callback released it just now
                    pass
                return

    def _take_turn(self) -> bool:
        """Reader thread, between reads: yield the role to waiting callers that asked for it;
        while callers read, stay out (look again every ``_LINGER``), and take the role back once
        it is free and no caller took it for a linger (or at once after :meth:`kick`). Returns
        False once the connection is closed."""
        with self._rcond:
            if self._leader == _READER:
                if not self._want:
                    return True
                self._want = False
                self._leader = 0
                self._recent = True
                self._hand_off_locked()
            while True:
                if self._closed:
                    return False
                if self._leader == 0 and not self._recent:
                    self._leader = _READER
                    self._want = bool(self._followers)
                    return True
                self._recent = False
                self._rcond.wait(_LINGER)

    def write_claim(self, data: bytes) -> bytes | None:
        """:meth:`write` for a caller that sends at once: when nobody is sending,
        returns the bytes to send (``data`` after anything still queued) and makes this thread
        the sender until :meth:`send_claimed`, which it must call next, once it no longer holds
        its own lock; else queues ``data`` (the current sender takes it) and returns None."""
        with self._lock:
            if self._closed:
                return None
            if self._sending or self._direct_sock is None:
                self._out += data
                if self._direct_sock is None:
                    self._cond.notify()
                return None
            if self._out:
                self._out += data
                data = bytes(self._out)
                self._out.clear()
            self._sending = True
            return data

    def claim_solo(self) -> bool:
        """For a caller about to send a request and read its answer, with the client's lock held
        (taken before this connection's locks): when nobody sends, nothing is queued and nobody
        reads, make this thread the sender and the reader at once and return True; it must call
        :meth:`solo_round` next, once it no longer holds the client's lock. Else change nothing
        and return False (the caller takes :meth:`write_claim` and :meth:`wait_answer`).

        The lone caller's request in one step: no queue, no hand-off, and no wait for another
        thread (the reading role cannot be taken by the reader thread between the send and the
        read, so the answer is read where it is awaited)."""
        lock = self._lock
        lock.acquire()  # (not ``with``: cheaper, and nothing below can raise)
        if self._sending or self._out or self._closed or not self.shared_reading:
            lock.release()
            return False
        rl = self._rl
        rl.acquire()  # taken last, as everywhere (see __init__)
        if self._leader:
            rl.release()
            lock.release()
            return False
        self._leader = _CALLER
        self._recent = True
        rl.release()
        self._sending = True
        lock.release()
        return True

    def abort_solo(self) -> None:
        """Give up both roles that :meth:`claim_solo` took, without sending or reading."""
        with self._lock:
            self._sending = False
            if self._out:
                self._cond.notify()
        with self._rl:
            self._leader = 0
            if self._followers:
                self._hand_off_locked()

    def solo_round(self, call: _Waitable, data: bytes, timeout: float | None) -> bool:
        """After :meth:`claim_solo`: send ``data`` without blocking (what the socket does not take
        goes to the writer thread, with what others queued meanwhile), then read while holding the
        reading role, as :meth:`wait_answer` does, and go on as it does if ``call`` is not done
        by then. Returns ``call.done``; does not raise."""
        end = None if timeout is None else time.monotonic() + timeout
        sock = self._direct_sock
        assert sock is not None
        try:
            sent = sock.send(data, _DONTWAIT)
        except OSError:  # BlockingIOError: the socket's buffer is full; else the writer reports it
            sent = 0
        lock = self._lock
        lock.acquire()
        if sent == len(data) and not self._out:  # the usual case: all sent, nobody queued meanwhile
            self._sending = False
            lock.release()
        else:
            lock.release()
            self._send_rest(data, sent)
        blocking_after = self._blocking_after
        if timeout is not None and timeout <= 0:  # no time to wait (as wait_answer): give the role up
            self._read_done(None, None)
        elif blocking_after is None or (timeout is not None and timeout <= blocking_after):
            self._lead(timeout)  # releases the role (and wakes a caller that waits for it)
        else:
            # _lead's blocking read, without its steps
            try:
                got = sock.recv(_RECV_SIZE)
            except Exception as e:
                self._read_done(None, e)
            except BaseException:
                self._read_done(None, None)  # (gives the role up)
                raise
            else:
                self._read_done(got, None)
        if call.done:
            return True
        return self.wait_answer(call, None if end is None else end - time.monotonic())

    def _send_rest(self, data: bytes, sent: int) -> None:
        """The sender sent ``sent`` bytes of ``data``: queue the rest for the writer thread, or
        send what others queued meanwhile (:meth:`send_claimed`), or end the send claim."""
        more = self._after_send(data, sent)
        if more is not None:
            self.send_claimed(more)

    def _after_send(self, data: bytes, sent: int) -> bytes | None:
        """The sender sent ``sent`` bytes of ``data``: queue the rest for the writer thread and
        end the send claim; or, all sent, take what others queued meanwhile (still the sender)
        and return it; or end the send claim. None: the claim ended."""
        with self._lock:
            if sent < len(data):
                self._out[:0] = data[sent:]
                self._sending = False
                self._cond.notify()
                return None
            if not self._out or self._closed:
                self._sending = False
                return None
            more = bytes(self._out)
            self._out.clear()
            return more

    def send_claimed(self, data: bytes) -> None:
        """Send ``data`` (from :meth:`write_claim`) without blocking, then what others queued
        meanwhile (a few rounds); the rest, or a failed send, is left to the writer thread."""
        sock = self._direct_sock
        assert sock is not None
        for _ in range(4):
            try:
                sent = sock.send(data, _DONTWAIT)
            except OSError:  # BlockingIOError: the socket's buffer is full; else the writer reports it
                sent = 0
            more = self._after_send(data, sent)
            if more is None:
                return
            data = more
        with self._lock:
            self._out[:0] = data
            self._sending = False
            self._cond.notify()

    def close(self, reason: str) -> None:
        """Close now (both threads end); ``on_closed`` runs once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        with self._rcond:
            self._rcond.notify_all()
            followers = list(self._followers.values())
            self._followers.clear()
        for wake in followers:  # they wait for the next connection's answer (or their timeout)
            try:
                wake.release()
            except RuntimeError:
                pass
        _shutdown(self._transport.sock)
        try:
            self._on_closed(self, reason)
        except Exception:  # pragma: no cover - defensive
            log.exception("on_closed callback failed")

    def forget_after_fork(self) -> None:
        """In a child process: close our copy of the socket without a shutdown (which would cut
        the parent's connection too) and never touch it again."""
        with self._lock:
            self._closed = True
        try:
            self._transport.sock.close()
        except OSError:
            pass

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while (not self._out or self._sending) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                data = bytes(self._out)
                self._out.clear()
                self._sending = True
            try:
                self._transport.sendall(data)
            except (OSError, _ssl.SSLError) as e:
                self.close(f"connection lost while sending: {e}")
                return
            with self._lock:
                self._sending = False

    def _read_loop(self) -> None:
        reason = "the server closed the connection"
        try:
            data = self._leftover
            self._leftover = b""
            while True:
                if data:
                    self.last_received = _clock.now()
                    frames = self._frames.feed(data)
                    if frames:
                        self._on_frames(self, frames)
                if self._closed:
                    return
                if self._poller is not None and not self._take_turn():
                    return
                try:
                    data = self._transport.recv()
                except BlockingIOError:  # the socket's receive timeout (_RCV_TIMEOUT): quiet
                    data = b""
                    continue
                if not data:
                    break
        except ProtocolError as e:
            reason = f"protocol error from the server: {e}"
            log.error("%s", reason)
        except (OSError, _ssl.SSLError) as e:
            reason = f"connection lost: {e}"
        except Exception as e:  # pragma: no cover - defensive
            reason = f"reader failed: {e!r}"
            log.exception("reader thread failed")
        self.close(reason)
