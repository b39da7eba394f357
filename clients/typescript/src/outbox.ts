/**
 * {@link Outbox}: a device's durable outbox. `send()` stores the message
 * with its idempotency key and resolves once the store has it durably; a
 * sender uploads the stored messages one at a time, oldest first, retrying
 * with backoff and always the same key, so that neither a lost answer nor
 * the app being killed and started again makes a second message or loses
 * one.
 *
 * What it guarantees, and the choices behind it:
 * - Order: messages go to the server in `send()` order, one request at a
 *   time. A message that fails for good (see below) is marked `failed` and
 *   the next one goes on: it never blocks those behind it.
 * - Restart: entries found `sending` when the outbox opens (the app died
 *   mid-request) go back to `queued` and are sent again under their key.
 * - Attempts: only error answers of the server count. A try without an
 *   answer (network down, timeout) is counted apart (`unanswered`) and
 *   retried with backoff, without end but for the age limit.
 * - Failure is visible, never silent: a 4xx answer that retrying cannot
 *   change (`rejected`), `maxAttempts` error answers such as 503
 *   (`attempts`), or a message older than `maxAgeMs` that the server has not
 *   confirmed (`expired`) ends `failed`, kept until the app removes or
 *   retries it. A 401 (the token is unknown) fails no message: the sender
 *   stops with the error, since every message would meet it.
 * - Bounds: at most `maxEntries` messages not yet sent (queued, sending or
 *   failed); `send()` beyond that rejects with {@link OutboxFullError}. Sent
 *   entries are kept for display, the newest `keepSent` of them.
 * - The age limit is at most the time the server remembers an idempotency
 *   key (7 days from the message's arrival): every try of a message falls
 *   within that time, so a retry is always recognised.
 *
 * One `Outbox` per store at a time; one store per device (its token).
 */

import { Backoff, type BackoffOptions } from "./backoff.js";
import { systemClock, Stopper, type Clock, type StopSignal } from "./clock.js";
import type { EstafetaClient } from "./client.js";
import { ApiError, BadAnswerError, OutboxFullError, TransportError, isTransient } from "./errors.js";
import type { OutboxEntry, OutboxFailure, OutboxState, OutboxStore } from "./outbox-store.js";

/** How long the server remembers an idempotency key after the message arrived. */
export const KEY_LIFETIME_MS = 7 * 24 * 3600 * 1000;

/** How an outbox behaves; everything but `client` and `store` has a default. */
export interface OutboxOptions {
  /** The device's client (device token). */
  client: EstafetaClient;
  /** Where entries are kept. */
  store: OutboxStore;
  /** Most messages held that are not sent: queued, sending or failed (default 1000). */
  maxEntries?: number;
  /** A message not confirmed this long after `send()` fails as `expired` (default and most: {@link KEY_LIFETIME_MS}). */
  maxAgeMs?: number;
  /** Error answers (503, 500) after which a message fails as `attempts` (default 10). */
  maxAttempts?: number;
  /** Sent entries kept for display, newest first (default 100). */
  keepSent?: number;
  /** Waits between tries (default 0.5 s doubling to 60 s). */
  backoff?: BackoffOptions;
  /** The time (default: the system's). */
  clock?: Clock;
  /** Random numbers in [0, 1) for the backoff's jitter (default `Math.random`). */
  random?: () => number;
  /** Makes a new idempotency key (default: 128 random bits in hex). */
  newKey?: () => string;
  /** Told of every state change, with a copy of the entry. */
  onChange?: (entry: OutboxEntry) => void;
  /** Told of an error that stopped the background sender for a while (a 401, a store failure). */
  onError?: (err: unknown) => void;
}

/** How many entries are in each state. */
export type OutboxCounts = Record<OutboxState, number>;

