"""Every request, response, handshake, auth and malformed vector of protocol/vectors.json
encodes to / decodes from the exact bytes."""

from __future__ import annotations

from typing import Any

import pytest

from ticketing import exceptions as ex
from ticketing.constants import Field, Limit, Op, Status
from ticketing.constants import CHALLENGE_SIZE, MAX_CHALLENGE_DATA
from ticketing.protocol import (
    Auth,
    Challenge,
    ClientHandshake,
    FrameBuffer,
    Hello,
    Request,
    Response,
    Welcome,
    challenge_size,
    client_proof,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    server_proof,
)

from .vectors import load

VECTORS = load("vectors.json")


def _op(name: str) -> int:
    return int(name, 16) if name.startswith("0x") else Op[name]


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in items]


def test_version() -> None:
    assert VECTORS["version"] == 1


def _request(f: dict[str, Any]) -> Request:
    return Request(op=_op(f["op"]), flags=f["flags"], id=int(f["id"]), token=int(f["token"]),
                   lease_ms=f["lease_ms"], wait_ms=f["wait_ms"], key=bytes.fromhex(f["key_hex"]))


def _response(f: dict[str, Any]) -> Response:
    return Response(op=_op(f["op"]), status=Status[f["status"]], id=int(f["id"]), token=int(f["token"]),
                    lease_ms=f["lease_ms"], detail=f["detail"], data=bytes.fromhex(f["data_hex"]))


@pytest.mark.parametrize("vec", VECTORS["requests"], ids=_ids(VECTORS["requests"]))
def test_request_vectors(vec: dict[str, Any]) -> None:
    want = bytes.fromhex(vec["hex"])
    req = _request(vec["fields"])
    assert encode_request(req) == want
    assert req.encode() == want
    got, size = decode_request(want)
    assert size == len(want)
    assert got == req


@pytest.mark.parametrize("vec", VECTORS["responses"], ids=_ids(VECTORS["responses"]))
def test_response_vectors(vec: dict[str, Any]) -> None:
    want = bytes.fromhex(vec["hex"])
    resp = _response(vec["fields"])
    assert encode_response(resp) == want
    got, size = decode_response(want)
    assert size == len(want)
    assert got == resp
    # The stream reader finds the same frame, whole or split at every byte.
    for cut in range(len(want) + 1):
        fb = FrameBuffer()
        frames = fb.feed(want[:cut]) + fb.feed(want[cut:])
        assert frames == [resp]
        assert len(fb) == 0


def test_response_errors_map_to_exceptions() -> None:
    by_name = {v["name"]: _response(v["fields"]) for v in VECTORS["responses"]}

    def err(name: str) -> ex.ServerError:
        r = by_name[name]
        return ex.error_for_status(r.status, r.detail, r.data)

    e = err("invalid_key")
    assert isinstance(e, ex.InvalidRequest) and isinstance(e, ValueError)
    assert e.field is Field.KEY and e.message == "key empty or longer than the server's max key length"
    assert str(e) == "invalid KEY: key empty or longer than the server's max key length"
    op = err("invalid_op")
    assert isinstance(op, ex.InvalidRequest) and op.field is Field.OP
    b = err("busy_waiters_per_key")
    assert isinstance(b, ex.Busy) and b.limit is Limit.WAITERS_PER_KEY
    storage = err("busy_storage")
    assert isinstance(storage, ex.Busy) and storage.limit is Limit.STORAGE
    used = err("invalid_request_id_used")
    assert isinstance(used, ex.InvalidRequest) and used.field is Field.REQUEST_ID
    nl = err("not_leader")
    assert isinstance(nl, ex.NotLeader) and nl.leader == "127.0.0.2:7070"
    assert isinstance(err("acquire_timed_out"), ex.NotAcquired)
    assert isinstance(err("acquire_cancelled"), ex.Cancelled)
    assert isinstance(err("release_not_held"), ex.NotHeld)
    assert isinstance(err("acquire_retry_not_held"), ex.NotHeld)
    assert isinstance(err("shutting_down"), ex.ShuttingDown)


