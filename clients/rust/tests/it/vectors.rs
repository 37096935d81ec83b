//! Every vector of protocol/vectors.json and every code of protocol/constants.json, read at test
//! time: encoded byte for byte and decoded field for field.

use std::collections::BTreeMap;

use serde_json::Value;
use ticketing::wire::{
    self, Auth, BusyLimit, Challenge, ExpiredReason, FrameError, GoawayReason, Hello, InspectFlags, InvalidField, Op,
    Request, Response, Status, Welcome,
};

use crate::support::{from_hex, protocol_file, to_hex};

fn json(name: &str) -> Value {
    let text = std::fs::read_to_string(protocol_file(name)).unwrap_or_else(|e| panic!("reading {name}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {name}: {e}"))
}

fn list<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    v[key].as_array().unwrap_or_else(|| panic!("{key} is not a list"))
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

fn u64_of(v: &Value, key: &str) -> u64 {
    match &v[key] {
        Value::String(s) => s.parse().unwrap_or_else(|e| panic!("{key}: {e}")),
        Value::Number(n) => n.as_u64().unwrap_or_else(|| panic!("{key} is not a u64")),
        other => panic!("{key} is not an integer: {other}"),
    }
}

fn u32_of(v: &Value, key: &str) -> u32 {
    u32::try_from(u64_of(v, key)).unwrap_or_else(|_| panic!("{key} does not fit u32"))
}

fn bytes_of(v: &Value, key: &str) -> Vec<u8> {
    from_hex(str_of(v, key))
}

fn array_of<const N: usize>(v: &Value, key: &str) -> [u8; N] {
    let b = bytes_of(v, key);
    if b.is_empty() {
        return [0u8; N];
    }
    b.try_into().unwrap_or_else(|_| panic!("{key} is not {N} bytes"))
}

fn code_by_name<T: Copy>(all: &[(&str, T)], name: &str) -> T {
    all.iter().find(|(n, _)| *n == name).map(|(_, c)| *c).unwrap_or_else(|| panic!("unknown code name {name}"))
}

