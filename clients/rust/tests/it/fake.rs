//! The protocol's failure paths against a fake server that the test drives frame by frame:
//! resume with original ids, NOT_LEADER/GOAWAY/leader hints, state id changes, CANCEL on drop,
//! ACK, heartbeat, timeouts, pushes, malformed frames, auth proofs.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use ticketing::wire::{self, ExpiredReason, GoawayReason, Op, Response, Status};
use ticketing::{Client, ClientOptions, Error, Lock, LostReason};

use crate::support::{FakeConn, FakeOpts, FakeServer, eventually};

const SECOND: Duration = Duration::from_secs(1);

pub(crate) fn opts(addr: &str) -> ClientOptions {
    ClientOptions::new()
        .endpoint(addr)
        .heartbeat_interval(Duration::ZERO)
        .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(50))
        .dial_timeout(Duration::from_secs(3))
}

pub(crate) async fn connect(fake: &FakeServer, o: ClientOptions, fo: &FakeOpts) -> (Client, FakeConn) {
    let (client, conn) = tokio::join!(Client::connect(o), fake.accept(fo));
    (client.expect("connect"), conn)
}

/// Acquires `key` through `conn`, granting token `token` with a 10 s lease.
pub(crate) async fn hold(client: &Client, conn: &mut FakeConn, key: &str, token: u64) -> ticketing::Lock {
    let c = client.clone();
    let key2 = key.to_owned();
    let task = tokio::spawn(async move { c.acquire(key2, Duration::from_secs(10)).await });
    let req = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(req.key, key.as_bytes());
    conn.grant(&req, token, 0).await;
    task.await.expect("task").expect("acquire")
}

/// [`hold`] with keep-alive on and a lease of `lease_ms`.
async fn hold_kept_alive(
    client: &Client,
    conn: &mut FakeConn,
    key: &str,
    token: u64,
    lease_ms: u64,
) -> ticketing::Lock {
    let c = client.clone();
    let key2 = key.to_owned();
    let task = tokio::spawn(async move { c.acquire(key2, Duration::from_millis(lease_ms)).keep_alive(true).await });
    let req = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(req.key, key.as_bytes());
    conn.grant(&req, token, 0).await;
    task.await.expect("task").expect("acquire")
}

#[test]
fn public_types_can_cross_tasks() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Client>();
    send_sync::<ticketing::Lock>();
    send_sync::<ticketing::LockGuard>();
    send_sync::<Error>();
    send::<ticketing::AcquireFuture>();
    send::<ticketing::Acquire>();
}

#[test]
fn connect_outside_a_tokio_runtime_is_an_error_not_a_panic() {
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    let mut fut = std::pin::pin!(Client::connect(ClientOptions::new()));
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Err(Error::InvalidArgument { message, .. })) => assert!(message.contains("tokio")),
        other => panic!("{:?}", other.map(|r| r.map(drop))),
    }
}

#[tokio::test]
async fn pipelined_requests_are_matched_by_id_out_of_order() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c1 = client.clone();
    let a = tokio::spawn(async move { c1.acquire("a", Duration::from_secs(5)).await });
    let r1 = conn.read_op(Op::ACQUIRE).await;
    let c2 = client.clone();
    let b = tokio::spawn(async move { c2.inspect("b").await });
    let r2 = conn.read_op(Op::INSPECT).await;
    assert_eq!((r1.id, r2.id), (1, 2), "ids start at 1, in send order");
    assert_eq!((r1.lease_ms, r1.wait_ms), (5000, u32::MAX));
    // The later request is answered first; the waiting acquire holds nothing back.
    let data = [0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1];
    conn.send(Response {
        op: Op::INSPECT,
        status: Status::OK,
        id: r2.id,
        lease_ms: 700,
        detail: 3,
        data: &data,
        token: 0,
    })
    .await;
    let insp = b.await.unwrap().expect("inspect");
    assert!(insp.held);
    assert_eq!(
        (insp.waiters, insp.lease_left, insp.held_for, insp.token),
        (3, Duration::from_millis(700), Duration::from_millis(9), None)
    );
    assert!(!a.is_finished());
    conn.grant(&r1, 11, 0).await;
    let lock = a.await.unwrap().expect("acquire");
    assert_eq!(lock.token(), 11);
    assert_eq!(lock.key(), b"a");
}

#[tokio::test]
async fn request_ids_reach_the_wire_in_send_order() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let mut tasks = Vec::new();
    for i in 0..200 {
        let c = client.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 { c.ping().await.map(|_| ()) } else { c.release("k", i).await }
        }));
    }
    let mut last = 0;
    for _ in 0..200 {
        let r = conn.read().await;
        assert!(r.id > last, "id {} after {last}", r.id);
        last = r.id;
        conn.ok(&r).await;
    }
    for t in tasks {
        t.await.unwrap().expect("answered");
    }
}

#[tokio::test]
async fn auth_success_and_every_failure() {
    let token = b"correct horse".to_vec();
    let fake = FakeServer::bind().await;
    let fo = FakeOpts { token: Some(token.clone()), ..FakeOpts::default() };
    let (client, mut conn) = connect(&fake, opts(&fake.addr).token("correct horse"), &fo).await;
    let c = client.clone();
    let p = tokio::spawn(async move { c.ping().await });
    let r = conn.read_op(Op::PING).await;
    conn.ok(&r).await;
    p.await.unwrap().expect("ping after auth");

    // Wrong token: the server answers AUTH_FAILED.
    let (res, _) = tokio::join!(Client::connect(opts(&fake.addr).token("wrong")), fake.accept(&fo));
    let err = res.expect_err("wrong token");
    assert!(matches!(&err, Error::AuthFailed { message, .. } if message.contains("wrong token")), "{err}");

    // No token, server requires one.
    let failing = FakeOpts { auth_failed: true, ..FakeOpts::default() };
    let (res, _) = tokio::join!(Client::connect(opts(&fake.addr)), fake.accept(&failing));
    let err = res.expect_err("no token");
    assert!(matches!(&err, Error::AuthFailed { message, .. } if message.contains("requires a token")), "{err}");

    // The server's proof does not verify: a server without the token.
    let bad = FakeOpts { bad_proof: true, ..fo.clone() };
    let (res, _) = tokio::join!(Client::connect(opts(&fake.addr).token("correct horse")), fake.accept(&bad));
    let err = res.expect_err("bad proof");
    assert!(matches!(&err, Error::AuthFailed { message, .. } if message.contains("proof")), "{err}");

    // A token is configured but the server does not require one.
    let plain = FakeOpts::default();
    let (res, _) = tokio::join!(Client::connect(opts(&fake.addr).token("x")), fake.accept(&plain));
    let err = res.expect_err("server without auth");
    assert!(matches!(&err, Error::AuthFailed { message, .. } if message.contains("does not require")), "{err}");
}

#[tokio::test]
async fn challenge_refusals_map_to_errors() {
    let fake = FakeServer::bind().await;
    let cases: [(Status, u32, &str); 3] = [
        (Status::UNSUPPORTED_VERSION, 0, "unsupported"),
        (Status::BUSY, 1, "busy"),
        (Status::SHUTTING_DOWN, 0, "shutting down"),
    ];
    for (status, detail, what) in cases {
        let fo = FakeOpts { challenge: Some((status, detail, b"no".to_vec())), ..FakeOpts::default() };
        let (res, _) = tokio::join!(Client::connect(opts(&fake.addr)), fake.accept(&fo));
        let err = res.expect_err(what);
        let ok = match status {
            Status::UNSUPPORTED_VERSION => matches!(err, Error::UnsupportedVersion { server_version: 1, .. }),
            Status::BUSY => matches!(err, Error::Busy { limit: ticketing::wire::BusyLimit::CONNECTIONS, .. }),
            _ => matches!(err, Error::ShuttingDown { .. }),
        };
        assert!(ok, "{what}: {err:?}");
    }
}

