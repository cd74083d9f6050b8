import { Registry } from "prom-client";

import { Ack, Client, Retry, Term, Worker, type Delivery, type Outcome } from "@socle/eventbus";

const url = process.env.EVENTBUS_URL ?? "http://127.0.0.1:50051";

async function handle(delivery: Delivery): Promise<Outcome> {
  const order = JSON.parse(delivery.event.payload.toString());
  if (!("id" in order)) return new Term("no order id"); // never valid: dead-letter it now
  if (order.bank === "down") return new Retry(5_000); // try again in 5 s
  console.log("billing order", order.id, "attempt", delivery.attempt);
  return new Ack(); // (returning nothing acks too; a thrown error retries)
}

const registry = new Registry(); // the host's registry: socle_push_worker_* metrics
const client = await Client.connect(url);
await client.createConsumer("billing", ["orders.>"], { ackDeadlineMs: 30_000, maxAttempts: 5 });
await client.publish("orders.created", '{"id": 42}');

const worker = new Worker(client, "billing", handle, { concurrency: 16, shutdownTimeoutMs: 30_000, registry });
await worker.start();
await new Promise((stop) => process.once("SIGTERM", stop).once("SIGINT", stop));
await worker.stop(); // running handlers finish, what none started is handed back
console.log("stopped:", worker.stats());
client.close();
