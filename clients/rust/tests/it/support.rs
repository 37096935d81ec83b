//! Test support: hex, the protocol files, the real server (started and stopped by PID), a fake
//! server that speaks the protocol frame by frame, a TCP proxy that can cut connections, and
//! test certificates made with the openssl CLI.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use ticketing::wire::{self, Auth, Challenge, Hello, Op, Request, Response, Status, Welcome};

pub fn from_hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length: {s}");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn repo_root() -> PathBuf {
    // The manifest is clients/rust/dev/Cargo.toml (the tests' package).
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

pub fn protocol_file(name: &str) -> PathBuf {
    repo_root().join("protocol").join(name)
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "ticketing-rust-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
pub async fn eventually(within: Duration, what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if cond().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The real server.

/// The server binary: $TICKETING_BIN, or built once from the repository root (a failed build is
/// reported by every test that needs the server, without building again).
pub fn server_bin() -> PathBuf {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let bin = BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("TICKETING_BIN").filter(|p| !p.is_empty()) {
            return Ok(PathBuf::from(p));
        }
        // Into the build directory (cargo's target/tmp), not /tmp: nothing is left behind.
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ticketing");
        let res = Command::new("go")
            .args(["build", "-o"])
            .arg(&out)
            .arg("./cmd/ticketing")
            .current_dir(repo_root())
            .output()
            .map_err(|e| format!("running go build: {e}"))?;
        if !res.status.success() {
            return Err(format!("go build ./cmd/ticketing failed:\n{}", String::from_utf8_lossy(&res.stderr)));
        }
        Ok(out)
    });
    match bin {
        Ok(p) => p.clone(),
        Err(e) => panic!("no server binary (set TICKETING_BIN): {e}"),
    }
}

pub struct Server {
    child: Option<Child>,
    pub addr: String,
    pub data: Arc<TempDir>,
    env: Vec<(String, String)>,
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts a server on 127.0.0.1 with a free port, a fresh data dir, and `env`.
    pub fn start(env: &[(&str, &str)]) -> Server {
        let data = Arc::new(TempDir::new("data"));
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Server::spawn("127.0.0.1:0", data, env)
    }

    fn spawn(addr: &str, data: Arc<TempDir>, env: Vec<(String, String)>) -> Server {
        let mut cmd = Command::new(server_bin());
        cmd.arg("server")
            .env("TICKETING_ADDR", addr)
            .env("TICKETING_DATA_DIR", data.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting the server");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("msg=listening")
                    && let Some(a) = line.split_whitespace().find_map(|f| f.strip_prefix("addr="))
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(a.trim_matches('"').to_owned());
                }
                let mut l = log2.lock().unwrap_or_else(|e| e.into_inner());
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not report msg=listening; log:\n{}", log.lock().unwrap());
            }
        };
        Server { child: Some(child), addr, data, env, log }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    pub fn port(&self) -> &str {
        self.addr.rsplit_once(':').map(|(_, p)| p).unwrap_or("")
    }

    /// Sends a signal (by name: TERM, STOP, CONT) to the server's PID with kill(1).
    fn signal(&self, sig: &str) {
        if self.child.is_some() {
            let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.pid().to_string()).status();
            assert!(matches!(ok, Ok(s) if s.success()), "kill -{sig} {}", self.pid());
        }
    }

    pub fn stop_signal(&self) {
        self.signal("STOP");
    }

    /// Waits until every thread of the (SIGSTOPped) server is stopped, so that no request is
    /// answered by a thread that had not stopped yet.
    pub fn wait_stopped(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let tasks = format!("/proc/{}/task", self.pid());
        loop {
            let all_stopped = std::fs::read_dir(&tasks).map(|dir| {
                dir.filter_map(Result::ok).all(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    // The state follows the command name in parentheses.
                    stat.rsplit_once(") ")
                        .map(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
                        .unwrap_or(true)
                })
            });
            if matches!(all_stopped, Ok(true)) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the server did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn cont_signal(&self) {
        self.signal("CONT");
    }

    /// SIGTERM, without waiting.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Waits for the process to exit (after terminate), up to `within`.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(_))) | None => {
                    self.child = None;
                    return true;
                }
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        false
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))) | None)
    }

    /// SIGKILL and wait.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL, then start again on the same port and data dir with `extra` env on top.
    pub fn restart(&mut self, extra: &[(&str, &str)]) {
        self.kill();
        let mut env = self.env.clone();
        for (k, v) in extra {
            env.retain(|(ek, _)| ek != k);
            env.push(((*k).to_owned(), (*v).to_owned()));
        }
        let addr = self.addr.clone();
        // The port was just freed; retry briefly if the kernel has not let go of it yet.
        let mut last = None;
        for _ in 0..50 {
            let s = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Server::spawn(&addr, self.data.clone(), env.clone())
            }));
            match s {
                Ok(s) => {
                    *self = s;
                    return;
                }
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        std::panic::resume_unwind(last.expect("restart attempts"));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            let _ = Command::new("kill").arg("-CONT").arg(c.id().to_string()).status();
        }
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------------
// Certificates.

