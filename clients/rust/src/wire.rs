//! The protocol's bytes: frame layouts, code tables and the handshake's proofs.
//!
//! This module is the codec the [`Client`](crate::Client) is built on, public for tools and tests
//! that speak the protocol directly (a fake server, a proxy, a fuzzer). It does no I/O. Every
//! layout and rule is PROTOCOL.md's, version 1: all integers big-endian, every frame a 4-byte
//! length followed by that many bytes, and after the handshake a 32-byte header plus a variable
//! part (a key in requests, data in responses).
//!
//! Code sets are newtypes with associated constants ([`Op::ACQUIRE`], [`Status::NOT_HELD`], ...)
//! rather than closed enums: the protocol may add codes within version 1, and a decoder must
//! carry an unknown one through instead of failing.
//!
//! ```
//! use ticketing::wire::{self, Op, Request};
//!
//! let mut frame = Vec::new();
//! Request { op: Op::PING, id: 8, ..Request::default() }.encode(&mut frame);
//! assert_eq!(frame.len(), wire::HEADER_LEN);
//! let (decoded, used) = Request::decode(&frame, 256).unwrap().unwrap();
//! assert_eq!((decoded.op, decoded.id, used), (Op::PING, 8, frame.len()));
//! ```

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Protocol version sent in `HELLO`.
pub const VERSION: u8 = 1;
/// Bytes in the header of every frame after the handshake (length field included).
pub const HEADER_LEN: usize = 32;
/// Bytes of the `HELLO` frame.
pub const HELLO_LEN: usize = 56;
/// Bytes of the `CHALLENGE` frame without its data.
pub const CHALLENGE_LEN: usize = 48;
/// Bytes of the `AUTH` frame.
pub const AUTH_LEN: usize = 40;
/// Bytes of the `WELCOME` frame.
pub const WELCOME_LEN: usize = 64;
/// Bytes of a session id.
pub const SESSION_ID_LEN: usize = 16;
/// Bytes of a state id.
pub const STATE_ID_LEN: usize = 16;
/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a handshake proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Bytes of the data of an `INSPECT` answer.
pub const INSPECT_DATA_LEN: usize = 12;
/// The most data a `CHALLENGE` may carry.
pub const MAX_CHALLENGE_DATA: usize = 1024;
/// The most bytes of key or data a frame may carry (the format's ceiling).
pub const MAX_VAR_LEN: usize = 65535;
/// The longest key a client may send (the server's own limit is usually lower: 256 by default).
pub const MAX_KEY_LEN: usize = 65535;
/// `wait_ms` meaning "wait without limit".
pub const WAIT_FOREVER: u32 = u32::MAX;
/// `CHALLENGE` flag bit: the server holds a token and requires the client's proof.
pub const CHALLENGE_AUTH_REQUIRED: u8 = 1;
/// `WELCOME` flag bit: the session named in `HELLO` was live and is resumed.
pub const WELCOME_RESUMED: u8 = 1;
/// A client sends `ACK` at least once per this many answers.
pub const ACK_EVERY: u32 = 1024;
/// Bound on the rate error of each clock, in parts per million (ρ = 0.001).
pub const CLOCK_RATE_BOUND_PPM: u32 = 1000;
/// The lost signal fires `min(LOST_MARGIN_MS, lease / 10)` before the local deadline.
pub const LOST_MARGIN_MS: u32 = 5;
/// While it holds a lock, a client compares its deadlines with the clock at least this often
/// (timers stop while the host is suspended; the clock of the deadlines does not).
pub const LOST_CHECK_MS: u32 = 250;

