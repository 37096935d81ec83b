//! The Rust incumbent of the client benchmark: rslock (Redlock on Redis, async, tokio), used as
//! its README shows, under the benchmark program contract (bench/):
//!
//! ```text
//! rust-redis-lock-bench --addr HOST:PORT --callers N --seconds S [--warmup W]
//!     [--runtime current-thread|multi-thread]
//! ```
//!
//! One `LockManager` on one Redis server (rslock keeps one multiplexed connection per server), N
//! tokio tasks, each looping `lock(key, 10 s)` on its own key (`bench-<pid>-<caller>`; rslock
//! retries only after a failure, which an uncontended key never has) then `unlock(&lock)`. W
//! seconds (default 1) of warm-up are not counted, then S seconds are. Prints one JSON line,
//! `{"pairs_per_sec": R, "errors": E, ...}`, and exits 1 when more than 1% of the attempts failed.
//! The runtime is the same as the Ticketing Rust client's benchmark (clients/rust/bench), so the
//! pair compares the libraries, not the runtimes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rslock::LockManager;

fn usage() -> ! {
    eprintln!(
        "usage: rust-redis-lock-bench --addr HOST:PORT --callers N --seconds S [--warmup W] [--runtime current-thread|multi-thread]"
    );
    std::process::exit(2)
}

/// One task's counters, on a cache line of its own.
#[repr(align(64))]
#[derive(Default)]
struct Counts {
    pairs: AtomicU64,
    errors: AtomicU64,
}

fn totals(counts: &[Counts]) -> (u64, u64) {
    counts.iter().fold((0, 0), |(p, e), c| (p + c.pairs.load(Ordering::Relaxed), e + c.errors.load(Ordering::Relaxed)))
}

struct Args {
    addr: String,
    callers: usize,
    seconds: f64,
    warmup: f64,
    multi: bool,
}

fn parse() -> Args {
    let mut a = Args { addr: "127.0.0.1:6379".into(), callers: 16, seconds: 5.0, warmup: 1.0, multi: false };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match x.as_str() {
            "--addr" => a.addr = val(),
            "--callers" => a.callers = val().parse().ok().filter(|&n| n >= 1).unwrap_or_else(|| usage()),
            "--seconds" => a.seconds = val().parse().ok().filter(|&s: &f64| s > 0.0).unwrap_or_else(|| usage()),
            "--warmup" => a.warmup = val().parse().ok().filter(|&s: &f64| s >= 0.0).unwrap_or_else(|| usage()),
            "--runtime" => {
                a.multi = match val().as_str() {
                    "current-thread" => false,
                    "multi-thread" => true,
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    a
}

fn main() {
    let a = parse();
    let rt = if a.multi {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    };
    let code = rt.expect("tokio runtime").block_on(run(a));
    std::process::exit(code)
}

async fn run(a: Args) -> i32 {
    let rl = LockManager::new(vec![format!("redis://{}/", a.addr)]);
    // Connect (and check the server) before the clock starts.
    let probe = format!("bench-probe-{}", std::process::id());
    match rl.lock(probe.as_bytes(), Duration::from_secs(10)).await {
        Ok(l) => rl.unlock(&l).await,
        Err(e) => {
            eprintln!("rust-redis-lock-bench: {e:?}");
            return 1;
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[Counts]> = (0..a.callers).map(|_| Counts::default()).collect();
    let pid = std::process::id();
    let mut tasks = Vec::new();
    for w in 0..a.callers {
        let (rl, stop, counts) = (rl.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("bench-{pid}-{w}");
            let c = &counts[w];
            while !stop.load(Ordering::Relaxed) {
                match rl.lock(key.as_bytes(), Duration::from_secs(10)).await {
                    Ok(lock) => {
                        rl.unlock(&lock).await; // best effort: rslock reports no outcome
                        c.pairs.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        c.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(a.warmup)).await;
    let (p0, e0) = totals(&counts);
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(a.seconds)).await;
    let (p1, e1) = totals(&counts);
    let elapsed = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let (n, errors) = (p1 - p0, e1 - e0);
    let rate = n as f64 / elapsed;
    let runtime = if a.multi { "multi-thread" } else { "current-thread" };
    println!(
        "{{\"pairs_per_sec\":{rate:.1},\"errors\":{errors},\"client\":\"rust-redis\",\"library\":\"rslock\",\"callers\":{},\"runtime\":\"{runtime}\",\"seconds\":{elapsed:.2}}}",
        a.callers
    );
    if errors * 100 > n + errors {
        1
    } else {
        0
    }
}
