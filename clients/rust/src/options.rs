//! Client options, each with a documented default.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_rustls::rustls;

use crate::clock::WallClock;

/// The endpoint tried when none is given: a single node on loopback.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:7070";
/// Default [`ClientOptions::dial_timeout`]: 5 s.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`ClientOptions::request_timeout`]: 10 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`ClientOptions::heartbeat_interval`]: 2 s.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(2);
/// Default [`ClientOptions::cleanup_timeout`]: 5 s.
pub const DEFAULT_CLEANUP_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`ClientOptions::reconnect_backoff_min`]: 50 ms.
pub const DEFAULT_RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Default [`ClientOptions::reconnect_backoff_max`]: 2 s.
pub const DEFAULT_RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// How to connect: endpoints, token, TLS and timeouts. Build it with [`ClientOptions::new`] and
/// the chaining setters, or set the public fields.
///
/// ```
/// use std::time::Duration;
/// use ticketing::ClientOptions;
///
/// let opts = ClientOptions::new()
///     .endpoints(["10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070"])
///     .token("s3cret")
///     .request_timeout(Duration::from_secs(3));
/// assert_eq!(opts.endpoints.len(), 3);
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Server addresses (`host:port`, IPv6 as `[::1]:7070`), tried in order; a leader hint from
    /// the server (`NOT_LEADER`, `GOAWAY`) is tried first when known.
    /// Default: `["127.0.0.1:7070"]`.
    pub endpoints: Vec<String>,
    /// The shared auth token. With a token the client also refuses a server that does not
    /// require one (it could not prove it holds the token). Default: none.
    pub token: Option<String>,
    /// TLS settings; `None` for plain TCP. Default: none.
    pub tls: Option<TlsOptions>,
    /// Limit on TCP connect + TLS + handshake, per endpoint; once TCP is connected, TLS and the
    /// handshake must also finish within 2 s (a frozen node's kernel still accepts connections).
    /// Default: 5 s.
    pub dial_timeout: Duration,
    /// Limit on every request's answer, except the time an acquire spends queued (which its wait
    /// timeout and the heartbeat bound instead). Also bounds a call's wait for a connection: a call
    /// whose timeout passes while the client reconnects fails [`Error::Timeout`](crate::Error::Timeout),
    /// naming the last connect error. A short one makes calls fail fast while the server is down.
    /// Default: 10 s.
    pub request_timeout: Duration,
    /// After this long without receiving anything, send `PING` (after 250 ms at most while any
    /// request waits for its answer, a queued acquire included); a `PING` unanswered within
    /// min(this, 750 ms) gives the connection up: the client reconnects (for 2 s the node just
    /// left is neither dialled nor followed as a leader hint, unless it is the only endpoint;
    /// then it is tried last) and resumes the session, and the calls in flight keep waiting.
    /// `Duration::ZERO` disables it. Default: 2 s.
    pub heartbeat_interval: Duration,
    /// First pause between reconnect rounds (each round tries every endpoint once); it doubles
    /// up to [`reconnect_backoff_max`](Self::reconnect_backoff_max), with jitter. Default: 50 ms.
    pub reconnect_backoff_min: Duration,
    /// Longest pause between reconnect rounds. Default: 2 s.
    pub reconnect_backoff_max: Duration,
    /// When set, [`Client::close`](crate::Client::close) releases every lock still held through
    /// this client (each bounded by the request timeout). Default: off: closing leaves locks
    /// held until their lease ends.
    pub release_on_close: bool,
    /// How long an acquire cancelled through [`Acquire::cancel_on`](crate::Acquire::cancel_on),
    /// and [`Client::close`](crate::Client::close) withdrawing the acquires still queued, wait for
    /// the server to confirm the withdrawal (and for the release of a grant that raced it) before
    /// returning; the clean-up then finishes in the background. (A dropped acquire future cannot
    /// wait: its clean-up always runs in the background.) Default: 5 s.
    pub cleanup_timeout: Duration,
    /// See [`wall_clock`](Self::wall_clock).
    pub(crate) wall_clock: Option<WallClock>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            endpoints: vec![DEFAULT_ENDPOINT.to_owned()],
            token: None,
            tls: None,
            dial_timeout: DEFAULT_DIAL_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            reconnect_backoff_min: DEFAULT_RECONNECT_BACKOFF_MIN,
            reconnect_backoff_max: DEFAULT_RECONNECT_BACKOFF_MAX,
            release_on_close: false,
            cleanup_timeout: DEFAULT_CLEANUP_TIMEOUT,
            wall_clock: None,
        }
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("endpoints", &self.endpoints)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("dial_timeout", &self.dial_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("reconnect_backoff_min", &self.reconnect_backoff_min)
            .field("reconnect_backoff_max", &self.reconnect_backoff_max)
            .field("release_on_close", &self.release_on_close)
            .field("cleanup_timeout", &self.cleanup_timeout)
            .finish()
    }
}