/** A device's durable outbox: see the module overview. */
export class Outbox {
  // The options (OutboxOptions says what each is for), defaults applied.
  private readonly client: EstafetaClient;
  private readonly store: OutboxStore;
  private readonly maxEntries: number;
  private readonly maxAgeMs: number;
  private readonly maxAttempts: number;
  private readonly keepSent: number;
  private readonly clock: Clock;
  /** The waits between tries (from the `backoff` and `random` options), reset by each success. */
  private readonly backoff: Backoff;
  private readonly newKey: () => string;
  private readonly onChange: ((entry: OutboxEntry) => void) | undefined;
  private readonly onError: ((err: unknown) => void) | undefined;
  /** Every entry kept, by sequence number; the store holds the same. */
  private readonly entriesBySeq = new Map<number, OutboxEntry>();
  /** The highest sequence number used. */
  private lastSeq: number;
  /** Sends whose entry is being stored: they count against `maxEntries` already. */
  private reserved = 0;
  /** The store's operations, one after another, in call order. */
  private storeChain: Promise<void> = Promise.resolve();
  /** The drain in progress, if any. */
  private draining: Promise<void> | undefined;
  /** The background sender, if started, and the switch that stops it. */
  private background: { loop: Promise<void>; stopper: Stopper } | undefined;
  /** Wakes the background sender when a message is added. */
  private bell: (() => void) | undefined;
  /** Entries that were `sending` when the outbox opened (the app died mid-request). */
  readonly recovered: number;

  private constructor(options: OutboxOptions, loaded: OutboxEntry[], recovered: number) {
    this.client = options.client;
    this.store = options.store;
    this.maxEntries = positive("maxEntries", options.maxEntries ?? 1000);
    this.maxAgeMs = positive("maxAgeMs", options.maxAgeMs ?? KEY_LIFETIME_MS);
    if (this.maxAgeMs > KEY_LIFETIME_MS) {
      throw new RangeError(
        `maxAgeMs ${this.maxAgeMs} is over the server's idempotency key lifetime (${KEY_LIFETIME_MS} ms): ` +
          "a retry after the key is forgotten could make a second message",
      );
    }
    this.maxAttempts = positive("maxAttempts", options.maxAttempts ?? 10);
    this.keepSent = Math.max(0, options.keepSent ?? 100);
    this.clock = options.clock ?? systemClock;
    this.backoff = new Backoff(options.backoff, options.random);
    this.newKey = options.newKey ?? randomKey;
    this.onChange = options.onChange;
    this.onError = options.onError;
    for (const entry of loaded) this.entriesBySeq.set(entry.seq, entry);
    this.lastSeq = loaded.reduce((max, e) => Math.max(max, e.seq), 0);
    this.recovered = recovered;
  }

  /**
   * Opens the outbox on its store: loads the entries and puts those caught
   * mid-send back in the queue (durably) before anything is sent.
   */
  static async open(options: OutboxOptions): Promise<Outbox> {
    const loaded = await options.store.load();
    let recovered = 0;
    for (const entry of loaded) {
      if (entry.state === "sending") {
        entry.state = "queued";
        await options.store.save(entry);
        recovered += 1;
      }
    }
    return new Outbox(options, loaded, recovered);
  }

  /**
   * Puts a message for database `to` in the outbox; resolves with its entry
   * (state `queued`) once the store holds it durably. Rejects with
   * {@link OutboxFullError} when `maxEntries` messages are not sent yet, and
   * with a `TypeError` when `body` is not JSON.
   */
  async send(to: string, body: unknown): Promise<OutboxEntry> {
    if (typeof to !== "string" || to === "") throw new TypeError("send: `to` must be a database id");
    if (JSON.stringify(body) === undefined) throw new TypeError("send: `body` must be JSON");
    const counts = this.count();
    const held = counts.queued + counts.sending + counts.failed + this.reserved;
    if (held >= this.maxEntries) throw new OutboxFullError(held, this.maxEntries);
    const now = this.clock.now();
    const entry: OutboxEntry = {
      seq: ++this.lastSeq,
      to,
      body,
      idempotencyKey: this.newKey(),
      createdAt: new Date(now).toISOString(),
      enqueuedAt: now,
      state: "queued",
      attempts: 0,
      unanswered: 0,
    };
    this.reserved += 1;
    try {
      await this.persist(entry);
    } finally {
      this.reserved -= 1;
    }
    this.entriesBySeq.set(entry.seq, entry);
    this.changed(entry);
    this.bell?.();
    return { ...entry };
  }

