#!/usr/bin/env node
// Throughput of the TypeScript Worker with a no-op handler.
//
// Creates a durable consumer, publishes N events into it (publishStream, pipelined), then
// starts a Worker and times until all N are handled and acked. Reports events/s over the
// consume phase and this process's CPU time per event (the client's own cost, independent
// of how fast the daemon is).
//
//   npm run bench:worker -- --url http://127.0.0.1:50051 -n 100000
//   npm run bench:worker -- -n 50000   # starts $EVENTBUS_BIN (default target/release,
//                                      # else target/debug eventbusd) on 127.0.0.1:0
// Needs `npm run build` first.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { Client, Worker } from "@socle/eventbus";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

const { values: args } = parseArgs({
  options: {
    url: { type: "string" },
    n: { type: "string", short: "n", default: "100000" },
    concurrency: { type: "string", default: "16" },
    payload: { type: "string", default: "100" },
  },
});

async function startDaemon() {
  let bin = process.env.EVENTBUS_BIN;
  if (!bin) {
    const release = join(REPO, "target", "release", "eventbusd");
    bin = existsSync(release) ? release : join(REPO, "target", "debug", "eventbusd");
  }
  const data = mkdtempSync(join(tmpdir(), "bench-worker-"));
  const proc = spawn(bin, ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"], {
    cwd: data,
    env: { ...process.env, EVENTBUS__DURABLE__DATA_DIR: data, NO_COLOR: "1" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines = createInterface({ input: proc.stdout });
  const addr = await new Promise((resolveAddr, reject) => {
    proc.once("exit", () => reject(new Error("eventbusd exited before starting")));
    lines.on("line", (line) => {
      const m = /eventbusd started.*grpc_addr="?([^\s"]+)/.exec(line.replace(/\x1b\[[0-9;]*m/g, ""));
      if (m) resolveAddr(m[1]);
    });
  });
  console.error(`daemon: ${bin} on ${addr}`);
  const stop = async () => {
    proc.kill("SIGTERM");
    await new Promise((r) => proc.once("exit", r));
    rmSync(data, { recursive: true, force: true });
  };
  return { url: `http://${addr}`, stop };
}

async function bench(url, n, concurrency, payloadBytes) {
  const client = await Client.connect(url);
  try {
    const name = `bench-${randomBytes(4).toString("hex")}`;
    await client.createConsumer(name, [`${name}.>`], { maxInFlight: 10_000 });
    const payload = Buffer.alloc(payloadBytes, "x");
    async function* events() {
      for (let i = 0; i < n; i++) yield { channel: `${name}.e`, payload };
    }
    let t0 = performance.now();
    let published = 0;
    for await (const _ of client.publishStream(events())) published += 1;
    const tPub = (performance.now() - t0) / 1000;
    console.log(`published ${published} in ${tPub.toFixed(2)}s (${Math.round(published / tPub).toLocaleString("en")}/s)`);

    let handled = 0;
    let done;
    const all = new Promise((r) => (done = r));
    const worker = new Worker(
      client,
      name,
      () => {
        handled += 1;
        if (handled === n) done();
      },
      { concurrency, queueCapacity: 4096 },
    );
    const cpu0 = process.cpuUsage();
    t0 = performance.now();
    await worker.start();
    await all;
    for (;;) {
      const info = await client.getConsumer(name);
      if (info.pending === 0n && info.inFlight === 0n) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    const elapsed = (performance.now() - t0) / 1000;
    const used = process.cpuUsage(cpu0);
    const cpu = (used.user + used.system) / 1e6;
    await worker.stop();
    const info = await client.getConsumer(name);
    console.log(
      `consumed ${handled} (acked ${info.acked}) in ${elapsed.toFixed(2)}s: ` +
        `${Math.round(handled / elapsed).toLocaleString("en")} events/s; node CPU ${cpu.toFixed(2)}s = ` +
        `${((cpu / handled) * 1e6).toFixed(1)} us/event (ceiling ${Math.round(handled / cpu).toLocaleString("en")}/s on one core)`,
    );
    try {
      await client.deleteConsumer(name);
    } catch (err) {
      console.error(`(deleteConsumer ${name}: ${err.message})`);
    }
  } finally {
    client.close();
  }
}

const daemon = args.url ? undefined : await startDaemon();
try {
  await bench(args.url ?? daemon.url, Number(args.n), Number(args.concurrency), Number(args.payload));
} finally {
  await daemon?.stop();
}
