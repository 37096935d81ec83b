//! One Rust waiter for tests/crosslang: `crosslang_waiter ADDR KEY` waits for KEY without limit
//! (FIFO), prints `granted TOKEN` once it holds it, releases it on a line from stdin, then prints
//! `released`.

use std::io::BufRead;
use std::time::Duration;

use ticketing::{Client, ClientOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), ticketing::Error> {
    let mut args = std::env::args().skip(1);
    let (Some(addr), Some(key)) = (args.next(), args.next()) else {
        eprintln!("usage: crosslang_waiter ADDR KEY");
        std::process::exit(2);
    };
    let client = Client::connect(ClientOptions::new().endpoint(addr)).await?;
    let lock = client.acquire(&key, Duration::from_secs(60)).await?;
    println!("granted {}", lock.token());
    // Read stdin on the blocking pool, so that the client's heartbeat keeps running.
    let _ = tokio::task::spawn_blocking(|| std::io::stdin().lock().read_line(&mut String::new())).await;
    lock.release().await?;
    println!("released");
    client.close().await;
    Ok(())
}
