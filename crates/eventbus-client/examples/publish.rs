//! Publishes a few events, one call each, then many through one pipelined stream.
//!
//! `cargo run -p eventbus-client --example publish` (broker at `EVENTBUS_SERVER`,
//! default `http://127.0.0.1:50051`; token from `EVENTBUS_TOKEN` if set).

use eventbus_client::{Client, ClientOptions, Message};

fn options() -> ClientOptions {
    let server = std::env::var("EVENTBUS_SERVER").unwrap_or_else(|_| eventbus_client::options::DEFAULT_SERVER.into());
    let options = ClientOptions::new(server);
    match std::env::var("EVENTBUS_TOKEN") {
        Ok(token) => options.token(token),
        Err(_) => options,
    }
}

#[tokio::main]
async fn main() -> Result<(), eventbus_client::Error> {
    let client = Client::connect(options()).await?;
    for i in 0..3 {
        let answer =
            client.publish("orders.created", format!("{{\"order\":{i}}}")).content_type("application/json").await?;
        println!("published {} ({} subscriptions)", answer.event_id, answer.delivered_count);
    }

    // Pipelined: send without waiting; answers come back in order.
    let (sender, mut answers) = client.publish_stream(256).await?;
    let sending = tokio::spawn(async move {
        for i in 0..1000 {
            sender.send(Message::new("orders.created", i.to_string())).await?;
        }
        Ok::<_, eventbus_client::Error>(())
    });
    let mut answered = 0;
    while answers.next().await?.is_some() {
        answered += 1;
    }
    sending.await.map_err(|e| eventbus_client::Error::Protocol(e.to_string()))??;
    println!("published {answered} more through one stream");
    Ok(())
}
