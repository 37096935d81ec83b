"""One connection of the asyncio client: asyncio streams (plain or TLS) for the handshake, then
a protocol of its own on the same transport that hands every received frame to the client from
``data_received`` (no reader task: an answer costs one turn of the event loop, not three).
Writes go straight into the transport's buffer, in the order the client queues them.

Mirrors :mod:`ticketing.connection` of the blocking client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl as _ssl
from collections.abc import Callable

from .. import _clock
from .._common import (
    HANDSHAKE_WAIT,
    PLAINTEXT_TO_TLS,
    TLS_PROBE_WAIT,
    Endpoint,
    format_endpoint,
    not_leader_unavailable,
    speaks_tls,
    tls_client_hello,
)
from ..constants import WELCOME_SIZE
from ..exceptions import NotLeader, ProtocolError, TicketingError, TLSError, Unavailable
from ..protocol import ClientHandshake, FrameBuffer, Response, Welcome, challenge_size

__all__ = ["Connection", "dial"]

log = logging.getLogger("ticketing")

_RECV_SIZE = 65536


async def dial(endpoint: Endpoint, *, session_id: bytes, token: bytes | None, ssl_context: _ssl.SSLContext | None,
               server_hostname: str | None, timeout: float | None,
               probe_tls: bool = True) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Welcome]:
    """Connect to ``endpoint`` and run TLS and the handshake within ``timeout`` seconds.

    Raises :class:`Unavailable` (refused, unreachable, timed out, closed or reset during the
    handshake, or not the leader: then its ``__cause__`` is the :class:`NotLeader` with the
    hint), :class:`TLSError`, or what the handshake raises (:class:`AuthFailed`,
    :class:`Busy`...). With ``probe_tls`` (the client's first connection), a plaintext
    handshake closed before any byte of the CHALLENGE asks the endpoint whether it speaks TLS
    (then :class:`TLSError`)."""
    where = format_endpoint(endpoint)
    writer: asyncio.StreamWriter | None = None
    phase = "connect"
    got = 0  # bytes of the CHALLENGE received
    # TLS and the handshake get at most HANDSHAKE_WAIT once TCP is connected: a frozen node's
    # kernel still accepts connections, and the next endpoint should not wait behind it.
    hs_limit = HANDSHAKE_WAIT if timeout is None else min(HANDSHAKE_WAIT, timeout)
    loop = asyncio.get_running_loop()
    end = None if timeout is None else loop.time() + timeout
    try:
        async with asyncio.timeout(timeout) as cm:
            reader, writer = await asyncio.open_connection(endpoint[0], endpoint[1])
            hs_deadline = loop.time() + HANDSHAKE_WAIT
            when = cm.when()
            cm.reschedule(hs_deadline if when is None else min(when, hs_deadline))
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl_context is not None:
                phase = "TLS handshake"
                await writer.start_tls(ssl_context, server_hostname=server_hostname or endpoint[0])
            phase = "handshake"
            hs = ClientHandshake(session_id, token)
            writer.write(hs.hello())
            head = await reader.readexactly(4)
            got = len(head)
            try:
                size = challenge_size(head)
            except ProtocolError as e:
                if "TLS" in str(e):
                    raise TLSError(f"{where}: the server answered with TLS: is the server using TLS? "
                                   "(pass ssl= to connect with TLS)") from None
                raise
            assert size is not None
            challenge = head + await reader.readexactly(size - 4)
            writer.write(hs.on_challenge(challenge))
            welcome = hs.on_welcome(await reader.readexactly(WELCOME_SIZE))
    except NotLeader as e:
        _abort(writer)
        raise not_leader_unavailable(where, e) from e
    except TicketingError:
        _abort(writer)
        raise
    except TimeoutError:
        _abort(writer)
        if phase == "connect":
            raise Unavailable(f"{where}: connect timed out after {timeout:g} s") from None
        raise Unavailable(f"{where}: {phase} timed out after {hs_limit:g} s of the TCP connection "
                          "(is the server frozen, or not a Ticketing server?)") from None
    except _ssl.SSLCertVerificationError as e:
        _abort(writer)
        raise TLSError(f"{where}: TLS certificate verification failed: {e.verify_message or e.reason}") from None
    except _ssl.SSLError as e:
        _abort(writer)
        hint = " (is the server using TLS?)" if phase == "TLS handshake" else ""
        raise TLSError(f"{where}: TLS failed: {e.reason or e}{hint}") from None
    except asyncio.IncompleteReadError as e:
        _abort(writer)
        if probe_tls and ssl_context is None and got + len(e.partial) == 0 and await _probe_tls(endpoint, end):
            raise TLSError(f"{where}: {PLAINTEXT_TO_TLS}") from None
        raise Unavailable(f"{where}: the server closed the connection during the handshake") from None
    except OSError as e:
        _abort(writer)
        if phase == "TLS handshake":
            raise TLSError(f"{where}: TLS failed: {_os_text(e)} (is the server using TLS?)") from None
        if probe_tls and ssl_context is None and phase == "handshake" and got == 0 and await _probe_tls(endpoint, end):
            raise TLSError(f"{where}: {PLAINTEXT_TO_TLS}") from None
        raise Unavailable(f"{where}: {_os_text(e)}") from None
    except BaseException:
        _abort(writer)
        raise
    return reader, writer, welcome


async def _probe_tls(endpoint: Endpoint, end: float | None) -> bool:
    """A plaintext handshake was closed (or reset) before any byte of a CHALLENGE: does the
    endpoint speak TLS? A second connection sends a TLS ClientHello and looks at the first bytes
    of the answer (at most TLS_PROBE_WAIT, and not after the loop time ``end``). A Ticketing
    server closes it without an answer."""
    loop = asyncio.get_running_loop()
    left = TLS_PROBE_WAIT if end is None else min(TLS_PROBE_WAIT, end - loop.time())
    if left <= 0:
        return False
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(left):
            reader, writer = await asyncio.open_connection(endpoint[0], endpoint[1])
            writer.write(tls_client_hello())
            answer = b""
            while len(answer) < 2:
                data = await reader.read(16)
                if not data:
                    break
                answer += data
    except (OSError, TimeoutError):
        return False
    finally:
        _abort(writer)
    return speaks_tls(answer)


def _os_text(e: OSError) -> str:
    """An OSError for messages: the system's text for its errno ("Connection refused", as the
    blocking client says) rather than asyncio's "Connect call failed (...)"."""
    if e.errno:
        return os.strerror(e.errno)
    return e.strerror or str(e)


