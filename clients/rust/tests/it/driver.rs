//! The conformance driver (examples/conformance_driver.rs) through its JSON-lines protocol,
//! against the real server: the scenarios' key steps, so the driver is known to work before the
//! shared runner uses it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::Server;

struct Driver {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    seen: Vec<Value>,
    next_id: u64,
}

impl Driver {
    fn start() -> Driver {
        let exe = std::env::current_exe().expect("test binary path");
        let path = exe.parent().and_then(|p| p.parent()).expect("target dir").join("examples/conformance_driver");
        let mut child = Command::new(&path)
            .env("TICKETING_CONFORMANCE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e} (built by cargo test)", path.display()));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("driver wrote {line:?}: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Driver { child, stdin, lines, seen: Vec::new(), next_id: 1 }
    }

    fn send(&mut self, op: &str, args: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut cmd = args;
        cmd["id"] = json!(id);
        cmd["op"] = json!(op);
        writeln!(self.stdin, "{cmd}").expect("write command");
        id
    }

    fn pump(&mut self, until: Instant) -> bool {
        match self.lines.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(v) => {
                self.seen.push(v);
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => panic!("the driver exited"),
        }
    }

    fn reply(&mut self, id: u64, within: Duration) -> Value {
        let until = Instant::now() + within;
        loop {
            if let Some(i) = self.seen.iter().position(|v| v["id"] == json!(id)) {
                return self.seen.remove(i);
            }
            assert!(self.pump(until), "no reply to command {id} within {within:?}");
        }
    }

    fn call(&mut self, op: &str, args: Value) -> Value {
        let id = self.send(op, args);
        self.reply(id, Duration::from_secs(10))
    }

    fn ok(&mut self, op: &str, args: Value) -> Value {
        let r = self.call(op, args.clone());
        assert_eq!(r["ok"], json!(true), "{op} {args}: {r}");
        r
    }

    fn err(&mut self, op: &str, args: Value) -> Value {
        let r = self.call(op, args.clone());
        assert_eq!(r["ok"], json!(false), "{op} {args}: {r}");
        r["error"].clone()
    }

