"""One connection of the blocking client: the socket (plain or TLS), the handshake, and a
background reader thread that dispatches answers to waiting callers by request id.

Any number of threads send on one connection (each write is one ``sendall`` under a lock), so
requests pipeline; a waiting ACQUIRE never holds back other requests. TLS runs through an
``ssl.SSLObject`` over memory BIOs, so the reader thread and writer threads never call into the
same ``SSLSocket`` at once (OpenSSL objects are not safe for that).
"""

from __future__ import annotations

import logging
import socket
import ssl as _ssl
import threading
import time
from collections.abc import Callable

from ._common import Endpoint, format_endpoint
from .constants import CHALLENGE_SIZE, WELCOME_SIZE, Op, Status
from .exceptions import ConnectionLost, ProtocolError, RequestTimeout
from .protocol import ClientHandshake, FrameBuffer, Request, Response, encode_request

__all__ = ["Connection"]

log = logging.getLogger("ticketing")

_RECV_SIZE = 65536


class _PlainTransport:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(data)

    def recv(self) -> bytes:
        return self._sock.recv(_RECV_SIZE)

    def close(self) -> None:
        _close_socket(self._sock)


class _TLSTransport:
    """TLS over memory BIOs. ``_ssl_lock`` guards the SSLObject and both BIOs and is never held
    during socket I/O; ``_send_lock`` keeps ciphertext in the order it was produced."""

    def __init__(self, sock: socket.socket, context: _ssl.SSLContext, hostname: str) -> None:
        self._sock = sock
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
                data = self._sock.recv(_RECV_SIZE)
                if not data:
                    raise ConnectionLost("the server closed the connection during the TLS handshake") from None
                self._in.write(data)
        self._flush()

    def _flush(self) -> None:
        with self._send_lock:
            with self._ssl_lock:
                out = self._out.read()
            if out:
                self._sock.sendall(out)

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            with self._ssl_lock:
                self._obj.write(data)
                out = self._out.read()
            self._sock.sendall(out)

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
            raw = self._sock.recv(_RECV_SIZE)
            if not raw:
                return b""
            with self._ssl_lock:
                self._in.write(raw)

    def close(self) -> None:
        _close_socket(self._sock)


