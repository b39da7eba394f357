/**
 * The processor loop against a real server and a real SQLite database:
 * every message applied once and answered, verdicts, `select`, BUSY and
 * IDLE, a failing `apply`, lost answers to prepare and commit (resumed in
 * the same or the next cycle), an operator's verdict against the
 * processor's, and backing off from a server that is down.
 */

import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import {
  EstafetaClient,
  SqliteProcessorStore,
  TransportError,
  inbox,
  processOnce,
  runProcessor,
  type Cycle,
  type FetchLike,
  type Message,
  type ProcessorEvent,
  type ProcessorOptions,
} from "../src/index.js";
import { refusedUrl } from "./support/closed-port.js";
import { appliedCounts, applyMessages, assertExactlyOnce, nonceOf, openLedger, type Db } from "./support/ledger.js";
import { ManualClock } from "./support/manual-clock.js";
import { TestServer } from "./support/server.js";
import { provision, type Tenancy } from "./support/tenancy.js";
import { waitFor } from "./support/wait.js";

let server: TestServer;
let t: Tenancy;
let scratch: string;
let ledgers = 0;

before(async () => {
  // Short enough that a test can wait for a process to be in doubt.
  server = await TestServer.start({ ESTAFETA_READY_TIMEOUT: "2s" });
  t = await provision(server, ["db-a"], ["phone-1"]);
  scratch = await mkdtemp(join(tmpdir(), "estafeta-processor-test-"));
});