macro_rules! code_set {
    (
        $(#[$meta:meta])*
        $name:ident($repr:ty) {
            $( $(#[$cmeta:meta])* $konst:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub $repr);

        impl $name {
            $( $(#[$cmeta])* pub const $konst: $name = $name($value); )*

            /// Every code this crate knows, with its name as in `protocol/constants.json`.
            pub const ALL: &'static [(&'static str, $name)] = &[ $( (stringify!($konst), $name::$konst), )* ];

            /// The code's name as in `protocol/constants.json`, or `None` for a code this
            /// crate does not know.
            pub fn name(self) -> Option<&'static str> {
                Self::ALL.iter().find(|(_, c)| *c == self).map(|(n, _)| *n)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "{}({})", stringify!($name), self.0),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(self, f)
            }
        }
    };
}

code_set! {
    /// An operation code (byte 4 of every frame).
    Op(u8) {
        /// Client -> server, first frame: version, session id, client nonce.
        HELLO = 0x01,
        /// Server -> client: status, server version, flags, detail, server nonce, data.
        CHALLENGE = 0x02,
        /// Client -> server: the client proof.
        AUTH = 0x03,
        /// Server -> client: status, resumed flag, session grace, state id, server proof.
        WELCOME = 0x04,
        /// Take a key for `lease_ms`, waiting up to `wait_ms` in the FIFO queue.
        ACQUIRE = 0x10,
        /// Release a key held with a token.
        RELEASE = 0x11,
        /// Set the lease of a key held with a token to `lease_ms` from now.
        EXTEND = 0x12,
        /// Withdraw this session's `ACQUIRE` whose request id is in `token`.
        CANCEL = 0x13,
        /// Liveness; answered `OK`.
        PING = 0x14,
        /// Report a key's state.
        INSPECT = 0x15,
        /// `token` = the lowest request id still awaited: the server may drop outcomes below it.
        ACK = 0x16,
        /// Server push: the lock on the key in `data` with `token` is lost; `detail` is the reason.
        EXPIRED = 0x20,
        /// Server push: this node is going away; `data` is the leader's address.
        GOAWAY = 0x21,
    }
}

code_set! {
    /// A status code (byte 5 of a response).
    Status(u8) {
        /// Done.
        OK = 0,
        /// The wait timeout passed, or a try found the key taken; nothing is held.
        TIMED_OUT = 1,
        /// The token is not the key's current holder; nothing changed.
        NOT_HELD = 2,
        /// Bad request; `detail` is the field code.
        INVALID = 3,
        /// This node is not the leader; `data` is the leader's address (may be empty).
        NOT_LEADER = 4,
        /// A server limit was reached; `detail` is the limit code.
        BUSY = 5,
        /// The server is stopping.
        SHUTTING_DOWN = 6,
        /// The handshake proof did not verify.
        AUTH_FAILED = 7,
        /// The server does not speak the client's version.
        UNSUPPORTED_VERSION = 8,
        /// The `ACQUIRE` was withdrawn by `CANCEL`.
        CANCELLED = 9,
    }
}

code_set! {
    /// The field an `INVALID` answer blames (its `detail`).
    InvalidField(u32) {
        /// Frame length inconsistent with its layout or above the ceiling; the connection closes.
        LENGTH = 1,
        /// Unknown operation.
        OP = 2,
        /// Reserved flags are not zero.
        FLAGS = 3,
        /// Key empty or longer than the server's limit.
        KEY = 4,
        /// `lease_ms` outside the server's range.
        LEASE = 5,
        /// Reserved; never sent in version 1.
        WAIT = 6,
        /// Token zero where one is needed.
        TOKEN = 7,
        /// Request id zero, already used on this connection, or a retry that differs.
        REQUEST_ID = 8,
        /// Reserved: handshake frames with a bad layout close without an answer.
        HANDSHAKE = 9,
        /// `HELLO`'s session id is all zero.
        SESSION = 10,
    }
}

code_set! {
    /// The limit a `BUSY` answer names (its `detail`).
    BusyLimit(u32) {
        /// Too many connections (`CHALLENGE`).
        CONNECTIONS = 1,
        /// The key's queue is full.
        WAITERS_PER_KEY = 2,
        /// The server's total number of queued acquires is reached.
        WAITERS_TOTAL = 3,
        /// The server's number of distinct keys is reached.
        LOCKS = 4,
        /// The session has too many queued acquires or stored outcomes.
        INFLIGHT = 5,
        /// Tokens or the restart horizon cannot be made durable now.
        STORAGE = 6,
        /// Too many sessions (`WELCOME`).
        SESSIONS = 7,
    }
}

code_set! {
    /// Why an `EXPIRED` push was sent (its `detail`).
    ExpiredReason(u32) {
        /// The lease ran out and the server reclaimed the lock.
        LEASE = 1,
        /// The server is stopping; the lock will not survive the stop.
        STOPPING = 2,
    }
}

code_set! {
    /// Why a `GOAWAY` push was sent (its `detail`).
    GoawayReason(u32) {
        /// This node is no longer the leader.
        LEADERSHIP = 1,
        /// This cluster node is stopping for maintenance.
        STOPPING = 2,
    }
}

code_set! {
    /// Flag bits of an `INSPECT` answer (the last u32 of its data).
    InspectFlags(u32) {
        /// Somebody holds the key.
        HELD = 1,
        /// The request's token is the holder's token.
        TOKEN_MATCH = 2,
        /// The asking session holds the key.
        SESSION = 4,
        /// The key waits for storage before its next grant.
        STALLED = 8,
        /// The server is in its start-up wait: no grant before it ends (the lock-delay left says
        /// when).
        STARTUP = 16,
    }
}

impl InspectFlags {
    /// Whether every bit of `other` is set in `self`.
    pub fn contains(self, other: InspectFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// Why bytes could not be decoded as a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The length field, or a key/data length, disagrees with the layout.
    Length,
    /// The length field is above what the reader accepts (detected from the first 4 bytes).
    TooLarge,
    /// The frame's op is not the one the layout expects (handshake frames).
    Op,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameError::Length => "frame length does not match its layout",
            FrameError::TooLarge => "frame length above the reader's limit",
            FrameError::Op => "unexpected operation in frame",
        })
    }
}

