//! Prints events on `orders.*` as they arrive; survives broker restarts, recovering what
//! it missed when the channels keep a history, else logging the gap (core pub/sub is
//! at most once: read the subscription by items, `Subscription::next`, to handle gaps
//! yourself).
//!
//! `cargo run -p eventbus-client --example subscribe`

use eventbus_client::{Client, ClientOptions, SubscribeOptions};

#[tokio::main]
async fn main() -> Result<(), eventbus_client::Error> {
    let server = std::env::var("EVENTBUS_SERVER").unwrap_or_else(|_| eventbus_client::options::DEFAULT_SERVER.into());
    let client = Client::connect(ClientOptions::new(server)).await?;
    let mut orders = client.subscribe(SubscribeOptions::new(["orders.*"]).name("example")).await?;
    println!("subscribed ({})", orders.subscription_id());
    while let Some(event) = orders.next_event().await {
        let e = event?;
        println!("{} {} {}", e.channel, e.id, String::from_utf8_lossy(&e.payload));
    }
    Ok(())
}
