//! The clients' edges (issue 26, docs/clients.md): a lost lock's release answers at once, close
//! withdraws queued acquires, a call that times out while the client reconnects is a timeout
//! naming the last connect error, errors that no retry fixes fail waiting calls at once, one-line
//! messages that cut long keys and say nothing twice, `source()` chains, and liveness: a PING
//! while a request waits, a silent connection replaced without failing the calls in flight, the
//! node just left neither dialled nor followed as a hint for a while, then tried last, the
//! handshake bounded once TCP connects.

use std::error::Error as _;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use ticketing::wire::{ExpiredReason, Op, Response, Status};
use ticketing::{Client, ClientOptions, Error, LostReason};

use crate::fake::{connect, hold, opts};
use crate::support::{FakeOpts, FakeServer};

const SECOND: Duration = Duration::from_secs(1);

/// A run of at least `n` bytes that occurs twice in `msg` (outside runs of one repeated byte).
fn repeated_phrase(msg: &str, n: usize) -> Option<&str> {
    let b = msg.as_bytes();
    (0..b.len().saturating_sub(n - 1)).find_map(|i| {
        let p = &b[i..i + n];
        if p.iter().all(|&c| c == p[0]) {
            return None;
        }
        let rest = &b[i + n..];
        rest.windows(n).any(|w| w == p).then(|| std::str::from_utf8(p).unwrap_or("?"))
    })
}

#[tokio::test]
async fn releasing_a_lost_lock_answers_at_once_and_releases_in_the_background() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let lock = hold(&client, &mut conn, "k", 5).await;
    conn.send(Response {
        op: Op::EXPIRED,
        status: Status::OK,
        token: 5,
        detail: ExpiredReason::LEASE.0,
        data: b"k",
        ..Response::default()
    })
    .await;
    assert_eq!(timeout(SECOND, lock.lost()).await.expect("lost"), LostReason::Expired);
    // The server answers nothing from now on: the release must not wait for it.
    let start = Instant::now();
    let err = timeout(Duration::from_millis(500), lock.release()).await.expect("at once").expect_err("lost");
    assert_eq!(err.lost_reason(), Some(LostReason::Expired), "{err}");
    assert!(start.elapsed() < Duration::from_millis(100), "took {:?}", start.elapsed());
    let rel = conn.read_op(Op::RELEASE).await;
    assert_eq!((rel.token, rel.key.as_slice()), (5, &b"k"[..]), "the server is still told");
    // Again: the same answer, and the server is told once.
    let err = timeout(Duration::from_millis(500), lock.release()).await.expect("at once").expect_err("lost");
    assert_eq!(err.lost_reason(), Some(LostReason::Expired));
    assert!(conn.read_within(Duration::from_millis(200)).await.is_none(), "one RELEASE");
    conn.ok(&rel).await;

    // Lost to a NOT_HELD answer: nothing is left to release, and nothing is sent.
    let lock = hold(&client, &mut conn, "n", 6).await;
    let ext = {
        let l = &lock;
        let extend = l.extend(Duration::from_secs(10));
        let answer = async {
            let r = conn.read_op(Op::EXTEND).await;
            conn.status(&r, Status::NOT_HELD, 0, &[]).await;
        };
        tokio::join!(extend, answer).0
    };
    assert!(ext.is_err());
    assert_eq!(lock.lost_reason(), Some(LostReason::NotHeld));
    let err = timeout(Duration::from_millis(500), lock.release()).await.expect("at once").expect_err("lost");
    assert_eq!(err.lost_reason(), Some(LostReason::NotHeld));
    assert!(conn.read_within(Duration::from_millis(200)).await.is_none(), "no RELEASE after NOT_HELD");
}

