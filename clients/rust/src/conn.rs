//! The connection: dialing (TCP, TLS), the handshake, installing a connection into the session
//! (resume, restart detection), and the read, write and heartbeat loops.

use std::fmt;
use std::future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, RootCertStore};

use crate::client::{Answer, ForgetOnDrop, Inner, Outbox, Reply, Req, Sent, empty_key};
use crate::error::{Cause, Error, LostReason};
use crate::lock::local_deadline;
use crate::options::{ClientOptions, Pem};
use crate::wire::{
    self, Auth, BusyLimit, Challenge, ExpiredReason, GoawayReason, Hello, InvalidField, Op, Response, Status, Welcome,
};

/// Fills `buf` from the operating system's cryptographic random source.
pub(crate) fn fill_random(buf: &mut [u8]) -> Result<(), Error> {
    getrandom::getrandom(buf).map_err(|e| Error::connection_lost(format!("no random source: {e}")))
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type Stream = Box<dyn Io>;

/// Makes connections: TCP, then TLS when configured.
pub(crate) struct Dialer {
    tls: Option<(TlsConnector, Option<String>)>,
}

const SYSTEM_CA_FILES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

fn tls_config_error(message: impl Into<String>) -> Error {
    Error::Tls { endpoint: String::new(), message: message.into(), source: None }
}

/// The rustls crypto provider: the process default when the application installed one
/// (`CryptoProvider::install_default`), else the one rustls's crate features name (*ring*, which
/// this crate enables), which rustls then installs as the process default.
fn crypto_provider() -> Result<Arc<rustls::crypto::CryptoProvider>, Error> {
    if let Some(provider) = rustls::crypto::CryptoProvider::get_default() {
        return Ok(provider.clone());
    }
    // rustls panics when its features name no single provider (an application that enabled
    // another one too and installed none): a configuration error, not a panic of the client.
    match std::panic::catch_unwind(rustls::ClientConfig::builder) {
        Ok(builder) => Ok(builder.crypto_provider().clone()),
        Err(_) => Err(tls_config_error(
            "no rustls CryptoProvider: install one with rustls::crypto::CryptoProvider::install_default",
        )),
    }
}

fn read_pem(pem: &Pem, what: &str) -> Result<Vec<u8>, Error> {
    match pem {
        Pem::Bytes(b) => Ok(b.clone()),
        Pem::File(path) => {
            std::fs::read(path).map_err(|e| tls_config_error(format!("reading {what} file {}: {e}", path.display())))
        }
    }
}

impl Dialer {
    pub fn new(opts: &ClientOptions) -> Result<Dialer, Error> {
        let Some(tls) = &opts.tls else { return Ok(Dialer { tls: None }) };
        let config = match &tls.config {
            Some(c) => c.clone(),
            None => {
                let mut roots = RootCertStore::empty();
                match &tls.ca {
                    Some(ca) => {
                        let bytes = read_pem(ca, "CA")?;
                        for cert in CertificateDer::pem_slice_iter(&bytes) {
                            let cert = cert.map_err(|e| tls_config_error(format!("parsing the CA PEM: {e}")))?;
                            roots.add(cert).map_err(|e| tls_config_error(format!("adding a CA certificate: {e}")))?;
                        }
                    }
                    None => {
                        if let Some(bytes) = SYSTEM_CA_FILES.iter().find_map(|p| std::fs::read(p).ok()) {
                            roots.add_parsable_certificates(
                                CertificateDer::pem_slice_iter(&bytes).filter_map(Result::ok),
                            );
                        }
                    }
                }
                if roots.is_empty() {
                    return Err(tls_config_error("no CA certificate to verify the server with (set a CA file or PEM)"));
                }
                let builder = rustls::ClientConfig::builder_with_provider(crypto_provider()?)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| tls_config_error(e.to_string()))?
                    .with_root_certificates(roots);
                let config = match &tls.client_cert {
                    Some((cert, key)) => {
                        let cert_pem = read_pem(cert, "client certificate")?;
                        let certs = CertificateDer::pem_slice_iter(&cert_pem)
                            .collect::<Result<Vec<_>, _>>()
                            .map_err(|e| tls_config_error(format!("parsing the client certificate PEM: {e}")))?;
                        if certs.is_empty() {
                            return Err(tls_config_error("the client certificate PEM holds no certificate"));
                        }
                        let key_pem = read_pem(key, "client key")?;
                        let key = PrivateKeyDer::from_pem_slice(&key_pem)
                            .map_err(|e| tls_config_error(format!("parsing the client key PEM: {e}")))?;
                        builder
                            .with_client_auth_cert(certs, key)
                            .map_err(|e| tls_config_error(format!("client certificate: {e}")))?
                    }
                    None => builder.with_no_client_auth(),
                };
                Arc::new(config)
            }
        };
        Ok(Dialer { tls: Some((TlsConnector::from(config), tls.server_name.clone())) })
    }
}

/// The host part of `host:port` (without the brackets of an IPv6 address).
fn host_of(endpoint: &str) -> &str {
    if let Some(rest) = endpoint.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    endpoint.rsplit_once(':').map(|(h, _)| h).unwrap_or(endpoint)
}

