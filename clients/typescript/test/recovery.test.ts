// Recovery on channels with history: the subscription tracks the last position per
// channel and re-subscribes with `since`; a `Gap` only when recovery was incomplete.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { type AddressInfo, type Server, type Socket, connect, createServer } from "node:net";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  Client,
  Gap,
  InvalidArgument,
  MAX_SINCE_CHANNELS,
  NotFound,
  type Event,
  type Subscription,
  type SubscriptionItem,
} from "@socle/eventbus";

import { Daemon, take, tempDir, uniqueName } from "./helpers.js";

const T = { timeout: 90_000 };
const HISTORY = 'eventbus:\n  history:\n    - channels: "hist.>"\n      size: 1000\n';

function historyDaemon(): Daemon {
  const dir = tempDir("history");
  writeFileSync(join(dir, "history.yaml"), HISTORY);
  return new Daemon({ EVENTBUS_CONFIG: join(dir, "history.yaml") }, "http", dir);
}

function payloads(items: SubscriptionItem[]): number[] {
  assert.deepEqual(items.filter((i) => i instanceof Gap), [], "no gap expected");
  return (items as Event[]).map((e) => Number(e.payload.toString()));
}

function offsets(sub: { positions: Record<string, { offset: bigint }> }): Record<string, bigint> {
  return Object.fromEntries(Object.entries(sub.positions).map(([ch, p]) => [ch, p.offset]));
}

/**
 * A TCP relay in front of a daemon: `cut()` drops every connection (a network failure)
 * and refuses new ones until `restore()`.
 */
class Proxy {
  private up = true;
  private readonly sockets = new Set<Socket>();
  private readonly server: Server;

  constructor(target: string) {
    const [host, port] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
    this.server = createServer((downstream) => {
      if (!this.up) return downstream.destroy();
      const upstream = connect(port, host);
      for (const s of [downstream, upstream]) {
        this.sockets.add(s);
        s.on("error", () => {});
        s.on("close", () => {
          this.sockets.delete(s);
          downstream.destroy();
          upstream.destroy();
        });
      }
      downstream.pipe(upstream);
      upstream.pipe(downstream);
    });
  }