#[tokio::test]
async fn close_withdraws_queued_acquires_and_releases_a_raced_grant() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr).cleanup_timeout(3 * SECOND), &FakeOpts::default()).await;
    let held = hold(&client, &mut conn, "held", 4).await;
    let c = client.clone();
    let first = tokio::spawn(async move { c.acquire("a", SECOND).await });
    let a = conn.read_op(Op::ACQUIRE).await;
    let c = client.clone();
    let second = tokio::spawn(async move { c.acquire("b", SECOND).await });
    let b = conn.read_op(Op::ACQUIRE).await;
    let c = client.clone();
    let closing = tokio::spawn(async move { c.close().await });
    // The callers learn at once; the server is asked to withdraw both.
    for task in [first, second] {
        let res = timeout(SECOND, task).await.expect("failed at once").unwrap();
        assert!(matches!(res, Err(Error::Closed)), "{:?}", res.map(|l| l.token()));
    }
    let mut cancelled = vec![conn.read_op(Op::CANCEL).await.token, conn.read_op(Op::CANCEL).await.token];
    cancelled.sort_unstable();
    assert_eq!(cancelled, vec![a.id, b.id]);
    // `a` is withdrawn; `b` was granted before its CANCEL arrived: released.
    conn.status(&a, Status::CANCELLED, 0, &[]).await;
    conn.grant(&b, 9, 0).await;
    let rel = conn.read_op(Op::RELEASE).await;
    assert_eq!(rel.token, 9, "the raced grant is released");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!closing.is_finished(), "close waits for the clean-up");
    conn.ok(&rel).await;
    timeout(SECOND, closing).await.expect("close returns once it is done").unwrap();
    // The held lock is not released (release on close is off).
    loop {
        match conn.read_within(SECOND).await {
            None => break,
            Some(r) => assert_ne!((r.op, r.token), (Op::RELEASE, 4), "close does not release held locks"),
        }
    }
    drop(held);

    // A server that answers nothing: close still returns after the cleanup timeout.
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).cleanup_timeout(Duration::from_millis(300));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    let c = client.clone();
    let waiting = tokio::spawn(async move { c.acquire("a", SECOND).await });
    conn.read_op(Op::ACQUIRE).await;
    let start = Instant::now();
    client.close().await;
    assert!(start.elapsed() < 2 * SECOND, "took {:?}", start.elapsed());
    assert!(matches!(waiting.await.unwrap(), Err(Error::Closed)));
    assert_eq!(conn.read_op(Op::CANCEL).await.op, Op::CANCEL);
}