/// How one endpoint failed.
enum Failure {
    /// Give up the round: the same answer would come from any endpoint (auth, version, TLS).
    Fatal(Error),
    /// Try the next endpoint.
    Next(String, Option<Error>),
    /// Try the next endpoint: an I/O error (the cause of the round's error).
    Io(String, Cause),
    /// `CHALLENGE` `NOT_LEADER`: try the leader (when known) next.
    NotLeader(Option<String>),
}

/// A connection that completed its handshake.
pub(crate) struct Established {
    stream: Stream,
    welcome: Welcome,
    session_id: [u8; wire::SESSION_ID_LEN],
    endpoint: String,
}

/// Reads the frame the handshake expects next: 4 length bytes, then the rest. `size` maps the
/// first 4 bytes to the frame's size.
async fn read_handshake_frame(
    s: &mut Stream,
    size: impl Fn(&[u8]) -> Result<usize, wire::FrameError>,
    tls: bool,
) -> Result<Vec<u8>, Failure> {
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.map_err(|e| closed_in_handshake(e, tls))?;
    let n = match size(&head) {
        Ok(n) if n >= head.len() => n,
        Ok(_) => return Err(Failure::Next("bad handshake frame from the server".into(), None)),
        Err(e) => {
            if !tls && (head[0] == 0x15 || head[0] == 0x16) && head[1] == 0x03 {
                return Err(Failure::Fatal(Error::Tls {
                    endpoint: String::new(),
                    message: "the server answered with TLS: is the server using TLS? (set ClientOptions::tls)".into(),
                    source: None,
                }));
            }
            return Err(Failure::Next(format!("bad handshake frame from the server: {e}"), None));
        }
    };
    let mut frame = vec![0u8; n];
    frame[..4].copy_from_slice(&head);
    s.read_exact(&mut frame[4..]).await.map_err(|e| closed_in_handshake(e, tls))?;
    Ok(frame)
}

fn closed_in_handshake(e: std::io::Error, tls: bool) -> Failure {
    if tls && let Some(te) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
        // A TLS alert after the TLS handshake, such as a server that requires a client certificate.
        let message = te.to_string();
        return Failure::Fatal(Error::Tls { endpoint: String::new(), message, source: Some(Arc::new(te.clone())) });
    }
    let hint = if tls { "" } else { " (is the server using TLS?)" };
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        Failure::Io(format!("the server closed the connection during the handshake{hint}"), Arc::new(e))
    } else {
        Failure::Io(format!("handshake: {e}{hint}"), Arc::new(e))
    }
}

