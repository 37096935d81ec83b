#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
mod client;
mod conn;
mod error;
mod lock;
mod options;
mod table;
mod timers;
pub mod wire;

pub use acquire::{Acquire, AcquireFuture};
pub use client::{Client, Inspection};
pub use error::{Error, LostReason};
pub use lock::{Lock, LockGuard};
pub use options::{
    ClientOptions, DEFAULT_CLEANUP_TIMEOUT, DEFAULT_DIAL_TIMEOUT, DEFAULT_ENDPOINT, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_RECONNECT_BACKOFF_MAX, DEFAULT_RECONNECT_BACKOFF_MIN, DEFAULT_REQUEST_TIMEOUT, TlsOptions,
};
/// The rustls crate this client uses, for [`TlsOptions::rustls_config`].
pub use tokio_rustls::rustls;