  async listen(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  cut(): void {
    this.up = false;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.up = true;
  }

  close(): void {
    this.cut();
    this.server.close();
  }
}

describe("recovery", () => {
  let shared: Daemon;
  let client: Client;

  before(async () => {
    shared = historyDaemon();
    await shared.start();
    client = await Client.connect(shared.url);
  });
  after(async () => {
    client?.close();
    await shared?.stop();
  });

  it("re-subscribing with since recovers every event once, in order", T, async () => {
    const name = uniqueName();
    const [a, b, c] = ["a", "b", "c"].map((x) => `hist.${name}.${x}`) as [string, string, string];
    const sub = client.subscribe(`hist.${name}.>`);
    await sub.started();
    assert.equal(sub.recovered, false);
    assert.ok(sub.startedAt instanceof Date);
    for (const [seq, channel] of [
      [1, a],
      [2, b],
      [3, a],
    ] as const) {
      await client.publish(channel, String(seq));
    }
    assert.deepEqual(payloads(await take(sub, 3)), [1, 2, 3]);
    await sub.close();
    const since = sub.since;
    assert.deepEqual(offsets(since), { [a]: 2n, [b]: 1n });
    assert.ok(since.time);

    // Missed while away: more on the tracked channels, and a first event on `c`
    // (untracked: recovered from the time the subscription first started).
    for (const [seq, channel] of [
      [4, a],
      [5, b],
      [6, c],
    ] as const) {
      await client.publish(channel, String(seq));
    }
    const again = client.subscribe(`hist.${name}.>`, { since });
    await again.started();
    assert.equal(again.recovered, true);
    await client.publish(b, "7");
    await client.publish(c, "8");
    assert.deepEqual(payloads(await take(again, 5)), [4, 5, 6, 7, 8]);
    assert.deepEqual(offsets(again), { [a]: 3n, [b]: 3n, [c]: 2n });
    await again.close();

    // The other forms of `since`: positions as [epoch, offset], and a Date.
    const epoch = again.positions[a]!.epoch;
    const fromPair = client.subscribe(a, { since: { positions: { [a]: [epoch, 1] } } });
    await fromPair.started();
    assert.equal(fromPair.recovered, true);
    assert.deepEqual(payloads(await take(fromPair, 2)), [3, 4]);
    await fromPair.close();
    const fromTime = client.subscribe(`hist.${name}.>`, { since: sub.startedAt! });
    await fromTime.started();
    assert.equal(fromTime.recovered, true);
    assert.deepEqual(payloads(await take(fromTime, 8)), [1, 2, 3, 4, 5, 6, 7, 8]);
    await fromTime.close();

    // An exact channel starts from its latest position, received or not.
    const exact = client.subscribe(b);
    await exact.started();
    assert.deepEqual(offsets(exact), { [b]: 3n });
    await client.publish(b, "9");
    assert.deepEqual(payloads(await take(exact, 1)), [9]);
    assert.equal(exact.positions[b]!.offset, 4n);
    await exact.close();
  });

  it("since is checked", T, async () => {
    const name = uniqueName();
    assert.throws(
      () => client.subscribe(`hist.${name}.>`, { group: "g", since: { positions: { [`hist.${name}.a`]: ["e", 1] } } }),
      /group/,
    );
    const outside = client.subscribe(`hist.${name}.a`, { since: { positions: { [`hist.${name}.b`]: ["e", 1] } } });
    await assert.rejects(outside.next(), (err: unknown) => err instanceof InvalidArgument && /covers/.test(err.message));
    await assert.rejects(outside.started(), InvalidArgument);
  });

  it("over the since limit the oldest channels resume by time, without copies", T, async () => {
    const name = uniqueName();
    const channels = Array.from({ length: MAX_SINCE_CHANNELS + 6 }, (_, i) => `hist.${name}.${i}`);
    const sub = client.subscribe(`hist.${name}.>`);
    await sub.started();
    for (let i = 0; i < channels.length; i += 500) {
      await client.publishBatch(channels.slice(i, i + 500).map((channel) => ({ channel, payload: "0" })));
    }
    assert.equal((await take(sub, channels.length)).length, channels.length);
    await sub.close();
    // The 6 channels updated first are left out of `since` and resumed by time: their
    // events already yielded come again from the broker, and are skipped here.
    await client.publish(channels[0]!, "1");
    await client.publish(channels.at(-1)!, "2");
    const again = client.subscribe(`hist.${name}.>`, { since: sub.since });
    await again.started();
    assert.equal(again.recovered, true);
    await client.publish(channels[1]!, "3");
    const got = (await take(again, 3)) as Event[];
    assert.deepEqual(
      got.map((e) => [e.channel, e.payload.toString()]),
      [
        [channels[0], "1"],
        [channels.at(-1), "2"],
        [channels[1], "3"],
      ],
    );
    await again.close();
  });

  it("a network break is recovered without a gap", T, async () => {
    const name = uniqueName();
    const [a, b] = [`hist.${name}.a`, `hist.${name}.b`];
    const proxy = new Proxy(shared.grpcAddr);
    const viaProxy = await Client.connect(await proxy.listen());
    try {
      const sub = viaProxy.subscribe(`hist.${name}.>`, { backoff: { initialMs: 50, maxMs: 500 } });
      await sub.started();
      await client.publish(a, "1");
      await client.publish(b, "2");
      const got = await take(sub, 2);

      proxy.cut(); // the subscriber is cut off; what is published now is missed...
      for (const [seq, channel] of [
        [3, a],
        [4, b],
        [5, a],
      ] as const) {
        await client.publish(channel, String(seq));
      }
      proxy.restore(); // ... and recovered when it re-subscribes by itself
      await client.publish(b, "6"); // live, or recovered: either way once
      got.push(...(await take(sub, 4, 30_000)));
      assert.deepEqual(payloads(got), [1, 2, 3, 4, 5, 6]);
      assert.equal(sub.reconnects, 1);
      assert.equal(sub.recovered, true);
      await sub.close();
    } finally {
      viaProxy.close();
      proxy.close();
    }
  });

  it("leaving and coming back while events are published loses and repeats nothing", T, async () => {
    const name = uniqueName();
    const total = 600;
    const channels = [0, 1, 2].map((i) => `hist.${name}.${i}`);
    let sub: Subscription = client.subscribe(`hist.${name}.>`);
    await sub.started();
    const publisher = (async () => {
      for (let seq = 1; seq <= total; seq++) await client.publish(channels[seq % 3]!, String(seq));
    })();
    const received: number[] = [];
    const rounds: Array<boolean | undefined> = [];
    try {
      for (let round = 0; round < 6; round++) {
        received.push(...payloads(await take(sub, 40)));
        await sub.close();
        sub = client.subscribe(`hist.${name}.>`, { since: sub.since });
        await sub.started();
        rounds.push(sub.recovered);
      }
      received.push(...payloads(await take(sub, total - received.length, 60_000)));
    } finally {
      await sub.close();
      await publisher;
    }
    // Every event exactly once, and each channel's in publish order (the order the
    // broker keeps; across channels, one recovered and one live event may swap at the
    // seam).
    assert.deepEqual(
      [...received].sort((a, b) => a - b),
      Array.from({ length: total }, (_, i) => i + 1),
    );
    for (const channel of [0, 1, 2]) {
      const mine = received.filter((seq) => seq % 3 === channel);
      assert.deepEqual(
        mine,
        [...mine].sort((a, b) => a - b),
      );
    }
    assert.ok(
      rounds.every((r) => r === true),
      String(rounds),
    );
  });

  it("channelHistory reads what a channel keeps", T, async () => {
    const name = uniqueName();
    const channel = `hist.${name}.h`;
    const ids: string[] = [];
    for (let i = 1; i <= 5; i++) ids.push((await client.publish(channel, String(i))).eventId);
    const all = await client.channelHistory(channel);
    assert.equal(all.history?.channel, channel);
    assert.deepEqual([all.history?.firstOffset, all.history?.lastOffset, all.history?.events], [1n, 5n, 5n]);
    assert.deepEqual(
      all.events.map((e) => e.id),
      ids,
    );
    const page = await client.channelHistory(channel, { afterOffset: 2, limit: 2 });
    assert.deepEqual(
      page.events.map((e) => e.position?.offset),
      [3n, 4n],
    );
    assert.equal(page.more, true);
    const since = await client.channelHistory(channel, { since: new Date(Date.now() - 60_000) });
    assert.equal(since.events.length, 5);
    await assert.rejects(client.channelHistory(`${name}.no-history`), NotFound);
  });
});

describe("recovery across a restart", () => {
  let daemon: Daemon;
  before(async () => {
    daemon = historyDaemon();
    await daemon.start();
  });
  after(async () => {
    await daemon?.stop();
  });

  it("an in_memory restart loses history, so a gap is reported", T, async () => {
    const name = uniqueName();
    const channel = `hist.${name}.a`;
    const client = await Client.connect(daemon.url);
    try {
      const sub = client.subscribe(`hist.${name}.>`);
      await sub.started();
      assert.equal(sub.recovered, false);
      for (const i of [1, 2, 3]) await client.publish(channel, String(i));
      assert.deepEqual(payloads(await take(sub, 3)), [1, 2, 3]);
      const before = sub.positions[channel]!;
      assert.equal(before.offset, 3n);
      assert.ok(before.epoch);

      await daemon.restart(); // in_memory: the history is gone, with its epoch
      const [gap] = await take(sub, 1, 30_000);
      assert.ok(gap instanceof Gap);
      assert.equal(gap.reconnects, 1);
      assert.equal(sub.recovered, false);
      await sub.started();
      await client.publish(channel, "4");
      const [after] = (await take(sub, 1)) as Event[];
      assert.equal(after!.payload.toString(), "4");
      assert.notEqual(after!.position?.epoch, before.epoch);
      assert.equal(after!.position?.offset, 1n);
      // Another epoch replaces the tracked position.
      assert.deepEqual(sub.positions[channel], { epoch: after!.position!.epoch, offset: 1n });
      await sub.close();
    } finally {
      client.close();
    }
  });
});