fn message(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// Whether `tcp` is connected to itself. A connect to a local port in the ephemeral range that
/// nothing listens on may be given that same port as its source, and TCP then connects the socket
/// to itself (a simultaneous open): the handshake would read its own `HELLO` back, and the socket
/// would hold the port a restarting server needs. Such a connect counts as refused.
fn connected_to_itself(tcp: &TcpStream) -> bool {
    matches!((tcp.local_addr(), tcp.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

/// How long TLS and the protocol handshake may take once TCP is connected (docs/clients.md, the
/// connect timeout): a frozen node's kernel still accepts connections, and the next endpoint
/// should not wait for the whole dial timeout behind it.
pub(crate) const HANDSHAKE_WAIT: Duration = Duration::from_secs(2);

async fn dial(inner: &Inner, endpoint: &str, session_id: [u8; 16]) -> Result<Established, Failure> {
    let tcp = TcpStream::connect(endpoint).await.map_err(|e| Failure::Io(e.to_string(), Arc::new(e)))?;
    if connected_to_itself(&tcp) {
        return Err(Failure::Next("nothing listens there (the connection reached itself)".into(), None));
    }
    let _ = tcp.set_nodelay(true);
    let wait = HANDSHAKE_WAIT.min(inner.opts.dial_timeout);
    match timeout(wait, secure_and_handshake(inner, endpoint, session_id, tcp)).await {
        Ok(r) => r,
        Err(_) => Err(Failure::Next(
            format!(
                "timed out: no handshake within {wait:?} of the TCP connection (is the server frozen, or not a Ticketing server?)"
            ),
            None,
        )),
    }
}

/// TLS (when configured) and the protocol handshake on a connected socket.
async fn secure_and_handshake(
    inner: &Inner,
    endpoint: &str,
    session_id: [u8; 16],
    tcp: TcpStream,
) -> Result<Established, Failure> {
    let tls = inner.dialer.tls.is_some();
    let mut stream: Stream = match &inner.dialer.tls {
        None => Box::new(tcp),
        Some((connector, name)) => {
            let name = name.clone().unwrap_or_else(|| host_of(endpoint).to_owned());
            let server_name = ServerName::try_from(name.clone()).map_err(|e| {
                Failure::Fatal(Error::Tls {
                    endpoint: endpoint.to_owned(),
                    message: format!("server name {name:?}: {e}"),
                    source: Some(Arc::new(e)),
                })
            })?;
            match connector.connect(server_name, tcp).await {
                Ok(s) => Box::new(s),
                Err(e) => {
                    // A TLS error (certificate, alert) speaks for itself; a connection that
                    // closed or broke during the TLS handshake is most likely a plaintext server.
                    let tls_error = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()).cloned();
                    let hint = if tls_error.is_some() { "" } else { " (is the server using TLS?)" };
                    let message = format!("{e}{hint}");
                    let source: Cause = match tls_error {
                        Some(te) => Arc::new(te),
                        None => Arc::new(e),
                    };
                    return Err(Failure::Fatal(Error::Tls {
                        endpoint: endpoint.to_owned(),
                        message,
                        source: Some(source),
                    }));
                }
            }
        }
    };
    let welcome = handshake(&mut stream, inner, endpoint, &session_id, tls).await.map_err(|f| match f {
        Failure::Fatal(Error::Tls { endpoint: e, message, source }) if e.is_empty() => {
            Failure::Fatal(Error::Tls { endpoint: endpoint.to_owned(), message, source })
        }
        f => f,
    })?;
    Ok(Established { stream, welcome, session_id, endpoint: endpoint.to_owned() })
}

async fn handshake(
    s: &mut Stream,
    inner: &Inner,
    endpoint: &str,
    session_id: &[u8; 16],
    tls: bool,
) -> Result<Welcome, Failure> {
    let token = inner.opts.token.as_deref().map(str::as_bytes);
    let mut client_nonce = [0u8; wire::NONCE_LEN];
    fill_random(&mut client_nonce).map_err(Failure::Fatal)?;
    let hello = Hello { version: wire::VERSION, flags: 0, session_id: *session_id, client_nonce };
    let io = |e: std::io::Error| Failure::Io(format!("handshake: {e}"), Arc::new(e));
    s.write_all(&hello.encode()).await.map_err(io)?;
    s.flush().await.map_err(io)?;

    let frame =
        read_handshake_frame(s, |h| Challenge::frame_size(h).and_then(|n| n.ok_or(wire::FrameError::Length)), tls)
            .await?;
    let ch = Challenge::decode(&frame).map_err(|e| Failure::Next(format!("bad CHALLENGE: {e}"), None))?;
    match ch.status {
        Status::OK => {}
        Status::NOT_LEADER => {
            let hint = message(&ch.data);
            return Err(Failure::NotLeader((!hint.is_empty()).then_some(hint)));
        }
        Status::UNSUPPORTED_VERSION => {
            return Err(Failure::Fatal(Error::UnsupportedVersion {
                endpoint: endpoint.to_owned(),
                server_version: ch.version,
            }));
        }
        Status::BUSY => {
            let e = Error::Busy { limit: BusyLimit(ch.detail), message: message(&ch.data) };
            return Err(Failure::Next(e.to_string(), Some(e)));
        }
        Status::SHUTTING_DOWN => {
            let e = Error::ShuttingDown { message: message(&ch.data) };
            return Err(Failure::Next(e.to_string(), Some(e)));
        }
        Status::INVALID => {
            return Err(Failure::Fatal(Error::InvalidArgument {
                field: Some(InvalidField(ch.detail)),
                message: format!("the server refused the handshake: {}", message(&ch.data)),
            }));
        }
        status => {
            let e = Error::Status { op: Op::CHALLENGE, status, detail: ch.detail, message: message(&ch.data) };
            return Err(Failure::Next(e.to_string(), Some(e)));
        }
    }
    if token.is_some() && !ch.auth_required() {
        return Err(Failure::Fatal(Error::AuthFailed {
            endpoint: endpoint.to_owned(),
            message: "a token is configured but the server does not require one, so it cannot prove it holds the token; refusing it".into(),
        }));
    }
    let client_proof = match token {
        Some(t) => wire::client_proof(t, session_id, &client_nonce, &ch.server_nonce),
        None => [0u8; wire::PROOF_LEN],
    };
    s.write_all(&Auth { client_proof }.encode()).await.map_err(io)?;
    s.flush().await.map_err(io)?;

    let frame = read_handshake_frame(
        s,
        |h| {
            if u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize == wire::WELCOME_LEN - 4 {
                Ok(wire::WELCOME_LEN)
            } else {
                Err(wire::FrameError::Length)
            }
        },
        tls,
    )
    .await?;
    let w = Welcome::decode(&frame).map_err(|e| Failure::Next(format!("bad WELCOME: {e}"), None))?;
    match w.status {
        Status::OK => {}
        Status::AUTH_FAILED => {
            let message = if token.is_some() {
                "the server rejected the token (wrong token)"
            } else {
                "the server requires a token and none is configured"
            };
            return Err(Failure::Fatal(Error::AuthFailed { endpoint: endpoint.to_owned(), message: message.into() }));
        }
        Status::NOT_LEADER => return Err(Failure::NotLeader(None)),
        Status::BUSY => {
            let e = Error::Busy { limit: BusyLimit(w.detail), message: String::new() };
            return Err(Failure::Next(e.to_string(), Some(e)));
        }
        Status::SHUTTING_DOWN => {
            let e = Error::ShuttingDown { message: String::new() };
            return Err(Failure::Next(e.to_string(), Some(e)));
        }
        status => {
            let e = Error::Status { op: Op::WELCOME, status, detail: w.detail, message: String::new() };
            return Err(Failure::Next(e.to_string(), Some(e)));
        }
    }
    if let Some(t) = token
        && !wire::verify_server_proof(t, session_id, &client_nonce, &ch.server_nonce, &w)
    {
        return Err(Failure::Fatal(Error::AuthFailed {
            endpoint: endpoint.to_owned(),
            message: "the server's proof did not verify: it does not hold the same token".into(),
        }));
    }
    Ok(w)
}

/// Why a connect round failed.
pub(crate) struct RoundFailed {
    pub error: Error,
    /// A node answered `NOT_LEADER` (a cluster electing a leader): worth another round soon.
    pub not_leader: bool,
}

/// How long a node whose connection the heartbeat found silent (a `PING` unanswered: frozen, or
/// cut off) is left out of the connect rounds, as an endpoint and as a leader hint, when there
/// are other endpoints: it still accepts TCP and would cost the handshake wait, and the other
/// nodes keep naming it as the leader until they elect another one (docs/clients.md, rule 1).
pub(crate) const SILENT_SKIP: Duration = Duration::from_secs(2);

/// One round over the endpoints: the leader hint first, then every endpoint once, starting at
/// `State::next_endpoint` (the endpoint of the connection that dropped, or the one after a node
/// the heartbeat found silent: that node is tried last), following `NOT_LEADER` hints a few
/// times. For [`SILENT_SKIP`] after the heartbeat found a node silent, that node is neither
/// dialled nor followed as a hint (unless it is the only endpoint). Returns the first connection
/// that completes the handshake.
pub(crate) async fn connect_round(inner: &Inner) -> Result<Established, RoundFailed> {
    let eps = &inner.opts.endpoints;
    let (session_id, mut hint, start, skip) = {
        let mut st = inner.lock_state();
        let skip = match &st.silent {
            Some((addr, till)) if eps.len() > 1 && Instant::now() < *till => Some(addr.clone()),
            _ => None,
        };
        (st.session_id, st.hint.take(), st.next_endpoint, skip)
    };
    if hint.is_some() && hint == skip {
        hint = None;
    }
    let mut order: Vec<String> = Vec::with_capacity(eps.len() + 1);
    for i in 0..eps.len() {
        let ep = &eps[(start + i) % eps.len()];
        if hint.as_ref() != Some(ep) && skip.as_ref() != Some(ep) {
            order.push(ep.clone());
        }
    }
    if let Some(hint) = hint {
        order.insert(0, hint);
    }
    let mut failures: Vec<String> = Vec::new();
    let mut specific: Vec<Error> = Vec::new();
    let mut cause: Option<Cause> = None;
    let mut hops = 0;
    let mut not_leader = false;
    let mut i = 0;
    let dial_timeout = inner.opts.dial_timeout;
    while i < order.len() && i < 64 {
        let endpoint = order[i].clone();
        i += 1;
        match timeout(dial_timeout, dial(inner, &endpoint, session_id)).await {
            Ok(Ok(est)) => return Ok(est),
            Ok(Err(Failure::Fatal(error))) => return Err(RoundFailed { error, not_leader: false }),
            Ok(Err(Failure::Next(msg, e))) => {
                failures.push(format!("{endpoint}: {msg}"));
                specific.extend(e);
            }
            Ok(Err(Failure::Io(msg, e))) => {
                failures.push(format!("{endpoint}: {msg}"));
                cause = Some(e);
            }
            Ok(Err(Failure::NotLeader(leader))) => {
                not_leader = true;
                failures
                    .push(format!("{endpoint}: not the leader (leader {})", leader.as_deref().unwrap_or("unknown")));
                if let Some(leader) = leader
                    && hops < 3
                    && skip.as_ref() != Some(&leader)
                {
                    hops += 1;
                    order.insert(i, leader);
                }
            }
            Err(_) => failures.push(format!("{endpoint}: timed out after {dial_timeout:?}")),
        }
    }
    let error = if failures.len() == 1 && specific.len() == 1 {
        specific.remove(0)
    } else {
        Error::Unavailable { message: failures.join("; "), source: cause }
    };
    Err(RoundFailed { error, not_leader })
}

/// A connection installed in the session, ready to be driven.
pub(crate) struct Connected {
    stream: Stream,
    wake: Arc<Notify>,
    /// Wakes the heartbeat task from its idle sleep (see [`Outbox::beat`]).
    beat: Arc<Notify>,
    epoch: u64,
    endpoint: String,
}

/// Why [`install`] did not install the connection.
pub(crate) enum NotInstalled {
    /// The server's state id changed: everything was failed and a new session id made; dial again.
    Restarted,
    /// The client is closed.
    Closed,
}

/// Installs a connection after its `WELCOME`: compares the state id, resumes (re-sending every
/// unanswered request with its id, in id order, before anything new) or fails what cannot be
/// resumed, then opens the session to new requests.
pub(crate) fn install(inner: &Arc<Inner>, est: Established) -> Result<Connected, NotInstalled> {
    let w = est.welcome;
    let result = {
        let mut st = inner.lock_state();
        if st.closed {
            Err(NotInstalled::Closed)
        } else if est.session_id != st.session_id || st.state_id.is_some_and(|s| s != w.state_id) {
            if st.state_id.is_some_and(|s| s != w.state_id) {
                st.lose_all(LostReason::ServerRestarted);
                st.fail_all(&Error::ServerRestarted);
                let mut session_id = [0u8; wire::SESSION_ID_LEN];
                if fill_random(&mut session_id).is_ok() {
                    st.session_id = session_id;
                }
                st.next_id = 1;
                st.ack_from = 1;
            }
            st.state_id = Some(w.state_id);
            Err(NotInstalled::Restarted)
        } else {
            st.state_id = Some(w.state_id);
            st.grace = Duration::from_millis(w.session_grace_ms.into());
            let wake = Arc::new(Notify::new());
            let beat = Arc::new(Notify::new());
            let mut buf = Vec::new();
            let now = Instant::now();
            if w.resumed() {
                let mut ids: Vec<u64> = st.pending.keys().collect();
                ids.sort_unstable();
                for id in ids {
                    // Its first send stays its time: an answer may be decided before this one.
                    if let Some(p) = st.pending.get_mut(id) {
                        p.req_encode(id, &mut buf);
                        p.retried = true;
                    }
                }
            } else {
                let err = Error::connection_lost(format!(
                    "reconnected to {} but the server did not resume the session (it had ended): the request's outcome is unknown",
                    est.endpoint
                ));
                for (_, p) in st.pending.drain() {
                    if let Some(w) = p.waiter {
                        st.deliver(w, Err(err.clone()));
                    }
                }
                st.deadlines.clear();
                st.ack_outstanding = false;
                st.answers_since_ack = 0;
            }
            // Woken below.
            st.out = Some(Outbox { buf, wake: wake.clone(), due: true, beat: beat.clone(), beat_idle: false });
            st.clock = None;
            st.clock_kept = false;
            st.epoch += 1;
            let epoch = st.epoch;
            let mut cancels: Vec<u64> = st
                .pending
                .iter_mut()
                .filter(|(_, p)| p.needs_cancel)
                .map(|(id, p)| {
                    p.needs_cancel = false;
                    id
                })
                .collect();
            cancels.sort_unstable();
            for id in cancels {
                let mut cancel = Req::new(Op::CANCEL, empty_key());
                cancel.token = id;
                st.queue(cancel, None, now);
            }
            for req in std::mem::take(&mut st.deferred) {
                st.queue(req, None, now);
            }
            st.last_error = None;
            st.fatal = None;
            wake.notify_one();
            Ok(Connected { stream: est.stream, wake, beat, epoch, endpoint: est.endpoint })
        }
    };
    inner.conn_tx.send_modify(|v| *v += 1);
    result
}

impl crate::client::Pending {
    fn req_encode(&self, id: u64, out: &mut Vec<u8>) {
        wire::Request {
            op: self.req.op,
            flags: 0,
            id,
            token: self.req.token,
            lease_ms: self.req.lease_ms,
            wait_ms: self.req.wait_ms,
            key: &self.req.key,
        }
        .encode(out);
    }
}

/// Why a connection ended.
#[derive(Debug)]
enum ConnEnd {
    Eof,
    Io(std::io::Error),
    Protocol(String),
    Redirect(String),
    /// A `PING` went unanswered for this long: the node is frozen or cut off.
    Silent(Duration),
    Closed,
    Stale,
}

impl fmt::Display for ConnEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnEnd::Eof => f.write_str("the server closed the connection"),
            ConnEnd::Io(e) => write!(f, "connection error: {e}"),
            ConnEnd::Protocol(m) => write!(f, "protocol error: {m}"),
            ConnEnd::Redirect(m) => f.write_str(m),
            ConnEnd::Silent(d) => write!(f, "the server did not answer a PING within {d:?}"),
            ConnEnd::Closed => f.write_str("client closed"),
            ConnEnd::Stale => f.write_str("connection replaced"),
        }
    }
}

