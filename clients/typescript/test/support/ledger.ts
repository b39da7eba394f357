/**
 * The tests' processor application: an SQLite database (node-sqlite3-wasm,
 * a real file with SQLite's own journal and fsyncs) whose `applied` table
 * gets one row per message applied, with the nonce of its body, and no
 * unique constraint: a message or a nonce applied twice shows as two rows,
 * which is what the oracles count.
 */

import assert from "node:assert/strict";
import { rmSync } from "node:fs";
import nodeSqlite from "node-sqlite3-wasm";
import type { ApplyResult, Message } from "../../src/index.js";

const { Database } = nodeSqlite;
/** An open node-sqlite3-wasm database. */
export type Db = InstanceType<typeof Database>;

/**
 * Opens the ledger at `path`. node-sqlite3-wasm locks a database by
 * creating the folder `<path>.lock`, which a killed process leaves behind;
 * the ledger has one user at a time, so a lock found at open is stale.
 */
export function openLedger(path: string): Db {
  rmSync(`${path}.lock`, { recursive: true, force: true });
  const db = new Database(path);
  db.exec("CREATE TABLE IF NOT EXISTS applied (message_id TEXT NOT NULL, nonce TEXT NOT NULL)");
  return db;
}

/** The nonce in a test message's body. */
export function nonceOf(message: Message): string {
  const nonce = (message.body as { nonce?: unknown } | null)?.nonce;
  if (typeof nonce !== "string") throw new Error(`message ${message.id} has no nonce`);
  return nonce;
}

/** Applies each message (a row in `applied`) and replies to its sender with its nonce. */
export function applyMessages(messages: Message[], db: Db): ApplyResult {
  for (const m of messages) db.run("INSERT INTO applied (message_id, nonce) VALUES (?, ?)", [m.id, nonceOf(m)]);
  return { replies: messages.map((m) => ({ to: m.from, body: { nonce: nonceOf(m), re: m.id } })) };
}

/** How many times each nonce was applied. */
export function appliedCounts(db: Db): Map<string, number> {
  const rows = db.all("SELECT nonce, COUNT(*) AS n FROM applied GROUP BY nonce") as Array<{ nonce: string; n: number }>;
  return new Map(rows.map((r) => [r.nonce, Number(r.n)]));
}

/** How many message ids were applied more than once. */
export function messagesAppliedTwice(db: Db): number {
  const row = db.get(
    "SELECT COUNT(*) AS n FROM (SELECT message_id FROM applied GROUP BY message_id HAVING COUNT(*) > 1)",
  ) as { n: number };
  return Number(row.n);
}

/**
 * The oracle: every nonce in `sent` counted in `counts` exactly once, and
 * nothing else there. Returns the lost, duplicated and unknown nonces.
 */
export function compare(
  sent: Iterable<string>,
  counts: Map<string, number>,
): { lost: string[]; duplicated: string[]; unknown: string[] } {
  const expected = new Set(sent);
  const lost = [...expected].filter((n) => !counts.has(n));
  const duplicated = [...counts].filter(([, n]) => n > 1).map(([nonce]) => nonce);
  const unknown = [...counts.keys()].filter((n) => !expected.has(n));
  return { lost, duplicated, unknown };
}

/** Asserts the oracle's verdict on `counts` (what `what` holds): nothing lost, nothing twice, nothing unknown. */
export function assertExactlyOnce(sent: Iterable<string>, counts: Map<string, number>, what: string): void {
  assert.deepEqual(compare(sent, counts), { lost: [], duplicated: [], unknown: [] }, `${what}: by nonce`);
}
