//! The lease clock, which the locks' deadlines run on (PROTOCOL.md, "The lost signal"): it counts
//! the time the host spends suspended (CLOCK_BOOTTIME on Linux, else the wall clock's fallback),
//! and a held lock is checked against it at least every LOST_CHECK_MS, since tokio's timers stop
//! during a suspend.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use ticketing::wire::{self, Op};
use ticketing::{Client, ClientOptions, Lock, LostReason};

use crate::support::{FakeConn, FakeOpts, FakeServer};

/// The system's wall clock, stepped by the test: a suspend shows to the fallback as the wall
/// clock running ahead of the monotonic clock.
#[derive(Clone, Default)]
struct SteppedWall(Arc<AtomicI64>);

impl SteppedWall {
    fn step(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }

    fn read(&self) -> SystemTime {
        let secs = self.0.load(Ordering::SeqCst);
        let now = SystemTime::now();
        if secs >= 0 {
            now + Duration::from_secs(secs.unsigned_abs())
        } else {
            now - Duration::from_secs(secs.unsigned_abs())
        }
    }
}

async fn connect(fake: &FakeServer, wall: &SteppedWall) -> (Client, FakeConn) {
    let wall = wall.clone();
    let o =
        ClientOptions::new().endpoint(&fake.addr).heartbeat_interval(Duration::ZERO).wall_clock(move || wall.read());
    let fo = FakeOpts::default();
    let (client, conn) = tokio::join!(Client::connect(o), fake.accept(&fo));
    (client.expect("connect"), conn)
}

async fn hold(client: &Client, conn: &mut FakeConn, key: &'static str, token: u64, lease: Duration) -> Lock {
    let c = client.clone();
    let task = tokio::spawn(async move { c.acquire(key, lease).await });
    let req = conn.read_op(Op::ACQUIRE).await;
    conn.grant(&req, token, 0).await;
    task.await.expect("task").expect("acquire")
}

#[tokio::test]
async fn a_suspend_makes_a_held_lock_lost_within_lost_check_ms() {
    let fake = FakeServer::bind().await;
    let wall = SteppedWall::default();
    let (client, mut conn) = connect(&fake, &wall).await;
    let watched = hold(&client, &mut conn, "a", 1, Duration::from_secs(30)).await;
    let asked = hold(&client, &mut conn, "b", 2, Duration::from_secs(30)).await;
    let mut lost = watched.lost_watch();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!watched.is_lost() && !asked.is_lost());

    // The host sleeps an hour: the wall clock jumps ahead; the monotonic clock (tokio's, and its
    // timers') saw nothing.
    wall.step(3600);
    let woke = Instant::now();
    assert_eq!(asked.lost_reason(), Some(LostReason::Expired), "a call about a lock checks its deadline at once");
    // Nobody asks about the other one: the client's timer finds it.
    let check = Duration::from_millis(wire::LOST_CHECK_MS.into());
    tokio::time::timeout(check * 4, lost.wait_for(Option::is_some))
        .await
        .expect("lost after the suspend")
        .expect("watch");
    let took = woke.elapsed();
    assert_eq!(*lost.borrow(), Some(LostReason::Expired));
    assert!(took <= check + Duration::from_millis(150), "lost {took:?} after the suspend");
}

#[tokio::test]
async fn the_fallback_ignores_a_wall_clock_stepped_back() {
    let fake = FakeServer::bind().await;
    let wall = SteppedWall::default();
    let (client, mut conn) = connect(&fake, &wall).await;
    let lock = hold(&client, &mut conn, "k", 1, Duration::from_millis(1000)).await;
    let deadline = lock.deadline();
    wall.step(-3600);
    // The client's timer has looked at the clock since.
    tokio::time::sleep(Duration::from_millis(u64::from(wire::LOST_CHECK_MS) + 100)).await;
    assert!(!lock.is_lost(), "lost when the wall clock was stepped back");
    // (Earlier by the time between the fallback's two clock reads at most.)
    let now = lock.deadline();
    assert!(now <= deadline && deadline - now < Duration::from_millis(5), "the deadline moved: {now:?}, {deadline:?}");
    // The clock kept counting: lost at the deadline, not an hour later.
    let reason = tokio::time::timeout(Duration::from_secs(2), lock.lost()).await.expect("lost at its deadline");
    assert_eq!(reason, LostReason::Expired);
    let at = std::time::Instant::now();
    assert!(at + Duration::from_millis(10) >= deadline, "lost {:?} before its deadline", deadline - at);
    assert!(at <= deadline + Duration::from_millis(300), "lost {:?} after its deadline", at - deadline);
}

/// The raw reading is CLOCK_BOOTTIME: inside a time namespace whose boottime is 100,000 s ahead
/// of its monotonic clock (what a long suspend looks like), it agrees with /proc/uptime.
#[cfg(target_os = "linux")]
#[test]
fn the_deadlines_clock_reads_clock_boottime() {
    const CHILD: &str = "TICKETING_RUST_BOOTTIME_CHILD";
    const NAME: &str = "clock::the_deadlines_clock_reads_clock_boottime";
    if std::env::var_os(CHILD).is_some() {
        let boot = ticketing::boottime().expect("CLOCK_BOOTTIME");
        let uptime = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
        let uptime: f64 = uptime.split_whitespace().next().and_then(|s| s.parse().ok()).expect("uptime");
        assert!(uptime >= 100_000.0, "not in the time namespace: /proc/uptime {uptime} s");
        assert!((boot.as_secs_f64() - uptime).abs() < 1.0, "the clock reads {boot:?}, /proc/uptime {uptime} s");
        return;
    }
    let exe = std::env::current_exe().expect("test binary");
    let run = std::process::Command::new("unshare")
        .args(["--time", "--fork", "--boottime", "100000"])
        .arg(exe)
        .args([NAME, "--exact", "--test-threads=1"])
        .env(CHILD, "1")
        .output();
    let out = match run {
        Ok(out) => out,
        Err(e) => return eprintln!("skipped: unshare could not be run ({e}); the clock is src/clock.rs's boottime"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stdout.contains("test result:") {
        // unshare refused (no time namespaces, not root): the test binary never ran.
        return eprintln!("skipped: no time namespace here ({}); the clock is src/clock.rs's boottime", stderr.trim());
    }
    assert!(out.status.success() && stdout.contains("1 passed"), "in a time namespace:\n{stdout}\n{stderr}");
}