impl ClientOptions {
    /// The defaults: `127.0.0.1:7070`, no token, no TLS.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a single endpoint (`host:port`), replacing the list.
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoints = vec![endpoint.into()];
        self
    }

    /// Sets the endpoint list, tried in order.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the shared auth token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Turns TLS on with these settings.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the dial timeout (TCP + TLS + handshake, per endpoint).
    pub fn dial_timeout(mut self, timeout: Duration) -> Self {
        self.dial_timeout = timeout;
        self
    }

    /// Sets the request timeout.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the heartbeat interval (`Duration::ZERO` disables the heartbeat).
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// Sets the reconnect backoff range.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_backoff_min = min;
        self.reconnect_backoff_max = max;
        self
    }

    /// Sets the cleanup timeout of cancelled acquires.
    pub fn cleanup_timeout(mut self, timeout: Duration) -> Self {
        self.cleanup_timeout = timeout;
        self
    }

    /// Makes [`Client::close`](crate::Client::close) release every lock still held.
    pub fn release_on_close(mut self, on: bool) -> Self {
        self.release_on_close = on;
        self
    }

    /// For the crate's tests, not part of the API: the locks' deadlines count suspend time from
    /// this wall clock, as on a system without CLOCK_BOOTTIME (each interval counts as the larger
    /// of the monotonic clock's and this clock's advance), so that a test can make the host look
    /// suspended, or step the wall clock back.
    #[doc(hidden)]
    pub fn wall_clock(mut self, wall: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.wall_clock = Some(Arc::new(wall));
        self
    }
}

/// Where PEM bytes come from: read from a file when the client connects, or given inline.
#[derive(Clone, Debug)]
pub(crate) enum Pem {
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// TLS settings: how to verify the server (a CA bundle, the system's, or your own rustls
/// configuration) and, for mutual TLS, the client certificate.
///
/// The server's name is checked against its certificate; it defaults to the host part of the
/// endpoint (an IP address is checked against the certificate's IP entries).
///
/// ```no_run
/// use ticketing::{ClientOptions, TlsOptions};
///
/// let opts = ClientOptions::new().endpoint("locks.internal:7070").tls(
///     TlsOptions::new()
///         .ca_file("/etc/ticketing/ca.pem")
///         .client_cert_file("/etc/ticketing/client.pem", "/etc/ticketing/client.key"),
/// );
/// ```
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct TlsOptions {
    pub(crate) ca: Option<Pem>,
    pub(crate) client_cert: Option<(Pem, Pem)>,
    /// The name to verify the server's certificate against, instead of the endpoint's host.
    /// Default: the endpoint's host.
    pub server_name: Option<String>,
    /// A complete rustls configuration to use instead of the CA and client certificate settings
    /// (for custom verifiers, other root stores, session resumption...). Default: none.
    pub config: Option<Arc<rustls::ClientConfig>>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca", &self.ca)
            .field("client_cert", &self.client_cert.as_ref().map(|(c, _)| c))
            .field("server_name", &self.server_name)
            .field("config", &self.config.as_ref().map(|_| "<rustls::ClientConfig>"))
            .finish()
    }
}

impl TlsOptions {
    /// TLS verified against the system's CA bundle (read from the usual Linux locations such as
    /// `/etc/ssl/certs/ca-certificates.crt`) unless a CA is set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Verifies the server against the CA certificates in this PEM file (read when connecting).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(Pem::File(path.into()));
        self
    }

    /// Verifies the server against the CA certificates in these PEM bytes.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Presents this client certificate chain and private key (PEM files, read when connecting)
    /// for mutual TLS.
    pub fn client_cert_file(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// Presents this client certificate chain and private key (PEM bytes) for mutual TLS.
    pub fn client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.client_cert = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// Verifies the server's certificate against this name instead of the endpoint's host.
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Uses this rustls configuration as is (the CA and client certificate settings are then
    /// ignored).
    pub fn rustls_config(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.config = Some(config);
        self
    }
}