/// A CA, a server certificate for 127.0.0.1/localhost, and a client certificate, made with the
/// openssl CLI in a temp dir.
pub struct Certs {
    pub dir: TempDir,
}

impl Certs {
    pub fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    pub fn make() -> Certs {
        let dir = TempDir::new("certs");
        let run = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(dir.path()).output().expect("running openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        std::fs::write(dir.path().join("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("ext");
        std::fs::write(dir.path().join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        let mut ca =
            vec!["req", "-x509", "-days", "2", "-subj", "/CN=ticketing test CA", "-keyout", "ca.key", "-out", "ca.pem"];
        ca.extend(ec);
        run(&ca);
        for (name, cn) in [("server", "localhost"), ("client", "ticketing test client")] {
            let subj = format!("/CN={cn}");
            let key = format!("{name}.key");
            let csr = format!("{name}.csr");
            let pem = format!("{name}.pem");
            let ext = format!("{name}.ext");
            let mut req = vec!["req", "-new", "-subj", &subj, "-keyout", &key, "-out", &csr];
            req.extend(ec);
            run(&req);
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &pem,
            ]);
        }
        Certs { dir }
    }
}

// ---------------------------------------------------------------------------------------------
// A fake server: speaks the handshake, then lets the test read requests and write answers.

#[derive(Clone)]
pub struct FakeOpts {
    pub state_id: [u8; 16],
    pub resumed: bool,
    pub grace_ms: u32,
    /// With a token the CHALLENGE requires auth and the WELCOME carries the proof.
    pub token: Option<Vec<u8>>,
    /// Send a wrong server proof.
    pub bad_proof: bool,
    /// Answer AUTH with AUTH_FAILED.
    pub auth_failed: bool,
    /// CHALLENGE status other than OK, with its data.
    pub challenge: Option<(Status, u32, Vec<u8>)>,
}

impl Default for FakeOpts {
    fn default() -> Self {
        FakeOpts {
            state_id: [7; 16],
            resumed: false,
            grace_ms: 5000,
            token: None,
            bad_proof: false,
            auth_failed: false,
            challenge: None,
        }
    }
}

pub struct FakeServer {
    listener: TcpListener,
    pub addr: String,
}

/// A request as the fake server read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Req {
    pub op: Op,
    pub id: u64,
    pub token: u64,
    pub lease_ms: u32,
    pub wait_ms: u32,
    pub key: Vec<u8>,
}