/// The client's background task: drives the connection, and reconnects (with backoff) when it
/// ends, until the client is closed.
pub(crate) async fn manage(inner: Arc<Inner>, first: Connected) {
    let mut closed_rx = inner.closed_tx.subscribe();
    let mut current = Some(first);
    let mut attempt: u32 = 0;
    loop {
        if let Some(c) = current.take() {
            let started = Instant::now();
            let endpoint = c.endpoint.clone();
            let end = drive(&inner, c).await;
            if matches!(end, ConnEnd::Closed) || inner.lock_state().closed {
                return;
            }
            // Where the next round starts: at the endpoint that dropped (it most likely comes
            // back), but after one the heartbeat found silent (a frozen node's kernel still
            // accepts connections: it is skipped for a while, then tried last); a redirect names
            // its own target.
            if matches!(end, ConnEnd::Silent(_)) {
                inner.lock_state().silent = Some((endpoint.clone(), Instant::now() + SILENT_SKIP));
            }
            let eps = &inner.opts.endpoints;
            if let Some(idx) = eps.iter().position(|e| *e == endpoint) {
                match end {
                    ConnEnd::Silent(_) => inner.lock_state().next_endpoint = (idx + 1) % eps.len(),
                    ConnEnd::Redirect(_) => {}
                    _ => inner.lock_state().next_endpoint = idx,
                }
            }
            disconnect(&inner, &format!("{end} ({endpoint})"), end);
            // Reconnect at once after a connection that lived; back off from one that ended at
            // once (a server that keeps redirecting or closing must not make this loop spin).
            attempt = if started.elapsed() >= Duration::from_secs(1) { 0 } else { attempt.saturating_add(1) };
        }
        if attempt > 0 {
            let pause = backoff(&inner.opts, attempt);
            tokio::select! {
                _ = sleep(pause) => {}
                _ = closed_rx.wait_for(|c| *c) => return,
            }
        }
        let round = tokio::select! {
            r = connect_round(&inner) => r,
            _ = closed_rx.wait_for(|c| *c) => return,
        };
        match round {
            Ok(est) => match install(&inner, est) {
                Ok(c) => current = Some(c),
                Err(NotInstalled::Closed) => return,
                Err(NotInstalled::Restarted) => attempt = attempt.saturating_add(1).min(1),
            },
            Err(f) => {
                let mut st = inner.lock_state();
                if matches!(f.error, Error::AuthFailed { .. } | Error::UnsupportedVersion { .. }) {
                    // No retry fixes it: every waiting call fails at once (docs/clients.md, rule
                    // 1); the client keeps trying for later calls.
                    st.fail_waiters(&f.error);
                    st.fatal = Some(f.error.clone());
                    drop(st);
                    inner.conn_tx.send_modify(|v| *v += 1);
                    st = inner.lock_state();
                }
                st.last_error = Some(f.error);
                drop(st);
                // A node answered NOT_LEADER: the cluster is electing a leader, which takes about a
                // second; retry at the shortest pause rather than back off as from a dead server
                // (docs/clients.md, rule 1).
                attempt = if f.not_leader { 1 } else { attempt.saturating_add(1) };
            }
        }
    }
}