def test_all_responses_in_one_stream() -> None:
    stream = b"".join(bytes.fromhex(v["hex"]) for v in VECTORS["responses"])
    want = [_response(v["fields"]) for v in VECTORS["responses"]]
    fb = FrameBuffer()
    got: list[Response] = []
    for i in range(0, len(stream), 7):
        got += fb.feed(stream[i:i + 7])
    assert got == want


HANDSHAKE = {v["name"]: v for v in VECTORS["handshake"]}


def _handshake_frame(vec: dict[str, Any]) -> Hello | Challenge | Auth | Welcome:
    """The frame a handshake vector describes, from its fields alone."""
    op = Op[vec["op"]]
    if op == Op.HELLO:
        return Hello(session_id=bytes.fromhex(vec["session_id_hex"]), nonce=bytes.fromhex(vec["nonce_hex"]),
                     version=vec["version"], flags=vec["flags"])
    if op == Op.CHALLENGE:
        return Challenge(status=Status[vec["status"]], version=vec["version"], flags=vec["flags"],
                         nonce=bytes.fromhex(vec["nonce_hex"]), detail=vec["detail"],
                         data=bytes.fromhex(vec["data_hex"]))
    if op == Op.AUTH:
        return Auth(proof=bytes.fromhex(vec["proof_hex"]))
    return Welcome(status=Status[vec["status"]], proof=bytes.fromhex(vec["proof_hex"]), flags=vec["flags"],
                   detail=vec["detail"], session_grace_ms=vec["session_grace_ms"],
                   state_id=bytes.fromhex(vec["state_id_hex"]))


@pytest.mark.parametrize("vec", VECTORS["handshake"], ids=_ids(VECTORS["handshake"]))
def test_handshake_vectors(vec: dict[str, Any]) -> None:
    want = bytes.fromhex(vec["hex"])
    msg = _handshake_frame(vec)
    assert msg.encode() == want
    assert type(msg).decode(want) == msg


@pytest.mark.parametrize("vec", VECTORS["auth"], ids=_ids(VECTORS["auth"]))
def test_auth_vectors(vec: dict[str, Any]) -> None:
    token = vec["token_utf8"].encode()
    sid = bytes.fromhex(vec["session_id_hex"])
    cn = bytes.fromhex(vec["client_nonce_hex"])
    sn = bytes.fromhex(vec["server_nonce_hex"])
    welcome = Welcome(status=Status.OK, proof=bytes(32), flags=vec["welcome_flags"],
                      session_grace_ms=vec["session_grace_ms"], state_id=bytes.fromhex(vec["state_id_hex"]))
    assert client_proof(token, sid, cn, sn).hex() == vec["client_proof_hex"]
    assert server_proof(token, sid, cn, sn, welcome.signed_part()).hex() == vec["server_proof_hex"]


def _auth_vector(name: str = "shared_token_new_session") -> dict[str, Any]:
    v: dict[str, Any] = {a["name"]: a for a in VECTORS["auth"]}[name]
    return v


def _hex(name: str) -> bytes:
    return bytes.fromhex(HANDSHAKE[name]["hex"])


@pytest.mark.parametrize(("auth_name", "welcome_name", "resumed"),
                         [("shared_token_new_session", "welcome_new_session", False),
                          ("shared_token_resumed", "welcome_resumed", True)])
def test_handshake_state_machine_with_auth(auth_name: str, welcome_name: str, resumed: bool) -> None:
    v = _auth_vector(auth_name)
    hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), v["token_utf8"].encode(),
                         bytes.fromhex(v["client_nonce_hex"]))
    assert hs.hello() == _hex("hello")
    assert hs.on_challenge(_hex("challenge_auth")) == _hex("auth")
    w = hs.on_welcome(_hex(welcome_name))  # the server proof verifies
    assert w.resumed is resumed
    assert w.session_grace_ms == v["session_grace_ms"]
    assert w.state_id.hex() == v["state_id_hex"]