#[tokio::test]
async fn challenge_not_leader_follows_the_leader_hint() {
    let follower = FakeServer::bind().await;
    let leader = FakeServer::bind().await;
    let fo =
        FakeOpts { challenge: Some((Status::NOT_LEADER, 0, leader.addr.as_bytes().to_vec())), ..FakeOpts::default() };
    let plain = FakeOpts::default();
    let (client, _, conn) =
        tokio::join!(Client::connect(opts(&follower.addr)), follower.accept(&fo), leader.accept(&plain));
    let client = client.expect("connected through the hint");
    let mut conn = conn;
    let c = client.clone();
    let p = tokio::spawn(async move { c.ping().await });
    let r = conn.read_op(Op::PING).await;
    conn.ok(&r).await;
    p.await.unwrap().expect("ping on the leader");
}

#[tokio::test]
async fn first_connect_keeps_trying_while_nodes_answer_not_leader() {
    let fake = FakeServer::bind().await;
    // A cluster electing a leader: CHALLENGE NOT_LEADER without a hint.
    let electing = FakeOpts { challenge: Some((Status::NOT_LEADER, 0, Vec::new())), ..FakeOpts::default() };
    let serve = async {
        for _ in 0..2 {
            drop(fake.accept(&electing).await);
        }
        fake.accept(&FakeOpts::default()).await
    };
    let (client, mut conn) = tokio::join!(Client::connect(opts(&fake.addr)), serve);
    let client = client.expect("connected once a leader answered");
    let c = client.clone();
    let p = tokio::spawn(async move { c.ping().await });
    let r = conn.read_op(Op::PING).await;
    conn.ok(&r).await;
    p.await.unwrap().expect("ping");

    // An election that outlasts the request timeout: the connect gives up, unavailable.
    let tries = std::cell::Cell::new(0);
    let serve_forever = async {
        loop {
            drop(fake.accept(&electing).await);
            tries.set(tries.get() + 1);
        }
    };
    let start = Instant::now();
    let res = tokio::select! {
        r = Client::connect(opts(&fake.addr).request_timeout(Duration::from_millis(400))) => r,
        () = serve_forever => unreachable!(),
    };
    let took = start.elapsed();
    let err = res.expect_err("no leader within the request timeout");
    assert!(matches!(&err, Error::Unavailable { message, .. } if message.contains("not the leader")), "{err}");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(1500), "gave up after {took:?}");
    assert!(tries.get() >= 2, "tried {} time(s)", tries.get());
}

#[tokio::test]
async fn not_leader_answer_is_resent_with_its_id_on_the_leader() {
    let follower = FakeServer::bind().await;
    let leader = FakeServer::bind().await;
    let (client, mut conn) = connect(&follower, opts(&follower.addr), &FakeOpts::default()).await;
    let session = client.session_id();
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(30)).wait(Duration::from_secs(5)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.status(&r, Status::NOT_LEADER, 0, leader.addr.as_bytes()).await;
    let mut lconn = leader.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    assert_eq!(lconn.hello.session_id, session, "the same session on the leader");
    let again = lconn.read_op(Op::ACQUIRE).await;
    assert_eq!(again, r, "the same request, the same id");
    lconn.grant(&again, 21, 0).await;
    assert_eq!(task.await.unwrap().expect("acquired on the leader").token(), 21);
}

#[tokio::test]
async fn goaway_moves_to_the_leader_and_resumes_a_queued_acquire() {
    let old = FakeServer::bind().await;
    let new = FakeServer::bind().await;
    let (client, mut conn) = connect(&old, opts(&old.addr), &FakeOpts::default()).await;
    let held = hold(&client, &mut conn, "held", 3).await;
    let c = client.clone();
    let start = std::time::Instant::now();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(30)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.send(Response {
        op: Op::GOAWAY,
        status: Status::OK,
        detail: GoawayReason::LEADERSHIP.0,
        data: new.addr.as_bytes(),
        ..Response::default()
    })
    .await;
    let mut nconn = new.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    let again = nconn.read_op(Op::ACQUIRE).await;
    assert_eq!(again, r);
    nconn.grant(&again, 40, 1200).await;
    let lock = task.await.unwrap().expect("granted after GOAWAY");
    assert_eq!(lock.token(), 40);
    // The deadline counts from the first send: (1200 + 30000) ms · 0.998 at most.
    let now = std::time::Instant::now();
    assert!(lock.deadline() <= now + Duration::from_micros(31_200 * 998), "{:?}", lock.deadline() - start);
    assert!(lock.deadline() >= now + Duration::from_secs(29));
    assert!(!held.is_lost(), "GOAWAY does not affect held locks");
}

#[tokio::test]
async fn a_request_made_after_a_pause_counts_its_lease_from_then() {
    // Requests queued right after a batch of answers share the batch's time (the clock is read
    // once per batch); one queued later must read the clock, or its deadline would come early.
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let _held = hold(&client, &mut conn, "a", 3).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let c = client.clone();
    let asked = std::time::Instant::now();
    let task = tokio::spawn(async move { c.acquire("b", Duration::from_secs(1)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&r, 4, 0).await;
    let lock = task.await.unwrap().expect("granted");
    let lease = lock.deadline() - asked;
    assert!(lease >= Duration::from_millis(990), "the lease counts from before the pause: {lease:?}");
}

/// `(detail + lease) · (1 − 2ρ)`: how long after the first send of an `ACQUIRE` its deadline comes.
fn rule(detail_ms: u32, lease_ms: u32) -> Duration {
    Duration::from_micros(u64::from(detail_ms + lease_ms) * (1000 - 2 * u64::from(wire::CLOCK_RATE_BOUND_PPM) / 1000))
}

#[tokio::test]
async fn a_grant_read_after_a_resend_counts_from_the_first_send() {
    // PROTOCOL.md, "The lost signal": whichever send an ACQUIRE OK answers, the deadline is the
    // first send + (detail + lease)(1 − 2ρ), `detail` counting from the request's first arrival.
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let resumed = FakeOpts { resumed: true, ..FakeOpts::default() };
    let tolerance = Duration::from_millis(5);

    // A hand-off decided 100 ms after the first arrival, before the re-send, and read after the
    // re-send 300 ms later: counted from the re-send, the deadline would be ~200 ms late.
    let c = client.clone();
    let start = std::time::Instant::now();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(3)).await });
    let first = conn.read_op(Op::ACQUIRE).await;
    let sent = std::time::Instant::now(); // after the first send
    drop(conn);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = fake.accept(&resumed).await;
    let again = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(again, first, "re-sent with its id");
    conn.grant(&again, 7, 100).await;
    let lock = task.await.unwrap().expect("granted after the resume");
    let deadline = lock.deadline();
    assert!(deadline <= sent + rule(100, 3000), "{:?} late", deadline - (sent + rule(100, 3000)));
    assert!(deadline + tolerance >= start + rule(100, 3000), "{:?} early", start + rule(100, 3000) - deadline);

    // A waiter re-sent after a reconnect and granted a second later: its `detail` counts the
    // time queued before the re-send too, and so does its deadline.
    let c = client.clone();
    let start = std::time::Instant::now();
    let task = tokio::spawn(async move { c.acquire("k2", Duration::from_secs(3)).await });
    let first = conn.read_op(Op::ACQUIRE).await;
    let sent = std::time::Instant::now();
    drop(conn);
    let mut conn = fake.accept(&resumed).await;
    let again = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(again, first, "re-sent with its id");
    tokio::time::sleep(SECOND).await;
    let detail = u32::try_from(sent.elapsed().as_millis()).expect("ms");
    conn.grant(&again, 8, detail).await;
    let lock2 = task.await.unwrap().expect("granted after the resume");
    let deadline = lock2.deadline();
    assert!(deadline <= sent + rule(detail, 3000), "{:?} late", deadline - (sent + rule(detail, 3000)));
    let earliest = start + rule(detail, 3000);
    assert!(deadline + tolerance >= earliest, "{:?} early", earliest - deadline);
    assert!(!lock.is_lost() && !lock2.is_lost());
}