/// Backoff before reconnect round `attempt` (1, 2, ...): the minimum doubling up to the maximum,
/// times a random factor in [0.5, 1.0].
pub(crate) fn backoff(opts: &ClientOptions, attempt: u32) -> Duration {
    let exp = opts.reconnect_backoff_min.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
    let base = exp.min(opts.reconnect_backoff_max);
    let mut r = [0u8; 2];
    let _ = fill_random(&mut r);
    let frac = 0.5 + f64::from(u16::from_be_bytes(r)) / f64::from(u16::MAX) / 2.0;
    base.mul_f64(frac)
}

/// Marks the session detached after a connection ended (`end`, described by `what`); unanswered
/// requests wait for a resume until the session grace passes (or fail at once with no grace).
fn disconnect(inner: &Arc<Inner>, what: &str, end: ConnEnd) {
    let cause: Option<Cause> = match end {
        ConnEnd::Io(e) => Some(Arc::new(e)),
        _ => None,
    };
    let (epoch, grace) = {
        let mut st = inner.lock_state();
        st.out = None;
        st.clock = None;
        st.clock_kept = false;
        st.epoch += 1;
        // What a call that times out before the next connect names as the reason.
        st.last_error = Some(Error::ConnectionLost { message: what.to_owned(), source: cause.clone() });
        let grace = st.grace;
        if grace.is_zero() {
            st.fail_waiters(&Error::ConnectionLost {
                message: format!("{what}; the server keeps no session to resume"),
                source: cause,
            });
        }
        (st.epoch, grace)
    };
    inner.conn_tx.send_modify(|v| *v += 1);
    if !grace.is_zero() {
        let weak = Arc::downgrade(inner);
        let what = what.to_owned();
        inner.runtime.spawn(async move {
            sleep(grace).await;
            let Some(inner) = weak.upgrade() else { return };
            let mut st = inner.lock_state();
            if st.epoch == epoch && st.out.is_none() {
                st.fail_waiters(&Error::connection_lost(format!(
                    "{what}, and the session grace of {grace:?} passed without a reconnect"
                )));
            }
        });
    }
}