fn check_table(constants: &Value, key: &str, ours: impl Iterator<Item = (&'static str, u64)>) {
    let theirs: BTreeMap<String, u64> =
        list(constants, key).iter().map(|e| (str_of(e, "name").to_owned(), u64_of(e, "value"))).collect();
    let ours: BTreeMap<String, u64> = ours.map(|(n, c)| (n.to_owned(), c)).collect();
    assert_eq!(ours, theirs, "code table {key} differs from constants.json");
}

#[test]
fn code_tables_match_constants_json() {
    let c = json("constants.json");
    assert_eq!(u64_of(&c, "version"), u64::from(wire::VERSION));
    check_table(&c, "ops", Op::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    check_table(&c, "statuses", Status::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    check_table(&c, "invalid_fields", InvalidField::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    check_table(&c, "busy_limits", BusyLimit::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    check_table(&c, "expired_reasons", ExpiredReason::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    check_table(&c, "goaway_reasons", GoawayReason::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    check_table(&c, "inspect_flags", InspectFlags::ALL.iter().map(|(n, c)| (*n, u64::from(c.0))));
    // Names round-trip through the tables.
    assert_eq!(Status::NOT_HELD.name(), Some("NOT_HELD"));
    assert_eq!(Status(200).name(), None);
}

#[test]
fn sizes_and_client_rules_match_constants_json() {
    let c = json("constants.json");
    let ours: BTreeMap<&str, u64> = [
        ("AUTH", wire::AUTH_LEN as u64),
        ("CHALLENGE", wire::CHALLENGE_LEN as u64),
        ("CHALLENGE_AUTH_REQUIRED", u64::from(wire::CHALLENGE_AUTH_REQUIRED)),
        ("HEADER", wire::HEADER_LEN as u64),
        ("HELLO", wire::HELLO_LEN as u64),
        ("INSPECT_DATA", wire::INSPECT_DATA_LEN as u64),
        ("MAX_CHALLENGE_DATA", wire::MAX_CHALLENGE_DATA as u64),
        ("MAX_DATA_LEN", wire::MAX_VAR_LEN as u64),
        ("MAX_KEY_LEN", wire::MAX_KEY_LEN as u64),
        ("NONCE", wire::NONCE_LEN as u64),
        ("PROOF", wire::PROOF_LEN as u64),
        ("SESSION_ID", wire::SESSION_ID_LEN as u64),
        ("STATE_ID", wire::STATE_ID_LEN as u64),
        ("WAIT_FOREVER", u64::from(wire::WAIT_FOREVER)),
        ("WELCOME", wire::WELCOME_LEN as u64),
        ("WELCOME_RESUMED", u64::from(wire::WELCOME_RESUMED)),
    ]
    .into_iter()
    .collect();
    let theirs: BTreeMap<&str, u64> =
        c["sizes"].as_object().expect("sizes").iter().map(|(k, _)| (k.as_str(), u64_of(&c["sizes"], k))).collect();
    assert_eq!(ours, theirs, "sizes differ from constants.json");

    let rules = &c["client_rules"];
    assert_eq!(rules.as_object().expect("client_rules").len(), 4, "a new client rule to implement");
    assert_eq!(u32_of(rules, "ACK_EVERY"), wire::ACK_EVERY);
    assert_eq!(u32_of(rules, "CLOCK_RATE_BOUND_PPM"), wire::CLOCK_RATE_BOUND_PPM);
    assert_eq!(u32_of(rules, "LOST_MARGIN_MS"), wire::LOST_MARGIN_MS);
    assert_eq!(u32_of(rules, "LOST_CHECK_MS"), wire::LOST_CHECK_MS);
}

#[test]
fn request_vectors_encode_and_decode() {
    let v = json("vectors.json");
    let reqs = list(&v, "requests");
    assert!(reqs.len() >= 12, "expected every request vector, got {}", reqs.len());
    for vec in reqs {
        let name = str_of(vec, "name");
        let f = &vec["fields"];
        let key = bytes_of(f, "key_hex");
        let req = Request {
            op: code_by_name(Op::ALL, str_of(f, "op")),
            flags: u8::try_from(u64_of(f, "flags")).expect("flags"),
            id: u64_of(f, "id"),
            token: u64_of(f, "token"),
            lease_ms: u32_of(f, "lease_ms"),
            wait_ms: u32_of(f, "wait_ms"),
            key: &key,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(to_hex(&out), str_of(vec, "hex"), "encoding request {name}");
        let bytes = bytes_of(vec, "hex");
        let (decoded, used) = Request::decode(&bytes, wire::MAX_KEY_LEN).expect(name).expect(name);
        assert_eq!(used, bytes.len(), "{name}");
        assert_eq!(decoded, req, "decoding request {name}");
    }
}

#[test]
fn response_vectors_encode_and_decode() {
    let v = json("vectors.json");
    let resps = list(&v, "responses");
    assert!(resps.len() >= 29, "expected every response vector, got {}", resps.len());
    for vec in resps {
        let name = str_of(vec, "name");
        let f = &vec["fields"];
        let data = bytes_of(f, "data_hex");
        let op = match Op::ALL.iter().find(|(n, _)| *n == str_of(f, "op")) {
            Some((_, op)) => *op,
            None => {
                // An op the table does not name (an unknown op echoed, or 0 for INVALID/LENGTH)
                // is given by number.
                let raw = str_of(f, "op");
                let hex = raw.strip_prefix("0x").unwrap_or_else(|| panic!("op {raw} in {name}"));
                Op(u8::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("op {raw} in {name}: {e}")))
            }
        };
        let res = Response {
            op,
            status: code_by_name(Status::ALL, str_of(f, "status")),
            id: u64_of(f, "id"),
            token: u64_of(f, "token"),
            lease_ms: u32_of(f, "lease_ms"),
            detail: u32_of(f, "detail"),
            data: &data,
        };
        let mut out = Vec::new();
        res.encode(&mut out);
        assert_eq!(to_hex(&out), str_of(vec, "hex"), "encoding response {name}");
        let bytes = bytes_of(vec, "hex");
        let (decoded, used) = Response::decode(&bytes, wire::MAX_VAR_LEN).expect(name).expect(name);
        assert_eq!(used, bytes.len(), "{name}");
        assert_eq!(decoded, res, "decoding response {name}");
    }
}

#[test]
fn handshake_vectors_encode_and_decode() {
    let v = json("vectors.json");
    let frames = list(&v, "handshake");
    assert!(frames.len() >= 15, "expected every handshake vector, got {}", frames.len());
    let mut seen = BTreeMap::new();
    for vec in frames {
        let name = str_of(vec, "name");
        let bytes = bytes_of(vec, "hex");
        let op = str_of(vec, "op");
        *seen.entry(op.to_owned()).or_insert(0) += 1;
        let status = || code_by_name(Status::ALL, str_of(vec, "status"));
        match op {
            "HELLO" => {
                let h = Hello {
                    version: u8::try_from(u64_of(vec, "version")).expect("version"),
                    flags: u16::try_from(u64_of(vec, "flags")).expect("flags"),
                    session_id: array_of(vec, "session_id_hex"),
                    client_nonce: array_of(vec, "nonce_hex"),
                };
                assert_eq!(to_hex(&h.encode()), to_hex(&bytes), "encoding {name}");
                assert_eq!(Hello::decode(&bytes), Ok(h), "decoding {name}");
            }
            "CHALLENGE" => {
                let c = Challenge {
                    status: status(),
                    version: u8::try_from(u64_of(vec, "version")).expect("version"),
                    flags: u8::try_from(u64_of(vec, "flags")).expect("flags"),
                    detail: u32_of(vec, "detail"),
                    server_nonce: array_of(vec, "nonce_hex"),
                    data: bytes_of(vec, "data_hex"),
                };
                let mut out = Vec::new();
                c.encode(&mut out);
                assert_eq!(to_hex(&out), to_hex(&bytes), "encoding {name}");
                assert_eq!(Challenge::frame_size(&bytes[..4]), Ok(Some(bytes.len())), "{name}");
                assert_eq!(Challenge::decode(&bytes), Ok(c), "decoding {name}");
            }
            "AUTH" => {
                let a = Auth { client_proof: array_of(vec, "proof_hex") };
                assert_eq!(to_hex(&a.encode()), to_hex(&bytes), "encoding {name}");
                assert_eq!(Auth::decode(&bytes), Ok(a), "decoding {name}");
            }
            "WELCOME" => {
                let w = Welcome {
                    status: status(),
                    flags: u8::try_from(u64_of(vec, "flags")).expect("flags"),
                    detail: u32_of(vec, "detail"),
                    session_grace_ms: u32_of(vec, "session_grace_ms"),
                    state_id: array_of(vec, "state_id_hex"),
                    server_proof: array_of(vec, "proof_hex"),
                };
                assert_eq!(to_hex(&w.encode()), to_hex(&bytes), "encoding {name}");
                assert_eq!(Welcome::decode(&bytes), Ok(w), "decoding {name}");
            }
            other => panic!("unknown handshake op {other} in {name}"),
        }
    }
    for op in ["HELLO", "CHALLENGE", "AUTH", "WELCOME"] {
        assert!(seen.contains_key(op), "no {op} vector");
    }
}

#[test]
fn auth_vectors_compute_both_proofs() {
    let v = json("vectors.json");
    let cases = list(&v, "auth");
    assert!(cases.len() >= 2);
    for case in cases {
        let name = str_of(case, "name");
        let token = str_of(case, "token_utf8").as_bytes();
        let session: [u8; 16] = array_of(case, "session_id_hex");
        let cn: [u8; 32] = array_of(case, "client_nonce_hex");
        let sn: [u8; 32] = array_of(case, "server_nonce_hex");
        let client = wire::client_proof(token, &session, &cn, &sn);
        assert_eq!(to_hex(&client), str_of(case, "client_proof_hex"), "client proof {name}");
        let mut w = Welcome {
            status: Status::OK,
            flags: u8::try_from(u64_of(case, "welcome_flags")).expect("flags"),
            detail: 0,
            session_grace_ms: u32_of(case, "session_grace_ms"),
            state_id: array_of(case, "state_id_hex"),
            server_proof: [0; 32],
        };
        let server = wire::server_proof(token, &session, &cn, &sn, &w);
        assert_eq!(to_hex(&server), str_of(case, "server_proof_hex"), "server proof {name}");
        w.server_proof = server;
        assert!(wire::verify_server_proof(token, &session, &cn, &sn, &w), "{name}");
        // A forged resumed flag, state id, or another token must not verify.
        let mut forged = w;
        forged.flags ^= wire::WELCOME_RESUMED;
        assert!(!wire::verify_server_proof(token, &session, &cn, &sn, &forged), "{name}: flags");
        let mut forged = w;
        forged.state_id[0] ^= 1;
        assert!(!wire::verify_server_proof(token, &session, &cn, &sn, &forged), "{name}: state id");
        assert!(!wire::verify_server_proof(b"another token", &session, &cn, &sn, &w), "{name}: token");
    }
}

#[test]
fn malformed_vectors_are_rejected() {
    let v = json("vectors.json");
    let cases = list(&v, "malformed");
    assert!(cases.len() >= 7);
    for case in cases {
        let name = str_of(case, "name");
        let bytes = bytes_of(case, "hex");
        let max = usize::try_from(u64_of(case, "max_var")).expect("max_var");
        let got: Result<bool, FrameError> = match str_of(case, "kind") {
            "request" => Request::decode(&bytes, max).map(|r| r.is_some()),
            "response" => Response::decode(&bytes, max).map(|r| r.is_some()),
            other => panic!("unknown kind {other} in {name}"),
        };
        match str_of(case, "error") {
            "short" => assert_eq!(got, Ok(false), "{name}: an incomplete frame means read more"),
            "length" => assert_eq!(got, Err(FrameError::Length), "{name}"),
            "too_large" => {
                assert_eq!(got, Err(FrameError::TooLarge), "{name}");
                assert_eq!(wire::frame_size(&bytes[..4], max), Err(FrameError::TooLarge), "{name}: from 4 bytes");
            }
            other => panic!("unknown error {other} in {name}"),
        }
    }
}

/// Arbitrary bytes never make a decoder panic, and whatever decodes re-encodes to the same bytes.
#[test]
fn decoders_survive_arbitrary_bytes() {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..20_000 {
        let len = (next() % 96) as usize;
        let mut buf: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if round % 2 == 0 && len >= 8 {
            // Make the length field plausible half of the time.
            let l = (len as u32).saturating_sub(4);
            buf[..4].copy_from_slice(&l.to_be_bytes());
            buf[6..8].copy_from_slice(&(l.saturating_sub(28) as u16).to_be_bytes());
        }
        if let Ok(Some((r, n))) = Response::decode(&buf, 256) {
            let mut out = Vec::new();
            r.encode(&mut out);
            assert_eq!(out, buf[..n]);
        }
        if let Ok(Some((r, n))) = Request::decode(&buf, 256) {
            let mut out = Vec::new();
            r.encode(&mut out);
            assert_eq!(out, buf[..n]);
        }
        let _ = Challenge::decode(&buf);
        let _ = Welcome::decode(&buf);
        let _ = Hello::decode(&buf);
        let _ = Auth::decode(&buf);
        let _ = wire::InspectData::decode(&buf);
    }
}