impl FakeServer {
    pub async fn bind() -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        FakeServer { listener, addr }
    }

    /// Accepts one connection and runs the handshake with `opts`.
    pub async fn accept(&self, opts: &FakeOpts) -> FakeConn {
        let (stream, _) = timeout(Duration::from_secs(10), self.listener.accept())
            .await
            .expect("no connection within 10 s")
            .expect("accept");
        FakeConn::handshake(stream, opts).await
    }

    /// Accepts one raw connection (no handshake).
    pub async fn accept_raw(&self) -> TcpStream {
        timeout(Duration::from_secs(10), self.listener.accept())
            .await
            .expect("no connection within 10 s")
            .expect("accept")
            .0
    }

    /// Whether a connection arrives within `within`.
    pub async fn try_accept(&self, within: Duration, opts: &FakeOpts) -> Option<FakeConn> {
        match timeout(within, self.listener.accept()).await {
            Ok(Ok((s, _))) => Some(FakeConn::handshake(s, opts).await),
            _ => None,
        }
    }
}

pub struct FakeConn {
    pub stream: TcpStream,
    buf: Vec<u8>,
    pub hello: Hello,
}

impl FakeConn {
    async fn handshake(mut stream: TcpStream, opts: &FakeOpts) -> FakeConn {
        let mut hello = [0u8; wire::HELLO_LEN];
        stream.read_exact(&mut hello).await.expect("HELLO");
        let hello = Hello::decode(&hello).expect("HELLO layout");
        let mut ch = Challenge { status: Status::OK, version: 1, ..Challenge::default() };
        if opts.token.is_some() {
            ch.flags = wire::CHALLENGE_AUTH_REQUIRED;
            ch.server_nonce = [0x5a; 32];
        }
        if let Some((status, detail, data)) = &opts.challenge {
            ch.status = *status;
            ch.detail = *detail;
            ch.data = data.clone();
        }
        let mut out = Vec::new();
        ch.encode(&mut out);
        stream.write_all(&out).await.expect("CHALLENGE");
        let mut conn = FakeConn { stream, buf: Vec::new(), hello };
        if ch.status != Status::OK {
            return conn;
        }
        let mut auth = [0u8; wire::AUTH_LEN];
        if conn.stream.read_exact(&mut auth).await.is_err() {
            return conn; // the client gave up the handshake
        }
        let auth = Auth::decode(&auth).expect("AUTH layout");
        let mut w = Welcome {
            status: Status::OK,
            flags: if opts.resumed { wire::WELCOME_RESUMED } else { 0 },
            detail: 0,
            session_grace_ms: opts.grace_ms,
            state_id: opts.state_id,
            server_proof: [0; 32],
        };
        if let Some(token) = &opts.token {
            let expected = wire::client_proof(token, &hello.session_id, &hello.client_nonce, &ch.server_nonce);
            if expected != auth.client_proof || opts.auth_failed {
                w = Welcome { status: Status::AUTH_FAILED, ..Welcome::default() };
            } else {
                w.server_proof =
                    wire::server_proof(token, &hello.session_id, &hello.client_nonce, &ch.server_nonce, &w);
                if opts.bad_proof {
                    w.server_proof[0] ^= 1;
                }
            }
        } else {
            assert_eq!(auth.client_proof, [0; 32], "a zero proof without auth");
            if opts.auth_failed {
                w = Welcome { status: Status::AUTH_FAILED, ..Welcome::default() };
            }
        }
        conn.stream.write_all(&w.encode()).await.expect("WELCOME");
        conn
    }

    /// Reads the next request, failing the test after 5 s.
    pub async fn read(&mut self) -> Req {
        match self.read_within(Duration::from_secs(5)).await {
            Some(r) => r,
            None => panic!("no request within 5 s"),
        }
    }

