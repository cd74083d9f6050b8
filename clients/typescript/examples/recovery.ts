import { Client, isGap } from "@socle/eventbus";

const url = process.env.EVENTBUS_URL ?? "http://127.0.0.1:50051";

const client = await Client.connect(url);
const sub = client.subscribe("prices.>");
await sub.started();
await client.publish("prices.eur", "1.08");
for await (const item of sub) {
  if (isGap(item)) continue;
  console.log("received", item.payload.toString());
  break; // away for a while...
}

await client.publish("prices.eur", "1.09"); // ... and this is missed

// Carry on from where it was: the missed events first, then the live ones.
const again = client.subscribe("prices.>", { since: sub.since });
for await (const item of again) {
  if (isGap(item)) continue;
  const offset = item.position?.offset; // a bigint: 64-bit fields are exact
  console.log("recovered", item.payload.toString(), "at offset", String(offset), "complete:", again.recovered);
  break;
}
client.close();
