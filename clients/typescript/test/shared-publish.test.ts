// `Client.publish` over the client's shared `PublishStream`: each of many concurrent calls
// gets its own answer or its own error, in order per caller, through a refusal, a deadline
// and a broker restart.
import assert from "node:assert/strict";
import { createServer, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";

import {
  Client,
  DeadlineExceeded,
  EventBusError,
  InvalidArgument,
  isTransient,
  type Event,
  type PublishResponse,
  type Subscription,
} from "@socle/eventbus";

import { Daemon, eventually, take, uniqueName, within } from "./helpers.js";

const T = { timeout: 90_000 };

async function received(sub: Subscription, n: number): Promise<Event[]> {
  return (await take(sub, n)) as Event[];
}

const text = (payload: Uint8Array): string => Buffer.from(payload).toString();

describe("shared publish stream", () => {
  let daemon: Daemon;
  let client: Client;

  before(async () => {
    daemon = await Daemon.start();
    client = await Client.connect(daemon.url);
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
  });

  it("answers each of 1,000 concurrent calls with its own event", T, async () => {
    const name = uniqueName();
    await client.createConsumer(`${name}-audit`, [`${name}.>`]);
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    const n = 1000;
    const answers = await Promise.all(
      Array.from({ length: n }, async (_, i): Promise<[number, PublishResponse]> => {
        let payload = String(i);
        let idempotencyKey = "";
        if (i % 100 === 1) idempotencyKey = `key-${i}`;
        if (i % 100 === 2) [idempotencyKey, payload] = [`key-${i - 1}`, String(i - 1)];
        return [i, await client.publish(`${name}.${Number(payload) % 7}`, payload, { idempotencyKey })];
      }),
    );
    const duplicates = answers.filter(([, a]) => a.duplicate).map(([i]) => i);
    assert.equal(duplicates.length, n / 100, `one duplicate per shared key: ${duplicates}`);
    const events = new Map((await received(sub, n - n / 100)).map((e) => [e.id, e]));
    assert.equal(events.size, n - n / 100);
    for (const [i, answer] of answers) {
      const expected = i % 100 === 2 ? i - 1 : i;
      const event = events.get(answer.eventId);
      assert.ok(event, `call ${i}: unknown id`);
      assert.equal(text(event.payload), String(expected), `call ${i} answered with another call's id`);
      assert.equal(event.channel, `${name}.${expected % 7}`);
      assert.equal(answer.capturedCount, answer.duplicate ? 0 : 1, `call ${i}`);
    }
    sub.close();
  });

  it("fails a refused event's own call and publishes the others", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    const n = 300;
    const bad = n / 2;
    const answers = await Promise.allSettled(
      Array.from({ length: n }, (_, i) => client.publish(i === bad ? `${name}..bad` : `${name}.${i}`, String(i))),
    );
    answers.forEach((answer, i) => {
      if (i === bad) {
        assert.ok(answer.status === "rejected" && answer.reason instanceof InvalidArgument, `call ${i}: ${answer.status}`);
        assert.match(String(answer.reason.message), new RegExp(`${name}\\.\\.bad`));
      } else {
        assert.equal(answer.status, "fulfilled", `call ${i}`);
      }
    });
    const events = new Map((await received(sub, n - 1)).map((e) => [e.id, e]));
    answers.forEach((answer, i) => {
      if (answer.status === "fulfilled") assert.equal(text(events.get(answer.value.eventId)!.payload), String(i), `call ${i}`);
    });
    sub.close();
  });

  it("keeps each caller's events in order", T, async () => {
    const name = uniqueName();
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    const callers = 16;
    const each = 50;
    const caller = async (c: number): Promise<void> => {
      for (let i = 0; i < each; i++) await client.publish(`${name}.${c}`, String(i));
    };
    // One caller that does not wait for one call before the next.
    const pipelined = Promise.all(Array.from({ length: each }, (_, i) => client.publish(`${name}.pipelined`, String(i))));
    await Promise.all([...Array.from({ length: callers }, (_, c) => caller(c)), pipelined]);
    const perCaller = new Map<string, string[]>();
    for (const e of await received(sub, (callers + 1) * each)) {
      perCaller.set(e.channel, [...(perCaller.get(e.channel) ?? []), text(e.payload)]);
    }
    assert.equal(perCaller.size, callers + 1);
    const inOrder = Array.from({ length: each }, (_, i) => String(i));
    for (const [channel, payloads] of perCaller) assert.deepEqual(payloads, inOrder, channel);
    sub.close();
  });

  it("holds a call's deadline and keeps the other calls' answers", T, async () => {
    // A "broker" that takes connections and never answers.
    const sockets: Socket[] = [];
    const silent = createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    const port = (silent.address() as AddressInfo).port;
    const stuck = await Client.connect(`http://127.0.0.1:${port}`, { connectTimeoutMs: 0 });
    const start = Date.now();
    await assert.rejects(stuck.publish("d.x", "x", { timeoutMs: 200 }), DeadlineExceeded);
    assert.ok(Date.now() - start < 2000, "the deadline held");
    const aborted = new AbortController();
    const call = stuck.publish("d.x", "x");
    aborted.abort(new Error("caller gave up"));
    await assert.rejects(stuck.publish("d.x", "x", { signal: aborted.signal }), /caller gave up/);
    stuck.close();
    await assert.rejects(call, EventBusError);
    for (const socket of sockets) socket.destroy();
    silent.close();

    // On a real broker, callers that give up at once leave the others' answers intact.
    const name = uniqueName();
    const sub = client.subscribe(`${name}.>`);
    await sub.started();
    const answers = await Promise.all(
      Array.from({ length: 400 }, (_, i) =>
        i % 2 === 0
          ? client.publish(`${name}.x`, String(i), { timeoutMs: 1 }).catch(() => undefined)
          : client.publish(`${name}.x`, String(i)),
      ),
    );
    const kept = answers.flatMap((a, i) => (a ? [[i, a.eventId] as const] : []));
    assert.ok(kept.length >= 200);
    const marker = (await client.publish(`${name}.end`, "end")).eventId;
    const payloads = new Map<string, string>();
    await within(
      (async () => {
        for await (const item of sub) {
          const e = item as Event;
          if (e.id === marker) return;
          payloads.set(e.id, text(e.payload));
        }
      })(),
      20_000,
      "the marker",
    );
    for (const [i, id] of kept) assert.equal(payloads.get(id), String(i), `call ${i}`);
    sub.close();
  });

  it("answers no false OK and loses no keyed event across a broker restart", T, async () => {
    const own = await Daemon.start();
    const c = await Client.connect(own.url);
    try {
      const name = uniqueName();
      await c.createConsumer("audit", [`${name}.>`]);
      const tasks = 8;
      const each = 60;
      let answered = 0;
      const ok: Array<[string, string]> = [];
      const publisher = async (t: number): Promise<void> => {
        const keyed = t < tasks;
        for (let i = 0; i < each; i++) {
          try {
            const answer = await c.publish(`${name}.${t}`, `${t}-${i}`, { idempotencyKey: keyed ? `${t}-${i}` : "" });
            ok.push([`${t}-${i}`, answer.eventId]);
          } catch (err) {
            assert.ok(!keyed, `a keyed call failed: ${err}`);
            assert.ok(isTransient(err), `a retryable error: ${err}`);
          }
          answered++;
        }
      };
      const running = Promise.all(Array.from({ length: tasks * 2 }, (_, t) => publisher(t)));
      await eventually(() => answered >= 200, "calls in flight");
      await own.restart();
      await within(running, 60_000, "the publishers");
      const stored = new Map<string, string>();
      for await (const entry of c.listPendingAll("audit")) stored.set(entry.event!.id, text(entry.event!.payload));
      for (const [payload, id] of ok) assert.equal(stored.get(id), payload, `answered OK but not stored: ${payload} (${id})`);
      const payloads = new Set(stored.values());
      for (let t = 0; t < tasks; t++) {
        for (let i = 0; i < each; i++) assert.ok(payloads.has(`${t}-${i}`), `keyed event ${t}-${i} lost`);
      }
    } finally {
      c.close();
      await own.stop();
    }
  });

  it("keeps unary calls as an option, and lingers when asked", T, async () => {
    const name = uniqueName();
    const unary = await Client.connect(daemon.url, { unaryPublish: true });
    try {
      assert.ok((await unary.publish(`${name}.x`, "1")).eventId);
      await assert.rejects(unary.publish(`${name}..x`, "2"), InvalidArgument);
    } finally {
      unary.close();
    }
    const lingering = await Client.connect(daemon.url, { publishLingerMs: 2 });
    try {
      const answers = await Promise.all(Array.from({ length: 100 }, (_, i) => lingering.publish(`${name}.l`, String(i))));
      assert.equal(new Set(answers.map((a) => a.eventId)).size, 100);
    } finally {
      lingering.close();
    }
  });
});