def test_server_proof_covers_state_id_and_resumed_flag() -> None:
    """A man in the middle flipping RESUMED or changing the state id breaks the proof."""
    v = _auth_vector()
    good = bytearray(_hex("welcome_new_session"))
    for offset in (6, 12, 16, 31):  # flags, grace, first and last byte of the state id
        forged = bytearray(good)
        forged[offset] ^= 0x01
        hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), v["token_utf8"].encode(),
                             bytes.fromhex(v["client_nonce_hex"]))
        hs.on_challenge(_hex("challenge_auth"))
        with pytest.raises(ex.AuthFailed, match="proof did not verify"):
            hs.on_welcome(bytes(forged))


def test_handshake_without_auth() -> None:
    v = _auth_vector()
    hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), None, bytes.fromhex(v["client_nonce_hex"]))
    assert hs.on_challenge(_hex("challenge_no_auth")) == _hex("auth_no_auth")
    w = hs.on_welcome(_hex("welcome_no_auth"))
    assert not w.resumed and w.session_grace_ms == 5000


def test_token_refuses_server_without_auth() -> None:
    hs = ClientHandshake(bytes(16), b"secret")
    with pytest.raises(ex.AuthFailed, match="does not require auth"):
        hs.on_challenge(_hex("challenge_no_auth"))


def test_bad_server_proof_is_refused() -> None:
    v = _auth_vector()
    hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), b"another token", bytes.fromhex(v["client_nonce_hex"]))
    hs.on_challenge(_hex("challenge_auth"))
    with pytest.raises(ex.AuthFailed, match="proof did not verify"):
        hs.on_welcome(_hex("welcome_new_session"))


def test_welcome_errors() -> None:
    hs = ClientHandshake(bytes(16), None)
    hs.on_challenge(_hex("challenge_auth"))
    with pytest.raises(ex.AuthFailed, match="requires a token"):
        hs.on_welcome(_hex("welcome_auth_failed"))
    hs = ClientHandshake(bytes(16), b"wrong")
    hs.on_challenge(_hex("challenge_auth"))
    with pytest.raises(ex.AuthFailed, match="rejected the token"):
        hs.on_welcome(_hex("welcome_auth_failed"))
    hs = ClientHandshake(bytes(16), None)
    hs.on_challenge(_hex("challenge_no_auth"))
    with pytest.raises(ex.Busy) as busy:
        hs.on_welcome(_hex("welcome_busy_sessions"))
    assert busy.value.limit is Limit.SESSIONS


def test_challenge_errors() -> None:
    def challenge(name: str) -> BaseException:
        with pytest.raises(ex.TicketingError) as e:
            ClientHandshake(bytes(16), None).on_challenge(_hex(name))
        return e.value

    e = challenge("challenge_unsupported_version")
    assert isinstance(e, ex.UnsupportedVersion) and "unsupported protocol version" in str(e)
    e = challenge("challenge_busy_connections")
    assert isinstance(e, ex.Busy) and e.limit is Limit.CONNECTIONS and "too many connections" in str(e)
    e = challenge("challenge_invalid_session")
    assert isinstance(e, ex.InvalidRequest) and e.field is Field.SESSION
    e = challenge("challenge_not_leader")
    assert isinstance(e, ex.NotLeader) and e.leader == "127.0.0.2:7070"
    e = challenge("challenge_not_leader_unknown")
    assert isinstance(e, ex.NotLeader) and e.leader is None


def test_challenge_framing() -> None:
    """CHALLENGE is variable-length: its size comes from the length field, bounded by 1024 bytes
    of data; a TLS record in its place says the server speaks TLS."""
    frame = _hex("challenge_not_leader")
    assert challenge_size(frame[:3]) is None
    assert challenge_size(frame[:4]) == len(frame)
    too_long = (CHALLENGE_SIZE - 4 + MAX_CHALLENGE_DATA + 1).to_bytes(4, "big")
    with pytest.raises(ex.ProtocolError):
        challenge_size(too_long)
    with pytest.raises(ex.ProtocolError, match="TLS"):
        challenge_size(bytes.fromhex("15030300"))
    with pytest.raises(ex.ProtocolError) as e:
        Challenge.decode(frame[:-1])
    assert e.value.reason == "length"


