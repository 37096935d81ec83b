//! Pipelined acquire + release pairs per second on one client, against a running server:
//!
//! ```text
//! cargo run --release --example bench -- [ADDR] [--in-flight N] [--seconds S] [--token T]
//!     [--current-thread] [--count-allocs]
//! ```
//!
//! `N` tasks (default 64) share one client (one connection) and each loops acquire (its own key,
//! so uncontended; lease 10 s; try once) then release, for `S` seconds (default 5). Prints a table
//! line and a JSON record. Loopback only; the run is bounded by `S`. The runtime is tokio's
//! multi-threaded one (as `#[tokio::main]` makes it), or the single-threaded one with
//! `--current-thread`. `--count-allocs` also reports the heap allocations per pair (a counting
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
    eprintln!("usage: bench [ADDR] [--in-flight N] [--seconds S] [--token T] [--current-thread] [--count-allocs]");
    std::process::exit(2)
}

fn main() {
    let current_thread = std::env::args().any(|a| a == "--current-thread");
    let rt = if current_thread {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    };
    rt.expect("tokio runtime").block_on(run());
}

async fn run() {
    let mut addr = "127.0.0.1:7070".to_owned();
    let mut in_flight: usize = 64;
    let mut seconds: f64 = 5.0;
    let mut token: Option<String> = None;
    let mut count_allocs = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--in-flight" => in_flight = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--seconds" => seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--token" => token = Some(args.next().unwrap_or_else(|| usage())),
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
            std::process::exit(1)
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let pid = std::process::id();
    let start = Instant::now();
    COUNTING.store(count_allocs, Ordering::Relaxed);
    let mut tasks = Vec::new();
    for w in 0..in_flight {
        let (client, stop) = (client.clone(), stop.clone());
        // Each task counts on its own (a counter shared by all would bounce between the cores on
        // every pair and be measured as the client's cost).
        tasks.push(tokio::spawn(async move {
            let key = format!("bench-rust-{pid}-{w}");
            let (mut pairs, mut errors) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                match client.acquire(&key, Duration::from_secs(10)).wait(Duration::ZERO).await {
                    Ok(lock) => match lock.release().await {
                        Ok(()) => pairs += 1,
                        Err(_) => errors += 1,
                    },
                    Err(_) => errors += 1,
                }
            }
            (pairs, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut n, mut errors) = (0u64, 0u64);
    for t in tasks {
        if let Ok((p, e)) = t.await {
            n += p;
            errors += e;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    COUNTING.store(false, Ordering::Relaxed);
    let rate = n as f64 / elapsed;
    if count_allocs {
        let allocs = ALLOCS.load(Ordering::Relaxed);
        println!("rust client: {allocs} heap allocations = {:.2} per pair", allocs as f64 / n.max(1) as f64);
    }
    println!(
        "rust client: {n} acquire+release pairs in {elapsed:.2} s = {rate:.0} pairs/s ({:.0} ops/s), {in_flight} in flight, {} errors",
        2.0 * rate,
        errors
    );
    println!(
        "{{\"client\":\"rust\",\"workload\":\"pipelined_acquire_release\",\"pairs_per_sec\":{rate:.0},\"ops_per_sec\":{:.0},\"in_flight\":{in_flight},\"seconds\":{elapsed:.2},\"errors\":{}}}",
        2.0 * rate,
        errors
    );
    client.close().await;
}