  /** Copies of every entry kept, in sequence order. */
  entries(): OutboxEntry[] {
    return [...this.entriesBySeq.values()].sort((a, b) => a.seq - b.seq).map((e) => ({ ...e }));
  }

  /** A copy of the entry with this sequence number. */
  entry(seq: number): OutboxEntry | undefined {
    const e = this.entriesBySeq.get(seq);
    return e && { ...e };
  }

  /** The queue's depth: messages waiting to be sent (queued or sending). */
  depth(): number {
    const c = this.count();
    return c.queued + c.sending;
  }

  /** How many entries are in each state. */
  count(): OutboxCounts {
    const counts: OutboxCounts = { queued: 0, sending: 0, sent: 0, failed: 0 };
    for (const e of this.entriesBySeq.values()) counts[e.state] += 1;
    return counts;
  }

  /**
   * Sends queued messages until none is left, waiting out network failures
   * and 503s with backoff; resolves then, or as soon as `signal` aborts.
   * Rejects on a 401 or a store failure (the message stays queued). A drain
   * already running is joined rather than started twice.
   */
  drain(signal?: StopSignal): Promise<void> {
    if (this.draining) return this.draining;
    const run = this.pump(signal).finally(() => {
      this.draining = undefined;
    });
    this.draining = run;
    return run;
  }

  /**
   * Starts the background sender: it drains, then waits for the next
   * `send()`; after an error (reported to `onError`) it waits the longest
   * backoff and drains again. {@link Outbox.stop} ends it.
   */
  start(): void {
    if (this.background) return;
    const stopper = new Stopper();
    this.background = { loop: this.runBackground(stopper.signal), stopper };
  }

  /** Stops the background sender; resolves once its request in flight, if any, is done. */
  async stop(): Promise<void> {
    const background = this.background;
    if (!background) return;
    background.stopper.stop();
    this.bell?.();
    await background.loop;
    this.background = undefined;
  }

  /**
   * Puts a `failed` message back in the queue under its key, with its
   * attempts and its age counted afresh (the server still recognises the
   * key if it has the message from an earlier try within the last 7 days).
   */
  async retry(seq: number): Promise<void> {
    const entry = this.failedOrSent(seq, ["failed"]);
    entry.state = "queued";
    entry.attempts = 0;
    entry.enqueuedAt = this.clock.now();
    delete entry.failure;
    await this.persist(entry);
    this.changed(entry);
    this.bell?.();
  }

  /** Forgets a `failed` or `sent` message. */
  async remove(seq: number): Promise<void> {
    this.failedOrSent(seq, ["failed", "sent"]);
    await this.forget(seq);
  }

  // The sender.

  private async runBackground(signal: StopSignal): Promise<void> {
    while (!signal.aborted) {
      try {
        await this.drain(signal);
      } catch (err) {
        this.onError?.(err);
        await this.clock.sleep(this.backoff.maxMs, signal);
        continue;
      }
      if (this.next() === undefined) {
        await new Promise<void>((resolve) => {
          this.bell = resolve;
        });
        this.bell = undefined;
      }
    }
  }

  private async pump(signal: StopSignal | undefined): Promise<void> {
    for (let head = this.next(); head && !signal?.aborted; head = this.next()) {
      const waitMs = await this.tryOnce(head);
      if (waitMs > 0) await this.clock.sleep(waitMs, signal);
    }
  }

  /** The oldest queued entry. */
  private next(): OutboxEntry | undefined {
    let head: OutboxEntry | undefined;
    for (const e of this.entriesBySeq.values()) {
      if (e.state === "queued" && (!head || e.seq < head.seq)) head = e;
    }
    return head;
  }