def test_handshake_wrong_op_and_length() -> None:
    hs = ClientHandshake(bytes(16), None)
    with pytest.raises(ex.ProtocolError) as e:
        hs.on_challenge(_hex("welcome_no_auth")[:48])
    assert e.value.reason == "wrong_op"
    hs.on_challenge(_hex("challenge_no_auth"))
    with pytest.raises(ex.ProtocolError) as e:
        hs.on_welcome(_hex("welcome_no_auth")[:-1])
    assert e.value.reason == "length"


@pytest.mark.parametrize("vec", VECTORS["malformed"], ids=_ids(VECTORS["malformed"]))
def test_malformed_vectors(vec: dict[str, Any]) -> None:
    data = bytes.fromhex(vec["hex"])
    decode = decode_request if vec["kind"] == "request" else decode_response
    with pytest.raises(ex.ProtocolError) as e:
        decode(data, vec["max_var"])
    assert e.value.reason == vec["error"]
    if vec["error"] != "short":
        with pytest.raises(ex.ProtocolError):
            FrameBuffer(vec["max_var"]).feed(data)  # a stream reader refuses it too, without waiting
    else:
        assert FrameBuffer(vec["max_var"]).feed(data) == []  # just incomplete: wait for more bytes


def test_inspect_answers_to_key_info() -> None:
    from ticketing import InspectFlag, KeyInfo
    from ticketing._common import key_info

    by_name = {v["name"]: _response(v["fields"]) for v in VECTORS["responses"]}
    assert key_info(by_name["inspect_held_by_other"]) == KeyInfo(
        held=True, token=None, lease_remaining=25.0, waiters=3, held_for=5.0, lock_delay_remaining=0.0,
        flags=InspectFlag.HELD)
    mine = key_info(by_name["inspect_held_token_match"])
    assert mine.held and mine.token == 42
    assert mine.flags == InspectFlag.HELD | InspectFlag.TOKEN_MATCH | InspectFlag.SESSION
    delay = key_info(by_name["inspect_lock_delay"])
    assert not delay.held and delay.waiters == 1 and delay.lock_delay_remaining == 0.75
    assert key_info(by_name["inspect_free"]) == KeyInfo(
        held=False, token=None, lease_remaining=0.0, waiters=0, held_for=0.0, lock_delay_remaining=0.0,
        flags=InspectFlag(0))
    # an unknown flag bit is kept; a token without TOKEN_MATCH/SESSION is not shown
    odd = Response(op=Op.INSPECT, status=Status.OK, id=1, token=9, data=bytes.fromhex("000000000000000000000031"))
    info = key_info(odd)
    assert info.held and info.token is None and int(info.flags) == 0x31
    with pytest.raises(ex.ProtocolError):
        key_info(Response(op=Op.INSPECT, status=Status.OK, id=1, data=b"\0" * 11))


def test_inspect_startup_flag() -> None:
    """STARTUP (0x10): the server's start-up wait; the lock-delay field is the time left."""
    from ticketing import InspectFlag
    from ticketing._common import key_info

    resp = Response(op=Op.INSPECT, status=Status.OK, id=1, data=bytes.fromhex("00000000" "00000bb8" "00000010"))
    info = key_info(resp)
    assert info.flags == InspectFlag.STARTUP and info.startup and not info.held
    assert info.lock_delay_remaining == 3.0
    assert not key_info(Response(op=Op.INSPECT, status=Status.OK, id=1, data=bytes(12))).startup


