// `Client.publish` over one long-lived `PublishStream` per client (each-answer mode).
//
// The calls of the whole process share the stream: a service that publishes one event
// per request handler pays a stream message per event instead of a whole gRPC call.
// Calls queue here; whatever has queued is written as soon as the stream can take it
// (the calls that arrive while it is busy go out together), and the broker's answers,
// which come in order, are matched to the calls in the order they were written. Each
// call gets its own answer or its own error, the stream answering a refused event in
// place (`ACK_MODE_EACH_IN_PLACE`):
// - a refused event fails its own call, and the stream goes on;
// - a stream ended by a request the broker could not read (over its read limit) fails
//   that call; the broker read nothing after it, so the calls written after it go
//   again, first and in order, on a new stream;
// - a stream lost otherwise (connection broken, broker restarting) leaves the fate of
//   the unanswered events unknown: a call with an idempotency key is sent again (the
//   broker answers a duplicate with the original id), any other fails with
//   `Unavailable`: never an answer for an event whose answer was not seen;
// - a call whose deadline passes, or whose signal aborts, before its event was written
//   takes it back: it is never sent.
import { type ClientDuplexStream, type Metadata, status as Status } from "@grpc/grpc-js";

import type { EventBusClient, PublishRequest, PublishResponse } from "./gen/eventbus/v1/eventbus.js";
import { DeadlineExceeded, type EventBusError, Unavailable, fromServiceError, fromStatus, statusName } from "./errors.js";
import { sleep } from "./util.js";

/** Most events written and not yet answered; past it calls wait here. */
const MAX_IN_FLIGHT = 4096;
/** Times an event with an idempotency key is sent again after streams lost under it. */
const MAX_RESENDS = 3;
/** First and longest pause between attempts to open a stream again, ms. */
const REOPEN_FIRST_MS = 20;
const REOPEN_MAX_MS = 500;

/** Codes the broker ends the stream with when it cannot read its next request (nothing
 * after it published); never produced by a connection breaking. */
const REFUSALS: ReadonlySet<number> = new Set([
  Status.INVALID_ARGUMENT,
  Status.PERMISSION_DENIED,
  Status.RESOURCE_EXHAUSTED,
  Status.NOT_FOUND,
  Status.FAILED_PRECONDITION,
  Status.ALREADY_EXISTS,
]);

class Call {
  /** Streams lost under it while it was written and unanswered. */
  lost = 0;
  settled = false;
  private readonly cleanup: () => void;

  constructor(
    readonly request: PublishRequest,
    private readonly resolveCall: (response: PublishResponse) => void,
    private readonly rejectCall: (error: unknown) => void,
    timeoutMs: number,
    signal: AbortSignal | undefined,
  ) {
    const timer =
      timeoutMs > 0
        ? setTimeout(
            () =>
              this.fail(new DeadlineExceeded(`DEADLINE_EXCEEDED: no answer within ${timeoutMs} ms`, Status.DEADLINE_EXCEEDED)),
            timeoutMs,
          )
        : undefined;
    const onAbort = (): void => this.fail(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    this.cleanup = () => {
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
  }

  answer(response: PublishResponse): void {
    if (this.settled) return;
    this.settled = true;
    this.cleanup();
    this.resolveCall(response);
  }

  fail(error: unknown): void {
    if (this.settled) return;
    this.settled = true;
    this.cleanup();
    this.rejectCall(error);
  }
}

/** An open stream: the call, and what was written on it and not answered yet. */
interface OpenStream {
  call: ClientDuplexStream<PublishRequest, PublishResponse>;
  inFlight: Call[];
  ended: boolean;
}

/** The error of a call whose event was written on a stream lost before its answer. */
export function unanswered(code: number, details: string): EventBusError {
  if (code === Status.UNAUTHENTICATED) return fromStatus(code, details);
  return new Unavailable(
    `UNAVAILABLE: the publish stream was lost before the broker answered this event (${statusName(code)}: ${details}); ` +
      "it may or may not be published: publish it again (with an idempotency key, to publish it once)",
    Status.UNAVAILABLE,
  );
}

/** The stream `Client.publish` shares, opened with the first call. */
export class SharedPublisher {
  /** Not written yet, in order; calls to send again come first. */
  private waiting: Call[] = [];
  private stream: OpenStream | undefined;
  private running = false;
  private closed = false;
  /** Wakes the writer waiting for room in the stream. */
  private room: (() => void) | undefined;

  constructor(
    private readonly bus: EventBusClient,
    private readonly metadata: () => Metadata,
    private readonly lingerMs: number,
    private readonly reopenForMs: number,
  ) {}

  publish(request: PublishRequest, timeoutMs: number, signal: AbortSignal | undefined): Promise<PublishResponse> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.closed) return Promise.reject(new Unavailable("UNAVAILABLE: the client is closed", Status.UNAVAILABLE));
    return new Promise<PublishResponse>((resolve, reject) => {
      this.waiting.push(new Call(request, resolve, reject, timeoutMs, signal));
      void this.run();
    });
  }