#[tokio::test]
async fn an_older_extends_answer_handled_after_a_newer_ones_does_not_move_the_deadline() {
    // Keep-alive and the application may extend one lock at once; the server applies extends in
    // id order, so the lease is the newest one's, whatever order the answers are handled in.
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let lock = std::sync::Arc::new(hold(&client, &mut conn, "k", 9).await);
    let extend = |lease: Duration| {
        let lock = lock.clone();
        tokio::spawn(async move { lock.extend(lease).await })
    };
    let older = extend(Duration::from_secs(60));
    let e_older = conn.read_op(Op::EXTEND).await;
    let newer = extend(Duration::from_secs(2));
    let e_newer = conn.read_op(Op::EXTEND).await;
    assert!(e_newer.id > e_older.id);
    let sent = Instant::now(); // after the newer one's send
    let answer = |e: &crate::support::Req| Response {
        op: Op::EXTEND,
        status: Status::OK,
        id: e.id,
        token: 9,
        lease_ms: e.lease_ms,
        ..Response::default()
    };
    conn.send(answer(&e_newer)).await;
    assert_eq!(newer.await.unwrap().expect("extended"), Duration::from_secs(2));
    conn.send(answer(&e_older)).await;
    assert_eq!(older.await.unwrap().expect("extended"), Duration::from_secs(60), "the server did extend it");
    assert_eq!(lock.lease(), Duration::from_secs(2), "the newer extend's lease stays");
    let limit = sent.into_std() + Duration::from_micros(2000 * 998);
    assert!(lock.deadline() <= limit, "the deadline moved to the older extend's: {:?} late", lock.deadline() - limit);
}

#[tokio::test]
async fn resume_resends_unanswered_requests_in_id_order_before_new_ones() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let mut tasks = Vec::new();
    for key in ["a", "b", "c"] {
        let c = client.clone();
        tasks.push(tokio::spawn(async move { c.acquire(key, Duration::from_secs(9)).await }));
    }
    let mut sent = Vec::new();
    for _ in 0..3 {
        sent.push(conn.read_op(Op::ACQUIRE).await);
    }
    sent.sort_by_key(|r| r.id);
    drop(conn); // the connection drops
    let mut conn = fake.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    let c = client.clone();
    let later = tokio::spawn(async move { c.inspect("z").await });
    let mut resent = Vec::new();
    for _ in 0..3 {
        resent.push(conn.read().await);
    }
    assert_eq!(resent, sent, "re-sent with their ids and fields, in id order");
    let new = conn.read_op(Op::INSPECT).await;
    assert!(new.id > sent[2].id, "new requests come after the re-sent ones");
    for (i, r) in resent.iter().enumerate() {
        conn.grant(r, 100 + i as u64, 0).await;
    }
    for t in tasks {
        let _lock = t.await.unwrap().expect("granted after resume");
    }
    conn.status(&new, Status::OK, 0, &[0; 12]).await;
    later.await.unwrap().expect("inspect");
}

#[tokio::test]
async fn session_not_resumed_fails_unanswered_requests_and_keeps_locks() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let lock = hold(&client, &mut conn, "held", 5).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    conn.read_op(Op::ACQUIRE).await;
    drop(conn);
    let mut conn = fake.accept(&FakeOpts { resumed: false, ..FakeOpts::default() }).await;
    let err = task.await.unwrap().expect_err("not resumed");
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert!(!lock.is_lost(), "held locks keep their deadline");
    assert!(conn.read_within(Duration::from_millis(200)).await.is_none(), "nothing re-sent");
}

#[tokio::test]
async fn a_new_state_id_loses_every_lock_and_fails_every_request() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let first_session = client.session_id();
    let lock = hold(&client, &mut conn, "held", 5).await;
    let mut lost = lock.lost_watch();
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    conn.read_op(Op::ACQUIRE).await;
    drop(conn);
    let restarted = FakeOpts { state_id: [9; 16], ..FakeOpts::default() };
    // The client sees the new state id, fails everything, and comes back with a new session.
    let _first = fake.accept(&restarted).await;
    let err = task.await.unwrap().expect_err("restart");
    assert!(matches!(err, Error::ServerRestarted), "{err}");
    tokio::time::timeout(SECOND, lost.wait_for(|r| r.is_some())).await.expect("lost").expect("watch");
    assert_eq!(lock.lost_reason(), Some(LostReason::ServerRestarted));
    let mut conn = fake.accept(&restarted).await;
    assert_ne!(conn.hello.session_id, first_session, "a new session id after a restart");
    assert_eq!(client.session_id(), conn.hello.session_id);
    let c = client.clone();
    let p = tokio::spawn(async move { c.ping().await });
    let r = conn.read().await;
    assert_eq!((r.op, r.id), (Op::PING, 1), "nothing re-sent; ids start over for the new session");
    conn.ok(&r).await;
    p.await.unwrap().expect("ping");
    let err = lock.release().await.expect_err("lost");
    assert_eq!(err.lost_reason(), Some(LostReason::ServerRestarted));
    assert!(conn.read_within(Duration::from_millis(100)).await.is_none(), "nothing to release on the new server");
    // A lock of the new server with the old one's token (a server that broke the promise that
    // tokens never repeat, or another cluster) is a lock of its own: the old one stays lost.
    let new = hold(&client, &mut conn, "held", 5).await;
    assert_eq!(new.lost_reason(), None);
    assert_eq!(lock.lost_reason(), Some(LostReason::ServerRestarted));
    drop(lock);
    assert!(client.holds("held"), "dropping the old lock leaves the new one");
    let c = client.clone();
    let rel = tokio::spawn(async move { new.release().await });
    let r = conn.read_op(Op::RELEASE).await;
    assert_eq!(r.token, 5);
    conn.ok(&r).await;
    rel.await.unwrap().expect("released");
    assert!(!c.holds("held"));
}