after(async () => {
  await server?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

/** A new ledger and the processor options over it; `fetch` replaces the database client's. */
async function processor(fetch?: FetchLike): Promise<{ db: Db; options: ProcessorOptions<Db> }> {
  const db = openLedger(join(scratch, `ledger-${++ledgers}.db`));
  const client = fetch
    ? new EstafetaClient({ baseUrl: server.url, token: t.databases[0]!.token, fetch })
    : t.databases[0]!.client;
  const options: ProcessorOptions<Db> = {
    client,
    dbId: "db-a",
    store: await SqliteProcessorStore.open(db),
    apply: async (messages, tx) => applyMessages(messages, tx),
    maxFiles: 5,
  };
  return { db, options };
}

/** Uploads one message per nonce from phone-1. */
async function upload(nonces: string[]): Promise<void> {
  for (const nonce of nonces) await t.devices[0]!.client.send({ to: "db-a", body: { nonce } });
}

/** The replies in phone-1's inbox, by nonce, acknowledged. */
async function repliesByNonce(): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  await inbox(t.devices[0]!.client, (m) => void counts.set(nonceOf(m), (counts.get(nonceOf(m)) ?? 0) + 1));
  return counts;
}

const nonces = (prefix: string, n: number): string[] => Array.from({ length: n }, (_, i) => `${prefix}-${i}`);

test("runProcessor applies every message once, in processes of maxFiles, and answers each", { timeout: 30_000 }, async () => {
  const sent = nonces("once", 12);
  await upload(sent);
  const { db, options } = await processor();
  const cycles: Cycle[] = [];
  await runProcessor({ ...options, untilIdle: true, onCycle: (c) => cycles.push(c) });
  assert.deepEqual(
    cycles.map((c) => (c.kind === "done" ? [c.kind, c.processed, c.committed, c.answer] : [c.kind])),
    [["done", 5, true, "OK"], ["done", 5, true, "OK"], ["done", 2, true, "OK"], ["idle"]],
  );
  assertExactlyOnce(sent, appliedCounts(db), "the processor's database");
  assertExactlyOnce(sent, await repliesByNonce(), "the replies the device received");
  assert.deepEqual(await options.store.unsettled(), []);
  db.close();
});

test("verdicts: a deadlocked message comes again, an incorrect one goes to Error with its code", { timeout: 30_000 }, async () => {
  await upload(["fine", "deadlock", "incorrect"]);
  const { db, options } = await processor();
  let deadlocks = 0;
  const cycles: Cycle[] = [];
  await runProcessor({
    ...options,
    untilIdle: true,
    onCycle: (c) => cycles.push(c),
    apply: async (messages, tx) => {
      const verdicts: Record<string, { status: "PROCESSED_DEADLOCK" | "PROCESSED_INCORRECT"; error_code?: number; error_text?: string }> = {};
      const ok: Message[] = [];
      for (const m of messages) {
        if (nonceOf(m) === "deadlock" && deadlocks++ === 0) verdicts[m.id] = { status: "PROCESSED_DEADLOCK" };
        else if (nonceOf(m) === "incorrect")
          verdicts[m.id] = { status: "PROCESSED_INCORRECT", error_code: 335544665, error_text: "no such customer" };
        else ok.push(m);
      }
      return { ...applyMessages(ok, tx), verdicts };
    },
  });
  assert.deepEqual(
    cycles.filter((c) => c.kind === "done").map((c) => c.kind === "done" && [c.processed, c.deadlocked, c.incorrect]),
    [
      [1, 1, 1],
      [1, 0, 0],
    ],
  );
  assert.deepEqual(Object.fromEntries(appliedCounts(db)), { fine: 1, deadlock: 1 });
  const errors = await t.admin.folder("db-a", "Error");
  assert.equal(errors.files.length, 1);
  assert.deepEqual(Object.fromEntries(await repliesByNonce()), { fine: 1, deadlock: 1 });
  db.close();
});

test("select narrows the process with accept; the others come again", { timeout: 30_000 }, async () => {
  const sent = nonces("select", 4);
  await upload(sent);
  const { db, options } = await processor();
  const first = await processOnce({ ...options, select: (messages) => messages.slice(0, 1) });
  assert.equal(first.kind === "done" && first.processed, 1);
  const none = await processOnce({ ...options, select: () => [] });
  assert.equal(none.kind, "rejected");
  await assert.rejects(
    processOnce({ ...options, select: (messages) => [messages[0]!, messages[0]!] }),
    /select must return some of the offered messages, each once/,
  );
  assert.deepEqual(await options.store.unsettled(), [], "that process was aborted and forgotten");
  await runProcessor({ ...options, untilIdle: true });
  assertExactlyOnce(sent, appliedCounts(db), "the processor's database");
  await repliesByNonce();
  db.close();
});

test("BUSY while another process is open, IDLE when nothing waits", { timeout: 30_000 }, async () => {
  await upload(["busy"]);
  const other = await t.databases[0]!.client.start({ db_id: "db-a" });
  const { db, options } = await processor();
  assert.equal((await processOnce(options)).kind, "busy");
  await t.databases[0]!.client.abort(other.process_id!, "test");
  assert.equal((await processOnce(options)).kind, "done");
  assert.equal((await processOnce(options)).kind, "idle");
  await repliesByNonce();
  db.close();
});

test("a failing apply rolls back, aborts the process, and leaves the messages queued", { timeout: 30_000 }, async () => {
  await upload(["fails-once"]);
  const { db, options } = await processor();
  const failing = processOnce({
    ...options,
    apply: async (messages, tx) => {
      applyMessages(messages, tx);
      throw new Error("the ERP refused");
    },
  });
  await assert.rejects(failing, /the ERP refused/);
  assert.equal(appliedCounts(db).size, 0, "the local transaction was rolled back");
  assert.deepEqual(await options.store.unsettled(), []);
  const aborted = (await t.admin.processes()).processes.filter((p) => p.state === "ABORTED");
  assert.ok(aborted.length >= 1);
  await runProcessor({ ...options, untilIdle: true });
  assert.deepEqual(Object.fromEntries(appliedCounts(db)), { "fails-once": 1 });
  await repliesByNonce();
  db.close();
});

/** A fetch that loses the answer to the first request whose path ends with `suffix` (the server did get it). */
function losesAnswerTo(suffix: string): FetchLike {
  let lost = false;
  return async (url, request) => {
    const response = await fetch(url, request as RequestInit);
    if (!lost && url.endsWith(suffix)) {
      lost = true;
      await response.text();
      throw new Error(`the answer to ${suffix} was lost`);
    }
    return response;
  };
}

test("a lost answer to prepare: rolled back locally and on the server, applied once later", { timeout: 30_000 }, async () => {
  const sent = nonces("lost-prepare", 3);
  await upload(sent);
  const { db, options } = await processor(losesAnswerTo("/prepare"));
  const err = await processOnce(options).catch((e: unknown) => e);
  assert.ok(err instanceof TransportError, String(err));
  assert.equal(appliedCounts(db).size, 0);
  assert.deepEqual(await options.store.unsettled(), [], "the rollback got through: nothing left to settle");
  assert.ok((await t.admin.processes()).processes.some((p) => p.state === "ROLLED_BACK"));
  await runProcessor({ ...options, untilIdle: true });
  assertExactlyOnce(sent, appliedCounts(db), "the processor's database");
  assertExactlyOnce(sent, await repliesByNonce(), "the replies the device received");
  db.close();
});

test("a lost answer to commit: the next cycle commits again and forgets the process", { timeout: 30_000 }, async () => {
  const sent = nonces("lost-commit", 2);
  await upload(sent);
  const { db, options } = await processor(losesAnswerTo("/commit"));
  const err = await processOnce(options).catch((e: unknown) => e);
  assert.ok(err instanceof TransportError, String(err));
  const [unsettled] = await options.store.unsettled();
  assert.equal(unsettled?.committed, true);
  const events: ProcessorEvent[] = [];
  const next = await processOnce({ ...options, onEvent: (e) => events.push(e) });
  assert.deepEqual(next.resumed, [{ processId: unsettled!.processId, committed: true, answer: "OK" }]);
  assert.deepEqual(events, [{ kind: "resumed", processId: unsettled!.processId, committed: true, answer: "OK" }]);
  assert.equal(next.kind, "idle");
  assertExactlyOnce(sent, appliedCounts(db), "the processor's database");
  assertExactlyOnce(sent, await repliesByNonce(), "the replies the device received");
  db.close();
});

test("an operator's rollback of a process in doubt is reported when the processor commits late", { timeout: 30_000 }, async () => {
  await upload(["overruled"]);
  const { db, options } = await processor();
  const events: ProcessorEvent[] = [];
  const cycle = await processOnce({
    ...options,
    onEvent: (e) => events.push(e),
    onStep: async (step, pid) => {
      if (step !== "committed-locally") return;
      await waitFor("the process to be in doubt", async () =>
        (await options.client.process(pid)).state === "IN_DOUBT" ? true : undefined,
      );
      assert.equal((await t.admin.settle(pid, "rollback")).status, "OK");
    },
  });
  assert.equal(cycle.kind === "done" && cycle.answer, "CANCELLED");
  assert.deepEqual(
    events.filter((e) => e.kind === "commit-cancelled"),
    [{ kind: "commit-cancelled", processId: cycle.kind === "done" ? cycle.processId : "" }],
  );
  assert.deepEqual(await options.store.unsettled(), []);
  db.close();
  // The operator's verdict queued the message again: take it away with a processor that only counts.
  const { db: other, options: counting } = await processor();
  await runProcessor({ ...counting, untilIdle: true });
  assert.deepEqual(Object.fromEntries(appliedCounts(other)), { overruled: 1 });
  await repliesByNonce();
  other.close();
});

test("runProcessor waits out a server that is down, with growing waits, until stopped", { timeout: 30_000 }, async () => {
  const { db, options } = await processor();
  const stop = new AbortController();
  const clock = new ManualClock();
  const events: ProcessorEvent[] = [];
  await runProcessor({
    ...options,
    client: new EstafetaClient({ baseUrl: await refusedUrl(), token: "t" }),
    clock,
    backoff: { initialMs: 100, maxMs: 1000 },
    signal: stop.signal,
    onEvent: (e) => {
      events.push(e);
      if (events.length === 6) stop.abort();
    },
  });
  assert.ok(events.every((e) => e.kind === "error" && e.error instanceof TransportError));
  assert.equal(clock.sleeps.length, 6);
  assert.ok(clock.sleeps[0]! <= 100 && clock.sleeps[5]! >= 500, `${clock.sleeps}`);
  await assert.rejects(
    runProcessor({ ...options, client: t.databases[0]!.client.withToken("wrong"), untilIdle: true }),
    /unauthorized/,
    "an answer that repeating cannot change ends the loop",
  );
  db.close();
});
