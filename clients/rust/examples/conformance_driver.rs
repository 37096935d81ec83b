//! The conformance driver (tests/conformance/DRIVER.md): reads one JSON command per line on
//! stdin, runs it concurrently on the client's public API, and writes one JSON reply per command
//! (and `lost` events) per line on stdout. Built by `clients/rust/test.sh`; started by
//! `clients/rust/conformance-driver`.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::oneshot;

use ticketing::{Client, ClientOptions, Error, Lock, LostReason, TlsOptions};

#[derive(Default)]
struct Driver {
    clients: Mutex<HashMap<String, Client>>,
    locks: Mutex<HashMap<String, Arc<Lock>>>,
    cancels: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

/// Writes one line to stdout; the lock keeps lines whole.
fn emit(v: &Value) {
    static OUT: Mutex<()> = Mutex::new(());
    let _g = OUT.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// A failed command: the error kind (DRIVER.md), the client's message, and the lost reason.
struct Fail {
    kind: &'static str,
    message: String,
    reason: Option<&'static str>,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let kind = match &e {
            Error::NotAcquired { .. } => "not_acquired",
            Error::Cancelled { .. } => "cancelled",
            Error::NotHeld { .. } => "not_held",
            Error::LockLost { .. } => "lock_lost",
            Error::InvalidArgument { .. } => "invalid_argument",
            Error::AlreadyHeld { .. } => "already_held",
            Error::AuthFailed { .. } => "auth_failed",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::Unavailable { .. } => "unavailable",
            Error::Tls { .. } => "tls",
            Error::Timeout { .. } => "timeout",
            Error::ConnectionLost { .. } => "connection_lost",
            Error::ServerRestarted => "server_restarted",
            Error::Busy { .. } => "busy",
            Error::ShuttingDown { .. } => "shutting_down",
            Error::Closed => "closed",
            _ => "other",
        };
        Fail { kind, message: e.to_string(), reason: e.lost_reason().map(reason_name) }
    }
}

fn fail(kind: &'static str, message: impl Into<String>) -> Fail {
    Fail { kind, message: message.into(), reason: None }
}

fn reason_name(r: LostReason) -> &'static str {
    match r {
        LostReason::Expired => "expired",
        LostReason::NotHeld => "not_held",
        LostReason::ServerRestarted => "server_restarted",
        LostReason::ServerStopping => "server_stopping",
        _ => "expired",
    }
}

type Reply = Result<Value, Fail>;

fn arg_str<'a>(cmd: &'a Value, name: &str) -> Result<&'a str, Fail> {
    cmd[name].as_str().ok_or_else(|| fail("other", format!("missing string argument {name}")))
}

/// A duration from integer milliseconds as given: a negative or non-numeric value is rejected
/// by `Duration`'s own conversion, as a caller of the API would see it.
fn millis(cmd: &Value, name: &str) -> Result<Duration, Fail> {
    let ms = cmd[name].as_f64().ok_or_else(|| fail("invalid_argument", format!("{name} is not a number")))?;
    Duration::try_from_secs_f64(ms / 1000.0).map_err(|e| fail("invalid_argument", format!("{name} {ms} ms: {e}")))
}

fn key_of(cmd: &Value) -> Result<Vec<u8>, Fail> {
    if let Some(h) = cmd["key_hex"].as_str() {
        if !h.len().is_multiple_of(2) {
            return Err(fail("other", "odd key_hex"));
        }
        return (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).map_err(|e| fail("other", e.to_string())))
            .collect();
    }
    Ok(arg_str(cmd, "key")?.as_bytes().to_vec())
}

impl Driver {
    fn client(&self, cmd: &Value) -> Result<Client, Fail> {
        let name = arg_str(cmd, "client")?;
        self.clients.lock().unwrap().get(name).cloned().ok_or_else(|| fail("other", format!("no client {name}")))
    }

    fn lock(&self, cmd: &Value) -> Result<Arc<Lock>, Fail> {
        let name = arg_str(cmd, "lock")?;
        self.locks.lock().unwrap().get(name).cloned().ok_or_else(|| fail("other", format!("no lock {name}")))
    }