async fn drive(inner: &Arc<Inner>, c: Connected) -> ConnEnd {
    let (rd, wr) = tokio::io::split(c.stream);
    let base = Instant::now();
    let last_rx = AtomicU64::new(0);
    let writing = AtomicBool::new(false);
    tokio::select! {
        e = read_loop(inner, rd, &last_rx, base, &writing, c.epoch) => e,
        e = write_loop(inner, wr, c.wake, &writing, c.epoch) => e,
        e = heartbeat_loop(inner, &last_rx, base, &c.beat, c.epoch) => e,
    }
}

/// `writing`: set while a write waits for the socket (see [`process`]).
async fn write_loop(
    inner: &Inner,
    mut wr: WriteHalf<Stream>,
    wake: Arc<Notify>,
    writing: &AtomicBool,
    epoch: u64,
) -> ConnEnd {
    let mut closed_rx = inner.closed_tx.subscribe();
    // One registration for the connection's life, not one per pass.
    let closed = closed_rx.wait_for(|c| *c);
    tokio::pin!(closed);
    let mut spare: Vec<u8> = Vec::new();
    loop {
        let closing = tokio::select! {
            biased;
            _ = &mut closed => true,
            _ = wake.notified() => false,
        };
        if !closing {
            // Let the tasks that are ready to run queue their frames first, so that one write
            // carries them all: tokio runs a task woken by another one next (the LIFO slot),
            // which would otherwise make this a write per frame under pipelining.
            behind_ready_tasks().await;
        }
        {
            let mut st = inner.lock_state();
            if st.epoch != epoch {
                return ConnEnd::Stale;
            }
            // Requests queued from now on are stamped with the clock (see `State::stamp`), unless
            // this pass was due before the reader's last batch: its callers run after this pass
            // then, and the next pass (made sure to come right after them) ends their stamp.
            let again = std::mem::take(&mut st.clock_kept);
            if !again {
                st.clock = None;
            }
            if let Some(out) = st.out.as_mut() {
                out.due = again;
                std::mem::swap(&mut out.buf, &mut spare);
            }
            if again {
                wake.notify_one();
            }
        }
        if closing {
            // Best effort: what was queued (a CANCEL, a RELEASE) goes out, within a short bound.
            let _ = timeout(Duration::from_millis(500), async {
                wr.write_all(&spare).await?;
                wr.shutdown().await
            })
            .await;
            return ConnEnd::Closed;
        }
        if spare.is_empty() {
            continue;
        }
        let write = async {
            wr.write_all(&spare).await?;
            wr.flush().await
        };
        writing.store(true, Ordering::Relaxed);
        tokio::select! {
            biased;
            _ = &mut closed => return ConnEnd::Closed,
            r = write => {
                if let Err(e) = r {
                    return ConnEnd::Io(e);
                }
            }
        }
        writing.store(false, Ordering::Relaxed);
        spare.clear();
        if spare.capacity() > 1 << 20 {
            spare = Vec::new();
        }
    }
}

