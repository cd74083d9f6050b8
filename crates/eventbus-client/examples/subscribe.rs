//! Prints events on `orders.*` as they arrive; survives broker restarts, recovering what
//! it missed when the channels keep a history, else reporting the gap (core pub/sub is
//! at most once).
//!
//! `cargo run -p eventbus-client --example subscribe`

use eventbus_client::{Client, ClientOptions, SubscribeOptions, SubscriptionItem};

#[tokio::main]
async fn main() -> Result<(), eventbus_client::Error> {
    let server = std::env::var("EVENTBUS_SERVER").unwrap_or_else(|_| eventbus_client::options::DEFAULT_SERVER.into());
    let client = Client::connect(ClientOptions::new(server)).await?;
    let mut orders = client.subscribe(SubscribeOptions::new(["orders.*"]).name("example")).await?;
    while let Some(item) = orders.next().await {
        match item? {
            SubscriptionItem::Started { subscription_id, recovered } => {
                println!("subscribed ({subscription_id}){}", if recovered { ", nothing missed" } else { "" })
            }
            SubscriptionItem::Events(events) => {
                for e in events {
                    println!("{} {} {}", e.channel, e.id, String::from_utf8_lossy(&e.payload));
                }
            }
            SubscriptionItem::Gap { reason } => println!("gap: {reason}; some events were missed"),
            _ => {}
        }
    }
    Ok(())
}
