"""A scripted fake server for what the real single node cannot show on demand: an ACQUIRE
answered OK after the client cancelled it, NOT_LEADER hints, SHUTTING_DOWN, a server that does not
hold the token, EXPIRED pushes. Each accepted connection runs ``script(FakeConn)`` on a thread."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Callable

from ticketing.constants import AUTH_SIZE, CHALLENGE_AUTH_REQUIRED, HELLO_SIZE, Status
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
    def __init__(self, sock: socket.socket, server: FakeServer) -> None:
        self.sock = sock
        self.server = server
        self.buf = bytearray()
        self.hello: Hello | None = None

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def handshake(self, token: bytes | None = None, proof_token: bytes | None = None) -> None:
        """Answer the handshake; ``proof_token`` (default ``token``) signs the server proof."""
        self.hello = Hello.decode(self._read(HELLO_SIZE))
        self.server.hellos.append(self.hello)
        nonce = secrets.token_bytes(32) if token is not None else bytes(32)
        flags = CHALLENGE_AUTH_REQUIRED if token is not None else 0
        self.sock.sendall(Challenge(status=Status.OK, version=1, flags=flags, nonce=nonce).encode())
        auth = Auth.decode(self._read(AUTH_SIZE))
        if token is None:
            self.sock.sendall(Welcome(status=Status.OK, proof=bytes(32)).encode())
            return
        h = self.hello
        if auth.proof != client_proof(token, h.session_id, h.nonce, nonce):
            self.sock.sendall(Welcome(status=Status.AUTH_FAILED, proof=bytes(32)).encode())
            raise EOFError
        sp = server_proof(proof_token or token, h.session_id, h.nonce, nonce)
        self.sock.sendall(Welcome(status=Status.OK, proof=sp).encode())

    def recv(self) -> Request:
        head = self._read(4)
        size = frame_size(head)
        assert size is not None
        req, _ = decode_request(head + self._read(size - 4))
        self.server.requests.append(req)
        return req

    def send(self, resp: Response) -> None:
        self.sock.sendall(resp.encode())

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class FakeServer:
    def __init__(self, script: Callable[[FakeConn], None]) -> None:
        self.script = script
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

    def close(self) -> None:
        self._closed = True
        self.listener.close()
        for c in self.conns:
            c.close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
