"""Every request, response, handshake, auth and malformed vector of protocol/vectors.json
encodes to / decodes from the exact bytes."""

from __future__ import annotations

from typing import Any

import pytest

from ticketing import exceptions as ex
from ticketing.constants import Field, Limit, Op, Status
from ticketing.protocol import (
    Auth,
    Challenge,
    ClientHandshake,
    FrameBuffer,
    Hello,
    Request,
    Response,
    Welcome,
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
    assert e.field is Field.KEY and e.message == "key longer than 256 bytes"
    op = err("invalid_op")
    assert isinstance(op, ex.InvalidRequest) and op.field is Field.OP
    b = err("busy_waiters_per_key")
    assert isinstance(b, ex.Busy) and b.limit is Limit.WAITERS_PER_KEY
    nl = err("not_leader")
    assert isinstance(nl, ex.NotLeader) and nl.leader == "127.0.0.2:7070"
    assert isinstance(err("acquire_timed_out"), ex.NotAcquired)
    assert isinstance(err("acquire_cancelled"), ex.Cancelled)
    assert isinstance(err("release_not_held"), ex.NotHeld)
    assert isinstance(err("release_not_held"), ex.LockLost)
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


@pytest.mark.parametrize("vec", VECTORS["handshake"], ids=_ids(VECTORS["handshake"]))
def test_handshake_vectors(vec: dict[str, Any]) -> None:
    want = bytes.fromhex(vec["hex"])
    op = Op[vec["op"]]
    msg: Hello | Challenge | Auth | Welcome
    if op == Op.HELLO:
        msg = Hello(session_id=bytes.fromhex(vec["session_id_hex"]), nonce=bytes.fromhex(vec["nonce_hex"]),
                    version=vec["version"])
        assert Hello.decode(want) == msg
    elif op == Op.CHALLENGE:
        msg = Challenge(status=Status[vec["status"]], version=vec["version"], flags=vec.get("flags", 0),
                        nonce=bytes.fromhex(vec["nonce_hex"]))
        assert Challenge.decode(want) == msg
    elif op == Op.AUTH:
        msg = Auth(proof=bytes.fromhex(vec["proof_hex"]))
        assert Auth.decode(want) == msg
    else:
        msg = Welcome(status=Status[vec["status"]], proof=bytes.fromhex(vec["proof_hex"]))
        assert Welcome.decode(want) == msg
    assert msg.encode() == want


@pytest.mark.parametrize("vec", VECTORS["auth"], ids=_ids(VECTORS["auth"]))
def test_auth_vectors(vec: dict[str, Any]) -> None:
    token = vec["token_utf8"].encode()
    sid = bytes.fromhex(vec["session_id_hex"])
    cn = bytes.fromhex(vec["client_nonce_hex"])
    sn = bytes.fromhex(vec["server_nonce_hex"])
    assert client_proof(token, sid, cn, sn).hex() == vec["client_proof_hex"]
    assert server_proof(token, sid, cn, sn).hex() == vec["server_proof_hex"]


def _auth_vector() -> dict[str, Any]:
    v: dict[str, Any] = VECTORS["auth"][0]
    return v


def test_handshake_state_machine_with_auth() -> None:
    v = _auth_vector()
    hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), v["token_utf8"].encode(),
                         bytes.fromhex(v["client_nonce_hex"]))
    assert hs.hello() == bytes.fromhex(HANDSHAKE["hello"]["hex"])
    auth = hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_auth"]["hex"]))
    assert auth == bytes.fromhex(HANDSHAKE["auth"]["hex"])
    hs.on_welcome(bytes.fromhex(HANDSHAKE["welcome_auth"]["hex"]))  # the server proof verifies


def test_handshake_without_auth() -> None:
    v = _auth_vector()
    hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), None, bytes.fromhex(v["client_nonce_hex"]))
    auth = hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_no_auth"]["hex"]))
    assert auth == bytes.fromhex(HANDSHAKE["auth_no_auth"]["hex"])
    hs.on_welcome(bytes.fromhex(HANDSHAKE["welcome_no_auth"]["hex"]))


def test_token_refuses_server_without_auth() -> None:
    hs = ClientHandshake(bytes(16), b"secret")
    with pytest.raises(ex.AuthFailed, match="does not require auth"):
        hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_no_auth"]["hex"]))


def test_bad_server_proof_is_refused() -> None:
    v = _auth_vector()
    hs = ClientHandshake(bytes.fromhex(v["session_id_hex"]), b"another token", bytes.fromhex(v["client_nonce_hex"]))
    hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_auth"]["hex"]))
    with pytest.raises(ex.AuthFailed, match="proof did not verify"):
        hs.on_welcome(bytes.fromhex(HANDSHAKE["welcome_auth"]["hex"]))


def test_welcome_auth_failed() -> None:
    hs = ClientHandshake(bytes(16), None)
    hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_auth"]["hex"]))
    with pytest.raises(ex.AuthFailed, match="requires a token"):
        hs.on_welcome(bytes.fromhex(HANDSHAKE["welcome_auth_failed"]["hex"]))
    hs = ClientHandshake(bytes(16), b"wrong")
    hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_auth"]["hex"]))
    with pytest.raises(ex.AuthFailed, match="rejected the token"):
        hs.on_welcome(bytes.fromhex(HANDSHAKE["welcome_auth_failed"]["hex"]))


def test_challenge_unsupported_version() -> None:
    hs = ClientHandshake(bytes(16), None)
    with pytest.raises(ex.UnsupportedVersion):
        hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_unsupported_version"]["hex"]))


def test_handshake_wrong_op_and_length() -> None:
    hs = ClientHandshake(bytes(16), None)
    with pytest.raises(ex.ProtocolError) as e:
        hs.on_challenge(bytes.fromhex(HANDSHAKE["welcome_no_auth"]["hex"]))
    assert e.value.reason == "wrong_op"
    with pytest.raises(ex.ProtocolError) as e:
        hs.on_challenge(bytes.fromhex(HANDSHAKE["challenge_no_auth"]["hex"])[:-1])
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
            FrameBuffer().feed(data)  # a stream reader refuses it too, without waiting for more
    else:
        assert FrameBuffer().feed(data) == []  # just incomplete: wait for more bytes


def test_inspect_answers_to_key_info() -> None:
    from ticketing import KeyInfo
    from ticketing._common import key_info

    by_name = {v["name"]: _response(v["fields"]) for v in VECTORS["responses"]}
    assert key_info(by_name["inspect_held"]) == KeyInfo(token=7, lease_remaining=25.0, waiters=3, held_for=5.0,
                                                        lock_delay_remaining=0.0)
    assert key_info(by_name["inspect_free"]) == KeyInfo(token=None, lease_remaining=0.0, waiters=0, held_for=0.0,
                                                        lock_delay_remaining=0.0)
    delayed = Response(op=Op.INSPECT, status=Status.OK, id=1, data=bytes.fromhex("00000000000005dc"))
    assert key_info(delayed).lock_delay_remaining == 1.5
    with pytest.raises(ex.ProtocolError):
        key_info(Response(op=Op.INSPECT, status=Status.OK, id=1, data=b"\0" * 7))
