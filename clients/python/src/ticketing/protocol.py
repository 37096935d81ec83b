"""Protocol version 1 without I/O: frames encoded and decoded at fixed offsets with ``struct``
(all integers big-endian), the mutual HMAC-SHA256 handshake as a small state machine, and a
stream buffer that splits received bytes into frames. PROTOCOL.md is the specification; the
tests check every function here against ``protocol/vectors.json``.

Both the blocking and the asyncio client use this module; it never touches a socket.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from dataclasses import dataclass

from .constants import (
    AUTH_SIZE,
    CHALLENGE_AUTH_REQUIRED,
    CHALLENGE_SIZE,
    HEADER_SIZE,
    HELLO_SIZE,
    MAX_CHALLENGE_DATA,
    MAX_DATA_LEN,
    MAX_KEY_LEN,
    NONCE_SIZE,
    PROOF_SIZE,
    SESSION_ID_SIZE,
    STATE_ID_SIZE,
    VERSION,
    WELCOME_RESUMED,
    WELCOME_SIZE,
    Field,
    Limit,
    Op,
    Status,
)
from .exceptions import (
    AuthFailed,
    Busy,
    InvalidRequest,
    NotLeader,
    ProtocolError,
    ShuttingDown,
    UnsupportedVersion,
    error_for_status,
)

__all__ = [
    "Request",
    "Response",
    "Hello",
    "Challenge",
    "Auth",
    "Welcome",
    "FrameBuffer",
    "ClientHandshake",
    "encode_request",
    "decode_request",
    "encode_response",
    "decode_response",
    "frame_size",
    "challenge_size",
    "client_proof",
    "server_proof",
]

# length, op, flags|status, key_len|data_len, request_id, token, lease_ms, wait_ms|detail
_HEADER = struct.Struct(">IBBHQQII")
_LEN = struct.Struct(">I")
_HELLO = struct.Struct(">IBBH16s32s")
# length, op, status, version, flags, detail, data_len, reserved, server_nonce
_CHALLENGE = struct.Struct(">IBBBBIHH32s")
_AUTH = struct.Struct(">IB3x32s")
# length, op, status, flags, reserved, detail, session_grace_ms, state_id, server_proof
_WELCOME = struct.Struct(">IBBBxII16s32s")
# WELCOME[5..31]: the part the server proof covers
_WELCOME_SIGNED = struct.Struct(">BBxII16s")

_CLIENT_LABEL = b"ticketing/1 client"
_SERVER_LABEL = b"ticketing/1 server"
_ZERO_PROOF = bytes(PROOF_SIZE)


_OPS: dict[int, int] = {int(m): m for m in Op}
_STATUSES: dict[int, int] = {int(m): m for m in Status}


def _op(value: int) -> int:
    """``Op(value)`` when known, else the plain int (an unknown op is echoed as received)."""
    return _OPS.get(value, value)


def _status(value: int) -> int:
    return _STATUSES.get(value, value)


@dataclass(frozen=True, slots=True)
class Request:
    """A request frame (client -> server). Unused fields are zero."""

    op: int
    id: int
    token: int = 0
    lease_ms: int = 0
    wait_ms: int = 0
    key: bytes = b""
    flags: int = 0

    def encode(self) -> bytes:
        """The bytes of this request (:func:`encode_request`)."""
        return encode_request(self)


@dataclass(frozen=True, slots=True)
class Response:
    """A response frame (server -> client), or a push (EXPIRED, GOAWAY: ``id`` 0)."""

    op: int
    status: int
    id: int
    token: int = 0
    lease_ms: int = 0
    detail: int = 0
    data: bytes = b""

    def encode(self) -> bytes:
        """The bytes of this response (:func:`encode_response`)."""
        return encode_response(self)


#: The slot setters of :class:`Response`, in field order (FrameBuffer.feed's fast construction).
_RESPONSE_SETTERS = tuple(getattr(Response, f).__set__ for f in Response.__slots__)
_new = object.__new__
assert Response.__slots__ == ("op", "status", "id", "token", "lease_ms", "detail", "data")


def encode_request(r: Request) -> bytes:
    """The bytes of request ``r``."""
    return encode_request_fields(r.op, r.id, r.token, r.lease_ms, r.wait_ms, r.key, r.flags)


def encode_request_fields(op: int, id: int, token: int, lease_ms: int, wait_ms: int, key: bytes,
                          flags: int = 0) -> bytes:
    """The bytes of a request with these fields (:func:`encode_request` without building a
    :class:`Request`: the clients' hot path)."""
    n = len(key)
    if n > MAX_KEY_LEN:
        raise ValueError(f"key longer than {MAX_KEY_LEN} bytes")
    return _HEADER.pack(HEADER_SIZE - 4 + n, op, flags, n, id, token, lease_ms, wait_ms) + key


def encode_response(r: Response) -> bytes:
    """The bytes of response ``r`` (data longer than the ceiling is cut, as the server does)."""
    data = r.data[:MAX_DATA_LEN]
    n = len(data)
    return _HEADER.pack(HEADER_SIZE - 4 + n, r.op, r.status, n, r.id, r.token, r.lease_ms, r.detail) + data


def frame_size(buf: bytes | bytearray | memoryview, max_var: int = MAX_KEY_LEN) -> int | None:
    """The total size (length field included) of the 32-byte-header frame at the start of
    ``buf``, or None when fewer than 4 bytes are there. Raises :class:`ProtocolError` when the
    length is below the header or above ``HEADER_SIZE + max_var`` — before the body arrives, so a
    reader never buffers an oversize frame."""
    if len(buf) < 4:
        return None
    length: int = _LEN.unpack_from(buf)[0]
    if length < HEADER_SIZE - 4:
        raise ProtocolError(f"frame length {length} below the {HEADER_SIZE}-byte header", "length")
    if length > HEADER_SIZE - 4 + min(max_var, MAX_KEY_LEN):
        raise ProtocolError(f"frame length {length} above the limit", "too_large")
    return 4 + length


def _decode_header(buf: bytes | bytearray | memoryview, max_var: int) -> tuple[int, tuple[int, ...]]:
    size = frame_size(buf, max_var)
    if size is None or len(buf) < size:
        raise ProtocolError("incomplete frame", "short")
    fields = _HEADER.unpack_from(buf)
    if fields[3] != size - HEADER_SIZE:
        raise ProtocolError("variable-part length disagrees with the frame length", "length")
    return size, fields


def decode_request(buf: bytes | bytearray | memoryview, max_key: int = MAX_KEY_LEN) -> tuple[Request, int]:
    """Decode the request frame at the start of ``buf``; returns it and its size."""
    size, f = _decode_header(buf, max_key)
    key = bytes(buf[HEADER_SIZE:size])
    return Request(op=_op(f[1]), flags=f[2], id=f[4], token=f[5], lease_ms=f[6], wait_ms=f[7], key=key), size


def decode_response(buf: bytes | bytearray | memoryview, max_data: int = MAX_DATA_LEN) -> tuple[Response, int]:
    """Decode the response frame at the start of ``buf``; returns it and its size."""
    size, f = _decode_header(buf, max_data)
    data = bytes(buf[HEADER_SIZE:size])
    return Response(op=_op(f[1]), status=_status(f[2]), id=f[4], token=f[5], lease_ms=f[6], detail=f[7], data=data), size


class FrameBuffer:
    """Accumulates received bytes and yields whole response frames; a frame split across reads
    is completed by the next :meth:`feed`. A length above ``HEADER_SIZE + max_data`` is refused
    from the first 4 bytes, before the body arrives."""

    __slots__ = ("_buf", "_max")

    def __init__(self, max_data: int = MAX_DATA_LEN) -> None:
        self._buf = bytearray()
        self._max = max_data

    def feed(self, data: bytes) -> list[Response]:
        """Add ``data``; return every response now complete (raises :class:`ProtocolError`).

        The checks and the frames are those of :func:`frame_size` and :func:`decode_response`,
        inlined: this runs for every frame received."""
        buf = self._buf
        if not buf and len(data) == HEADER_SIZE:
            # The usual read: nothing buffered and exactly one frame without a variable part
            # (every ACQUIRE, RELEASE, EXTEND... answer). The checks of the loop below, in short:
            # its length field says 28 and its data length 0; anything else takes the loop.
            f = _HEADER.unpack_from(data)
            if f[0] == HEADER_SIZE - 4 and not f[3]:
                r = _new(Response)
                set_op, set_status, set_id, set_token, set_lease, set_detail, set_data = _RESPONSE_SETTERS
                set_op(r, _OPS.get(f[1], f[1]))
                set_status(r, _STATUSES.get(f[2], f[2]))
                set_id(r, f[4])
                set_token(r, f[5])
                set_lease(r, f[6])
                set_detail(r, f[7])
                set_data(r, b"")
                return [r]
        # Usually nothing is buffered: decode straight from ``data`` and keep only a partial
        # frame at its end.
        src: bytes | bytearray
        if buf:
            buf += data
            src = buf
        else:
            src = data
        out: list[Response] = []
        pos = 0
        end = len(src)
        limit = HEADER_SIZE - 4 + min(self._max, MAX_KEY_LEN)
        unpack_len = _LEN.unpack_from
        unpack = _HEADER.unpack_from
        ops, statuses = _OPS, _STATUSES
        new = object.__new__
        set_op, set_status, set_id, set_token, set_lease, set_detail, set_data = _RESPONSE_SETTERS
        try:
            while end - pos >= 4:
                length: int = unpack_len(src, pos)[0]
                if length < HEADER_SIZE - 4:
                    raise ProtocolError(f"frame length {length} below the {HEADER_SIZE}-byte header", "length")
                if length > limit:
                    raise ProtocolError(f"frame length {length} above the limit", "too_large")
                size = 4 + length
                if end - pos < size:
                    break
                f = unpack(src, pos)
                if f[3] != size - HEADER_SIZE:
                    raise ProtocolError("variable-part length disagrees with the frame length", "length")
                # Response(...) without its generated __init__ (a frozen dataclass sets each
                # field through object.__setattr__, about 3x the cost of this for every frame).
                r = new(Response)
                set_op(r, ops.get(f[1], f[1]))
                set_status(r, statuses.get(f[2], f[2]))
                set_id(r, f[4])
                set_token(r, f[5])
                set_lease(r, f[6])
                set_detail(r, f[7])
                set_data(r, bytes(src[pos + HEADER_SIZE:pos + size]) if f[3] else b"")
                out.append(r)
                pos += size
        except BaseException:
            if src is not buf:
                buf += data  # as if it had been buffered first
            raise
        if src is buf:
            if pos:
                del buf[:pos]
        elif pos < end:
            buf += src[pos:]
        return out

    def __len__(self) -> int:
        """Bytes buffered (an incomplete frame)."""
        return len(self._buf)



# --- handshake frames -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """HELLO (client -> server): version, session id, client nonce."""

    session_id: bytes
    nonce: bytes
    version: int = VERSION
    flags: int = 0

    def encode(self) -> bytes:
        """The 56 bytes of this HELLO."""
        _check(self.session_id, SESSION_ID_SIZE, "session id")
        _check(self.nonce, NONCE_SIZE, "nonce")
        return _HELLO.pack(HELLO_SIZE - 4, Op.HELLO, self.version, self.flags, self.session_id, self.nonce)

    @classmethod
    def decode(cls, buf: bytes) -> Hello:
        """Decode a whole HELLO frame (raises :class:`ProtocolError`)."""
        _fixed(buf, HELLO_SIZE, Op.HELLO)
        _, _, version, flags, session_id, nonce = _HELLO.unpack(buf)
        return cls(session_id=session_id, nonce=nonce, version=version, flags=flags)


@dataclass(frozen=True, slots=True)
class Challenge:
    """CHALLENGE (server -> client): status, server version, flags, detail, server nonce and
    data (the leader's address for NOT_LEADER, a message for other errors)."""

    status: int
    version: int
    flags: int
    nonce: bytes
    detail: int = 0
    data: bytes = b""

    @property
    def auth_required(self) -> bool:
        """The server holds a token (flag ``AUTH_REQUIRED``)."""
        return bool(self.flags & CHALLENGE_AUTH_REQUIRED)

    def encode(self) -> bytes:
        """The ``48 + len(data)`` bytes of this CHALLENGE."""
        _check(self.nonce, NONCE_SIZE, "nonce")
        if len(self.data) > MAX_CHALLENGE_DATA:
            raise ValueError(f"CHALLENGE data longer than {MAX_CHALLENGE_DATA} bytes")
        n = len(self.data)
        return _CHALLENGE.pack(CHALLENGE_SIZE - 4 + n, Op.CHALLENGE, self.status, self.version, self.flags,
                               self.detail, n, 0, self.nonce) + self.data

    @classmethod
    def decode(cls, buf: bytes) -> Challenge:
        """Decode a whole CHALLENGE frame (raises :class:`ProtocolError`)."""
        size = challenge_size(buf)
        if size is None or len(buf) < CHALLENGE_SIZE:
            raise ProtocolError("incomplete CHALLENGE frame", "short")
        if buf[4] != Op.CHALLENGE:
            raise ProtocolError(f"expected CHALLENGE (0x02), got op 0x{buf[4]:02x}", "wrong_op")
        _, _, status, version, flags, detail, n, _, nonce = _CHALLENGE.unpack_from(buf)
        if size != CHALLENGE_SIZE + n or len(buf) != size:
            raise ProtocolError(f"CHALLENGE data_len {n} disagrees with its length", "length")
        return cls(status=_status(status), version=version, flags=flags, nonce=nonce, detail=detail,
                   data=bytes(buf[CHALLENGE_SIZE:size]))


def challenge_size(buf: bytes | bytearray | memoryview) -> int | None:
    """The size of the CHALLENGE frame at the start of ``buf`` from its length field (None with
    fewer than 4 bytes); raises :class:`ProtocolError` for a length outside 44..44 + 1024. A
    length that looks like a TLS record says so: the server speaks TLS."""
    if len(buf) < 4:
        return None
    if buf[0] in (0x15, 0x16) and buf[1] == 0x03:
        raise ProtocolError("the server answered with a TLS record: is the server using TLS?", "too_large")
    length: int = _LEN.unpack_from(buf)[0]
    if not CHALLENGE_SIZE - 4 <= length <= CHALLENGE_SIZE - 4 + MAX_CHALLENGE_DATA:
        raise ProtocolError(f"CHALLENGE frame length {length} outside "
                            f"{CHALLENGE_SIZE - 4}..{CHALLENGE_SIZE - 4 + MAX_CHALLENGE_DATA}", "length")
    return 4 + length


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (client -> server): the client proof (zero when the server does not require auth)."""

    proof: bytes

    def encode(self) -> bytes:
        """The 40 bytes of this AUTH."""
        _check(self.proof, PROOF_SIZE, "proof")
        return _AUTH.pack(AUTH_SIZE - 4, Op.AUTH, self.proof)

    @classmethod
    def decode(cls, buf: bytes) -> Auth:
        """Decode a whole AUTH frame (raises :class:`ProtocolError`)."""
        _fixed(buf, AUTH_SIZE, Op.AUTH)
        _, _, proof = _AUTH.unpack(buf)
        return cls(proof=proof)


@dataclass(frozen=True, slots=True)
class Welcome:
    """WELCOME (server -> client): status, the resumed flag, the session grace, the state id and
    the server proof; ends the handshake."""

    status: int
    proof: bytes
    flags: int = 0
    detail: int = 0
    session_grace_ms: int = 0
    state_id: bytes = bytes(STATE_ID_SIZE)

    @property
    def resumed(self) -> bool:
        """The session named in HELLO was live and is resumed (flag ``RESUMED``)."""
        return bool(self.flags & WELCOME_RESUMED)

    def signed_part(self) -> bytes:
        """``WELCOME[5..31]``: the 27 bytes the server proof covers."""
        _check(self.state_id, STATE_ID_SIZE, "state id")
        return _WELCOME_SIGNED.pack(self.status, self.flags, self.detail, self.session_grace_ms, self.state_id)

    def encode(self) -> bytes:
        """The 64 bytes of this WELCOME."""
        _check(self.proof, PROOF_SIZE, "proof")
        _check(self.state_id, STATE_ID_SIZE, "state id")
        return _WELCOME.pack(WELCOME_SIZE - 4, Op.WELCOME, self.status, self.flags, self.detail,
                             self.session_grace_ms, self.state_id, self.proof)

    @classmethod
    def decode(cls, buf: bytes) -> Welcome:
        """Decode a whole WELCOME frame (raises :class:`ProtocolError`)."""
        _fixed(buf, WELCOME_SIZE, Op.WELCOME)
        _, _, status, flags, detail, grace, state_id, proof = _WELCOME.unpack(buf)
        return cls(status=_status(status), proof=proof, flags=flags, detail=detail, session_grace_ms=grace,
                   state_id=state_id)


def _check(value: bytes, size: int, what: str) -> None:
    if len(value) != size:
        raise ValueError(f"{what} must be {size} bytes, got {len(value)}")


def _fixed(buf: bytes, size: int, op: Op) -> None:
    if len(buf) < 5:
        raise ProtocolError(f"incomplete {op.name} frame", "short")
    (length,) = _LEN.unpack_from(buf)
    if length + 4 != size or len(buf) != size:
        raise ProtocolError(f"{op.name} frame has length {length}, want {size - 4}", "length")
    if buf[4] != op:
        raise ProtocolError(f"expected {op.name} (0x{op:02x}), got op 0x{buf[4]:02x}", "wrong_op")


def client_proof(token: bytes, session_id: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """HMAC-SHA256(token, "ticketing/1 client" || session_id || client_nonce || server_nonce)."""
    return hmac.new(token, _CLIENT_LABEL + session_id + client_nonce + server_nonce, hashlib.sha256).digest()


def server_proof(token: bytes, session_id: bytes, client_nonce: bytes, server_nonce: bytes,
                 welcome_signed: bytes) -> bytes:
    """HMAC-SHA256(token, "ticketing/1 server" || session_id || client_nonce || server_nonce ||
    WELCOME[5..31]); ``welcome_signed`` is :meth:`Welcome.signed_part`."""
    msg = _SERVER_LABEL + session_id + client_nonce + server_nonce + welcome_signed
    return hmac.new(token, msg, hashlib.sha256).digest()


class ClientHandshake:
    """The client side of the handshake, without I/O::

        hs = ClientHandshake(session_id, token)
        send(hs.hello())
        send(hs.on_challenge(read_challenge()))   # the AUTH frame
        welcome = hs.on_welcome(read_exactly(WELCOME_SIZE))   # raises unless it succeeded

    Errors: :class:`UnsupportedVersion`, :class:`Busy` (connection or session limit),
    :class:`NotLeader` (``.leader`` is the leader hint), :class:`AuthFailed` (rejected proof, a
    server proof that does not verify, or a server without auth while a token is configured),
    :class:`ShuttingDown`, :class:`InvalidRequest`, :class:`ProtocolError`.
    """

    def __init__(self, session_id: bytes, token: bytes | None, client_nonce: bytes | None = None) -> None:
        _check(session_id, SESSION_ID_SIZE, "session id")
        self.session_id = session_id
        self.token = token
        self.client_nonce = client_nonce if client_nonce is not None else secrets.token_bytes(NONCE_SIZE)
        _check(self.client_nonce, NONCE_SIZE, "nonce")
        self.server_nonce = bytes(NONCE_SIZE)
        self.auth_required = False

    def hello(self) -> bytes:
        """The HELLO frame to send first."""
        return Hello(session_id=self.session_id, nonce=self.client_nonce).encode()

    def on_challenge(self, frame: bytes) -> bytes:
        """Check the CHALLENGE and return the AUTH frame to send."""
        ch = Challenge.decode(frame)
        message = " ".join(ch.data.decode("utf-8", "replace").split())
        if ch.status == Status.NOT_LEADER:
            raise NotLeader(status=Status.NOT_LEADER, leader=ch.data.decode("utf-8", "replace") or None)
        if ch.status == Status.UNSUPPORTED_VERSION:
            raise UnsupportedVersion(message, status=Status.UNSUPPORTED_VERSION,
                                     context=f"server speaks version {ch.version}, client {VERSION}")
        if ch.status == Status.BUSY:
            raise Busy(message, status=Status.BUSY, detail=ch.detail or Limit.CONNECTIONS)
        if ch.status == Status.INVALID:
            raise InvalidRequest(message, status=Status.INVALID, detail=ch.detail or Field.HANDSHAKE)
        if ch.status == Status.SHUTTING_DOWN:
            raise ShuttingDown(message, status=Status.SHUTTING_DOWN)
        if ch.status != Status.OK:
            raise error_for_status(ch.status, ch.detail, ch.data)
        if ch.version != VERSION:
            raise UnsupportedVersion(status=Status.UNSUPPORTED_VERSION,
                                     context=f"server speaks version {ch.version}, client {VERSION}")
        if self.token is not None and not ch.auth_required:
            raise AuthFailed("a token is configured but the server does not require auth, so it cannot "
                             "prove it holds the token: refusing it", status=Status.AUTH_FAILED)
        self.server_nonce = ch.nonce
        self.auth_required = ch.auth_required
        if ch.auth_required and self.token is not None:
            proof = client_proof(self.token, self.session_id, self.client_nonce, ch.nonce)
        else:
            proof = _ZERO_PROOF
        return Auth(proof=proof).encode()

    def on_welcome(self, frame: bytes) -> Welcome:
        """Check the WELCOME; returns it when the handshake succeeded (and, with a token, the
        server proved it holds the token over the state id and the resumed flag)."""
        w = Welcome.decode(frame)
        if w.status == Status.AUTH_FAILED:
            if self.token is None:
                raise AuthFailed("the server requires a token and none is configured", status=Status.AUTH_FAILED)
            raise AuthFailed("the server rejected the token", status=Status.AUTH_FAILED)
        if w.status == Status.BUSY:
            raise Busy(status=Status.BUSY, detail=w.detail or Limit.SESSIONS)
        if w.status == Status.SHUTTING_DOWN:
            raise ShuttingDown(status=Status.SHUTTING_DOWN)
        if w.status != Status.OK:
            raise error_for_status(w.status, w.detail)
        if self.token is not None:
            want = server_proof(self.token, self.session_id, self.client_nonce, self.server_nonce,
                                w.signed_part())
            if not hmac.compare_digest(want, w.proof):
                raise AuthFailed("the server's proof did not verify: it does not hold the token",
                                 status=Status.AUTH_FAILED)
        return w
