use std::time::Duration;
use ticketing::{Client, ClientOptions, Error};

pub async fn charge_order(endpoint: &str) -> Result<u64, Error> {
    let client = Client::connect(ClientOptions::new().endpoint(endpoint)).await?;
    let acquire = client.acquire("order-1234", Duration::from_secs(30)).wait(Duration::from_secs(5));
    // A guard releases the lock when dropped (an early `?`, a panic); a bare `Lock` would not.
    let lock = acquire.await?.into_guard();
    let token = lock.token(); // send it with every write: the resource rejects older tokens
    // ... charge the order ...
    lock.release().await?; // releases now and reports the outcome (a drop releases in the background)
    client.close().await;
    Ok(token)
}