def _close_socket(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class Waiter:
    """A request in flight: the caller waits on it; the reader thread completes it."""

    __slots__ = ("request", "t_send", "_event", "_lock", "_response", "_error", "_abandoned")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.t_send = 0.0
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._response: Response | None = None
        self._error: str | None = None
        self._abandoned = False

    def complete(self, resp: Response) -> bool:
        """Deliver the answer; True when the caller had abandoned the request."""
        with self._lock:
            if self._abandoned:
                return True
            self._response = resp
        self._event.set()
        return False

    def fail(self, message: str) -> None:
        with self._lock:
            if self._abandoned:
                return
            self._error = message
        self._event.set()

    def wait(self, timeout: float | None) -> Response:
        if not self._event.wait(timeout):
            raise RequestTimeout(f"no answer within {timeout:.3f} s")
        if self._error is not None:
            raise ConnectionLost(self._error)
        assert self._response is not None
        return self._response

    def abandon(self) -> tuple[bool, Response | None]:
        """Give up waiting. Returns (done, response): done is True when the answer (or a
        failure) had already arrived, with the response if there was one."""
        with self._lock:
            if self._event.is_set():
                return True, self._response
            self._abandoned = True
            return False, None


class Connection:
    """A handshaken connection and its reader thread. Use :meth:`open`."""

    def __init__(
        self,
        endpoint: Endpoint,
        transport: _PlainTransport | _TLSTransport,
        leftover: bytes,
        *,
        next_id: Callable[[], int],
        on_expired: Callable[[int, bytes], None],
        on_close: Callable[[Connection], None],
    ) -> None:
        self.endpoint = endpoint
        self._transport = transport
        self._next_id = next_id
        self._on_expired = on_expired
        self._on_close = on_close
        self._lock = threading.Lock()  # guards _pending, _closed, _retired
        self._pending: dict[int, Waiter] = {}
        self._closed = False
        self._retired = False
        self._frames = FrameBuffer()
        self._leftover = leftover
        self._thread = threading.Thread(
            target=self._read_loop, name=f"ticketing-reader-{format_endpoint(endpoint)}", daemon=True)
        self._thread.start()

    @classmethod
    def open(
        cls,
        endpoint: Endpoint,
        *,
        session_id: bytes,
        token: bytes | None,
        ssl_context: _ssl.SSLContext | None,
        timeout: float | None,
        next_id: Callable[[], int],
        on_expired: Callable[[int, bytes], None],
        on_close: Callable[[Connection], None],
    ) -> Connection:
        """Connect to ``endpoint``, run TLS and the handshake within ``timeout`` seconds."""
        where = format_endpoint(endpoint)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            sock = socket.create_connection(endpoint, timeout=timeout)
        except OSError as e:
            raise ConnectionLost(f"cannot connect to {where}: {e}") from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _set_remaining(sock, deadline)
            transport: _PlainTransport | _TLSTransport
            if ssl_context is not None:
                transport = _TLSTransport(sock, ssl_context, endpoint[0])
            else:
                transport = _PlainTransport(sock)
            hs = ClientHandshake(session_id, token)
            buf = bytearray()
            transport.sendall(hs.hello())
            challenge = _read_exact(transport, sock, buf, CHALLENGE_SIZE, deadline)
            transport.sendall(hs.on_challenge(challenge))
            welcome = _read_exact(transport, sock, buf, WELCOME_SIZE, deadline)
            hs.on_welcome(welcome)
            sock.settimeout(None)
        except (TimeoutError, socket.timeout) as e:
            _close_socket(sock)
            raise ConnectionLost(f"connecting to {where}: timed out") from e
        except _ssl.SSLError as e:
            _close_socket(sock)
            raise ConnectionLost(f"TLS with {where} failed: {e}") from e
        except OSError as e:
            _close_socket(sock)
            raise ConnectionLost(f"connecting to {where}: {e}") from e
        except BaseException:
            _close_socket(sock)
            raise
        return cls(endpoint, transport, bytes(buf), next_id=next_id, on_expired=on_expired, on_close=on_close)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def usable(self) -> bool:
        """Open and not retired: new requests may go here."""
        return not self._closed and not self._retired

    def send(self, request: Request) -> Waiter:
        """Register ``request`` and write it; the caller waits on the returned waiter."""
        waiter = Waiter(request)
        with self._lock:
            if self._closed:
                raise ConnectionLost("connection closed")
            self._pending[request.id] = waiter
        frame = encode_request(request)
        waiter.t_send = time.monotonic()
        try:
            self._transport.sendall(frame)
        except (OSError, _ssl.SSLError) as e:
            self.close(f"connection lost while sending: {e}")
            raise ConnectionLost(f"connection lost while sending: {e}") from e
        return waiter

    def send_nowait(self, request: Request) -> None:
        """Write ``request`` without waiting for its answer (the answer is dropped)."""
        try:
            self._transport.sendall(encode_request(request))
        except (OSError, _ssl.SSLError) as e:
            self.close(f"connection lost while sending: {e}")
            raise ConnectionLost(f"connection lost while sending: {e}") from e

    def abandon(self, waiter: Waiter) -> None:
        """The caller stopped waiting (timeout, interrupt). A pending ACQUIRE is withdrawn with
        CANCEL; if it is (or was) granted anyway, its token is released: an abandoned wait never
        leaves a lock held."""
        done, resp = waiter.abandon()
        req = waiter.request
        if done:
            if resp is not None and req.op == Op.ACQUIRE and resp.status == Status.OK:
                self._release_abandoned(req.key, resp.token)
            return
        if req.op != Op.ACQUIRE:
            with self._lock:
                self._pending.pop(req.id, None)
            return
        try:
            self.send_nowait(Request(op=Op.CANCEL, id=self._next_id(), token=req.id))
        except ConnectionLost:
            pass  # the server drops the waiters of a closed connection

    def _release_abandoned(self, key: bytes, token: int) -> None:
        log.debug("releasing token %d of an abandoned acquire of %r", token, key)
        try:
            self.send_nowait(Request(op=Op.RELEASE, id=self._next_id(), token=token, key=key))
        except ConnectionLost:
            log.warning("could not release token %d of an abandoned acquire of %r; its lease will end it",
                        token, key)

    def retire(self) -> None:
        """Take no new requests; close once the pending ones are answered."""
        with self._lock:
            self._retired = True
            idle = not self._pending
        if idle:
            self.close("connection retired")

    def close(self, reason: str = "connection closed") -> None:
        """Close now; calls in flight raise :class:`ConnectionLost`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
            self._pending.clear()
        self._transport.close()
        for w in pending:
            w.fail(reason)
        try:
            self._on_close(self)
        except Exception:  # pragma: no cover - defensive
            log.exception("ticketing: on_close callback failed")

    def _read_loop(self) -> None:
        reason = "the server closed the connection"
        try:
            data = self._leftover
            self._leftover = b""
            while True:
                if data:
                    for resp in self._frames.feed(data):
                        self._dispatch(resp)
                if self._closed:
                    return
                data = self._transport.recv()
                if not data:
                    break
        except ProtocolError as e:
            reason = f"protocol error from the server: {e}"
            log.error("ticketing: %s", reason)
        except (OSError, _ssl.SSLError) as e:
            reason = f"connection lost: {e}"
        except Exception as e:  # pragma: no cover - defensive
            reason = f"reader failed: {e!r}"
            log.exception("ticketing: reader thread failed")
        self.close(reason)

    def _dispatch(self, resp: Response) -> None:
        if resp.id == 0:
            if resp.op == Op.EXPIRED:
                try:
                    self._on_expired(resp.token, resp.data)
                except Exception:
                    log.exception("ticketing: EXPIRED handler failed")
            return
        with self._lock:
            waiter = self._pending.pop(resp.id, None)
            drain = self._retired and not self._pending
        if waiter is not None and waiter.complete(resp):
            req = waiter.request
            if req.op == Op.ACQUIRE and resp.status == Status.OK:
                self._release_abandoned(req.key, resp.token)
        if drain:
            self.close("connection retired")


def _set_remaining(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


def _read_exact(transport: _PlainTransport | _TLSTransport, sock: socket.socket, buf: bytearray, n: int,
                deadline: float | None) -> bytes:
    """Read one fixed-size handshake frame; bytes beyond it stay in ``buf``."""
    while len(buf) < n:
        _set_remaining(sock, deadline)
        data = transport.recv()
        if not data:
            raise ConnectionLost("the server closed the connection during the handshake")
        buf += data
    frame = bytes(buf[:n])
    del buf[:n]
    return frame