#[tokio::test]
async fn dropping_an_acquire_cancels_it_and_releases_a_raced_grant() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    let acq = conn.read_op(Op::ACQUIRE).await;
    task.abort();
    let cancel = conn.read_op(Op::CANCEL).await;
    assert_eq!(cancel.token, acq.id, "CANCEL names the acquire's id");
    // The grant raced the cancel: the server answers OK first, then CANCEL with detail 0.
    conn.grant(&acq, 77, 0).await;
    conn.status(&cancel, Status::OK, 0, &[]).await;
    let release = conn.read_op(Op::RELEASE).await;
    assert_eq!((release.token, release.key.as_slice()), (77, &b"k"[..]), "the raced grant is released");
    conn.ok(&release).await;
    assert!(!client.holds("k"));

    // A cancel that withdraws: CANCELLED then CANCEL OK detail 1; nothing to release.
    let c = client.clone();
    let fut = c.acquire("k2", Duration::from_secs(9)).wait(Duration::from_secs(60));
    let task = tokio::spawn(fut.into_future());
    let acq = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(acq.wait_ms, 60_000);
    task.abort();
    let cancel = conn.read_op(Op::CANCEL).await;
    conn.status(&acq, Status::CANCELLED, 0, &[]).await;
    conn.status(&cancel, Status::OK, 1, &[]).await;
    assert!(conn.read_within(Duration::from_millis(200)).await.is_none(), "no release for a withdrawn acquire");
}

#[tokio::test]
async fn an_acquire_dropped_while_disconnected_is_cancelled_after_the_resume() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    let acq = conn.read_op(Op::ACQUIRE).await;
    drop(conn);
    // Give up the wait while the connection is gone (the CANCEL cannot reach the server now).
    task.abort();
    let _ = task.await;
    let mut conn = fake.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    let again = conn.read().await;
    assert_eq!(again, acq, "the acquire is re-sent first (it may have been granted)");
    let cancel = conn.read().await;
    assert_eq!((cancel.op, cancel.token), (Op::CANCEL, acq.id), "then withdrawn");
    conn.grant(&again, 5, 0).await;
    conn.status(&cancel, Status::OK, 0, &[]).await;
    let release = conn.read_op(Op::RELEASE).await;
    assert_eq!(release.token, 5);
}

#[tokio::test]
async fn ack_is_sent_within_1024_answers_one_at_a_time() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    // An acquire that stays queued: ACK's point may pass it.
    let c = client.clone();
    let _queued = tokio::spawn(async move { c.acquire("q", Duration::from_secs(9)).await });
    let acq = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(acq.id, 1);
    let c = client.clone();
    let pings = tokio::spawn(async move {
        for _ in 0..2600 {
            c.ping().await.expect("ping");
        }
    });
    let mut answers = 0u32;
    let mut since_ack = 0u32;
    let mut acks = Vec::new();
    let mut held_ack = None;
    while acks.len() < 2 {
        let r = conn.read().await;
        match r.op {
            Op::PING => {
                conn.ok(&r).await;
                answers += 1;
                since_ack += 1;
                assert!(since_ack <= 1024 + 1, "no ACK within 1024 answers");
                // Hold the first ACK's answer for 300 more answers: no second ACK meanwhile.
                if let Some(a) = &held_ack
                    && since_ack >= 300
                {
                    conn.ok(a).await;
                    held_ack = None;
                }
            }
            Op::ACK => {
                assert!(held_ack.is_none(), "a second ACK while the first is unanswered");
                assert!(r.token > 1, "the queued acquire does not hold the ACK point back");
                assert!(r.token <= r.id, "nothing above the ACK's own id is acknowledged");
                acks.push(r.clone());
                since_ack = 0;
                if acks.len() == 1 {
                    held_ack = Some(r);
                } else {
                    conn.ok(&r).await;
                }
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(answers > 1000);
    pings.abort();
}

#[tokio::test]
async fn ack_point_is_the_lowest_request_still_awaited() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let _queued = tokio::spawn(async move { c.acquire("q", Duration::from_secs(9)).await });
    assert_eq!(conn.read_op(Op::ACQUIRE).await.id, 1);
    // A ping whose answer the server holds back.
    let c = client.clone();
    let _held = tokio::spawn(async move { c.ping().await });
    let mut held = Some(conn.read_op(Op::PING).await);
    assert_eq!(held.as_ref().map(|h| h.id), Some(2));
    let c = client.clone();
    let pings = tokio::spawn(async move {
        for _ in 0..3000 {
            if c.ping().await.is_err() {
                break;
            }
        }
    });
    let mut acks = Vec::new();
    while acks.len() < 3 {
        let r = conn.read().await;
        match r.op {
            Op::PING => conn.ok(&r).await,
            Op::ACK => {
                acks.push((r.id, r.token));
                conn.ok(&r).await;
                if let Some(h) = held.take() {
                    conn.ok(&h).await;
                }
            }
            other => panic!("unexpected {other}"),
        }
    }
    // The first ACK stops at the ping still awaited (passing the queued acquire); once that is
    // answered, the next ones pass it too: nothing is awaited below them but the acquire (the
    // pings go one at a time, and an ACK is sent right after an answer).
    assert_eq!(acks[0].1, 2, "the first ACK's point is the unanswered ping: {acks:?}");
    for &(id, token) in &acks[1..] {
        assert_eq!(token, id, "nothing is awaited below a later ACK but the acquire: {acks:?}");
    }
    pings.abort();
}

#[tokio::test]
async fn heartbeat_detects_a_frozen_server_and_reconnects() {
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).heartbeat_interval(Duration::from_millis(100)).request_timeout(Duration::from_millis(300));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    let ping = conn.read().await;
    assert_eq!(ping.op, Op::PING, "a PING after 100 ms of silence");
    // Never answered: the connection is given up and the client dials again.
    let start = Instant::now();
    let again = fake.try_accept(Duration::from_secs(3), &FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    assert!(again.is_some(), "reconnected");
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(client);
}

#[tokio::test]
async fn request_timeout_bounds_a_call_and_excludes_queued_time() {
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(Duration::from_millis(300));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    let start = Instant::now();
    let err = client.ping().await.expect_err("no answer");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(290) && start.elapsed() < Duration::from_secs(2));
    conn.read_op(Op::PING).await;

    // An acquire waits its wait timeout plus the request timeout before giving up.
    let start = Instant::now();
    let c = client.clone();
    let task =
        tokio::spawn(async move { c.acquire("k", Duration::from_secs(1)).wait(Duration::from_millis(400)).await });
    let acq = conn.read_op(Op::ACQUIRE).await;
    let err = task.await.unwrap().expect_err("no answer");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(690), "queued time excluded: {:?}", start.elapsed());
    let cancel = conn.read_op(Op::CANCEL).await;
    assert_eq!(cancel.token, acq.id, "a timed-out acquire is withdrawn");
}

#[tokio::test]
async fn a_call_long_after_the_last_answers_times_out_from_its_own_start() {
    // Requests queued in reaction to a batch of answers are stamped with the batch's arrival
    // rather than each reading the clock: a call made later must not inherit that stamp.
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(Duration::from_millis(300));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    for _ in 0..2 {
        let c = client.clone();
        let task = tokio::spawn(async move { c.ping().await });
        let ping = conn.read_op(Op::PING).await;
        conn.ok(&ping).await;
        task.await.unwrap().expect("answered");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start = Instant::now();
        let err = client.ping().await.expect_err("no answer");
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(290) && took < Duration::from_secs(2), "timed out after {took:?}");
        conn.read_op(Op::PING).await;
    }
}