def test_messages_cut_long_keys_and_say_nothing_twice() -> None:
    """A key longer than 64 bytes is cut in messages (never inside a character), with its
    length; the server's message for an INVALID key names its limit, once."""
    assert ex.describe_key(b"k") == "'k'"
    assert ex.describe_key(b"k" * 64) == "'" + "k" * 64 + "'"
    assert ex.describe_key(b"k" * 300) == "'" + "k" * 64 + "'…(300 bytes)"
    assert ex.describe_key("é".encode() * 40) == "'" + "é" * 32 + "'…(80 bytes)"
    assert ex.describe_key("éa".encode() * 30) == "'" + "éa" * 21 + "'…(90 bytes)"  # byte 64 would split an é
    assert ex.describe_key(b"\xff" * 70) == "0x" + "ff" * 64 + "…(70 bytes)"
    key = b"k" * 300
    err = ex.error_for_status(Status.INVALID, Field.KEY,
                              b"key of 300 bytes is longer than the server's max key length (256)",
                              f"key {ex.describe_key(key)}, lease 1 s, try once")
    text = str(err)
    assert "256" in text and "k" * 65 not in text and "\n" not in text
    assert text.count("is longer than the server's max key length") == 1


def test_not_acquired_gives_the_server_reason() -> None:
    """TIMED_OUT with the server's message (its start-up wait) says that, not "the key is held"."""
    err = ex.error_for_status(Status.TIMED_OUT, 0, b"the server is in its start-up wait: no grant for 2676 ms more",
                              "key 'k', wait timeout 0.3 s")
    assert str(err) == ("not acquired: the server is in its start-up wait: no grant for 2676 ms more "
                        "(key 'k', wait timeout 0.3 s)")
    plain = ex.error_for_status(Status.TIMED_OUT, 0, b"", "key 'k', try once")
    assert str(plain) == "not acquired: the key is held and the wait timeout passed (key 'k', try once)"


def test_one_whole_frame_per_read_takes_the_same_checks() -> None:
    """FrameBuffer.feed's shortcut for a read of exactly one 32-byte frame (the usual answer)
    gives what decode_response gives, and a 32-byte read that is not such a frame takes the
    general path: refused, or kept until the rest of its frame arrives."""
    frame = encode_response(Response(op=Op.ACQUIRE, status=Status.OK, id=9, token=77, lease_ms=5000, detail=3))
    assert len(frame) == 32
    fb = FrameBuffer()
    assert fb.feed(frame) == [decode_response(frame)[0]] and len(fb) == 0
    # A frame whose length field says more (a data part follows): kept, completed by the next read.
    longer = encode_response(Response(op=Op.INSPECT, status=Status.OK, id=10, data=b"abcd"))
    assert fb.feed(longer[:32]) == [] and len(fb) == 32
    assert fb.feed(longer[32:]) == [decode_response(longer)[0]] and len(fb) == 0
    # Length 28 but a data length that disagrees; a length below the header: refused as before.
    bad_var = bytearray(frame)
    bad_var[6:8] = (4).to_bytes(2, "big")
    with pytest.raises(ex.ProtocolError) as e:
        FrameBuffer().feed(bytes(bad_var))
    assert e.value.reason == "length"
    short = bytearray(frame)
    short[0:4] = (20).to_bytes(4, "big")
    with pytest.raises(ex.ProtocolError) as e:
        FrameBuffer().feed(bytes(short))
    assert e.value.reason == "length"
    # Unknown op and status values pass through as ints, as on the general path.
    odd = bytearray(frame)
    odd[4], odd[5] = 0x7E, 0x7F
    (r,) = FrameBuffer().feed(bytes(odd))
    assert (r.op, r.status) == (0x7E, 0x7F) and r == decode_response(bytes(odd))[0]
    # A partial frame buffered first: a following 32-byte read goes through the buffer.
    fb = FrameBuffer()
    assert fb.feed(frame[:10]) == [] and fb.feed(frame[10:] + frame[:10]) == [decode_response(frame)[0]]
    assert fb.feed(frame[10:]) == [decode_response(frame)[0]]
