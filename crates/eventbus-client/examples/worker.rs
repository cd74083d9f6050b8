//! A push worker for the durable consumer `billing` (created if missing): 16 handlers,
//! retries with the consumer's backoff, dead letters for bad input, metrics, and a
//! graceful drain on Ctrl-C.
//!
//! `cargo run -p eventbus-client --example worker`, then publish on `orders.created`.

use std::time::Duration;

use eventbus_client::{Client, ClientOptions, ConsumerBuilder, Delivery, Outcome, Worker, WorkerMetrics};
use tokio_util::sync::CancellationToken;

async fn bill(d: Delivery) -> Outcome {
    match std::str::from_utf8(&d.event.payload) {
        Err(_) => Outcome::term("payload is not UTF-8"),
        Ok("") => Outcome::retry_after(Duration::from_secs(1), "empty order, maybe not written yet"),
        Ok(order) => {
            println!("billing {order} (attempt {})", d.attempt);
            Outcome::Ack
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("EVENTBUS_SERVER").unwrap_or_else(|_| eventbus_client::options::DEFAULT_SERVER.into());
    let client = Client::connect(ClientOptions::new(server)).await?;
    let registry = prometheus::Registry::new();
    let worker = Worker::new(client, "billing")
        .create_if_missing(ConsumerBuilder::new("billing", ["orders.>"]))
        .concurrency(16)
        .queue_capacity(256)
        .shutdown_timeout(Duration::from_secs(10))
        .metrics(WorkerMetrics::register(&registry)?)
        .on_error(|event, reason, attempt| eprintln!("{} failed at attempt {attempt}: {reason}", event.id));

    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        }
    });
    worker.run(bill, shutdown).await?;
    println!("stopped: {:?}", worker.stats());
    Ok(())
}
