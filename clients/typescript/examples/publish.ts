import { Client } from "@socle/eventbus";

const url = process.env.EVENTBUS_URL ?? "http://127.0.0.1:50051";

// Client.connect(url, { token, tls: { ca, cert, key } }); an https:// URL turns TLS on.
const client = await Client.connect(url);
try {
  const resp = await client.publish("orders.created", '{"id": 42}', { contentType: "application/json" });
  console.log("published", resp.eventId);
} finally {
  client.close();
}