impl std::error::Error for FrameError {}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Finds the extent of the header-framed frame (request or response) at the start of `buf`:
/// `Ok(None)` when fewer than 4 bytes are there (read more), else the whole frame's size in bytes,
/// which may be more than `buf` holds. `max_var` is the reader's limit on the key or data length
/// (at most [`MAX_VAR_LEN`]); a length field above `28 + max_var` is [`FrameError::TooLarge`]
/// and one below 28 is [`FrameError::Length`], both known from the first 4 bytes alone.
pub fn frame_size(buf: &[u8], max_var: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = be_u32(buf, 0) as usize;
    if len > HEADER_LEN - 4 + max_var.min(MAX_VAR_LEN) {
        return Err(FrameError::TooLarge);
    }
    if len < HEADER_LEN - 4 {
        return Err(FrameError::Length);
    }
    Ok(Some(len + 4))
}

/// A request frame (client -> server), borrowing its key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request<'a> {
    /// Operation.
    pub op: Op,
    /// Reserved flags; 0.
    pub flags: u8,
    /// Request id: non-zero, in send order per session.
    pub id: u64,
    /// `RELEASE`/`EXTEND`: the fencing token; `CANCEL`: the request id to withdraw; `INSPECT`:
    /// 0 or a token to check; `ACK`: the lowest id still awaited.
    pub token: u64,
    /// `ACQUIRE`, `EXTEND`: the lease in milliseconds.
    pub lease_ms: u32,
    /// `ACQUIRE`: how long to wait in the queue, ms (0: try once; [`WAIT_FOREVER`]).
    pub wait_ms: u32,
    /// The key (empty for `CANCEL`, `PING`, `ACK`).
    pub key: &'a [u8],
}

impl<'a> Request<'a> {
    /// Appends the encoded frame to `out`. The key must be at most [`MAX_VAR_LEN`] bytes
    /// (longer keys are cut to that length; the client checks keys before encoding).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let key = &self.key[..self.key.len().min(MAX_VAR_LEN)];
        // The header built whole, then appended at once (one capacity check, not ten).
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&((HEADER_LEN - 4 + key.len()) as u32).to_be_bytes());
        h[4] = self.op.0;
        h[5] = self.flags;
        h[6..8].copy_from_slice(&(key.len() as u16).to_be_bytes());
        h[8..16].copy_from_slice(&self.id.to_be_bytes());
        h[16..24].copy_from_slice(&self.token.to_be_bytes());
        h[24..28].copy_from_slice(&self.lease_ms.to_be_bytes());
        h[28..32].copy_from_slice(&self.wait_ms.to_be_bytes());
        out.reserve(HEADER_LEN + key.len());
        out.extend_from_slice(&h);
        out.extend_from_slice(key);
    }

    /// Decodes the request frame at the start of `buf`: `Ok(None)` when the frame is not complete
    /// yet, else the request (a view into `buf`) and the number of bytes it used. `max_key` is the
    /// reader's limit on the key length.
    pub fn decode(buf: &'a [u8], max_key: usize) -> Result<Option<(Request<'a>, usize)>, FrameError> {
        let Some(size) = frame_size(buf, max_key)? else { return Ok(None) };
        if buf.len() < size {
            return Ok(None);
        }
        let key_len = be_u16(buf, 6) as usize;
        if HEADER_LEN + key_len != size {
            return Err(FrameError::Length);
        }
        let req = Request {
            op: Op(buf[4]),
            flags: buf[5],
            id: be_u64(buf, 8),
            token: be_u64(buf, 16),
            lease_ms: be_u32(buf, 24),
            wait_ms: be_u32(buf, 28),
            key: &buf[HEADER_LEN..size],
        };
        Ok(Some((req, size)))
    }
}

