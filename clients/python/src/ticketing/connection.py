"""One connection of the blocking client: the socket (plain or TLS), the handshake, a reader
thread that hands every received frame to the client, and a writer thread that sends what the
client queued, in order, never holding the client's lock during I/O. On a plain connection a
caller's own thread may send instead (:meth:`Connection.write` with ``defer``, then
:meth:`Connection.flush` once the client's lock is released): without blocking
(``MSG_DONTWAIT``), everything queued so far, one sender at a time; what the socket does not take
goes to the writer thread. A request then costs no hand-off to another thread, and with many
callers one send carries the requests of several.

TLS runs through an ``ssl.SSLObject`` over memory BIOs, so the reader thread and the writer
thread never call into the same ``SSLSocket`` at once (OpenSSL objects are not safe for that).
"""

from __future__ import annotations

import logging
import socket
import ssl as _ssl
import threading
import time
from collections.abc import Callable

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
        self._cond = threading.Condition()  # guards _out, _sending and _closed
        self._out = bytearray()
        self._sending = False  # a thread (the writer or a flush) is sending what it took from _out
        self._closed = False
        # Plain TCP: write() may send at once without blocking (TLS goes through the writer).
        self._direct_sock = transport.sock if _DONTWAIT and isinstance(transport, _PlainTransport) else None
        self._frames = FrameBuffer()
        self._leftover = leftover
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

    def write(self, data: bytes, *, defer: bool = False) -> None:
        """Queue ``data`` to be sent after everything written before (the caller serialises its
        calls, in the order of the bytes); never blocks on the socket. The writer thread sends
        it, unless ``defer`` on a plain connection: then the caller must call :meth:`flush`
        next, once it no longer holds its own lock."""
        with self._cond:
            if self._closed:
                return
            self._out += data
            if not (defer and self._direct_sock is not None):
                self._cond.notify()

    def flush(self) -> None:
        """Send what is queued from this thread, without blocking: one sender at a time (while
        another sends, it takes these bytes next). What the socket does not take now, or a
        failed send, is left to the writer thread (which reports the failure by closing the
        connection)."""
        sock = self._direct_sock
        if sock is None:
            return
        for _ in range(4):  # a few rounds of the bytes others queued meanwhile, then the writer
            with self._cond:
                if self._closed or self._sending or not self._out:
                    return
                data = bytes(self._out)
                self._out.clear()
                self._sending = True
            try:
                sent = sock.send(data, _DONTWAIT)
            except OSError:  # BlockingIOError: the socket's buffer is full; else the writer reports it
                sent = 0
            with self._cond:
                self._sending = False
                if sent < len(data):
                    self._out[:0] = data[sent:]
                    self._cond.notify()
                    return
                if not self._out:
                    return
        with self._cond:
            if self._out:
                self._cond.notify()

    def close(self, reason: str) -> None:
        """Close now (both threads end); ``on_closed`` runs once."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        _shutdown(self._transport.sock)
        try:
            self._on_closed(self, reason)
        except Exception:  # pragma: no cover - defensive
            log.exception("on_closed callback failed")

    def forget_after_fork(self) -> None:
        """In a child process: close our copy of the socket without a shutdown (which would cut
        the parent's connection too) and never touch it again."""
        with self._cond:
            self._closed = True
        try:
            self._transport.sock.close()
        except OSError:
            pass

    def _write_loop(self) -> None:
        while True:
            with self._cond:
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
            with self._cond:
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
                data = self._transport.recv()
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
