//! Pipelined acquire + release pairs per second on one client, against a running server:
//!
//! ```text
//! cargo run --release --example bench -- [ADDR] [--in-flight N] [--seconds S] [--token T]
//! ```
//!
//! `N` tasks (default 64) share one client (one connection) and each loops acquire (its own key,
//! so uncontended; lease 10 s; try once) then release, for `S` seconds (default 5). Prints a table
//! line and a JSON record. Loopback only; the run is bounded by `S`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ticketing::{Client, ClientOptions};

fn usage() -> ! {
    eprintln!("usage: bench [ADDR] [--in-flight N] [--seconds S] [--token T]");
    std::process::exit(2)
}

#[tokio::main]
async fn main() {
    let mut addr = "127.0.0.1:7070".to_owned();
    let mut in_flight: usize = 64;
    let mut seconds: f64 = 5.0;
    let mut token: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--in-flight" => in_flight = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--seconds" => seconds = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage()),
            "--token" => token = Some(args.next().unwrap_or_else(|| usage())),
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
    let pairs = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let pid = std::process::id();
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..in_flight {
        let (client, pairs, errors, stop) = (client.clone(), pairs.clone(), errors.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("bench-rust-{pid}-{w}");
            while !stop.load(Ordering::Relaxed) {
                match client.acquire(&key, Duration::from_secs(10)).wait(Duration::ZERO).await {
                    Ok(lock) => match lock.release().await {
                        Ok(()) => pairs.fetch_add(1, Ordering::Relaxed),
                        Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                    },
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = pairs.load(Ordering::Relaxed);
    let rate = n as f64 / elapsed;
    println!(
        "rust client: {n} acquire+release pairs in {elapsed:.2} s = {rate:.0} pairs/s ({:.0} ops/s), {in_flight} in flight, {} errors",
        2.0 * rate,
        errors.load(Ordering::Relaxed)
    );
    println!(
        "{{\"client\":\"rust\",\"workload\":\"pipelined_acquire_release\",\"pairs_per_sec\":{rate:.0},\"ops_per_sec\":{:.0},\"in_flight\":{in_flight},\"seconds\":{elapsed:.2},\"errors\":{}}}",
        2.0 * rate,
        errors.load(Ordering::Relaxed)
    );
    client.close().await;
}