#[tokio::test]
async fn expired_pushes_fire_lost_with_their_reason() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let a = hold(&client, &mut conn, "a", 10).await;
    let b = hold(&client, &mut conn, "b", 11).await;
    let c = hold(&client, &mut conn, "c", 12).await;
    let push = |token: u64, key: &'static [u8], reason: u32| Response {
        op: Op::EXPIRED,
        status: Status::OK,
        token,
        detail: reason,
        data: key,
        ..Response::default()
    };
    conn.send(push(10, b"other key", ExpiredReason::LEASE.0)).await; // wrong key: ignored
    conn.send(push(99, b"a", ExpiredReason::LEASE.0)).await; // unknown token: ignored
    conn.send(push(10, b"a", ExpiredReason::LEASE.0)).await;
    conn.send(push(11, b"b", ExpiredReason::STOPPING.0)).await;
    conn.send(push(12, b"c", 77)).await; // an unknown reason counts as lost
    conn.send(Response { op: ticketing::wire::Op(0x2f), status: Status::OK, ..Response::default() }).await; // unknown push
    assert_eq!(tokio::time::timeout(SECOND, a.lost()).await.expect("a lost"), LostReason::Expired);
    assert_eq!(tokio::time::timeout(SECOND, b.lost()).await.expect("b lost"), LostReason::ServerStopping);
    assert_eq!(tokio::time::timeout(SECOND, c.lost()).await.expect("c lost"), LostReason::Expired);
    // Releasing a lost lock still tells the server, and reports lock-lost.
    let c2 = client.clone();
    let rel = tokio::spawn(async move { (a.release().await, a) });
    let r = conn.read_op(Op::RELEASE).await;
    assert_eq!(r.token, 10);
    conn.status(&r, Status::NOT_HELD, 0, &[]).await;
    let (res, a) = rel.await.unwrap();
    assert_eq!(res.expect_err("lost").lost_reason(), Some(LostReason::Expired), "the first reason stays");
    assert_eq!(a.lost_reason(), Some(LostReason::Expired));
    assert!(!c2.holds("a") && !c2.holds("b") && !c2.holds("c"));
}

#[tokio::test]
async fn the_local_deadline_fires_lost_a_little_early() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let start = Instant::now();
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_millis(400)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&r, 3, 100).await; // 100 ms queued, then 400 ms lease
    let lock = task.await.unwrap().expect("granted");
    let reason = tokio::time::timeout(SECOND * 2, lock.lost()).await.expect("lost in time");
    let fired = start.elapsed();
    assert_eq!(reason, LostReason::Expired);
    // (100 + 400) · 0.998 − 5 = 494 ms after the send, which is after `start`.
    assert!(fired >= Duration::from_millis(494), "fired at {fired:?}, before the deadline");
    assert!(fired < Duration::from_millis(900), "fired at {fired:?}");
    assert!(!client.holds("k"));
}

/// Acquires `key` through `conn` with a `lease_ms` lease, granting token `token`; returns the
/// lock and when the acquire started (before its request was sent).
async fn hold_for(client: &Client, conn: &mut FakeConn, key: &str, token: u64, lease_ms: u64) -> (Lock, Instant) {
    let c = client.clone();
    let key2 = key.to_owned();
    let start = Instant::now();
    let task = tokio::spawn(async move { c.acquire(key2, Duration::from_millis(lease_ms)).await });
    let req = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&req, token, 0).await;
    (task.await.expect("task").expect("acquire"), start)
}

/// When `lock` is lost, and why.
async fn lost_at(lock: &Lock) -> (LostReason, Instant) {
    let reason = tokio::time::timeout(SECOND * 5, lock.lost()).await.expect("lost within 5 s");
    (reason, Instant::now())
}

#[tokio::test]
async fn locks_are_lost_at_their_own_deadlines_whatever_the_order_they_come_in() {
    // One timer serves all of a client's locks: leases granted out of their deadline order, and
    // an extend that brings a deadline closer, still fire each lock at its own deadline.
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    // An extend that brings the only deadline closer.
    let (d, _) = hold_for(&client, &mut conn, "d", 4, 10_000).await;
    let d_start = Instant::now();
    let ext = tokio::spawn(async move { (d.extend(Duration::from_millis(200)).await, d) });
    let e = conn.read_op(Op::EXTEND).await;
    conn.send(Response {
        op: Op::EXTEND,
        status: Status::OK,
        id: e.id,
        token: 4,
        lease_ms: 200,
        ..Response::default()
    })
    .await;
    let (res, d) = ext.await.unwrap();
    assert_eq!(res.expect("extended"), Duration::from_millis(200));
    let (rd, td) = lost_at(&d).await;
    // Leases granted out of their deadline order.
    let (a, a_start) = hold_for(&client, &mut conn, "a", 1, 900).await;
    let (b, b_start) = hold_for(&client, &mut conn, "b", 2, 300).await;
    let (c, c_start) = hold_for(&client, &mut conn, "c", 3, 600).await;
    let ((ra, ta), (rb, tb), (rc, tc)) = tokio::join!(lost_at(&a), lost_at(&b), lost_at(&c));
    assert_eq!([ra, rb, rc, rd], [LostReason::Expired; 4]);
    // lease · 0.998 − 5 ms after the send, which is after the start; late by at most 400 ms.
    for (name, fired, start, lease_ms) in
        [("a", ta, a_start, 900), ("b", tb, b_start, 300), ("c", tc, c_start, 600), ("d", td, d_start, 200)]
    {
        let after = fired - start;
        let earliest = Duration::from_micros(lease_ms * 998) - Duration::from_millis(5);
        assert!(after >= earliest, "{name} lost {after:?} after its start, before its deadline");
        assert!(after < earliest + Duration::from_millis(400), "{name} lost {after:?} after its start");
    }
    assert!(tb < tc && tc < ta, "in deadline order");
    for key in ["a", "b", "c", "d"] {
        assert!(!client.holds(key), "{key} still held");
    }
}

#[tokio::test]
async fn call_timeouts_hold_whatever_the_order_of_answers_and_deadlines() {
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(Duration::from_millis(300));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    // An acquire with a long wait limit comes first: the calls after it still time out on time.
    let c = client.clone();
    let acq = tokio::spawn(async move { c.acquire("k", SECOND).wait(Duration::from_secs(3)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    let start = Instant::now();
    let err = client.ping().await.expect_err("no answer");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(290) && start.elapsed() < Duration::from_millis(1500));
    conn.read_op(Op::PING).await;
    conn.status(&r, Status::TIMED_OUT, 0, &[]).await;
    let err = acq.await.unwrap().expect_err("not acquired");
    assert!(matches!(err, Error::NotAcquired { .. }), "{err}");

    // Answers out of order, then one that never comes: it times out 300 ms after its start.
    let pings: Vec<_> = (0..3)
        .map(|_| {
            let c = client.clone();
            tokio::spawn(async move { c.ping().await })
        })
        .collect();
    let mut reqs = Vec::new();
    for _ in 0..3 {
        reqs.push(conn.read_op(Op::PING).await);
    }
    for i in [2, 0, 1] {
        conn.ok(&reqs[i]).await;
    }
    for p in pings {
        p.await.unwrap().expect("answered");
    }
    let start = Instant::now();
    let err = client.ping().await.expect_err("no answer");
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(290) && start.elapsed() < Duration::from_millis(1500));
}

#[tokio::test]
async fn a_malformed_frame_drops_the_connection_and_the_session_resumes() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.ping().await });
    let ping = conn.read_op(Op::PING).await;
    // data_len disagrees with the length: the frame cannot be trusted.
    conn.send_raw(&crate::support::from_hex("0000001d14000000000000000000000100000000000000000000000000000000aa"))
        .await;
    let mut conn = fake.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    let again = conn.read().await;
    assert_eq!(again, ping);
    conn.ok(&again).await;
    task.await.unwrap().expect("answered after the resume");

    // A length above the ceiling, from the first 4 bytes.
    let c = client.clone();
    let task = tokio::spawn(async move { c.ping().await });
    let ping = conn.read_op(Op::PING).await;
    conn.send_raw(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).await;
    let mut conn = fake.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    let again = conn.read().await;
    assert_eq!(again, ping);
    conn.ok(&again).await;
    task.await.unwrap().expect("answered after the resume");
}