    /// Reads the next request if one arrives within `within` (None also on EOF).
    pub async fn read_within(&mut self, within: Duration) -> Option<Req> {
        let deadline = Instant::now() + within;
        loop {
            if let Some((r, n)) = Request::decode(&self.buf, wire::MAX_KEY_LEN).expect("a well-formed request") {
                let req = Req {
                    op: r.op,
                    id: r.id,
                    token: r.token,
                    lease_ms: r.lease_ms,
                    wait_ms: r.wait_ms,
                    key: r.key.to_vec(),
                };
                self.buf.drain(..n);
                return Some(req);
            }
            let mut chunk = [0u8; 4096];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Reads requests until one with `op` arrives, answering PINGs and ACKs on the way.
    pub async fn read_op(&mut self, op: Op) -> Req {
        for _ in 0..10_000 {
            let r = self.read().await;
            if r.op == op {
                return r;
            }
            if r.op == Op::PING || r.op == Op::ACK {
                self.ok(&r).await;
            }
        }
        panic!("no {op} request");
    }

    pub async fn send(&mut self, res: Response<'_>) {
        let mut out = Vec::new();
        res.encode(&mut out);
        self.stream.write_all(&out).await.expect("write");
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// Answers `req` with OK and nothing else.
    pub async fn ok(&mut self, req: &Req) {
        self.send(Response { op: req.op, status: Status::OK, id: req.id, ..Response::default() }).await;
    }

    /// Answers an ACQUIRE with OK, `token`, its lease, `queued_ms`.
    pub async fn grant(&mut self, req: &Req, token: u64, queued_ms: u32) {
        self.send(Response {
            op: Op::ACQUIRE,
            status: Status::OK,
            id: req.id,
            token,
            lease_ms: req.lease_ms,
            detail: queued_ms,
            data: &[],
        })
        .await;
    }

    pub async fn status(&mut self, req: &Req, status: Status, detail: u32, data: &[u8]) {
        self.send(Response { op: req.op, status, id: req.id, detail, data, ..Response::default() }).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A TCP proxy that can hold back server->client bytes and cut every connection.

pub struct Proxy {
    pub addr: String,
    state: Arc<Mutex<ProxyState>>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    hold_back: bool,
    generation: u64,
    accepted: u64,
}

impl Proxy {
    pub async fn start(target: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else { return };
                let Ok(server) = TcpStream::connect(&target).await else { continue };
                let gen_at_start = {
                    let mut s = st.lock().unwrap();
                    s.accepted += 1;
                    s.generation
                };
                let st2 = st.clone();
                tokio::spawn(pipe(client, server, st2, gen_at_start));
            }
        });
        Proxy { addr, state, task }
    }

    /// Holds back server->client bytes from now on (they are dropped when the connection is cut).
    pub fn hold_back(&self, on: bool) {
        self.state.lock().unwrap().hold_back = on;
    }

    /// Cuts every current connection (both directions); new ones pass again.
    pub fn cut(&self) {
        let mut s = self.state.lock().unwrap();
        s.generation += 1;
        s.hold_back = false;
    }

    pub fn accepted(&self) -> u64 {
        self.state.lock().unwrap().accepted
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pipe(client: TcpStream, server: TcpStream, st: Arc<Mutex<ProxyState>>, generation: u64) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let alive = |st: &Arc<Mutex<ProxyState>>| st.lock().unwrap().generation == generation;
    let st_up = st.clone();
    let up = async move {
        let mut b = [0u8; 8192];
        loop {
            let n = match tokio::time::timeout(Duration::from_millis(20), cr.read(&mut b)).await {
                Err(_) => {
                    if !alive(&st_up) {
                        return;
                    }
                    continue;
                }
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => n,
            };
            if !alive(&st_up) || sw.write_all(&b[..n]).await.is_err() {
                return;
            }
        }
    };
    let st_down = st.clone();
    let down = async move {
        let mut b = [0u8; 8192];
        let mut held: Vec<u8> = Vec::new();
        loop {
            let n = match tokio::time::timeout(Duration::from_millis(20), sr.read(&mut b)).await {
                Err(_) => 0,
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => n,
            };
            if !alive(&st_down) {
                return;
            }
            held.extend_from_slice(&b[..n]);
            if !st_down.lock().unwrap().hold_back && !held.is_empty() {
                if cw.write_all(&held).await.is_err() {
                    return;
                }
                held.clear();
            }
        }
    };
    tokio::select! { _ = up => {}, _ = down => {} }
    // Dropping both halves closes both connections.
}