  /** Fails what waits and ends the stream. */
  close(): void {
    this.closed = true;
    const closed = new Unavailable("UNAVAILABLE: the client was closed", Status.UNAVAILABLE);
    const stream = this.stream;
    this.stream = undefined;
    if (stream) {
      stream.ended = true;
      stream.call.cancel();
      for (const call of stream.inFlight) call.fail(closed);
      stream.inFlight = [];
    }
    for (const call of this.waiting) call.fail(closed);
    this.waiting = [];
    this.room?.();
  }

  /** Writes the waiting calls; one writer at a time. */
  private async run(): Promise<void> {
    if (this.running) return;
    this.running = true;
    try {
      while (!this.closed) {
        this.waiting = this.waiting.filter((call) => !call.settled);
        if (this.waiting.length === 0) return;
        let stream = this.stream;
        if (stream === undefined || stream.ended) {
          stream = await this.open();
          if (stream === undefined) continue;
        }
        if (this.lingerMs > 0 && stream.inFlight.length > 0) await sleep(this.lingerMs);
        await this.write(stream);
      }
    } finally {
      this.running = false;
    }
  }

  private async write(stream: OpenStream): Promise<void> {
    while (this.waiting.length > 0 && !stream.ended && !this.closed) {
      if (stream.inFlight.length >= MAX_IN_FLIGHT) {
        await new Promise<void>((resolve) => (this.room = resolve));
        this.room = undefined;
        continue;
      }
      const call = this.waiting.shift();
      if (call === undefined || call.settled) continue;
      stream.inFlight.push(call);
      if (!stream.call.write(call.request)) {
        await new Promise<void>((resolve) => {
          const done = (): void => {
            stream.call.off("drain", done);
            stream.call.off("close", done);
            stream.call.off("status", done);
            resolve();
          };
          stream.call.on("drain", done);
          stream.call.on("close", done);
          stream.call.on("status", done);
        });
      }
    }
  }

  /** A new stream for the waiting calls, trying again with backoff while the broker is
   * away, up to `reopenForMs`; then fails them with the last error. */
  private async open(): Promise<OpenStream | undefined> {
    const giveUp = Date.now() + this.reopenForMs;
    let pause = REOPEN_FIRST_MS;
    for (;;) {
      let error: EventBusError;
      try {
        return await this.tryOpen(Math.max(1, giveUp - Date.now()));
      } catch (err) {
        error = fromServiceError(err);
      }
      this.waiting = this.waiting.filter((call) => !call.settled);
      if (this.waiting.length === 0 || this.closed) return undefined;
      if (Date.now() + pause >= giveUp) {
        for (const call of this.waiting) call.fail(error);
        this.waiting = [];
        return undefined;
      }
      await sleep(pause);
      pause = Math.min(pause * 2, REOPEN_MAX_MS);
    }
  }

  /** Opens a stream and waits for the broker's headers (nothing is written before). */
  private tryOpen(withinMs: number): Promise<OpenStream> {
    const metadata = this.metadata();
    metadata.set("eventbus-ack", "each_in_place");
    const call = this.bus.publishStream(metadata);
    const stream: OpenStream = { call, inFlight: [], ended: false };
    call.on("error", () => {}); // the status below says it all
    return new Promise<OpenStream>((resolve, reject) => {
      let opened = false;
      const timer = setTimeout(() => {
        call.cancel();
        reject(new Unavailable(`UNAVAILABLE: the broker did not open a publish stream within ${this.reopenForMs} ms`, Status.UNAVAILABLE));
      }, withinMs);
      call.on("metadata", () => {
        opened = true;
        clearTimeout(timer);
        this.stream = stream;
        resolve(stream);
      });
      call.on("data", (response: PublishResponse) => {
        const answered = stream.inFlight.shift();
        if (answered === undefined) {
          this.ended(stream, Status.INTERNAL, "the broker answered more events than were sent");
          return;
        }
        if (response.error) answered.fail(fromStatus(response.error.code, response.error.message));
        else answered.answer(response);
        if (stream.inFlight.length < MAX_IN_FLIGHT) this.room?.();
      });
      call.on("status", ({ code, details }: { code: number; details: string }) => {
        if (!opened) {
          clearTimeout(timer);
          reject(fromStatus(code, details));
          return;
        }
        // After the answers still buffered in the stream.
        setImmediate(() =>
          this.ended(stream, code === Status.OK ? Status.UNAVAILABLE : code, code === Status.OK ? "the broker ended the publish stream" : details),
        );
      });
    });
  }

  /** The stream ended under calls in flight, with `code`. */
  private ended(stream: OpenStream, code: number, details: string): void {
    if (stream.ended) return;
    stream.ended = true;
    stream.call.cancel();
    if (this.stream === stream) this.stream = undefined;
    const again: Call[] = [];
    const inFlight = stream.inFlight;
    stream.inFlight = [];
    if (REFUSALS.has(code) && inFlight.length > 0) {
      // The broker could not read the first unanswered event, and read no further.
      inFlight.shift()?.fail(fromStatus(code, details));
      again.push(...inFlight);
    } else {
      for (const call of inFlight) {
        if (call.request.idempotencyKey !== "" && call.lost < MAX_RESENDS) {
          call.lost += 1;
          again.push(call);
        } else {
          call.fail(unanswered(code, details));
        }
      }
    }
    this.waiting = [...again, ...this.waiting];
    this.room?.();
    void this.run();
  }
}
