// Runs a real eventbusd for the tests.
//
// The binary: $EVENTBUS_BIN, else <repo>/target/debug/eventbusd (build it first: `cargo
// build -p eventbus-server --bin eventbusd`). Each daemon listens on 127.0.0.1:0 and keeps
// its durable store in its own temporary directory; its addresses are read from its
// `eventbusd started` line (no sleeps: conditions are polled with a deadline).
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

import type { Subscription, SubscriptionItem } from "@socle/eventbus";

/** clients/typescript (the tests run compiled, from build/test). */
export const PACKAGE_DIR = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const REPO = resolve(PACKAGE_DIR, "..", "..");
export const BIN = process.env.EVENTBUS_BIN ?? join(REPO, "target", "debug", "eventbusd");
const START_TIMEOUT_MS = 30_000;
const ANSI = /\x1b\[[0-9;]*m/g;

const live = new Set<ChildProcess>();
process.on("exit", () => {
  for (const proc of live) proc.kill("SIGKILL");
});

/** A fresh temporary directory, removed when the process exits. */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), `eventbus-ts-${prefix}-`));
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** One eventbusd process; `restart()` keeps its gRPC port and data directory. */
export class Daemon {
  grpcAddr = "127.0.0.1:0";
  httpAddr = "";
  readonly workdir: string;
  private proc: ChildProcess | undefined;
  private exited: Promise<void> | undefined;
  private starts = 0;

  constructor(
    private readonly env: Record<string, string> = {},
    private readonly scheme: "http" | "https" = "http",
    workdir?: string,
  ) {
    this.workdir = workdir ?? tempDir("daemon");
  }

  static async start(env: Record<string, string> = {}, scheme: "http" | "https" = "http"): Promise<Daemon> {
    const d = new Daemon(env, scheme);
    await d.start();
    return d;
  }

  /** With TLS, by the name the test certificate carries (`localhost`), as a client would. */
  get url(): string {
    const addr = this.scheme === "https" ? this.grpcAddr.replace(/^127\.0\.0\.1:/, "localhost:") : this.grpcAddr;
    return `${this.scheme}://${addr}`;
  }

  async start(): Promise<void> {
    if (!existsSync(BIN)) {
      throw new Error(`${BIN} not found: run \`cargo build -p eventbus-server --bin eventbusd\` or set EVENTBUS_BIN`);
    }
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(process.env)) {
      if (v !== undefined && !k.startsWith("EVENTBUS__") && k !== "RUST_LOG" && k !== "EVENTBUS_CONFIG") env[k] = v;
    }
    Object.assign(env, { EVENTBUS__DURABLE__DATA_DIR: join(this.workdir, "data"), NO_COLOR: "1" }, this.env);
    this.starts += 1;
    const logPath = join(this.workdir, `eventbusd-${this.starts}.log`);
    const log = createWriteStream(logPath);
    const proc = spawn(BIN, ["--grpc-addr", this.grpcAddr, "--http-addr", "127.0.0.1:0"], {
      cwd: this.workdir,
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.proc = proc;
    live.add(proc);
    this.exited = new Promise((resolve) =>
      proc.once("exit", () => {
        live.delete(proc);
        resolve();
      }),
    );
    proc.stderr!.pipe(log, { end: false });
    const lines = createInterface({ input: proc.stdout! });
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        proc.kill("SIGKILL");
        reject(new Error(`eventbusd did not start within ${START_TIMEOUT_MS} ms`));
      }, START_TIMEOUT_MS);
      let started = false;
      lines.on("line", (raw) => {
        log.write(raw + "\n"); // keeps the pipe drained for the daemon's whole life
        const line = raw.replace(ANSI, "");
        if (!started && line.includes("eventbusd started")) {
          const grpc = /grpc_addr="?([^\s"]+)/.exec(line);
          const http = /http_addr="?([^\s"]+)/.exec(line);
          if (!grpc) return reject(new Error(`no grpc_addr in: ${line}`));
          started = true;
          clearTimeout(timer);
          this.grpcAddr = grpc[1]!;
          this.httpAddr = http?.[1] ?? "";
          resolve();
        }
      });
      proc.once("exit", (code, signal) => {
        if (started) return;
        clearTimeout(timer);
        log.end();
        setTimeout(() => {
          let out = "";
          try {
            out = readFileSync(logPath, "utf8");
          } catch {
            // no log
          }
          reject(new Error(`eventbusd exited before starting (${code ?? signal}):\n${out}`));
        }, 100);
      });
    });
  }

  /** kill -9: no graceful anything. */
  async kill(): Promise<void> {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill("SIGKILL");
      await this.exited;
    }
  }

  async stop(): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill("SIGTERM");
    const timer = setTimeout(() => proc.kill("SIGKILL"), 10_000);
    await this.exited;
    clearTimeout(timer);
  }

  /** kill -9, then start again on the same port with the same data directory. */
  async restart(): Promise<void> {
    await this.kill();
    // The port was ours a moment ago; binding it again may race a lingering socket.
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        await this.start();
        return;
      } catch (err) {
        if (Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }
}

/** A fresh name for a test's channels and consumers. */
export function uniqueName(): string {
  return "t" + randomBytes(6).toString("hex");
}

/** Polls `check` until it is true; fails after `timeoutMs`. */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  what = "condition",
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** `promise`, or a failure after `ms`. */
export async function within<T>(promise: Promise<T>, ms: number, what = "promise"): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** A promise and its resolve function. */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** The next `count` items of a subscription. */
export async function take(sub: Subscription, count: number, timeoutMs = 20_000): Promise<SubscriptionItem[]> {
  const out: SubscriptionItem[] = [];
  const deadline = Date.now() + timeoutMs;
  while (out.length < count) {
    const next = await within(sub.next(), Math.max(100, deadline - Date.now()), `item ${out.length + 1} of ${count}`);
    if (next.done) throw new Error(`subscription ended after ${out.length} of ${count} items`);
    out.push(next.value);
  }
  return out;
}

