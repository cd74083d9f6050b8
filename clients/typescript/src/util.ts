// Small helpers shared by the client, the subscription and the worker.
import type { Timestamp } from "./gen/google/protobuf/timestamp.js";

/** An event payload: bytes, or a string sent as UTF-8. */
export type Payload = Uint8Array | string;

export function toBytes(payload: Payload | undefined): Buffer {
  if (payload === undefined) return Buffer.alloc(0);
  if (typeof payload === "string") return Buffer.from(payload, "utf8");
  return Buffer.isBuffer(payload) ? payload : Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength);
}

/** A protobuf `Timestamp` as a `Date` (rounded down to the millisecond). */
export function timestampToDate(ts: Timestamp): Date {
  return new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1_000_000));
}

/** A `Date` as a protobuf `Timestamp`. */
export function dateToTimestamp(date: Date): Timestamp {
  const ms = date.getTime();
  if (Number.isNaN(ms)) throw new TypeError("invalid Date");
  const seconds = Math.floor(ms / 1000);
  return { seconds: BigInt(seconds), nanos: (ms - seconds * 1000) * 1_000_000 };
}

/** Capped exponential backoff with ±20% jitter, for reconnecting. */
export class Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly multiplier: number;

  constructor(options: { initialMs?: number; maxMs?: number; multiplier?: number } = {}) {
    this.initialMs = options.initialMs ?? 100;
    this.maxMs = options.maxMs ?? 5000;
    this.multiplier = options.multiplier ?? 2;
  }

  /** Delay before reconnect number `attempt` (1-based), in milliseconds. */
  delay(attempt: number): number {
    const base = Math.min(this.maxMs, this.initialMs * this.multiplier ** Math.max(0, attempt - 1));
    return base * (0.8 + Math.random() * 0.4);
  }
}

/** Resolves after `ms`, or at once when `signal` is (or becomes) aborted. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve();
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A promise with its resolve function, resolved at most once. */
export class Signal<T = void> {
  readonly promise: Promise<T>;
  private resolveFn!: (value: T) => void;
  settled = false;

  constructor() {
    this.promise = new Promise<T>((resolve) => {
      this.resolveFn = resolve;
    });
  }

  resolve(value: T): void {
    if (this.settled) return;
    this.settled = true;
    this.resolveFn(value);
  }
}

/** Counting semaphore (the publish window); `close()` lets every waiter go with `false`. */
export class Semaphore {
  private waiters: Array<(ok: boolean) => void> = [];
  private closed = false;

  constructor(private permits: number) {}

  acquire(): Promise<boolean> | boolean {
    if (this.closed) return false;
    if (this.permits > 0) {
      this.permits -= 1;
      return true;
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  release(n = 1): void {
    for (let i = 0; i < n; i++) {
      const next = this.waiters.shift();
      if (next) next(true);
      else this.permits += 1;
    }
  }

  close(): void {
    this.closed = true;
    for (const w of this.waiters.splice(0)) w(false);
  }
}

/** Where log lines go (`console` by default); each method is optional. */
export interface Logger {
  warn?(message: string): void;
  debug?(message: string): void;
}