    /// Keeps a lock handle and reports its lost signal as an event, once.
    fn adopt(&self, name: &str, lock: Lock) -> Arc<Lock> {
        let lock = Arc::new(lock);
        let mut lost = lock.lost_watch();
        let name2 = name.to_owned();
        tokio::spawn(async move {
            // Ends when the lock is lost, or when its last handle is dropped (reset).
            if let Ok(r) = lost.wait_for(Option::is_some).await.map(|r| *r)
                && let Some(reason) = r
            {
                emit(&json!({"event": "lost", "lock": name2, "reason": reason_name(reason)}));
            }
        });
        self.locks.lock().unwrap().insert(name.to_owned(), lock.clone());
        lock
    }

    async fn run(self: Arc<Self>, id: u64, cmd: Value) -> Reply {
        let op = cmd["op"].as_str().unwrap_or("");
        match op {
            "hello" => Ok(json!({
                "language": "rust",
                "client_version": env!("CARGO_PKG_VERSION"),
                "features": ["locks", "cancel", "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls",
                             "request_timeout", "lost_events", "connect_election"],
            })),
            "connect" => {
                let name = arg_str(&cmd, "client")?.to_owned();
                let mut opts = ClientOptions::new();
                if let Some(eps) = cmd["endpoints"].as_array() {
                    opts = opts.endpoints(eps.iter().filter_map(|e| e.as_str().map(str::to_owned)));
                }
                if let Some(t) = cmd["token"].as_str() {
                    opts = opts.token(t);
                }
                if cmd["tls"].is_object() {
                    let t = &cmd["tls"];
                    let mut tls = TlsOptions::new();
                    if let Some(ca) = t["ca"].as_str() {
                        tls = tls.ca_file(ca);
                    }
                    if let (Some(c), Some(k)) = (t["cert"].as_str(), t["key"].as_str()) {
                        tls = tls.client_cert_file(c, k);
                    }
                    if let Some(n) = t["server_name"].as_str() {
                        tls = tls.server_name(n);
                    }
                    opts = opts.tls(tls);
                }
                if !cmd["request_timeout_ms"].is_null() {
                    opts = opts.request_timeout(millis(&cmd, "request_timeout_ms")?);
                }
                if !cmd["heartbeat_ms"].is_null() {
                    opts = opts.heartbeat_interval(millis(&cmd, "heartbeat_ms")?);
                }
                if !cmd["dial_timeout_ms"].is_null() {
                    opts = opts.dial_timeout(millis(&cmd, "dial_timeout_ms")?);
                }
                let client = Client::connect(opts).await?;
                let session: String = client.session_id().iter().map(|b| format!("{b:02x}")).collect();
                self.clients.lock().unwrap().insert(name, client);
                Ok(json!({ "session_id": session }))
            }
            "close" => {
                let name = arg_str(&cmd, "client")?;
                let client = self.clients.lock().unwrap().remove(name);
                if let Some(c) = client {
                    c.close().await;
                }
                Ok(json!({}))
            }
            "acquire" | "try_acquire" => {
                let client = self.client(&cmd)?;
                let key = key_of(&cmd)?;
                let lease = millis(&cmd, "lease_ms")?;
                let name = arg_str(&cmd, "lock")?.to_owned();
                if op == "try_acquire" {
                    return match client.try_acquire(&key, lease).await? {
                        Some(lock) => {
                            let token = lock.token().to_string();
                            self.adopt(&name, lock);
                            Ok(json!({ "acquired": true, "token": token }))
                        }
                        None => Ok(json!({ "acquired": false })),
                    };
                }
                let mut acquire = client
                    .acquire(&key, lease)
                    .keep_alive(cmd["keepalive"].as_bool().unwrap_or(false))
                    .refuse_held(cmd["refuse_held"].as_bool().unwrap_or(false));
                if !cmd["wait_ms"].is_null() {
                    acquire = acquire.wait(millis(&cmd, "wait_ms")?);
                }
                let (tx, rx) = oneshot::channel::<()>();
                self.cancels.lock().unwrap().insert(id, tx);
                // `cancel` completes the signal: the client withdraws the request and waits for
                // the clean-up, then the acquire fails with Error::Cancelled.
                let acquire = acquire.cancel_on(async move {
                    if rx.await.is_err() {
                        std::future::pending::<()>().await;
                    }
                });
                let res = acquire.await;
                self.cancels.lock().unwrap().remove(&id);
                let lock = res?;
                let reply = json!({ "token": lock.token().to_string(), "lease_ms": lock.lease().as_millis() as u64 });
                self.adopt(&name, lock);
                Ok(reply)
            }
            "cancel" => {
                let target = cmd["target"].as_u64().ok_or_else(|| fail("other", "missing target"))?;
                if let Some(tx) = self.cancels.lock().unwrap().remove(&target) {
                    let _ = tx.send(());
                }
                Ok(json!({}))
            }
            "release" => {
                self.lock(&cmd)?.release().await?;
                Ok(json!({}))
            }
            "extend" => {
                let lease = millis(&cmd, "lease_ms")?;
                let got = self.lock(&cmd)?.extend(lease).await?;
                Ok(json!({ "lease_ms": got.as_millis() as u64 }))
            }
            "lock_state" => {
                let lock = self.lock(&cmd)?;
                let (deadline, now) = (lock.deadline(), std::time::Instant::now());
                let deadline_in_ms = match deadline.checked_duration_since(now) {
                    Some(d) => d.as_secs_f64() * 1e3,
                    None => -(now - deadline).as_secs_f64() * 1e3,
                };
                let mut v = json!({
                    "lost": lock.is_lost(),
                    "token": lock.token().to_string(),
                    "deadline_in_ms": deadline_in_ms,
                });
                if let Some(r) = lock.lost_reason() {
                    v["reason"] = json!(reason_name(r));
                }
                Ok(v)
            }
            "verify" => Ok(json!({ "held": self.lock(&cmd)?.verify().await? })),
            "release_token" => {
                let client = self.client(&cmd)?;
                let token: u64 = arg_str(&cmd, "token")?
                    .parse()
                    .map_err(|e| fail("invalid_argument", format!("token is not a positive 64-bit integer: {e}")))?;
                client.release(key_of(&cmd)?, token).await?;
                Ok(json!({}))
            }
            "inspect" => {
                let i = self.client(&cmd)?.inspect(key_of(&cmd)?).await?;
                Ok(json!({ "held": i.held, "waiters": i.waiters, "lease_left_ms": i.lease_left.as_millis() as u64 }))
            }
            "ping" => {
                self.client(&cmd)?.ping().await?;
                Ok(json!({}))
            }
            "with_lock" => {
                let client = self.client(&cmd)?;
                let lease = millis(&cmd, "lease_ms")?;
                let hold = millis(&cmd, "hold_ms")?;
                client.with_lock(key_of(&cmd)?, lease, async |_lock| tokio::time::sleep(hold).await).await?;
                Ok(json!({}))
            }
            "reset" => {
                let clients: Vec<Client> = self.clients.lock().unwrap().drain().map(|(_, c)| c).collect();
                let closing: Vec<_> =
                    clients.into_iter().map(|c| tokio::spawn(async move { c.close().await })).collect();
                for c in closing {
                    let _ = c.await;
                }
                self.locks.lock().unwrap().clear();
                Ok(json!({}))
            }
            other => Err(fail("other", format!("unknown op {other:?}"))),
        }
    }
}

fn reply(id: u64, r: Reply) {
    match r {
        Ok(mut v) => {
            v["id"] = json!(id);
            v["ok"] = json!(true);
            emit(&v);
        }
        Err(f) => {
            let mut err = json!({ "kind": f.kind, "message": f.message });
            if let Some(reason) = f.reason {
                err["reason"] = json!(reason);
            }
            emit(&json!({ "id": id, "ok": false, "error": err }));
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let driver = Arc::new(Driver::default());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line.trim().is_empty() {
            continue;
        }
        let cmd: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("conformance-driver: bad command line {line:?}: {e}");
                continue;
            }
        };
        let id = cmd["id"].as_u64().unwrap_or(0);
        if cmd["op"] == "exit" {
            reply(id, Ok(json!({})));
            break;
        }
        let d = driver.clone();
        tokio::spawn(async move {
            let r = d.run(id, cmd).await;
            reply(id, r);
        });
    }
    std::process::exit(0);
}