#[tokio::test]
async fn unknown_and_error_statuses_map_to_errors() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let cases: Vec<(Status, u32, &[u8])> = vec![
        (Status(42), 7, b"new"),
        (Status::BUSY, 5, b"too many"),
        (Status::INVALID, 4, b"key too long"),
        (Status::SHUTTING_DOWN, 0, b"bye"),
        (Status::TIMED_OUT, 0, b""),
        (Status::CANCELLED, 0, b""),
    ];
    for (status, detail, data) in cases {
        let c = client.clone();
        let task =
            tokio::spawn(async move { c.acquire("k", Duration::from_secs(1)).wait(Duration::from_millis(10)).await });
        let r = conn.read_op(Op::ACQUIRE).await;
        conn.status(&r, status, detail, data).await;
        let err = task.await.unwrap().expect_err("an error");
        let ok = match status {
            Status::BUSY => matches!(&err, Error::Busy { limit, .. } if limit.0 == 5),
            Status::INVALID => matches!(&err, Error::InvalidArgument { field: Some(f), .. } if f.0 == 4),
            Status::SHUTTING_DOWN => matches!(err, Error::ShuttingDown { .. }),
            Status::TIMED_OUT => matches!(err, Error::NotAcquired { .. }),
            Status::CANCELLED => matches!(err, Error::Cancelled { .. }),
            _ => matches!(err, Error::Status { status: Status(42), detail: 7, .. }),
        };
        assert!(ok, "{status}: {err:?}");
        assert!(!err.to_string().contains('\n'), "one line: {err}");
    }
    // A try that finds the key taken is a value, not an error.
    let c = client.clone();
    let task = tokio::spawn(async move { c.try_acquire("k", Duration::from_secs(1)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(r.wait_ms, 0);
    conn.status(&r, Status::TIMED_OUT, 0, &[]).await;
    assert!(task.await.unwrap().expect("try").is_none());
}

#[tokio::test]
async fn tls_and_plaintext_mismatches_say_so() {
    // A plaintext client meeting a TLS server (which answers with a TLS alert record).
    let fake = FakeServer::bind().await;
    let (res, _) = tokio::join!(Client::connect(opts(&fake.addr)), async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = fake.accept_raw().await;
        let mut hello = [0u8; 56];
        s.read_exact(&mut hello).await.expect("hello");
        s.write_all(&[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46]).await.expect("alert");
        s
    });
    let err = res.expect_err("plaintext to TLS");
    assert!(matches!(&err, Error::Tls { message, .. } if message.contains("is the server using TLS")), "{err}");

    // A TLS client meeting a plaintext server that closes on the ClientHello.
    let certs = crate::support::Certs::make();
    let tls = ticketing::TlsOptions::new().ca_file(certs.path("ca.pem"));
    let (res, _) = tokio::join!(Client::connect(opts(&fake.addr).tls(tls)), async {
        use tokio::io::AsyncReadExt;
        let mut s = fake.accept_raw().await;
        let mut b = [0u8; 56];
        let _ = s.read_exact(&mut b).await;
    });
    let err = res.expect_err("TLS to plaintext");
    assert!(matches!(&err, Error::Tls { message, .. } if message.contains("is the server using TLS")), "{err}");

    // A CA file that does not exist is a TLS configuration error, before any dial.
    let err = Client::connect(opts(&fake.addr).tls(ticketing::TlsOptions::new().ca_file("/nonexistent/ca.pem")))
        .await
        .expect_err("no CA");
    assert!(matches!(&err, Error::Tls { endpoint, .. } if endpoint.is_empty()), "{err}");
}

#[tokio::test]
async fn unanswered_requests_fail_when_the_grace_passes_without_a_reconnect() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts { grace_ms: 300, ..FakeOpts::default() }).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    conn.read_op(Op::ACQUIRE).await;
    let start = Instant::now();
    drop(conn);
    drop(fake); // nobody listens any more
    let err = task.await.unwrap().expect_err("grace passed");
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(250) && start.elapsed() < Duration::from_secs(3));

    // While disconnected, a new call waits for a connection, bounded by the request timeout.
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).request_timeout(Duration::from_millis(300));
    let (client, conn) = connect(&fake, o, &FakeOpts { grace_ms: 0, ..FakeOpts::default() }).await;
    let mut conn = conn;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    conn.read_op(Op::ACQUIRE).await;
    drop(conn);
    drop(fake);
    let err = task.await.unwrap().expect_err("no grace");
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
    let start = Instant::now();
    let err = client.ping().await.expect_err("no server");
    assert!(start.elapsed() < Duration::from_secs(2), "bounded: {:?}", start.elapsed());
    assert!(matches!(err, Error::Unavailable { .. } | Error::Timeout { .. }), "{err}");
}

#[tokio::test]
async fn a_retried_acquire_answered_not_held_reports_the_unknown_outcome() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    conn.read_op(Op::ACQUIRE).await;
    drop(conn);
    let mut conn = fake.accept(&FakeOpts { resumed: true, ..FakeOpts::default() }).await;
    let again = conn.read_op(Op::ACQUIRE).await;
    conn.status(&again, Status::NOT_HELD, 0, &[]).await;
    let err = task.await.unwrap().expect_err("nothing held");
    assert!(matches!(err, Error::ConnectionLost { .. }), "{err}");
}

#[tokio::test]
async fn keepalive_extends_until_release_and_never_after() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let lock = hold_kept_alive(&client, &mut conn, "k", 9, 300).await;
    for _ in 0..4 {
        let e = conn.read_op(Op::EXTEND).await;
        assert_eq!((e.token, e.lease_ms, e.key.as_slice()), (9, 300, &b"k"[..]));
        conn.send(Response {
            op: Op::EXTEND,
            status: Status::OK,
            id: e.id,
            token: 9,
            lease_ms: 300,
            ..Response::default()
        })
        .await;
    }
    assert!(!lock.is_lost(), "extended past the first lease");
    let rel = tokio::spawn(async move { (lock.release().await, lock) });
    let release = loop {
        let r = conn.read().await;
        match r.op {
            Op::RELEASE => break r,
            Op::EXTEND => {
                conn.send(Response {
                    op: Op::EXTEND,
                    status: Status::OK,
                    id: r.id,
                    token: 9,
                    lease_ms: 300,
                    ..Response::default()
                })
                .await
            }
            other => panic!("unexpected {other}"),
        }
    };
    conn.ok(&release).await;
    let (res, lock) = rel.await.unwrap();
    res.expect("released");
    assert!(lock.is_released());
    assert!(conn.read_within(Duration::from_millis(400)).await.is_none(), "no EXTEND after the release");
}

