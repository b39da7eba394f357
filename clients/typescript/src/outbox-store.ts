/**
 * What the outbox keeps of each message ({@link OutboxEntry}), the
 * interface of the storage that keeps it ({@link OutboxStore}), and the
 * in-memory store. Other stores: `FileOutboxStore` (Node, in
 * `estafeta-client/node`) and `AsyncStorageOutboxStore` (React Native).
 *
 * A store holds one JSON document per entry under its sequence number; the
 * outbox calls it one operation at a time, in order, and counts an
 * operation done when its promise resolves, so a store must resolve only
 * once the entry is durable (that is what lets `send()` promise the message
 * survives the app being killed).
 */

import { OutboxStoreError } from "./errors.js";

/**
 * Where a message is: `queued` (waiting its turn), `sending` (a request is
 * out), `sent` (the server has it: `messageId` is set), `failed` (it will not
 * be sent: `failure` says why).
 */
export type OutboxState = "queued" | "sending" | "sent" | "failed";

/** Why a message ended `failed`. */
export interface OutboxFailure {
  /**
   * `rejected`: the server refused it (a 4xx answer that will not change);
   * `expired`: older than the outbox's `maxAgeMs` before the server took it;
   * `attempts`: answered with errors `maxAttempts` times (503s, 500s).
   */
  reason: "rejected" | "expired" | "attempts";
  /** The HTTP status of the last error answer, if there was one. */
  status?: number;
  /** The server's error code of the last error answer, if there was one. */
  code?: string;
  /** What happened, for people. */
  message: string;
}

/** One message of the outbox and its state. */
export interface OutboxEntry {
  /** Its place in the device's order: the outbox sends lower numbers first. */
  seq: number;
  /** The database it is for. */
  to: string;
  /** Its body (any JSON). */
  body: unknown;
  /** The key every try sends, so the server keeps one message whatever the retries. */
  idempotencyKey: string;
  /** When `send()` made it (RFC 3339), sent as the message's `created_at`. */
  createdAt: string;
  /** `createdAt` in milliseconds since the epoch, for the age limit. */
  enqueuedAt: number;
  /** Its state. */
  state: OutboxState;
  /** Error answers from the server so far (tries without an answer do not count). */
  attempts: number;
  /** Tries that got no answer (network down, timeout): shown, never counted as attempts. */
  unanswered: number;
  /** The server's message id, once `sent`. */
  messageId?: string;
  /** Why it is `failed`. */
  failure?: OutboxFailure;
  /** The last error of a try, while it waits to be tried again. */
  lastError?: string;
}

/** Durable storage of outbox entries: each promise resolves once the change is durable. */
export interface OutboxStore {
  /** Every entry kept, in any order. */
  load(): Promise<OutboxEntry[]>;
  /** Adds the entry or replaces the one with its `seq`. */
  save(entry: OutboxEntry): Promise<void>;
  /** Removes the entry with this `seq` (nothing when there is none). */
  remove(seq: number): Promise<void>;
}

const STATES: readonly string[] = ["queued", "sending", "sent", "failed"];

/**
 * An entry read back from a store, checked; an {@link OutboxStoreError}
 * naming `where` when it is not one (a damaged file, a foreign key).
 */
export function parseEntry(text: string, where: string): OutboxEntry {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new OutboxStoreError(`${where}: not JSON (${err instanceof Error ? err.message : String(err)})`);
  }
  const e = value as Partial<OutboxEntry> | null;
  const fits =
    typeof e === "object" &&
    e !== null &&
    Number.isSafeInteger(e.seq) &&
    typeof e.to === "string" &&
    "body" in e &&
    typeof e.idempotencyKey === "string" &&
    typeof e.createdAt === "string" &&
    typeof e.enqueuedAt === "number" &&
    typeof e.state === "string" &&
    STATES.includes(e.state) &&
    typeof e.attempts === "number" &&
    typeof e.unanswered === "number";
  if (!fits) throw new OutboxStoreError(`${where}: not an outbox entry`);
  return e as OutboxEntry;
}

/**
 * Entries in memory: for tests, and for apps that accept losing unsent
 * messages when the process ends. Keeps copies, as a durable store would.
 */
export class MemoryOutboxStore implements OutboxStore {
  /** Each entry's JSON by sequence number (text, so a caller's later changes do not reach it). */
  private readonly entries = new Map<number, string>();

  async load(): Promise<OutboxEntry[]> {
    return [...this.entries.entries()].map(([seq, text]) => parseEntry(text, `memory entry ${seq}`));
  }

  async save(entry: OutboxEntry): Promise<void> {
    this.entries.set(entry.seq, JSON.stringify(entry));
  }

  async remove(seq: number): Promise<void> {
    this.entries.delete(seq);
  }
}