#[tokio::test]
async fn a_call_that_times_out_while_reconnecting_is_a_timeout_naming_the_last_connect_error() {
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(Duration::from_millis(300));
    let (client, conn) = connect(&fake, o, &FakeOpts::default()).await;
    // The server goes away and stays away: every reconnect is refused.
    drop(conn);
    drop(fake);
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..2 {
        let start = Instant::now();
        let err = client.ping().await.expect_err("no server");
        assert!(start.elapsed() < 2 * SECOND, "took {:?}", start.elapsed());
        let Error::Timeout { timeout, .. } = &err else { panic!("want a timeout: {err}") };
        assert_eq!(*timeout, Duration::from_millis(300));
        let msg = err.to_string();
        assert!(msg.contains("last connect error") && msg.contains("refused"), "{msg}");
        let cause = err.source().and_then(|s| s.downcast_ref::<Error>()).expect("the last connect error");
        assert!(matches!(cause, Error::Unavailable { .. }), "{cause}");
        let io = cause.source().and_then(|s| s.downcast_ref::<std::io::Error>()).expect("its I/O error");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    // A call in flight when the connection drops, the server then unreachable: the same.
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(Duration::from_millis(400));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    let c = client.clone();
    let ping = tokio::spawn(async move { c.ping().await });
    conn.read_op(Op::PING).await;
    drop(conn);
    drop(fake);
    let err = ping.await.unwrap().expect_err("no answer");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(err.source().is_some_and(|s| s.is::<Error>()), "names why there is no connection: {err}");
}

#[tokio::test]
async fn an_error_no_retry_fixes_fails_waiting_calls_at_once() {
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(5 * SECOND);
    let (client, conn) = connect(&fake, o, &FakeOpts::default()).await;
    drop(conn);
    let c = client.clone();
    let ping = tokio::spawn(async move { c.ping().await });
    // The next handshake fails authentication.
    let _refused = fake.accept(&FakeOpts { auth_failed: true, ..FakeOpts::default() }).await;
    let start = Instant::now();
    let res = timeout(2 * SECOND, ping).await.expect("failed at once, not after the request timeout").unwrap();
    assert!(matches!(res, Err(Error::AuthFailed { .. })), "{res:?}");
    assert!(start.elapsed() < SECOND);
    let err = client.ping().await.expect_err("still refused");
    assert!(matches!(err, Error::AuthFailed { .. }), "{err}");
}

#[test]
fn messages_are_one_line_and_say_nothing_twice() {
    let cases = [
        Error::ShuttingDown { message: "server shutting down".into() },
        Error::ShuttingDown { message: "Server shutting down: draining".into() },
        Error::ShuttingDown { message: String::new() },
        Error::Busy { limit: ticketing::wire::BusyLimit::CONNECTIONS, message: "too many connections".into() },
        Error::InvalidArgument { field: None, message: "invalid argument: lease\nmust be positive".into() },
        Error::ConnectionLost { message: "connection lost".into(), source: None },
        Error::Unavailable { message: "no endpoint available".into(), source: None },
    ];
    for e in &cases {
        let msg = e.to_string();
        assert!(!msg.contains('\n'), "one line: {msg:?}");
        assert!(repeated_phrase(&msg, 16).is_none(), "{msg:?} says {:?} twice", repeated_phrase(&msg, 16));
        assert!(!msg.ends_with(": "), "{msg:?}");
    }
    assert_eq!(cases[0].to_string(), "server shutting down");
    assert_eq!(cases[1].to_string(), "Server shutting down: draining");
    assert_eq!(cases[4].to_string(), "invalid argument: lease must be positive");
}

#[tokio::test]
async fn messages_cut_long_keys_and_carry_the_servers_reason() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let key = "k".repeat(5000);
    let c = client.clone();
    let k = key.clone();
    let task = tokio::spawn(async move { c.acquire(k, SECOND).wait(Duration::from_millis(300)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    let why = b"the server is in its start-up wait: no grant for 2000 ms more (leases granted before its restart may still run)";
    conn.status(&r, Status::TIMED_OUT, 0, why).await;
    let err = task.await.unwrap().expect_err("not acquired");
    let Error::NotAcquired { message, .. } = &err else { panic!("{err}") };
    assert_eq!(message.as_bytes(), why);
    let msg = err.to_string();
    assert!(msg.contains("start-up wait"), "{msg}");
    assert!(msg.contains(&format!("{}…(5000 bytes)", "k".repeat(64))), "{msg}");
    assert!(msg.len() < 300, "{} bytes: {msg}", msg.len());
    assert!(repeated_phrase(&msg, 16).is_none(), "{msg}");

    // A key that is not UTF-8 shows as hex, cut the same way.
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire(vec![0xff; 100], SECOND).wait(Duration::ZERO).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.status(&r, Status::TIMED_OUT, 0, &[]).await;
    let msg = task.await.unwrap().expect_err("not acquired").to_string();
    assert!(msg.contains(&format!("0x{}…(100 bytes)", "ff".repeat(64))), "{msg}");
}

#[tokio::test]
async fn a_request_waiting_gets_a_ping_and_a_silent_node_is_left_for_the_next() {
    let (fs1, fs2) = (FakeServer::bind().await, FakeServer::bind().await);
    // The default heartbeat (2 s): while a request waits, the PING comes after 250 ms of silence
    // (at once here: the connection has been silent for 600 ms, and the idle heartbeat, which
    // would sleep until 2 s, is woken by the request).
    let o = ClientOptions::new()
        .endpoints([fs1.addr.clone(), fs2.addr.clone()])
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50));
    let (client, mut conn) = connect(&fs1, o, &FakeOpts::default()).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let c = client.clone();
    let acq = tokio::spawn(async move { c.acquire("k", 10 * SECOND).await });
    let start = Instant::now();
    let a = conn.read().await;
    assert_eq!(a.op, Op::ACQUIRE);
    let ping = conn.read_within(2 * SECOND).await.expect("a PING while the acquire waits");
    assert_eq!(ping.op, Op::PING);
    assert!(start.elapsed() < Duration::from_millis(900), "PING after {:?}", start.elapsed());
    // Never answered: within 750 ms the connection is replaced, on the other node, and
    // the acquire goes on there (it does not fail).
    let resumed = FakeOpts { resumed: true, ..FakeOpts::default() };
    let mut conn2 = fs2.accept(&resumed).await;
    assert!(start.elapsed() < Duration::from_millis(2500), "replaced after {:?}", start.elapsed());
    assert!(fs1.try_accept(Duration::from_millis(50), &resumed).await.is_none(), "the silent node is not dialled");
    let again = conn2.read_op(Op::ACQUIRE).await;
    assert_eq!(again.id, a.id, "re-sent with its id");
    conn2.grant(&again, 3, 0).await;
    let lock = acq.await.unwrap().expect("granted on the new node");
    assert_eq!(lock.token(), 3);
    drop(conn);
}

/// The other nodes keep naming a frozen leader until they elect another one: for a while the
/// client follows no hint to the node it just found silent (it accepts TCP and would cost the
/// handshake wait) and goes on to the next endpoint.
#[tokio::test]
async fn a_silent_node_is_not_followed_as_a_leader_hint() {
    let (fs1, fs2, fs3) = (FakeServer::bind().await, FakeServer::bind().await, FakeServer::bind().await);
    let o = ClientOptions::new()
        .endpoints([fs1.addr.clone(), fs2.addr.clone(), fs3.addr.clone()])
        .heartbeat_interval(SECOND)
        .reconnect_backoff(Duration::from_millis(5), Duration::from_millis(50));
    let (client, mut conn) = connect(&fs1, o, &FakeOpts::default()).await;
    let c = client.clone();
    let acq = tokio::spawn(async move { c.acquire("k", 60 * SECOND).await });
    let a = conn.read_op(Op::ACQUIRE).await;
    let ping = conn.read_within(2 * SECOND).await.expect("a PING while the acquire waits");
    assert_eq!(ping.op, Op::PING);
    let start = Instant::now();
    // Never answered. The second node names the first as the leader; the third accepts.
    let follower =
        FakeOpts { challenge: Some((Status::NOT_LEADER, 0, fs1.addr.as_bytes().to_vec())), ..FakeOpts::default() };
    let resumed = FakeOpts { resumed: true, ..FakeOpts::default() };
    let (_, mut conn3) = tokio::join!(fs2.accept(&follower), fs3.accept(&resumed));
    assert!(start.elapsed() < Duration::from_millis(1900), "resumed after {:?}", start.elapsed());
    let again = conn3.read_op(Op::ACQUIRE).await;
    assert_eq!(again.id, a.id, "re-sent with its id");
    conn3.grant(&again, 3, 0).await;
    let lock = acq.await.unwrap().expect("granted on the third node");
    assert_eq!(lock.token(), 3);
    assert!(
        fs1.try_accept(Duration::from_millis(100), &resumed).await.is_none(),
        "the hint to the silent node was followed"
    );
    drop(conn);
}

#[tokio::test]
async fn a_node_that_accepts_and_never_answers_is_left_after_two_seconds() {
    let (frozen, live) = (FakeServer::bind().await, FakeServer::bind().await);
    let o = ClientOptions::new().endpoints([frozen.addr.clone(), live.addr.clone()]);
    let fo = FakeOpts::default();
    let start = Instant::now();
    let (client, _silent, conn) = tokio::join!(Client::connect(o), frozen.accept_raw(), live.accept(&fo));
    let client = client.expect("connected to the live node");
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_millis(4000), "took {took:?}");
    drop((client, conn));
}
