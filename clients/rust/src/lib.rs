#![doc = include_str!("../README.md")]
// One unsafe call: clock_gettime(CLOCK_BOOTTIME) (src/clock.rs), which std does not offer.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod acquire;
mod client;
mod clock;
mod conn;
mod error;
mod lock;
mod options;
mod table;
mod timers;
pub mod wire;

pub use acquire::{Acquire, AcquireFuture};
pub use client::{Client, Inspection};
#[cfg(any(target_os = "linux", target_os = "android"))]
#[doc(hidden)]
pub use clock::boottime;
pub use error::{Cause, Error, LostReason};
pub use lock::{Lock, LockGuard};
pub use options::{
    ClientOptions, DEFAULT_CLEANUP_TIMEOUT, DEFAULT_DIAL_TIMEOUT, DEFAULT_ENDPOINT, DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_RECONNECT_BACKOFF_MAX, DEFAULT_RECONNECT_BACKOFF_MIN, DEFAULT_REQUEST_TIMEOUT, TlsOptions,
};
/// The rustls crate this client uses, for [`TlsOptions::rustls_config`].
pub use tokio_rustls::rustls;