    /// Lost events seen so far for `lock`, waiting up to `within` for at least one.
    fn lost_events(&mut self, lock: &str, within: Duration) -> Vec<Value> {
        let until = Instant::now() + within;
        loop {
            let ev: Vec<Value> =
                self.seen.iter().filter(|v| v["event"] == json!("lost") && v["lock"] == json!(lock)).cloned().collect();
            if !ev.is_empty() || !self.pump(until) {
                return ev;
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_driver_runs_the_scenarios_key_steps() {
    let server = Server::start(&[("TICKETING_STARTUP_GRACE", "0")]);
    let mut d = Driver::start();
    let hello = d.ok("hello", json!({}));
    assert_eq!(hello["language"], "rust");
    for f in [
        "locks",
        "cancel",
        "keepalive",
        "with_lock",
        "verify",
        "refuse_held",
        "tls",
        "mtls",
        "request_timeout",
        "lost_events",
    ] {
        assert!(hello["features"].as_array().expect("features").contains(&json!(f)), "feature {f}");
    }
    for c in ["A", "B", "R"] {
        let r = d.ok(
            "connect",
            json!({"client": c, "endpoints": [server.addr], "token": null, "tls": null,
            "request_timeout_ms": null, "heartbeat_ms": null, "dial_timeout_ms": null}),
        );
        assert_eq!(r["session_id"].as_str().expect("session").len(), 32);
    }

    // basic
    let r = d.ok(
        "acquire",
        json!({"client": "A", "key": "k", "lease_ms": 5000, "wait_ms": null, "keepalive": false, "lock": "l1"}),
    );
    let token: u64 = r["token"].as_str().expect("token string").parse().expect("decimal");
    assert!(token > 0);
    assert_eq!(d.ok("inspect", json!({"client": "R", "key": "k"}))["held"], true);
    assert_eq!(d.ok("verify", json!({"lock": "l1"}))["held"], true);
    d.ok("release", json!({"lock": "l1"}));
    assert_eq!(d.ok("inspect", json!({"client": "R", "key": "k"}))["held"], false);
    assert_eq!(d.ok("lock_state", json!({"lock": "l1"}))["lost"], false);

    // try_acquire and refuse_held
    let r = d.ok("try_acquire", json!({"client": "R", "key": "t", "lease_ms": 5000, "lock": "r1"}));
    assert_eq!(r["acquired"], true);
    assert_eq!(
        d.ok("try_acquire", json!({"client": "A", "key": "t", "lease_ms": 5000, "lock": "a1"}))["acquired"],
        false
    );
    let e = d.err(
        "acquire",
        json!({"client": "A", "key": "t", "lease_ms": 5000, "wait_ms": 0, "keepalive": false, "lock": "a2"}),
    );
    assert_eq!(e["kind"], "not_acquired");
    let e = d.err("acquire", json!({"client": "R", "key": "t", "lease_ms": 5000, "wait_ms": null, "keepalive": false, "lock": "r2", "refuse_held": true}));
    assert_eq!(e["kind"], "already_held");

    // cancel_waiting
    let target = d.send(
        "acquire",
        json!({"client": "A", "key": "t", "lease_ms": 5000, "wait_ms": null, "keepalive": false, "lock": "a3"}),
    );
    let until = Instant::now() + Duration::from_secs(5);
    while d.ok("inspect", json!({"client": "R", "key": "t"}))["waiters"] != 1 {
        assert!(Instant::now() < until, "never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    d.ok("cancel", json!({"target": target}));
    assert_eq!(d.reply(target, Duration::from_secs(2))["error"]["kind"], "cancelled");
    let until = Instant::now() + Duration::from_secs(2);
    while d.ok("inspect", json!({"client": "R", "key": "t"}))["waiters"] != 0 {
        assert!(Instant::now() < until, "still queued after the cancel");
        std::thread::sleep(Duration::from_millis(10));
    }

    // owner_is_token
    let r = d.ok(
        "acquire",
        json!({"client": "A", "key": "o", "lease_ms": 5000, "wait_ms": null, "keepalive": false, "lock": "o1"}),
    );
    d.ok("release_token", json!({"client": "B", "key": "o", "token": r["token"]}));
    let e = d.err("release", json!({"lock": "o1"}));
    assert_eq!((e["kind"].clone(), e["reason"].clone()), (json!("lock_lost"), json!("not_held")));
    let ev = d.lost_events("o1", Duration::from_secs(2));
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["reason"], "not_held");

    // lost_on_expiry and with_lock_lost
    d.ok(
        "acquire",
        json!({"client": "A", "key": "e", "lease_ms": 300, "wait_ms": null, "keepalive": false, "lock": "e1"}),
    );
    let ev = d.lost_events("e1", Duration::from_secs(2));
    assert_eq!(ev.first().map(|e| e["reason"].clone()), Some(json!("expired")));
    let e = d.err("release", json!({"lock": "e1"}));
    assert_eq!(e["reason"], "expired");
    let e = d.err("with_lock", json!({"client": "A", "key": "w", "lease_ms": 300, "hold_ms": 900}));
    assert_eq!((e["kind"].clone(), e["reason"].clone()), (json!("lock_lost"), json!("expired")));
    d.ok("with_lock", json!({"client": "A", "key": "w", "lease_ms": 2000, "hold_ms": 100}));

    // keepalive and extend
    d.ok(
        "acquire",
        json!({"client": "A", "key": "ka", "lease_ms": 300, "wait_ms": null, "keepalive": true, "lock": "k1"}),
    );
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(d.ok("lock_state", json!({"lock": "k1"}))["lost"], false);
    assert_eq!(d.ok("extend", json!({"lock": "k1", "lease_ms": 2000}))["lease_ms"], 2000);
    d.ok("release", json!({"lock": "k1"}));

    // bad_arguments
    let long = "x".repeat(65_536);
    for args in [
        json!({"client": "A", "key": "", "lease_ms": 1000, "wait_ms": null, "keepalive": false, "lock": "b"}),
        json!({"client": "A", "key": long, "lease_ms": 1000, "wait_ms": null, "keepalive": false, "lock": "b"}),
        json!({"client": "A", "key": "b", "lease_ms": 0, "wait_ms": null, "keepalive": false, "lock": "b"}),
        json!({"client": "A", "key": "b", "lease_ms": -5, "wait_ms": null, "keepalive": false, "lock": "b"}),
        json!({"client": "A", "key": "b", "lease_ms": 1000, "wait_ms": -5, "keepalive": false, "lock": "b"}),
    ] {
        assert_eq!(d.err("acquire", args)["kind"], "invalid_argument");
    }
    assert_eq!(d.err("release_token", json!({"client": "A", "key": "b", "token": "0"}))["kind"], "invalid_argument");
    d.ok(
        "acquire",
        json!({"client": "A", "key": "x", "lease_ms": 5000, "wait_ms": null, "keepalive": false, "lock": "x1"}),
    );
    assert_eq!(d.err("extend", json!({"lock": "x1", "lease_ms": 0}))["kind"], "invalid_argument");
    assert_eq!(d.ok("inspect", json!({"client": "R", "key": "b"}))["held"], false);

    // unreachable, wrong token, reset, exit
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_addr = dead.local_addr().expect("addr").to_string();
    drop(dead);
    let e = d.err(
        "connect",
        json!({"client": "U", "endpoints": [dead_addr], "token": null, "tls": null,
        "request_timeout_ms": null, "heartbeat_ms": null, "dial_timeout_ms": 1000}),
    );
    assert_eq!(e["kind"], "unavailable");
    let e = d.err(
        "connect",
        json!({"client": "W", "endpoints": [server.addr], "token": "nope", "tls": null,
        "request_timeout_ms": null, "heartbeat_ms": null, "dial_timeout_ms": null}),
    );
    assert_eq!(e["kind"], "auth_failed", "a token the server does not require is refused");
    d.ok("reset", json!({}));
    assert_eq!(d.err("ping", json!({"client": "A"}))["kind"], "other", "clients are forgotten");
    let id = d.send("exit", json!({}));
    assert_eq!(d.reply(id, Duration::from_secs(2))["ok"], true);
    let until = Instant::now() + Duration::from_secs(5);
    while d.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < until, "the driver did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}