/// Goes to the back of the runtime's queue of ready tasks, once: a task woken by itself while it
/// runs is queued behind the others (the LIFO slot is for tasks woken by another task). Unlike
/// `tokio::task::yield_now`, which waits for the worker to run out of tasks and then polls the
/// I/O driver (a syscall) first, this costs nothing beyond the requeue.
async fn behind_ready_tasks() {
    let mut yielded = false;
    future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await;
}

fn micros_since(base: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(base).as_micros()).unwrap_or(u64::MAX)
}

async fn read_loop(
    inner: &Arc<Inner>,
    mut rd: ReadHalf<Stream>,
    last_rx: &AtomicU64,
    base: Instant,
    writing: &AtomicBool,
    epoch: u64,
) -> ConnEnd {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => return ConnEnd::Eof,
            Ok(_) => {}
            Err(e) => return ConnEnd::Io(e),
        }
        let now = Instant::now();
        last_rx.store(micros_since(base, now), Ordering::Relaxed);
        match process(inner, &buf, epoch, now, !writing.load(Ordering::Relaxed)) {
            Ok(used) => {
                buf.drain(..used);
            }
            Err(end) => return end,
        }
    }
}

/// Handles every complete frame in `buf`, read at `now`; returns the bytes used. With `stamp`
/// (no write waits for the socket), the callers that the answers wake stamp their next requests
/// with `now` rather than reading the clock each, until the writer's next pass, which this
/// makes sure comes (see `State::stamp`).
fn process(inner: &Arc<Inner>, buf: &[u8], epoch: u64, now: Instant, stamp: bool) -> Result<usize, ConnEnd> {
    let mut used = 0;
    let mut end = None;
    {
        let mut st = inner.lock_state();
        if st.epoch != epoch {
            return Err(ConnEnd::Stale);
        }
        while end.is_none() || matches!(end, Some(ConnEnd::Redirect(_))) {
            match Response::decode(&buf[used..], wire::MAX_VAR_LEN) {
                Ok(None) => break,
                Ok(Some((res, n))) => {
                    used += n;
                    if let Some(e) = handle(inner, &mut st, &res, now) {
                        end = Some(e);
                    }
                }
                Err(e) => {
                    end = Some(ConnEnd::Protocol(format!("undecodable frame from the server: {e}")));
                    break;
                }
            }
        }
        st.maybe_ack(now);
        if stamp
            && used > 0
            && end.is_none()
            && let Some(out) = st.out.as_mut()
        {
            if out.due {
                // The writer's pass is queued already, ahead of the callers just woken.
                st.clock_kept = true;
            } else {
                out.due = true;
                out.wake.notify_one();
            }
            st.clock = Some(now);
        }
    }
    match end {
        Some(e) => Err(e),
        None => Ok(used),
    }
}

