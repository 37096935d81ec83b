//! The crate's error type.

use std::fmt;
use std::sync::Arc;
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

/// The cause an [`Error`] wraps, for [`std::error::Error::source`]: an I/O or TLS error, or the
/// last connect error of a call that timed out while the client reconnected. Shared, so that the
/// error stays `Clone`.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong, one variant per protocol status and per client-side condition.
///
/// Keys in messages are shown as text when they are valid UTF-8, else as `0x`-prefixed hex; a key
/// longer than 64 bytes is cut, with its length. Every message is one line. The variants that
/// wrap a cause (an I/O error, a TLS error, the last connect error) return it from
/// [`source`](std::error::Error::source).
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
        /// The server's message, when it says why (such as its start-up wait after a restart);
        /// empty otherwise.
        message: String,
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
    /// handshake, or a node that is not the leader refused it).
    Unavailable {
        /// Each endpoint tried and why it failed.
        message: String,
        /// The I/O error behind it, when there is one (the last endpoint's that had one).
        source: Option<Cause>,
    },
    /// The TLS handshake failed or TLS could not be configured (including TLS spoken to a
    /// plaintext server and back).
    Tls {
        /// The endpoint, or empty for a configuration error.
        endpoint: String,
        /// What failed.
        message: String,
        /// The rustls or I/O error behind it, when there is one.
        source: Option<Cause>,
    },
    /// A request timeout passed (a frozen or half-open server, or a call's own timeout passed
    /// while the client reconnected: then `source` is the last connect error, an [`Error`]).
    Timeout {
        /// What timed out.
        what: String,
        /// The timeout.
        timeout: Duration,
        /// The last connect error, when the call timed out while the client had no connection.
        source: Option<Cause>,
    },
    /// The connection dropped and the request's fate is unknown: the session could not be
    /// resumed (the server ended it, or its grace passed).
    ConnectionLost {
        /// What happened.
        message: String,
        /// The I/O error that ended the connection, when there is one.
        source: Option<Cause>,
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
        Error::ConnectionLost { message: message.into(), source: None }
    }
}

/// Writes `prefix`, then `: message` unless the message says nothing more than the prefix: a
/// server's message that repeats it ("server shutting down") is not said twice, and one that
/// begins with it is shown once, whole.
fn write_prefixed(f: &mut fmt::Formatter<'_>, prefix: &str, message: &str) -> fmt::Result {
    let message = one_line(message);
    let m = message.trim();
    if m.is_empty() || prefix.to_ascii_lowercase().contains(&m.to_ascii_lowercase()) {
        return f.write_str(prefix);
    }
    if m.get(..prefix.len()).is_some_and(|head| head.eq_ignore_ascii_case(prefix)) {
        return f.write_str(m);
    }
    write!(f, "{prefix}: {m}")
}

/// `s` on one line: line breaks (from a server's message) become spaces.
fn one_line(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains(['\n', '\r']) {
        std::borrow::Cow::Owned(s.split(['\n', '\r']).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" "))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotAcquired { key, wait, message } => {
                let base = if wait.is_zero() {
                    format!("lock {key:?} not acquired")
                } else {
                    format!("lock {key:?} not acquired within the wait timeout of {wait:?}")
                };
                match (message.trim().is_empty(), wait.is_zero()) {
                    (true, true) => write!(f, "{base}: it is held by another holder"),
                    (true, false) => f.write_str(&base),
                    (false, _) => write_prefixed(f, &base, message),
                }
            }
            Error::Cancelled { key } => write!(f, "acquire of {key:?} cancelled"),
            Error::NotHeld { key, token } => {
                write!(f, "token {token} does not hold {key:?} (expired, released or never issued)")
            }
            Error::LockLost { key, token, reason } => write!(f, "lock {key:?} (token {token}) lost: {reason}"),
            Error::InvalidArgument { field, message } => match field {
                Some(field) => write_prefixed(f, &format!("invalid argument ({field})"), message),
                None => write_prefixed(f, "invalid argument", message),
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
            Error::Unavailable { message, .. } => write_prefixed(f, "no endpoint available", message),
            Error::Tls { endpoint, message, .. } => {
                if endpoint.is_empty() {
                    write_prefixed(f, "TLS configuration", message)
                } else {
                    write_prefixed(f, &format!("TLS with {endpoint} failed"), message)
                }
            }
            Error::Timeout { what, timeout, source } => {
                write!(f, "{what} timed out after {timeout:?}")?;
                match source {
                    // The call waited for a connection: say why there was none.
                    Some(cause) => write!(f, " while the client reconnected (last connect error: {cause})"),
                    None => Ok(()),
                }
            }
            Error::ConnectionLost { message, .. } => write_prefixed(f, "connection lost", message),
            Error::ServerRestarted => f.write_str(
                "server restarted (its state id changed): its locks and queues are gone and the request was not sent again",
            ),
            Error::Busy { limit, message } => write_prefixed(f, &format!("server busy ({limit})"), message),
            Error::ShuttingDown { message } => write_prefixed(f, "server shutting down", message),
            Error::Closed => f.write_str("client closed"),
            Error::Protocol { message } => write_prefixed(f, "protocol error", message),
            Error::Status { op, status, detail, message } => {
                write_prefixed(f, &format!("unexpected answer {status} (detail {detail}) to {op}"), message)
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Unavailable { source, .. }
            | Error::Tls { source, .. }
            | Error::Timeout { source, .. }
            | Error::ConnectionLost { source, .. } => {
                source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
            }
            _ => None,
        }
    }
}

/// The most of a key that a message shows, in bytes (as the Go client).
pub(crate) const MAX_KEY_IN_MESSAGE: usize = 64;

/// Renders a key for messages: text when it is valid UTF-8, else `0x`-prefixed hex; a key longer
/// than [`MAX_KEY_IN_MESSAGE`] bytes is cut (never inside a character), with its length.
pub(crate) fn key_text(key: &[u8]) -> String {
    let mut cut = &key[..key.len().min(MAX_KEY_IN_MESSAGE)];
    let utf8 = std::str::from_utf8(key).is_ok();
    if utf8 {
        while std::str::from_utf8(cut).is_err() {
            cut = &cut[..cut.len() - 1];
        }
    }
    let mut s = match std::str::from_utf8(cut) {
        Ok(text) if utf8 => text.to_owned(),
        _ => {
            let mut s = String::with_capacity(2 + 2 * cut.len());
            s.push_str("0x");
            for b in cut {
                s.push_str(&format!("{b:02x}"));
            }
            s
        }
    };
    if cut.len() < key.len() {
        s.push_str(&format!("…({} bytes)", key.len()));
    }
    s
}