def _abort(writer: asyncio.StreamWriter | None) -> None:
    if writer is None:
        return
    try:
        writer.transport.abort()
    except (OSError, RuntimeError):
        pass


class _FrameProtocol(asyncio.Protocol):
    """The connection's protocol once the handshake is done: frames to the client as they
    arrive, the transport's flow control for :meth:`Connection.drain`, and the end of the
    connection."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []

    def data_received(self, data: bytes) -> None:
        self._conn._received(data)

    def eof_received(self) -> bool:
        self._conn.close("the server closed the connection")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn._lost(exc)
        self.resume_writing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_writable(self) -> None:
        if not self.paused:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(fut)
        await fut


class Connection:
    """A handshaken connection; frames are handled as they arrive (:class:`_FrameProtocol`).

    ``on_frames(conn, frames)`` runs on the loop for every batch of frames received;
    ``on_closed(conn, reason)`` runs once, when the connection closes for any reason.
    """

    def __init__(self, endpoint: Endpoint, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 welcome: Welcome, *, on_frames: Callable[[Connection, list[Response]], None],
                 on_closed: Callable[[Connection, str], None]) -> None:
        self.endpoint = endpoint
        self.welcome = welcome
        #: When anything was last received, on the lock clock (for the heartbeat).
        self.last_received = _clock.now()
        self._reader = reader
        self._writer = writer
        self._transport = writer.transport
        self._on_frames = on_frames
        self._on_closed = on_closed
        self._closed = False
        self._frames = FrameBuffer()
        self._protocol: _FrameProtocol | None = None
        self._gone: asyncio.Future[None] | None = None  # done once the transport is closed

    def start(self) -> None:
        """Take the transport over from the handshake's stream (bytes it buffered are handled
        first)."""
        loop = asyncio.get_running_loop()
        self._gone = loop.create_future()
        reader = self._reader
        proto = self._protocol = _FrameProtocol(self)
        buffered: bytearray = getattr(reader, "_buffer", bytearray())
        leftover = bytes(buffered)
        buffered.clear()
        eof = reader.at_eof() or self._transport.is_closing()
        exc = reader.exception()
        self._transport.set_protocol(proto)
        if getattr(reader, "_paused", False) and isinstance(self._transport, asyncio.ReadTransport):
            try:
                self._transport.resume_reading()
            except RuntimeError:  # pragma: no cover - defensive
                pass
        if leftover:
            loop.call_soon(self._received, leftover)
        if exc is not None or eof:
            loop.call_soon(self._lost, exc)

    @property
    def closed(self) -> bool:
        """The connection was closed (by either side)."""
        return self._closed

    @property
    def write_paused(self) -> bool:
        """The transport's write buffer is above its high-water mark (:meth:`drain` waits)."""
        proto = self._protocol
        return proto is not None and proto.paused and not self._closed

    def write(self, data: bytes) -> None:
        """Queue ``data`` in the transport (never blocks)."""
        if not self._closed and data:
            self._transport.write(data)

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        proto = self._protocol
        if self._closed or proto is None:
            return
        await proto.wait_writable()

    def close(self, reason: str) -> None:
        """Close now; ``on_closed`` runs once."""
        if self._closed:
            return
        self._closed = True
        _abort(self._writer)
        try:
            self._on_closed(self, reason)
        except Exception:  # pragma: no cover - defensive
            log.exception("on_closed callback failed")

    async def wait_closed(self) -> None:
        """Wait until the transport is closed."""
        gone = self._gone
        if gone is not None:
            await asyncio.shield(gone)

    def forget_after_fork(self) -> None:
        """In a child process: close our copy of the socket without a shutdown (which would cut
        the parent's connection too) and never touch it again."""
        self._closed = True
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            try:
                socket.socket(fileno=sock.fileno()).close()
            except OSError:
                pass

    def _received(self, data: bytes) -> None:
        if self._closed or not data:
            return
        self.last_received = _clock.now()
        try:
            frames = self._frames.feed(data)
            if frames:
                self._on_frames(self, frames)
        except ProtocolError as e:
            reason = f"protocol error from the server: {e}"
            log.error("%s", reason)
            self.close(reason)
        except Exception as e:  # pragma: no cover - defensive
            log.exception("handling received frames failed")
            self.close(f"reader failed: {e!r}")

    def _lost(self, exc: BaseException | None) -> None:
        gone = self._gone
        if gone is not None and not gone.done():
            gone.set_result(None)
        if exc is None:
            self.close("the server closed the connection")
        else:
            self.close(f"connection lost: {exc}")