// Inlined into its one caller (the frames' fields then need not be moved through a call).
#[inline(always)]
fn handle(inner: &Arc<Inner>, st: &mut crate::client::State, res: &Response<'_>, now: Instant) -> Option<ConnEnd> {
    if res.id == 0 {
        match res.op {
            Op::EXPIRED => {
                let reason = if ExpiredReason(res.detail) == ExpiredReason::STOPPING {
                    LostReason::ServerStopping
                } else {
                    LostReason::Expired
                };
                if st.locks.get(res.token).is_some_and(|h| *h.key == *res.data) {
                    st.fire_lost(res.token, reason);
                }
            }
            Op::GOAWAY => {
                let leader = message(res.data);
                st.hint = (!leader.is_empty()).then_some(leader);
                return Some(ConnEnd::Redirect(format!("the server sent GOAWAY ({})", GoawayReason(res.detail))));
            }
            _ if res.status == Status::INVALID => {
                return Some(ConnEnd::Protocol(format!(
                    "the server rejected a frame ({}): {}",
                    InvalidField(res.detail),
                    message(res.data)
                )));
            }
            op => log::debug!("ticketing: ignoring unknown push {op}"),
        }
        return None;
    }
    st.answers_since_ack = st.answers_since_ack.saturating_add(1);
    if res.status == Status::NOT_LEADER {
        // Kept, to be sent again with its id on the leader.
        if !st.pending.contains_key(res.id) {
            return None;
        }
        let leader = message(res.data);
        st.hint = (!leader.is_empty()).then_some(leader);
        return Some(ConnEnd::Redirect("the server is not the leader".into()));
    }
    let mut p = st.take_pending(res.id)?;
    if p.req.op == Op::ACK {
        st.ack_outstanding = false;
    }
    if p.req.op == Op::ACQUIRE && res.status == Status::OK {
        // From the first send, whichever send this answers: `detail` counts from the request's
        // first arrival (for a retry answered from the table, with the lease left), and a grant
        // read after a re-send may have been decided before it.
        let deadline = local_deadline(p.first_sent, u64::from(res.detail) + u64::from(res.lease_ms));
        // The request's key moves on (to the lock, or to the release): a clone would be two more
        // updates of its reference count.
        match p.waiter.take() {
            Some(w) => {
                let era = st.register(inner, res.token, p.req.key, res.lease_ms, deadline);
                st.deliver(w, Ok(Answer::Granted { token: res.token, era }));
            }
            None => {
                // The caller gave up (cancelled, timed out): release the grant that raced it.
                let mut release = Req::new(Op::RELEASE, p.req.key);
                release.token = res.token;
                st.queue(release, None, now);
            }
        }
        return None;
    }
    if let Some(w) = p.waiter.take() {
        let reply = Reply {
            id: res.id,
            status: res.status,
            token: res.token,
            lease_ms: res.lease_ms,
            detail: res.detail,
            data: res.data.to_vec(),
            t_first: p.first_sent,
        };
        let retried_acquire_not_held = p.req.op == Op::ACQUIRE && p.retried && res.status == Status::NOT_HELD;
        let answer = if retried_acquire_not_held {
            Err(Error::connection_lost(
                "the acquire was sent again after a reconnect and the server holds nothing for it (granted and since ended, or unknown)",
            ))
        } else {
            Ok(Answer::Reply(reply))
        };
        // Released once the caller has the answer: a caller that gave up before it never learns
        // of the release, and its lock stays as it was. (A waiter still in the table has its
        // caller: one that gives up takes it out.)
        st.deliver(w, answer);
        if p.req.forget && res.status == Status::OK {
            st.released(p.req.token);
        }
    }
    None
}

/// While any request waits for an answer (a queued `ACQUIRE` included), a `PING` goes after this
/// long of silence at most (docs/clients.md, the heartbeat interval).
pub(crate) const BUSY_HEARTBEAT: Duration = Duration::from_millis(250);
/// A `PING` unanswered for this long (at most) gives the connection up: the client replaces it
/// and resumes the session, the calls in flight keep waiting. A frozen leader is so left about
/// 1 s after it froze.
pub(crate) const MAX_PING_WAIT: Duration = Duration::from_millis(750);

/// Sends a `PING` when nothing has arrived for the heartbeat interval (at most
/// [`BUSY_HEARTBEAT`] while requests wait), and ends the connection ([`ConnEnd::Silent`]) when
/// one stays unanswered for min(heartbeat, [`MAX_PING_WAIT`]).
///
/// It wakes only when a `PING` may be due: at the end of the interval (busy or idle) counted
/// from the last input, or, while it sleeps out the idle interval, when a request is queued
/// (`beat`, see [`Outbox::beat`]).
async fn heartbeat_loop(inner: &Inner, last_rx: &AtomicU64, base: Instant, beat: &Notify, epoch: u64) -> ConnEnd {
    let interval = inner.opts.heartbeat_interval;
    if interval.is_zero() {
        return future::pending().await;
    }
    let ping_wait = interval.min(MAX_PING_WAIT);
    let busy_interval = interval.min(BUSY_HEARTBEAT);
    loop {
        let busy = {
            let mut st = inner.lock_state();
            if st.epoch != epoch {
                return ConnEnd::Stale;
            }
            let busy = st.pending.len() > 0;
            if let Some(out) = st.out.as_mut() {
                out.beat_idle = !busy;
            }
            busy
        };
        let due =
            base + Duration::from_micros(last_rx.load(Ordering::Relaxed)) + if busy { busy_interval } else { interval };
        if Instant::now() < due {
            if busy {
                sleep_until(due).await;
            } else {
                // A request queued meanwhile (it sees `beat_idle`) shortens the wait.
                tokio::select! {
                    () = sleep_until(due) => {}
                    () = beat.notified() => {}
                }
            }
            continue;
        }
        let sent = {
            let mut st = inner.lock_state();
            if st.epoch != epoch {
                return ConnEnd::Stale;
            }
            if let Some(out) = st.out.as_mut() {
                out.beat_idle = false;
            }
            let w = st.waiter(None);
            let ticket = w.ticket();
            match st.queue(Req::new(Op::PING, empty_key()), Some(w), Instant::now()) {
                Some(id) => Sent { id, ticket, registered: false },
                None => {
                    st.free_slot(ticket);
                    return ConnEnd::Stale;
                }
            }
        };
        // Forgotten when the connection ends first (this future is dropped) or the answer is late.
        let mut forget = ForgetOnDrop { inner, id: Some((sent.id, sent.ticket)) };
        if timeout(ping_wait, sent.answer(inner)).await.is_err() {
            return ConnEnd::Silent(ping_wait);
        }
        forget.id = None;
    }
}
