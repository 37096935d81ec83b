use std::time::Duration;
use ticketing::{Client, ClientOptions, Error};

pub async fn charge_order(endpoint: &str) -> Result<u64, Error> {
    let client = Client::connect(ClientOptions::new().endpoint(endpoint)).await?;
    let lock = client.acquire("order-1234", Duration::from_secs(30)).wait(Duration::from_secs(5)).await?;
    let token = lock.token(); // send it with every write: the resource rejects older tokens
    // ... charge the order ...
    lock.release().await?;
    client.close().await;
    Ok(token)
}
