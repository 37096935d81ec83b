"""One connection of the asyncio client: asyncio streams (plain or TLS), the handshake, and one
reader task that dispatches answers to waiting tasks by request id.

Mirrors :mod:`ticketing.connection` of the blocking client.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl as _ssl
import time
from collections.abc import Callable

from .._common import Endpoint, format_endpoint
from ..constants import CHALLENGE_SIZE, WELCOME_SIZE, Op, Status
from ..exceptions import ConnectionLost, ProtocolError
from ..protocol import ClientHandshake, FrameBuffer, Request, Response, encode_request

__all__ = ["Connection"]

log = logging.getLogger("ticketing")

_RECV_SIZE = 65536


class Connection:
    """A handshaken connection and its reader task. Use :meth:`open`."""

    def __init__(
        self,
        endpoint: Endpoint,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        next_id: Callable[[], int],
        on_expired: Callable[[int, bytes], None],
        on_close: Callable[[Connection], None],
    ) -> None:
        self.endpoint = endpoint
        self._reader = reader
        self._writer = writer
        self._next_id = next_id
        self._on_expired = on_expired
        self._on_close = on_close
        self._pending: dict[int, tuple[Request, asyncio.Future[Response]]] = {}
        self._closed = False
        self._retired = False
        self._frames = FrameBuffer()
        self._task = asyncio.get_running_loop().create_task(
            self._read_loop(), name=f"ticketing-reader-{format_endpoint(endpoint)}")

    @classmethod
    async def open(
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
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    endpoint[0], endpoint[1], ssl=ssl_context,
                    server_hostname=endpoint[0] if ssl_context is not None else None)
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hs = ClientHandshake(session_id, token)
                writer.write(hs.hello())
                challenge = await reader.readexactly(CHALLENGE_SIZE)
                writer.write(hs.on_challenge(challenge))
                welcome = await reader.readexactly(WELCOME_SIZE)
                hs.on_welcome(welcome)
        except TimeoutError as e:
            _abort(writer)
            raise ConnectionLost(f"connecting to {where}: timed out") from e
        except asyncio.IncompleteReadError as e:
            _abort(writer)
            raise ConnectionLost(f"the server at {where} closed the connection during the handshake") from e
        except _ssl.SSLError as e:
            _abort(writer)
            raise ConnectionLost(f"TLS with {where} failed: {e}") from e
        except OSError as e:
            _abort(writer)
            raise ConnectionLost(f"cannot connect to {where}: {e}") from e
        except BaseException:
            _abort(writer)
            raise
        return cls(endpoint, reader, writer, next_id=next_id, on_expired=on_expired, on_close=on_close)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def usable(self) -> bool:
        """Open and not retired: new requests may go here."""
        return not self._closed and not self._retired

    def send(self, request: Request) -> tuple[asyncio.Future[Response], float]:
        """Register ``request`` and write it; returns the future of its answer and the
        monotonic time it was sent."""
        if self._closed:
            raise ConnectionLost("connection closed")
        fut: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = (request, fut)
        t_send = time.monotonic()
        self._writer.write(encode_request(request))
        return fut, t_send

    async def drain(self) -> None:
        """Wait while the write buffer is above its high-water mark."""
        try:
            await self._writer.drain()
        except (OSError, _ssl.SSLError) as e:
            self.close(f"connection lost while sending: {e}")
            raise ConnectionLost(f"connection lost while sending: {e}") from e

    def send_nowait(self, request: Request) -> None:
        """Write ``request`` without waiting for its answer (the answer is dropped)."""
        if self._closed:
            raise ConnectionLost("connection closed")
        self._writer.write(encode_request(request))

    def abandon(self, request: Request, fut: asyncio.Future[Response]) -> None:
        """The waiting task stopped (cancelled, timed out). A pending ACQUIRE is withdrawn with
        CANCEL; if it is (or was) granted anyway, its token is released: a cancelled wait never
        leaves a lock held."""
        if fut.done() and not fut.cancelled():
            if fut.exception() is None:
                resp = fut.result()
                if request.op == Op.ACQUIRE and resp.status == Status.OK:
                    self._release_abandoned(request.key, resp.token)
            return
        fut.cancel()
        if request.op != Op.ACQUIRE:
            self._pending.pop(request.id, None)
            return
        if request.id not in self._pending:
            return
        try:
            self.send_nowait(Request(op=Op.CANCEL, id=self._next_id(), token=request.id))
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
        self._retired = True
        if not self._pending:
            self.close("connection retired")

    def close(self, reason: str = "connection closed") -> None:
        """Close now; tasks waiting on this connection raise :class:`ConnectionLost`."""
        if self._closed:
            return
        self._closed = True
        pending = [fut for _, fut in self._pending.values()]
        self._pending.clear()
        _abort(self._writer, graceful=True)
        if self._task is not asyncio.current_task():
            self._task.cancel()
        for fut in pending:
            if not fut.done():
                fut.set_exception(ConnectionLost(reason))
        try:
            self._on_close(self)
        except Exception:  # pragma: no cover - defensive
            log.exception("ticketing: on_close callback failed")

    async def wait_closed(self) -> None:
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        try:
            await self._writer.wait_closed()
        except (OSError, _ssl.SSLError, asyncio.CancelledError):
            pass

    async def _read_loop(self) -> None:
        reason = "the server closed the connection"
        try:
            while True:
                data = await self._reader.read(_RECV_SIZE)
                if not data:
                    break
                for resp in self._frames.feed(data):
                    self._dispatch(resp)
                if self._closed:
                    return
        except asyncio.CancelledError:
            reason = "connection closed"
        except ProtocolError as e:
            reason = f"protocol error from the server: {e}"
            log.error("ticketing: %s", reason)
        except (OSError, _ssl.SSLError) as e:
            reason = f"connection lost: {e}"
        except Exception as e:  # pragma: no cover - defensive
            reason = f"reader failed: {e!r}"
            log.exception("ticketing: reader task failed")
        self.close(reason)

    def _dispatch(self, resp: Response) -> None:
        if resp.id == 0:
            if resp.op == Op.EXPIRED:
                try:
                    self._on_expired(resp.token, resp.data)
                except Exception:
                    log.exception("ticketing: EXPIRED handler failed")
            return
        entry = self._pending.pop(resp.id, None)
        if entry is not None:
            req, fut = entry
            if fut.cancelled():
                if req.op == Op.ACQUIRE and resp.status == Status.OK:
                    self._release_abandoned(req.key, resp.token)
            elif not fut.done():
                fut.set_result(resp)
        if self._retired and not self._pending:
            self.close("connection retired")


def _abort(writer: asyncio.StreamWriter | None, graceful: bool = False) -> None:
    if writer is None:
        return
    try:
        if graceful:
            writer.close()
        else:
            writer.transport.abort()
    except (OSError, RuntimeError):
        pass