/// A response frame (server -> client), borrowing its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Response<'a> {
    /// The request's op; [`Op::EXPIRED`]/[`Op::GOAWAY`] for pushes; 0 for `INVALID`/`LENGTH`.
    pub op: Op,
    /// Status.
    pub status: Status,
    /// The request's id; 0 for pushes.
    pub id: u64,
    /// `ACQUIRE OK`, `EXTEND OK`: the token; `EXPIRED`: the lost lock's token; `INSPECT`: the
    /// holder's token when shown.
    pub token: u64,
    /// `ACQUIRE OK`, `EXTEND OK`: the lease now running, ms; `INSPECT`: ms left on the lease.
    pub lease_ms: u32,
    /// Op- and status-specific detail (queued ms, field or limit code, reason, ...).
    pub detail: u32,
    /// `EXPIRED`: the key; `GOAWAY`, `NOT_LEADER`: the leader's address; `INSPECT`: 12 bytes;
    /// errors: a message.
    pub data: &'a [u8],
}

impl<'a> Response<'a> {
    /// Appends the encoded frame to `out` (data longer than [`MAX_VAR_LEN`] is cut).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let data = &self.data[..self.data.len().min(MAX_VAR_LEN)];
        out.reserve(HEADER_LEN + data.len());
        out.extend_from_slice(&((HEADER_LEN - 4 + data.len()) as u32).to_be_bytes());
        out.push(self.op.0);
        out.push(self.status.0);
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.token.to_be_bytes());
        out.extend_from_slice(&self.lease_ms.to_be_bytes());
        out.extend_from_slice(&self.detail.to_be_bytes());
        out.extend_from_slice(data);
    }

    /// Decodes the response frame at the start of `buf`: `Ok(None)` when the frame is not
    /// complete yet, else the response (a view into `buf`) and the number of bytes it used.
    /// `max_data` is the reader's limit on the data length.
    pub fn decode(buf: &'a [u8], max_data: usize) -> Result<Option<(Response<'a>, usize)>, FrameError> {
        let Some(size) = frame_size(buf, max_data)? else { return Ok(None) };
        if buf.len() < size {
            return Ok(None);
        }
        let data_len = be_u16(buf, 6) as usize;
        if HEADER_LEN + data_len != size {
            return Err(FrameError::Length);
        }
        let res = Response {
            op: Op(buf[4]),
            status: Status(buf[5]),
            id: be_u64(buf, 8),
            token: be_u64(buf, 16),
            lease_ms: be_u32(buf, 24),
            detail: be_u32(buf, 28),
            data: &buf[HEADER_LEN..size],
        };
        Ok(Some((res, size)))
    }
}

/// The 12 data bytes of an `INSPECT` answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InspectData {
    /// Milliseconds since the lock was granted.
    pub held_for_ms: u32,
    /// Milliseconds of lock-delay left.
    pub lock_delay_ms: u32,
    /// Flag bits.
    pub flags: InspectFlags,
}

impl InspectData {
    /// Decodes the data of an `INSPECT` answer; `None` unless it is exactly 12 bytes.
    pub fn decode(data: &[u8]) -> Option<InspectData> {
        if data.len() != INSPECT_DATA_LEN {
            return None;
        }
        Some(InspectData {
            held_for_ms: be_u32(data, 0),
            lock_delay_ms: be_u32(data, 4),
            flags: InspectFlags(be_u32(data, 8)),
        })
    }

    /// Appends the 12 encoded bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.held_for_ms.to_be_bytes());
        out.extend_from_slice(&self.lock_delay_ms.to_be_bytes());
        out.extend_from_slice(&self.flags.0.to_be_bytes());
    }
}

/// The `HELLO` frame (client -> server, 56 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version ([`VERSION`]).
    pub version: u8,
    /// Reserved; 0.
    pub flags: u16,
    /// The client's session id (never all zero).
    pub session_id: [u8; SESSION_ID_LEN],
    /// Fresh random bytes for this connection.
    pub client_nonce: [u8; NONCE_LEN],
}

