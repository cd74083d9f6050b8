import { Client, Gap } from "@socle/eventbus";

const url = process.env.EVENTBUS_URL ?? "http://127.0.0.1:50051";

const client = await Client.connect(url);
const sub = client.subscribe(["orders.*"]);
await sub.started(); // live: what is published from now on arrives
await client.publish("orders.shipped", "parcel 7");

for await (const item of sub) {
  if (item instanceof Gap) {
    console.log("missed events between", item.lostAt, "and", item.resumedAt);
    continue;
  }
  console.log("received", item.channel, item.payload.toString());
  break; // leaving the loop ends the subscription
}
client.close();