  /** One try of `entry`; how long to wait before the next try (0 to go on at once). */
  private async tryOnce(entry: OutboxEntry): Promise<number> {
    if (this.clock.now() - entry.enqueuedAt >= this.maxAgeMs) {
      await this.fail(entry, {
        reason: "expired",
        message:
          `not confirmed by the server within ${this.maxAgeMs} ms` +
          (entry.unanswered > 0 ? " (a try without an answer may have reached it)" : ""),
      });
      return 0;
    }
    await this.setState(entry, "sending");
    try {
      const sent = await this.client.send({
        to: entry.to,
        body: entry.body,
        created_at: entry.createdAt,
        idempotency_key: entry.idempotencyKey,
      });
      entry.messageId = sent.id;
      delete entry.lastError;
      await this.setState(entry, "sent");
      this.backoff.reset();
      await this.pruneSent();
      return 0;
    } catch (err) {
      return this.failedTry(entry, err);
    }
  }

  /** Records a failed try; the wait before the next (0 after a final failure). */
  private async failedTry(entry: OutboxEntry, err: unknown): Promise<number> {
    entry.lastError = err instanceof Error ? err.message : String(err);
    if (err instanceof TransportError || err instanceof BadAnswerError) {
      // No answer, or not the server's (a captive portal's page): not an attempt.
      entry.unanswered += 1;
      await this.setState(entry, "queued");
      return this.backoff.next();
    }
    if (!(err instanceof ApiError)) {
      await this.setState(entry, "queued");
      throw err;
    }
    entry.attempts += 1;
    const last = { status: err.status, code: err.code, message: err.serverMessage };
    if (err.status === 401) {
      await this.setState(entry, "queued");
      throw err;
    }
    if (!isTransient(err)) {
      await this.fail(entry, { reason: "rejected", ...last });
      return 0;
    }
    if (entry.attempts >= this.maxAttempts) {
      await this.fail(entry, { reason: "attempts", ...last });
      return 0;
    }
    await this.setState(entry, "queued");
    return Math.max(this.backoff.next(), (err.retryAfterSeconds ?? 0) * 1000);
  }

  // Entries and the store.

  private async fail(entry: OutboxEntry, failure: OutboxFailure): Promise<void> {
    entry.failure = failure;
    await this.setState(entry, "failed");
  }

  private async setState(entry: OutboxEntry, state: OutboxState): Promise<void> {
    entry.state = state;
    await this.persist(entry);
    this.changed(entry);
  }

  /** Removes the oldest sent entries beyond `keepSent`. */
  private async pruneSent(): Promise<void> {
    const sent = [...this.entriesBySeq.values()].filter((e) => e.state === "sent").sort((a, b) => a.seq - b.seq);
    for (const e of sent.slice(0, Math.max(0, sent.length - this.keepSent))) await this.forget(e.seq);
  }

  private async forget(seq: number): Promise<void> {
    await this.queueStore(() => this.store.remove(seq));
    this.entriesBySeq.delete(seq);
  }

  private persist(entry: OutboxEntry): Promise<void> {
    const copy = { ...entry };
    return this.queueStore(() => this.store.save(copy));
  }

  /** Runs `op` after every store operation asked for before it. */
  private queueStore(op: () => Promise<void>): Promise<void> {
    const run = this.storeChain.then(op);
    this.storeChain = run.catch(() => undefined);
    return run;
  }

  private failedOrSent(seq: number, states: readonly OutboxState[]): OutboxEntry {
    const entry = this.entriesBySeq.get(seq);
    if (!entry) throw new RangeError(`no outbox entry ${seq}`);
    if (!states.includes(entry.state)) {
      throw new RangeError(`outbox entry ${seq} is ${entry.state}, not ${states.join(" or ")}`);
    }
    return entry;
  }

  private changed(entry: OutboxEntry): void {
    this.onChange?.({ ...entry });
  }
}

function positive(name: string, value: number): number {
  if (!(Number.isFinite(value) && value > 0)) throw new RangeError(`${name} must be a positive number (got ${value})`);
  return value;
}

/** 128 random bits in hex: from the platform's secure generator where there is one. */
function randomKey(): string {
  const bytes = new Uint8Array(16);
  const crypto = (globalThis as unknown as { crypto?: { getRandomValues?(array: Uint8Array): Uint8Array } }).crypto;
  if (crypto?.getRandomValues) {
    crypto.getRandomValues(bytes);
  } else {
    for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(Math.random() * 256);
  }
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