impl Hello {
    /// Returns the encoded 56 bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..4].copy_from_slice(&((HELLO_LEN - 4) as u32).to_be_bytes());
        b[4] = Op::HELLO.0;
        b[5] = self.version;
        b[6..8].copy_from_slice(&self.flags.to_be_bytes());
        b[8..24].copy_from_slice(&self.session_id);
        b[24..56].copy_from_slice(&self.client_nonce);
        b
    }

    /// Decodes a whole `HELLO` frame (exactly 56 bytes with op `HELLO`).
    pub fn decode(b: &[u8]) -> Result<Hello, FrameError> {
        if b.len() != HELLO_LEN || be_u32(b, 0) as usize != HELLO_LEN - 4 {
            return Err(FrameError::Length);
        }
        if b[4] != Op::HELLO.0 {
            return Err(FrameError::Op);
        }
        Ok(Hello { version: b[5], flags: be_u16(b, 6), session_id: array(b, 8), client_nonce: array(b, 24) })
    }
}

/// The `CHALLENGE` frame (server -> client, 48 + n bytes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Challenge {
    /// `OK`, or why the server refuses the connection.
    pub status: Status,
    /// The server's protocol version.
    pub version: u8,
    /// Bit 0 [`CHALLENGE_AUTH_REQUIRED`].
    pub flags: u8,
    /// `INVALID`: field code; `BUSY`: limit code; else 0.
    pub detail: u32,
    /// Random when auth is required, else zero.
    pub server_nonce: [u8; NONCE_LEN],
    /// `NOT_LEADER`: the leader's address (may be empty); other errors: a message.
    pub data: Vec<u8>,
}

impl Challenge {
    /// Whether the server requires a token.
    pub fn auth_required(&self) -> bool {
        self.flags & CHALLENGE_AUTH_REQUIRED != 0
    }

    /// Appends the encoded frame to `out` (data longer than [`MAX_CHALLENGE_DATA`] is cut).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let data = &self.data[..self.data.len().min(MAX_CHALLENGE_DATA)];
        out.extend_from_slice(&((CHALLENGE_LEN - 4 + data.len()) as u32).to_be_bytes());
        out.push(Op::CHALLENGE.0);
        out.push(self.status.0);
        out.push(self.version);
        out.push(self.flags);
        out.extend_from_slice(&self.detail.to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.server_nonce);
        out.extend_from_slice(data);
    }

    /// The size of the `CHALLENGE` at the start of `buf` from its length field: `Ok(None)` with
    /// fewer than 4 bytes, an error when the length cannot be a `CHALLENGE`.
    pub fn frame_size(buf: &[u8]) -> Result<Option<usize>, FrameError> {
        if buf.len() < 4 {
            return Ok(None);
        }
        let len = be_u32(buf, 0) as usize;
        if len > CHALLENGE_LEN - 4 + MAX_CHALLENGE_DATA {
            return Err(FrameError::TooLarge);
        }
        if len < CHALLENGE_LEN - 4 {
            return Err(FrameError::Length);
        }
        Ok(Some(len + 4))
    }

    /// Decodes a whole `CHALLENGE` frame.
    pub fn decode(b: &[u8]) -> Result<Challenge, FrameError> {
        match Challenge::frame_size(b)? {
            Some(size) if size == b.len() => {}
            _ => return Err(FrameError::Length),
        }
        if b[4] != Op::CHALLENGE.0 {
            return Err(FrameError::Op);
        }
        let n = be_u16(b, 12) as usize;
        if CHALLENGE_LEN + n != b.len() {
            return Err(FrameError::Length);
        }
        Ok(Challenge {
            status: Status(b[5]),
            version: b[6],
            flags: b[7],
            detail: be_u32(b, 8),
            server_nonce: array(b, 16),
            data: b[CHALLENGE_LEN..].to_vec(),
        })
    }
}

/// The `AUTH` frame (client -> server, 40 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Auth {
    /// The client proof; all zero when the server does not require auth.
    pub client_proof: [u8; PROOF_LEN],
}

impl Auth {
    /// Returns the encoded 40 bytes.
    pub fn encode(&self) -> [u8; AUTH_LEN] {
        let mut b = [0u8; AUTH_LEN];
        b[0..4].copy_from_slice(&((AUTH_LEN - 4) as u32).to_be_bytes());
        b[4] = Op::AUTH.0;
        b[8..40].copy_from_slice(&self.client_proof);
        b
    }

    /// Decodes a whole `AUTH` frame.
    pub fn decode(b: &[u8]) -> Result<Auth, FrameError> {
        if b.len() != AUTH_LEN || be_u32(b, 0) as usize != AUTH_LEN - 4 {
            return Err(FrameError::Length);
        }
        if b[4] != Op::AUTH.0 {
            return Err(FrameError::Op);
        }
        Ok(Auth { client_proof: array(b, 8) })
    }
}

