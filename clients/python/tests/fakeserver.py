"""A scripted fake server for what a real single node cannot show on demand: GOAWAY and
NOT_LEADER hints, a changed state id, answers lost with a dropped connection, an ACQUIRE
answered OK after the client cancelled it, a server that does not hold the token, a frozen
server. Each accepted connection runs ``script(FakeConn)`` on a thread."""

from __future__ import annotations

import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from ticketing.constants import AUTH_SIZE, CHALLENGE_AUTH_REQUIRED, HELLO_SIZE, WELCOME_RESUMED, Op, Status
from ticketing.protocol import (
    Auth,
    Challenge,
    Hello,
    Request,
    Response,
    Welcome,
    client_proof,
    decode_request,
    frame_size,
    server_proof,
)


class FakeConn:
    """One accepted connection; the script calls :meth:`handshake`, then :meth:`recv` and
    :meth:`send`."""

    def __init__(self, sock: socket.socket, server: FakeServer) -> None:
        self.sock = sock
        self.server = server
        self.buf = bytearray()
        self.hello: Hello | None = None
        self.requests: list[Request] = []

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def handshake(self, token: bytes | None = None, *, proof_token: bytes | None = None,
                  resumed: bool | None = None, state_id: bytes | None = None, grace_ms: int | None = None,
                  challenge: Challenge | None = None, welcome: Welcome | None = None) -> Hello:
        """Answer the handshake. ``resumed`` defaults to "this session id was seen before by this
        server"; ``state_id`` and ``grace_ms`` to the server's; ``proof_token`` (default
        ``token``) signs the server proof; a given ``challenge``, or ``welcome`` (after the
        AUTH), is sent as it is and the connection closes."""
        hello = self.hello = Hello.decode(self._read(HELLO_SIZE))
        self.server.hellos.append(hello)
        if challenge is not None:
            self.sock.sendall(challenge.encode())
            raise EOFError
        nonce = secrets.token_bytes(32) if token is not None else bytes(32)
        flags = CHALLENGE_AUTH_REQUIRED if token is not None else 0
        self.sock.sendall(Challenge(status=Status.OK, version=1, flags=flags, nonce=nonce).encode())
        auth = Auth.decode(self._read(AUTH_SIZE))
        if welcome is not None:
            self.sock.sendall(welcome.encode())
            raise EOFError
        if token is not None and auth.proof != client_proof(token, hello.session_id, hello.nonce, nonce):
            self.sock.sendall(Welcome(status=Status.AUTH_FAILED, proof=bytes(32)).encode())
            raise EOFError
        if resumed is None:
            resumed = hello.session_id in self.server.sessions
        self.server.sessions.add(hello.session_id)
        w = Welcome(status=Status.OK, proof=bytes(32), flags=WELCOME_RESUMED if resumed else 0,
                    session_grace_ms=self.server.grace_ms if grace_ms is None else grace_ms,
                    state_id=self.server.state_id if state_id is None else state_id)
        if token is not None:
            proof = server_proof(proof_token or token, hello.session_id, hello.nonce, nonce, w.signed_part())
            w = Welcome(status=w.status, proof=proof, flags=w.flags, session_grace_ms=w.session_grace_ms,
                        state_id=w.state_id)
        self.sock.sendall(w.encode())
        return hello

    def recv(self, *, answer_pings: bool = True) -> Request:
        """The next request (EOFError when the client closed); PINGs are answered OK on the way
        unless ``answer_pings`` is false."""
        while True:
            head = self._read(4)
            size = frame_size(head)
            assert size is not None
            req, _ = decode_request(head + self._read(size - 4))
            self.server.requests.append(req)
            self.requests.append(req)
            if req.op == Op.PING and answer_pings:
                self.answer(req)
                continue
            return req

    def idle(self, seconds: float) -> None:
        """Let ``seconds`` pass as a live server does while a request waits (a queued ACQUIRE):
        PINGs are answered; any other request is an error."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.buf and not select.select([self.sock], [], [], left)[0]:
                return
            req = self.recv(answer_pings=False)
            assert req.op == Op.PING, f"unexpected {req.op!r} while idle"
            self.answer(req)

    def send(self, resp: Response) -> None:
        self.sock.sendall(resp.encode())

    def answer(self, req: Request, status: Status = Status.OK, **fields: int | bytes) -> None:
        """Answer ``req`` with ``status`` (echoing its op and id)."""
        self.send(Response(op=req.op, status=status, id=req.id, **fields))  # type: ignore[arg-type]

    def reset(self) -> None:
        """Close with a TCP reset (RST) instead of a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeServer:
    """Listens on 127.0.0.1 with a free port; every connection runs ``script``."""

    def __init__(self, script: Callable[[FakeConn], None], *, grace_ms: int = 5000,
                 state_id: bytes | None = None) -> None:
        self.script = script
        self.grace_ms = grace_ms
        self.state_id = state_id or secrets.token_bytes(16)
        self.sessions: set[bytes] = set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.hellos: list[Hello] = []
        self.requests: list[Request] = []
        self.errors: list[BaseException] = []
        self.conns: list[FakeConn] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            conn = FakeConn(sock, self)
            self.conns.append(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: FakeConn) -> None:
        try:
            self.script(conn)
        except (EOFError, OSError):
            pass
        except BaseException as e:  # surfaced by the test through .errors
            self.errors.append(e)
        finally:
            conn.close()

    def ops(self) -> list[Op | int]:
        """The ops of every request received, in order."""
        return [r.op for r in self.requests]

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for c in self.conns:
            c.close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(c: FakeConn, first_token: int = 100) -> None:
    """A well-behaved responder: every ACQUIRE granted, EXTEND echoed, everything else OK."""
    token = first_token
    while True:
        req = c.recv()
        if req.op == Op.ACQUIRE:
            token += 1
            c.answer(req, token=token, lease_ms=req.lease_ms)
        elif req.op == Op.EXTEND:
            c.answer(req, token=req.token, lease_ms=req.lease_ms)
        elif req.op == Op.INSPECT:
            c.answer(req, data=bytes(12))
        else:
            c.answer(req)


def leader(c: FakeConn) -> None:
    """Handshake, then :func:`serve`."""
    c.handshake()
    serve(c)