#[tokio::test]
async fn a_dropped_lock_is_forgotten_at_once_and_sends_nothing() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let lock = hold_kept_alive(&client, &mut conn, "k", 9, 150).await;
    let mut lost = lock.lost_watch();
    assert!(client.holds("k"));
    drop(lock);
    // Its state left with it: not held, its lost signal's sender gone, keep-alive stopped (no
    // EXTEND, no RELEASE), and an EXPIRED for it changes nothing.
    assert!(!client.holds("k"));
    assert!(lost.changed().await.is_err(), "the lost signal closes with the lock");
    assert_eq!(*lost.borrow(), None, "never fired");
    conn.send(Response { op: Op::EXPIRED, token: 9, data: b"k", ..Response::default() }).await;
    assert!(conn.read_within(Duration::from_millis(300)).await.is_none(), "nothing sent for a dropped lock");
    let c = client.clone();
    let p = tokio::spawn(async move { c.ping().await });
    let r = conn.read_op(Op::PING).await;
    conn.ok(&r).await;
    p.await.unwrap().expect("the connection lives on");
}

#[tokio::test]
async fn keepalive_stops_at_max_hold_and_a_not_held_extend_loses_the_lock() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let start = Instant::now();
    let task = tokio::spawn(async move {
        c.acquire("k", Duration::from_millis(600)).keep_alive(true).max_hold(Duration::from_millis(1200)).await
    });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&r, 9, 0).await;
    let lock = task.await.unwrap().expect("granted");
    // Extends every 200 ms while the max hold lasts, then none: the lock runs out its lease. (With
    // a 150 ms lease a stall of 100 ms on a loaded machine could lose the lock before the cap.)
    let mut extends = 0;
    while let Some(e) = conn.read_within(Duration::from_millis(1000)).await {
        assert_eq!(e.op, Op::EXTEND);
        assert!(start.elapsed() < Duration::from_millis(1200 + 400), "an extend after the max hold");
        extends += 1;
        conn.send(Response {
            op: Op::EXTEND,
            status: Status::OK,
            id: e.id,
            token: 9,
            lease_ms: 600,
            ..Response::default()
        })
        .await;
    }
    assert!(extends >= 1, "keep-alive extended");
    assert_eq!(tokio::time::timeout(3 * SECOND, lock.lost()).await.expect("expired"), LostReason::Expired);

    // An explicit extend answered NOT_HELD makes the lock lost, once.
    let mut lock2 = hold(&client, &mut conn, "k2", 10).await;
    let mut watch = lock2.lost_watch();
    let ext = tokio::spawn(async move { (lock2.extend(Duration::from_secs(5)).await, lock2) });
    let e = conn.read_op(Op::EXTEND).await;
    conn.status(&e, Status::NOT_HELD, 0, &[]).await;
    let res;
    (res, lock2) = ext.await.unwrap();
    assert_eq!(res.expect_err("not held").lost_reason(), Some(LostReason::NotHeld));
    watch.changed().await.expect("fired");
    assert_eq!(*watch.borrow(), Some(LostReason::NotHeld));
    assert!(lock2.extend(Duration::from_secs(1)).await.is_err(), "a lost lock is not extended");
    assert!(conn.read_within(Duration::from_millis(100)).await.is_none(), "nothing sent for a lost lock");
}

#[tokio::test]
async fn bad_arguments_are_rejected_before_anything_is_sent() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let long = vec![b'x'; 65_536];
    let checks: Vec<(&str, Result<(), Error>)> = vec![
        ("empty key", client.acquire("", Duration::from_secs(1)).await.map(drop)),
        ("long key", client.acquire(&long, Duration::from_secs(1)).await.map(drop)),
        ("zero lease", client.acquire("k", Duration::ZERO).await.map(drop)),
        ("sub-ms lease", client.acquire("k", Duration::from_micros(500)).await.map(drop)),
        ("huge lease", client.acquire("k", Duration::from_secs(5_000_000)).await.map(drop)),
        ("try zero lease", client.try_acquire("k", Duration::ZERO).await.map(drop)),
        ("release token 0", client.release("k", 0).await),
        ("release empty key", client.release("", 5).await),
        ("extend zero lease", client.extend("k", 5, Duration::ZERO).await.map(drop)),
        ("inspect empty key", client.inspect("").await.map(drop)),
    ];
    for (what, res) in checks {
        let err = res.expect_err(what);
        assert!(matches!(err, Error::InvalidArgument { .. }), "{what}: {err}");
    }
    let err = client.acquire("k", Duration::from_micros(500)).await.expect_err("unit");
    assert!(err.to_string().contains("1 ms"), "says the unit: {err}");
    assert!(conn.read_within(Duration::from_millis(200)).await.is_none(), "nothing was sent");
    // The largest key is accepted locally.
    let c = client.clone();
    let key = vec![b'y'; 65_535];
    let task = tokio::spawn(async move { c.try_acquire(key, Duration::from_secs(1)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(r.key.len(), 65_535);
    conn.status(&r, Status::INVALID, 4, b"key too long").await;
    assert!(matches!(task.await.unwrap(), Err(Error::InvalidArgument { .. })));
}

#[tokio::test]
async fn refuse_held_fails_at_once_and_queueing_behind_yourself_is_the_default() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let lock = hold(&client, &mut conn, "k", 4).await;
    assert!(client.holds("k"));
    let err = client.acquire("k", Duration::from_secs(1)).refuse_held(true).await.expect_err("held");
    assert!(matches!(err, Error::AlreadyHeld { .. }), "{err}");
    assert!(conn.read_within(Duration::from_millis(100)).await.is_none(), "nothing sent");
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(1)).await });
    let r = conn.read_op(Op::ACQUIRE).await;
    assert_eq!(r.key, b"k", "queues behind itself");
    task.abort();
    drop(lock);
}

#[tokio::test]
async fn close_fails_calls_in_flight_returns_promptly_and_keeps_locks() {
    let fake = FakeServer::bind().await;
    // The server never answers the withdrawal: close waits the cleanup timeout at most.
    let o = opts(&fake.addr).cleanup_timeout(Duration::from_millis(500));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    let lock = hold(&client, &mut conn, "held", 4).await;
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire("k", Duration::from_secs(9)).await });
    conn.read_op(Op::ACQUIRE).await;
    let start = Instant::now();
    client.close().await;
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(matches!(task.await.unwrap(), Err(Error::Closed)));
    assert!(matches!(client.ping().await, Err(Error::Closed)));
    // The queued acquire was withdrawn; no RELEASE for the held lock (release on close is off);
    // the connection ends.
    let mut cancels = 0;
    loop {
        match conn.read_within(Duration::from_secs(2)).await {
            None => break,
            Some(r) if r.op == Op::CANCEL => cancels += 1,
            Some(r) => assert_ne!(r.op, Op::RELEASE, "close does not release"),
        }
    }
    assert!(cancels >= 1, "the queued acquire is withdrawn");
    assert!(!lock.is_lost());
    assert!(matches!(lock.release().await, Err(Error::Closed)));
    client.close().await; // idempotent
}

#[tokio::test]
async fn release_on_close_releases_held_locks() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr).release_on_close(true), &FakeOpts::default()).await;
    let _lock = hold(&client, &mut conn, "held", 4).await;
    let c = client.clone();
    let closing = tokio::spawn(async move { c.close().await });
    let r = conn.read_op(Op::RELEASE).await;
    assert_eq!(r.token, 4);
    conn.ok(&r).await;
    tokio::time::timeout(Duration::from_secs(3), closing).await.expect("close returns").unwrap();
}

