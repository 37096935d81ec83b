//! Acquire + release pairs per second on one client, against a running server (the benchmark
//! program contract of the repository's bench/, run by `bench/bench-run.sh`):
//!
//! ```text
//! cargo run --release --example bench -- [--addr ADDR] [--callers N] [--seconds S] [--warmup W]
//!     [--runtime current-thread|multi-thread] [--token T] [--count-allocs]
//! ```
//!
//! `N` tasks (default 64; `--in-flight N` and a bare `ADDR` are the older spellings) share one
//! client (one connection) and each loops acquire (its own key, so uncontended; lease 10 s; try
//! once) then release. `W` seconds (default 1) of warm-up are not counted, then `S` seconds
//! (default 5) are. Prints exactly one JSON line on stdout, `{"pairs_per_sec": R, "errors": E, ...}`
//! (a human line goes to stderr), and exits 1 when more than 1% of the attempts failed. Loopback
//! only; the run is bounded by `W + S`. The runtime is tokio's single-threaded one by default
//! (`--current-thread` is its older spelling), or the multi-threaded one with
//! `--runtime multi-thread`: see clients/rust/bench/bench-run.sh for the measurements behind the
//! default. `--count-allocs` also reports the heap allocations per pair on stderr (a counting
//! global allocator; off, it costs one relaxed load per allocation).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ticketing::{Client, ClientOptions};

/// The system allocator, counting allocations while `COUNTING` is set.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

fn count() {
    if COUNTING.load(Ordering::Relaxed) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is passed on to `System` unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn usage() -> ! {
    eprintln!(
        "usage: bench [--addr ADDR] [--callers N] [--seconds S] [--warmup W] [--runtime current-thread|multi-thread] [--token T] [--count-allocs]"
    );
    std::process::exit(2)
}

fn main() {
    let mut multi = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--current-thread" => multi = false,
            "--runtime" => match args.next().as_deref() {
                Some("current-thread") => multi = false,
                Some("multi-thread") => multi = true,
                _ => usage(),
            },
            _ => {}
        }
    }
    let rt = if multi {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    };
    let code = rt.expect("tokio runtime").block_on(run(multi));
    std::process::exit(code)
}

/// One task's counters, on a cache line of its own (a counter shared by all would bounce between
/// the cores on every pair and be measured as the client's cost).
#[repr(align(64))]
#[derive(Default)]
struct Counts {
    pairs: AtomicU64,
    errors: AtomicU64,
}

fn totals(counts: &[Counts]) -> (u64, u64) {
    counts.iter().fold((0, 0), |(p, e), c| (p + c.pairs.load(Ordering::Relaxed), e + c.errors.load(Ordering::Relaxed)))
}

async fn run(multi: bool) -> i32 {
    let mut addr = "127.0.0.1:7070".to_owned();
    let mut callers: usize = 64;
    let mut seconds: f64 = 5.0;
    let mut warmup: f64 = 1.0;
    let mut token: Option<String> = None;
    let mut count_allocs = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--addr" => addr = args.next().unwrap_or_else(|| usage()),
            "--callers" | "--in-flight" => {
                callers = args.next().and_then(|v| v.parse().ok()).filter(|&n| n >= 1).unwrap_or_else(|| usage())
            }
            "--seconds" => {
                seconds = args.next().and_then(|v| v.parse().ok()).filter(|&s| s > 0.0).unwrap_or_else(|| usage())
            }
            "--warmup" => {
                warmup = args.next().and_then(|v| v.parse().ok()).filter(|&s| s >= 0.0).unwrap_or_else(|| usage())
            }
            "--token" => token = Some(args.next().unwrap_or_else(|| usage())),
            "--runtime" => {
                args.next();
            }
            "--current-thread" => {}
            "--count-allocs" => count_allocs = true,
            "-h" | "--help" => usage(),
            other if !other.starts_with('-') => addr = other.to_owned(),
            _ => usage(),
        }
    }
    let mut opts = ClientOptions::new().endpoint(&addr);
    if let Some(t) = token {
        opts = opts.token(t);
    }
    let client = match Client::connect(opts).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bench: {e}");
            return 1;
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counts: Arc<[Counts]> = (0..callers).map(|_| Counts::default()).collect();
    let pid = std::process::id();
    let mut tasks = Vec::new();
    for w in 0..callers {
        let (client, stop, counts) = (client.clone(), stop.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("bench-rust-{pid}-{w}");
            let c = &counts[w];
            while !stop.load(Ordering::Relaxed) {
                match client.acquire(&key, Duration::from_secs(10)).wait(Duration::ZERO).await {
                    Ok(lock) => match lock.release().await {
                        Ok(()) => c.pairs.fetch_add(1, Ordering::Relaxed),
                        Err(_) => c.errors.fetch_add(1, Ordering::Relaxed),
                    },
                    Err(_) => c.errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
    let (p0, e0) = totals(&counts);
    let start = Instant::now();
    COUNTING.store(count_allocs, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let (p1, e1) = totals(&counts);
    let elapsed = start.elapsed().as_secs_f64();
    COUNTING.store(false, Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let (n, errors) = (p1 - p0, e1 - e0);
    let rate = n as f64 / elapsed;
    if count_allocs {
        let allocs = ALLOCS.load(Ordering::Relaxed);
        eprintln!("rust client: {allocs} heap allocations = {:.2} per pair", allocs as f64 / n.max(1) as f64);
    }
    let runtime = if multi { "multi-thread" } else { "current-thread" };
    eprintln!(
        "rust client: {n} acquire+release pairs in {elapsed:.2} s = {rate:.0} pairs/s ({:.0} ops/s), {callers} callers, {runtime} runtime, {errors} errors",
        2.0 * rate
    );
    println!(
        "{{\"pairs_per_sec\":{rate:.1},\"errors\":{errors},\"client\":\"rust\",\"callers\":{callers},\"runtime\":\"{runtime}\",\"seconds\":{elapsed:.2}}}"
    );
    client.close().await;
    if errors * 100 > n + errors { 1 } else { 0 }
}
