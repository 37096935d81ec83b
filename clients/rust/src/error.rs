//! The crate's error type.

use std::fmt;
use std::time::Duration;

use crate::wire::{BusyLimit, InvalidField, Op, Status};

/// Why a held lock was lost: the same four names in every Ticketing client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out: the local deadline passed, or the server sent `EXPIRED` (reason
    /// `LEASE`). Displayed as `expired`.
    Expired,
    /// The server answered `NOT_HELD` to an extend or release of the lock: somebody released it
    /// with its token, or it expired. Displayed as `not held`.
    NotHeld,
    /// The client reconnected to a server with a different state id: the server restarted and
    /// forgot every lock. Displayed as `server restarted`.
    ServerRestarted,
    /// The server is stopping gracefully (`EXPIRED` reason `STOPPING`); the lock will not survive
    /// the stop. Displayed as `server stopping`.
    ServerStopping,
}

impl LostReason {
    /// The reason's name, as every client spells it: `expired`, `not held`, `server restarted`,
    /// `server stopping`.
    pub fn as_str(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::NotHeld => "not held",
            LostReason::ServerRestarted => "server restarted",
            LostReason::ServerStopping => "server stopping",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong, one variant per protocol status and per client-side condition.
///
/// Keys in messages are shown as text when they are valid UTF-8, else as `0x`-prefixed hex.
/// The enum is `#[non_exhaustive]`: match the variants you act on and keep a catch-all arm.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Error {
    /// The wait timeout passed, or a try (`wait` of zero) found the key taken (`TIMED_OUT`).
    /// Nothing is held. [`Client::try_acquire`](crate::Client::try_acquire) returns `Ok(None)`
    /// instead.
    NotAcquired {
        /// The key.
        key: String,
        /// The wait timeout the acquire was sent with.
        wait: Duration,
    },
    /// The acquire was withdrawn (`CANCELLED`).
    Cancelled {
        /// The key.
        key: String,
    },
    /// The server answered `NOT_HELD` to a release or extend by key and token: the token does not
    /// hold the key (expired, released, or never issued). Nothing changed.
    NotHeld {
        /// The key.
        key: String,
        /// The token sent.
        token: u64,
    },
    /// An operation on a [`Lock`](crate::Lock) that is lost.
    LockLost {
        /// The key.
        key: String,
        /// The lock's token.
        token: u64,
        /// Why it was lost (the first reason seen).
        reason: LostReason,
    },
    /// A bad argument: rejected locally before anything was sent (`field` names it when it maps
    /// to a protocol field), or answered `INVALID` by the server (`field` is the server's).
    InvalidArgument {
        /// The field at fault, when known.
        field: Option<InvalidField>,
        /// What is wrong.
        message: String,
    },
    /// `refuse_held` was set and this client already holds the key.
    AlreadyHeld {
        /// The key.
        key: String,
    },
    /// The handshake's authentication failed: wrong token, the server requires a token, the server
    /// does not hold the token (its proof did not verify, or it does not require one).
    AuthFailed {
        /// The endpoint.
        endpoint: String,
        /// What failed.
        message: String,
    },
    /// The server does not speak protocol version 1 (`UNSUPPORTED_VERSION`).
    UnsupportedVersion {
        /// The endpoint.
        endpoint: String,
        /// The server's protocol version.
        server_version: u8,
    },
    /// No endpoint could be connected to (refused, unreachable, dial timeout, closed during the
    /// handshake).
    Unavailable {
        /// Each endpoint tried and why it failed.
        message: String,
    },
    /// The TLS handshake failed or TLS could not be configured (including TLS spoken to a
    /// plaintext server and back).
    Tls {
        /// The endpoint, or empty for a configuration error.
        endpoint: String,
        /// What failed.
        message: String,
    },
    /// A request timeout passed (a frozen or half-open server).
    Timeout {
        /// What timed out.
        what: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The connection dropped and the request's fate is unknown: the session could not be
    /// resumed (the server ended it, or its grace passed).
    ConnectionLost {
        /// What happened.
        message: String,
    },
    /// The server's state id changed while the call was in flight: the server restarted and
    /// forgot its locks and queues; the request was not sent again.
    ServerRestarted,
    /// A server limit was reached (`BUSY`).
    Busy {
        /// The limit.
        limit: BusyLimit,
        /// The server's message.
        message: String,
    },
    /// The server is stopping (`SHUTTING_DOWN`).
    ShuttingDown {
        /// The server's message.
        message: String,
    },
    /// The client was closed.
    Closed,
    /// The server sent bytes that break the protocol; the connection was dropped.
    Protocol {
        /// What was wrong.
        message: String,
    },
    /// A status this client does not know or does not expect for the operation.
    Status {
        /// The operation.
        op: Op,
        /// The status.
        status: Status,
        /// The answer's `detail`.
        detail: u32,
        /// The server's message.
        message: String,
    },
}

impl Error {
    /// The lost reason, for [`Error::LockLost`].
    pub fn lost_reason(&self) -> Option<LostReason> {
        match self {
            Error::LockLost { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    pub(crate) fn invalid(field: Option<InvalidField>, message: impl Into<String>) -> Error {
        Error::InvalidArgument { field, message: message.into() }
    }

    pub(crate) fn connection_lost(message: impl Into<String>) -> Error {
        Error::ConnectionLost { message: message.into() }
    }
}

fn write_message(f: &mut fmt::Formatter<'_>, message: &str) -> fmt::Result {
    if message.is_empty() { Ok(()) } else { write!(f, ": {message}") }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAcquired { key, wait } => {
                if wait.is_zero() {
                    write!(f, "lock {key:?} not acquired: it is held by another holder")
                } else {
                    write!(f, "lock {key:?} not acquired within the wait timeout of {wait:?}")
                }
            }
            Error::Cancelled { key } => write!(f, "acquire of {key:?} cancelled"),
            Error::NotHeld { key, token } => {
                write!(f, "token {token} does not hold {key:?} (expired, released or never issued)")
            }
            Error::LockLost { key, token, reason } => write!(f, "lock {key:?} (token {token}) lost: {reason}"),
            Error::InvalidArgument { field, message } => match field {
                Some(field) => write!(f, "invalid argument ({field}): {message}"),
                None => write!(f, "invalid argument: {message}"),
            },
            Error::AlreadyHeld { key } => {
                write!(f, "this client already holds {key:?} (refuse_held is set)")
            }
            Error::AuthFailed { endpoint, message } => {
                write!(f, "authentication with {endpoint} failed: {message}")
            }
            Error::UnsupportedVersion { endpoint, server_version } => write!(
                f,
                "{endpoint} does not support protocol version {} (it speaks version {server_version})",
                crate::wire::VERSION
            ),
            Error::Unavailable { message } => write!(f, "no endpoint available: {message}"),
            Error::Tls { endpoint, message } => {
                if endpoint.is_empty() {
                    write!(f, "TLS configuration: {message}")
                } else {
                    write!(f, "TLS with {endpoint} failed: {message}")
                }
            }
            Error::Timeout { what, timeout } => write!(f, "{what} timed out after {timeout:?}"),
            Error::ConnectionLost { message } => write!(f, "connection lost: {message}"),
            Error::ServerRestarted => f.write_str(
                "server restarted (its state id changed): its locks and queues are gone and the request was not sent again",
            ),
            Error::Busy { limit, message } => {
                write!(f, "server busy ({limit})")?;
                write_message(f, message)
            }
            Error::ShuttingDown { message } => {
                f.write_str("server shutting down")?;
                write_message(f, message)
            }
            Error::Closed => f.write_str("client closed"),
            Error::Protocol { message } => write!(f, "protocol error: {message}"),
            Error::Status { op, status, detail, message } => {
                write!(f, "unexpected answer {status} (detail {detail}) to {op}")?;
                write_message(f, message)
            }
        }
    }
}

impl std::error::Error for Error {}

/// Renders a key for messages: text when it is valid UTF-8, else `0x`-prefixed hex.
pub(crate) fn key_text(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let mut s = String::with_capacity(2 + 2 * key.len());
            s.push_str("0x");
            for b in key {
                s.push_str(&format!("{b:02x}"));
            }
            s
        }
    }
}