#[tokio::test]
async fn scoped_helpers_report_a_lost_lock_and_guards_release_on_drop() {
    let fake = FakeServer::bind().await;
    let (client, mut conn) = connect(&fake, opts(&fake.addr), &FakeOpts::default()).await;
    let c = client.clone();
    let task = tokio::spawn(async move {
        c.with_lock("k", Duration::from_secs(10), async |lock| {
            let _ = tokio::time::timeout(Duration::from_secs(5), lock.lost()).await;
            lock.token()
        })
        .await
    });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&r, 31, 0).await;
    conn.send(Response {
        op: Op::EXPIRED,
        status: Status::OK,
        token: 31,
        detail: 1,
        data: b"k",
        ..Response::default()
    })
    .await;
    let rel = conn.read_op(Op::RELEASE).await;
    conn.status(&rel, Status::NOT_HELD, 0, &[]).await;
    let err = task.await.unwrap().expect_err("lost while the body ran");
    assert_eq!(err.lost_reason(), Some(LostReason::Expired));

    // The opt-out returns the body's value.
    let c = client.clone();
    let task = tokio::spawn(async move {
        c.acquire("k", Duration::from_secs(10)).report_lost(false).run(async |lock| lock.token()).await
    });
    let r = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&r, 32, 0).await;
    let rel = conn.read_op(Op::RELEASE).await;
    conn.ok(&rel).await;
    assert_eq!(task.await.unwrap().expect("ok"), 32);

    // A guard releases when dropped.
    let lock = hold(&client, &mut conn, "g", 33).await;
    let guard = lock.into_guard();
    assert_eq!(guard.token(), 33);
    drop(guard);
    let rel = conn.read_op(Op::RELEASE).await;
    assert_eq!(rel.token, 33);
    conn.ok(&rel).await;
}

#[tokio::test]
async fn a_client_that_cannot_connect_is_unavailable() {
    let fake = FakeServer::bind().await;
    let addr = fake.addr.clone();
    drop(fake);
    let start = Instant::now();
    let err = Client::connect(opts(&addr).endpoints([addr.clone(), addr.clone()])).await.expect_err("nobody listens");
    assert!(matches!(&err, Error::Unavailable { message, source: Some(_) } if message.contains(&addr)), "{err}");
    assert!(start.elapsed() < Duration::from_secs(2));
    let err = Client::connect(opts(&addr).endpoints(Vec::<String>::new())).await.expect_err("no endpoints");
    assert!(matches!(err, Error::InvalidArgument { .. }));

    // A server that accepts and never answers: the dial timeout bounds the handshake.
    let fake = FakeServer::bind().await;
    let start = Instant::now();
    let (res, _s) =
        tokio::join!(Client::connect(opts(&fake.addr).dial_timeout(Duration::from_millis(300))), fake.accept_raw());
    assert!(matches!(res, Err(Error::Unavailable { .. })), "{res:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    eventually(SECOND, "nothing", async || true).await;
}

#[tokio::test]
async fn cancel_on_waits_for_the_withdrawal_and_releases_a_raced_grant() {
    let fake = FakeServer::bind().await;
    let o = opts(&fake.addr).cleanup_timeout(Duration::from_millis(300));
    let (client, mut conn) = connect(&fake, o, &FakeOpts::default()).await;
    let acquire_cancellable = |key: &'static str| {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let c = client.clone();
        let task = tokio::spawn(async move {
            c.acquire(key, Duration::from_secs(9))
                .cancel_on(async move {
                    let _ = rx.await;
                })
                .await
        });
        (tx, task)
    };

    // The grant raced the cancellation: released before the acquire returns.
    let (stop, task) = acquire_cancellable("k");
    let acq = conn.read_op(Op::ACQUIRE).await;
    stop.send(()).expect("signal");
    let cancel = conn.read_op(Op::CANCEL).await;
    assert_eq!(cancel.token, acq.id);
    conn.grant(&acq, 5, 0).await;
    conn.status(&cancel, Status::OK, 0, &[]).await;
    let release = conn.read_op(Op::RELEASE).await;
    assert_eq!(release.token, 5);
    assert!(!task.is_finished(), "returns only after the release is answered");
    conn.ok(&release).await;
    let err = task.await.unwrap().expect_err("cancelled");
    assert!(matches!(err, Error::Cancelled { .. }), "{err}");
    assert!(!client.holds("k"));

    // Withdrawn from the queue: CANCELLED, then CANCEL OK with detail 1.
    let (stop, task) = acquire_cancellable("k2");
    let acq = conn.read_op(Op::ACQUIRE).await;
    stop.send(()).expect("signal");
    let cancel = conn.read_op(Op::CANCEL).await;
    assert!(!task.is_finished(), "waits for the server's word");
    conn.status(&acq, Status::CANCELLED, 0, &[]).await;
    conn.status(&cancel, Status::OK, 1, &[]).await;
    assert!(matches!(task.await.unwrap(), Err(Error::Cancelled { .. })));

    // No answer at all: the cleanup timeout bounds the wait; the rest happens in the background.
    let (stop, task) = acquire_cancellable("k3");
    let acq = conn.read_op(Op::ACQUIRE).await;
    let start = Instant::now();
    stop.send(()).expect("signal");
    conn.read_op(Op::CANCEL).await;
    assert!(matches!(task.await.unwrap(), Err(Error::Cancelled { .. })));
    assert!(start.elapsed() >= Duration::from_millis(250) && start.elapsed() < Duration::from_secs(2));
    conn.grant(&acq, 6, 0).await; // a late grant is still released
    assert_eq!(conn.read_op(Op::RELEASE).await.token, 6);
}

#[tokio::test]
async fn garbage_in_the_handshake_is_an_error_not_a_panic() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fake = FakeServer::bind().await;
    let challenge_ok = crate::support::from_hex(
        "0000002c02000100000000000000000000000000000000000000000000000000000000000000000000000000000000",
    );
    let mut cases: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 0],                                                  // a length below any frame
        vec![0, 0, 0, 44, 9, 0, 1, 0],                                     // a truncated CHALLENGE, then EOF
        [&[0u8, 0, 0, 45][..], &[2; 45][..]].concat(),                     // data_len disagrees with the length
        [&challenge_ok[..], &[0, 0, 0, 60, 2][..], &[0; 59][..]].concat(), // WELCOME with a wrong op
        [&challenge_ok[..], &[0, 0, 0, 61][..], &[4; 61][..]].concat(),    // WELCOME too long
        [&[0u8, 0, 4, 0x2d][..], &[2; 1069][..]].concat(),                 // CHALLENGE data above 1024
    ];
    let mut seed: u32 = 0x1234_5678;
    for _ in 0..10 {
        cases.push(
            (0..120)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed as u8
                })
                .collect(),
        );
    }
    for bytes in cases {
        let o = opts(&fake.addr).dial_timeout(Duration::from_millis(500));
        let (res, _) = tokio::join!(Client::connect(o), async {
            let mut s = fake.accept_raw().await;
            let mut hello = [0u8; 56];
            s.read_exact(&mut hello).await.expect("hello");
            let _ = s.write_all(&bytes).await;
            let mut auth = [0u8; 40];
            let _ = tokio::time::timeout(Duration::from_millis(100), s.read_exact(&mut auth)).await;
        });
        assert!(res.is_err(), "the client accepted {bytes:02x?}");
    }
}