/// The `WELCOME` frame (server -> client, 64 bytes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Welcome {
    /// `OK`, or why the server refuses the connection.
    pub status: Status,
    /// Bit 0 [`WELCOME_RESUMED`].
    pub flags: u8,
    /// `BUSY`: limit code; else 0.
    pub detail: u32,
    /// How long the server keeps the session after its connection drops (0: no resume).
    pub session_grace_ms: u32,
    /// The lock state this server serves.
    pub state_id: [u8; STATE_ID_LEN],
    /// The server proof; zero without auth or unless `OK`.
    pub server_proof: [u8; PROOF_LEN],
}

impl Welcome {
    /// Whether the session was resumed.
    pub fn resumed(&self) -> bool {
        self.flags & WELCOME_RESUMED != 0
    }

    /// Returns the encoded 64 bytes.
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        b[0..4].copy_from_slice(&((WELCOME_LEN - 4) as u32).to_be_bytes());
        b[4] = Op::WELCOME.0;
        b[5..32].copy_from_slice(&self.signed_part());
        b[32..64].copy_from_slice(&self.server_proof);
        b
    }

    /// Bytes 5..=31 of the encoded frame: the part the server proof covers.
    pub fn signed_part(&self) -> [u8; 27] {
        let mut b = [0u8; 27];
        b[0] = self.status.0;
        b[1] = self.flags;
        b[3..7].copy_from_slice(&self.detail.to_be_bytes());
        b[7..11].copy_from_slice(&self.session_grace_ms.to_be_bytes());
        b[11..27].copy_from_slice(&self.state_id);
        b
    }

    /// Decodes a whole `WELCOME` frame.
    pub fn decode(b: &[u8]) -> Result<Welcome, FrameError> {
        if b.len() != WELCOME_LEN || be_u32(b, 0) as usize != WELCOME_LEN - 4 {
            return Err(FrameError::Length);
        }
        if b[4] != Op::WELCOME.0 {
            return Err(FrameError::Op);
        }
        Ok(Welcome {
            status: Status(b[5]),
            flags: b[6],
            detail: be_u32(b, 8),
            session_grace_ms: be_u32(b, 12),
            state_id: array(b, 16),
            server_proof: array(b, 32),
        })
    }
}

type HmacSha256 = Hmac<Sha256>;

const CLIENT_LABEL: &[u8] = b"ticketing/1 client";
const SERVER_LABEL: &[u8] = b"ticketing/1 server";

fn proof_mac(token: &[u8], label: &[u8], session_id: &[u8; 16], cn: &[u8; 32], sn: &[u8; 32]) -> HmacSha256 {
    // HMAC accepts keys of any length; new_from_slice cannot fail for it.
    let mut mac = match HmacSha256::new_from_slice(token) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    mac.update(label);
    mac.update(session_id);
    mac.update(cn);
    mac.update(sn);
    mac
}

/// `client_proof = HMAC-SHA256(token, "ticketing/1 client" || session_id || client_nonce || server_nonce)`.
pub fn client_proof(
    token: &[u8],
    session_id: &[u8; SESSION_ID_LEN],
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
) -> [u8; PROOF_LEN] {
    proof_mac(token, CLIENT_LABEL, session_id, client_nonce, server_nonce).finalize().into_bytes().into()
}

/// `server_proof = HMAC-SHA256(token, "ticketing/1 server" || session_id || client_nonce ||
/// server_nonce || WELCOME[5..31])`, where `welcome` supplies the signed bytes.
pub fn server_proof(
    token: &[u8],
    session_id: &[u8; SESSION_ID_LEN],
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    welcome: &Welcome,
) -> [u8; PROOF_LEN] {
    let mut mac = proof_mac(token, SERVER_LABEL, session_id, client_nonce, server_nonce);
    mac.update(&welcome.signed_part());
    mac.finalize().into_bytes().into()
}

/// Checks `welcome.server_proof` in constant time.
pub fn verify_server_proof(
    token: &[u8],
    session_id: &[u8; SESSION_ID_LEN],
    client_nonce: &[u8; NONCE_LEN],
    server_nonce: &[u8; NONCE_LEN],
    welcome: &Welcome,
) -> bool {
    let mut mac = proof_mac(token, SERVER_LABEL, session_id, client_nonce, server_nonce);
    mac.update(&welcome.signed_part());
    mac.verify_slice(&welcome.server_proof).is_ok()
}
