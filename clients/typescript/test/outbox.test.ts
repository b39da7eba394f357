/**
 * The outbox against a real server: durable `send()`, order, visible
 * states and depth, the bound, the age limit, attempts that count only
 * answers, failures that stay visible, and restart after a send cut short.
 * Waits run on a {@link ManualClock}, so no test sleeps.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import {
  ApiError,
  AsyncStorageOutboxStore,
  EstafetaClient,
  KEY_LIFETIME_MS,
  MemoryOutboxStore,
  Outbox,
  OutboxFullError,
  OutboxStoreError,
  parseEntry,
  type AsyncStorageLike,
  type FetchLike,
  type OutboxEntry,
  type OutboxOptions,
} from "../src/index.js";
import { FileOutboxStore } from "../src/node/index.js";
import { refusedUrl } from "./support/closed-port.js";
import { close, listen } from "./support/http.js";
import { ManualClock } from "./support/manual-clock.js";
import { receiveAll } from "./support/receive.js";
import { TestServer } from "./support/server.js";
import { provision, type Tenancy } from "./support/tenancy.js";
import { waitFor } from "./support/wait.js";

let server: TestServer;
let t: Tenancy;
let scratch: string;

before(async () => {
  server = await TestServer.start();
  t = await provision(server, ["db-a", "db-b"], ["phone-1", "phone-2"]);
  scratch = await mkdtemp(join(tmpdir(), "estafeta-outbox-test-"));
});

after(async () => {
  await server?.stop();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

function open(options: Partial<OutboxOptions> = {}): Promise<Outbox> {
  return Outbox.open({
    client: t.devices[0]!.client,
    store: new MemoryOutboxStore(),
    clock: new ManualClock(),
    ...options,
  });
}

test("send() queues in order; the sender uploads one at a time with every state visible", { timeout: 30_000 }, async () => {
  const changes: Array<[number, string]> = [];
  const outbox = await open({ onChange: (e) => changes.push([e.seq, e.state]) });
  const made: OutboxEntry[] = [];
  for (let i = 0; i < 5; i++) made.push(await outbox.send("db-a", { nonce: `order-${i}` }));
  assert.deepEqual(
    made.map((e) => [e.seq, e.state]),
    [1, 2, 3, 4, 5].map((seq) => [seq, "queued"]),
  );
  assert.equal(outbox.depth(), 5);
  assert.equal(new Set(made.map((e) => e.idempotencyKey)).size, 5, "each message has its own key");

  await outbox.drain();
  assert.equal(outbox.depth(), 0);
  assert.deepEqual(outbox.count(), { queued: 0, sending: 0, sent: 5, failed: 0 });
  const uploads = changes.filter(([, state]) => state !== "queued");
  assert.deepEqual(
    uploads,
    [1, 2, 3, 4, 5].flatMap((seq) => [
      [seq, "sending"],
      [seq, "sent"],
    ]),
    "one request at a time, in send() order",
  );

  const received = await receiveAll(t.databases[0]!.client, "db-a");
  assert.deepEqual(
    received.map((m) => (m.body as { nonce: string }).nonce),
    made.map((e) => (e.body as { nonce: string }).nonce),
  );
  assert.deepEqual(
    received.map((m) => m.id),
    outbox.entries().map((e) => e.messageId),
    "each entry shows the server's id of its message",
  );
  assert.deepEqual(
    received.map((m) => m.created_at),
    made.map((e) => e.createdAt),
    "the message carries the time send() made it",
  );
});

test("a full outbox refuses send() with OutboxFullError and keeps what it had", { timeout: 30_000 }, async () => {
  const outbox = await open({ maxEntries: 3 });
  for (let i = 0; i < 3; i++) await outbox.send("db-a", { nonce: `full-${i}` });
  const refused = await outbox.send("db-a", { nonce: "full-3" }).catch((e: unknown) => e);
  assert.ok(refused instanceof OutboxFullError, String(refused));
  assert.deepEqual([refused.held, refused.limit], [3, 3]);
  assert.match(refused.message, /outbox full/);
  assert.equal(outbox.entries().length, 3);
  await outbox.drain();
  await outbox.send("db-a", { nonce: "full-3" });
  await outbox.drain();
  assert.equal((await receiveAll(t.databases[0]!.client, "db-a")).length, 4);
});

test("network failures are retried with growing waits and never count as attempts; the age limit fails visibly", { timeout: 30_000 }, async () => {
  const clock = new ManualClock();
  const outbox = await open({
    client: new EstafetaClient({ baseUrl: await refusedUrl(), token: t.devices[0]!.token }),
    clock,
    maxAgeMs: 60_000,
    backoff: { initialMs: 1000, maxMs: 8000 },
  });
  await outbox.send("db-a", { nonce: "offline-0" });
  await outbox.send("db-a", { nonce: "offline-1" });
  await outbox.drain();

  const [first, second] = outbox.entries();
  assert.equal(first!.state, "failed");
  assert.equal(first!.failure?.reason, "expired");
  assert.match(first!.failure!.message, /may have reached it/);
  assert.equal(first!.attempts, 0, "no answer, no attempt");
  assert.ok(first!.unanswered >= 5, `tried ${first!.unanswered} times`);
  assert.equal(second!.state, "failed", "the next message is as old: it expires too, visibly");
  assert.equal(second!.failure?.reason, "expired");
  assert.equal(second!.unanswered, 0, "its age was checked before any try");
  assert.equal(outbox.depth(), 0);

  assert.ok(clock.sleeps.every((ms) => ms >= 500 && ms <= 8000), `waits ${clock.sleeps}`);
  assert.ok(clock.sleeps[0]! <= 1000 && clock.sleeps.at(-1)! >= 4000, `waits grow: ${clock.sleeps}`);
});

test("a message older than the age limit is never sent: it fails as expired", { timeout: 30_000 }, async () => {
  const clock = new ManualClock();
  const outbox = await open({ clock, maxAgeMs: 1000, client: t.devices[1]!.client });
  await outbox.send("db-b", { nonce: "stale" });
  clock.advance(1000);
  await outbox.drain();
  assert.equal(outbox.entries()[0]!.failure?.reason, "expired");
  assert.deepEqual(await receiveAll(t.databases[1]!.client, "db-b"), []);
  await assert.rejects(
    Outbox.open({ client: t.devices[0]!.client, store: new MemoryOutboxStore(), maxAgeMs: 8 * 86_400_000 }),
    /over the server's idempotency key lifetime/,
  );
});

test("the age limit's ceiling is the server's idempotency key lifetime", () => {
  const config = readFileSync(
    fileURLToPath(new URL("../../../../crates/exchange/src/service/config.rs", import.meta.url)),
    "utf8",
  );
  const seconds = /idempotency_ttl: Duration::from_secs\(([\d\s*]+)\)/.exec(config);
  assert.ok(seconds, "the server's default was found");
  const product = seconds[1]!.split("*").reduce((acc, factor) => acc * Number(factor.trim()), 1);
  assert.equal(KEY_LIFETIME_MS, product * 1000);
});

test("a rejected message fails with the server's code and the next one goes on; retry() and remove()", { timeout: 30_000 }, async () => {
  const outbox = await open();
  const bad = await outbox.send("not-our-db", { nonce: "rejected" });
  const good = await outbox.send("db-a", { nonce: "after-rejected" });
  await outbox.drain();
  const failed = outbox.entry(bad.seq)!;
  assert.equal(failed.state, "failed");
  assert.deepEqual(
    [failed.failure?.reason, failed.failure?.status, failed.failure?.code, failed.attempts],
    ["rejected", 403, "forbidden", 1],
  );
  assert.equal(outbox.entry(good.seq)!.state, "sent");
  assert.deepEqual(
    (await receiveAll(t.databases[0]!.client, "db-a")).map((m) => (m.body as { nonce: string }).nonce),
    ["after-rejected"],
  );

  await outbox.retry(bad.seq);
  assert.equal(outbox.entry(bad.seq)!.state, "queued");
  await outbox.drain();
  assert.equal(outbox.entry(bad.seq)!.state, "failed", "refused again");
  await assert.rejects(outbox.retry(good.seq), RangeError, "only failed messages are retried");
  await outbox.remove(bad.seq);
  assert.equal(outbox.entry(bad.seq), undefined);
});

test("503 answers count as attempts, honour Retry-After, and end failed after maxAttempts", { timeout: 30_000 }, async () => {
  let requests = 0;
  const recovering = createServer((_req, res) => {
    requests += 1;
    res
      .writeHead(503, { "content-type": "application/json", "retry-after": "7" })
      .end(JSON.stringify({ version: 1, error: { code: "not_ready", message: "recovering" } }));
  });
  const base = await listen(recovering);
  try {
    const clock = new ManualClock();
    const outbox = await open({
      client: new EstafetaClient({ baseUrl: base, token: "t" }),
      clock,
      maxAttempts: 3,
      backoff: { initialMs: 100, maxMs: 1000 },
    });
    await outbox.send("db-a", { nonce: "busy-server" });
    await outbox.drain();
    const entry = outbox.entries()[0]!;
    assert.deepEqual(
      [entry.state, entry.failure?.reason, entry.failure?.code, entry.attempts, requests],
      ["failed", "attempts", "not_ready", 3, 3],
    );
    assert.deepEqual(clock.sleeps, [7000, 7000], "Retry-After is longer than the backoff: it wins");
  } finally {
    await close(recovering);
  }
});

test("a 401 stops the sender without failing the message", { timeout: 30_000 }, async () => {
  const outbox = await open({ client: t.devices[0]!.client.withToken("revoked-token") });
  await outbox.send("db-a", { nonce: "unauthorized" });
  const err = await outbox.drain().catch((e: unknown) => e);
  assert.ok(err instanceof ApiError && err.status === 401, String(err));
  const entry = outbox.entries()[0]!;
  assert.deepEqual([entry.state, entry.attempts], ["queued", 1]);
});

test("an entry caught mid-send goes back to queued at start and its retry makes no second message", { timeout: 30_000 }, async () => {
  const dir = join(scratch, "mid-send");
  let release: (() => void) | undefined;
  const held = new Promise<void>((resolve) => (release = resolve));
  // The request reaches the server; its answer never reaches the outbox.
  const answerLost: FetchLike = async (url, request) => {
    await (await fetch(url, request as RequestInit)).text();
    await held;
    throw new Error("the app was killed");
  };
  const device = t.devices[0]!;
  const first = await Outbox.open({
    client: new EstafetaClient({ baseUrl: server.url, token: device.token, fetch: answerLost }),
    store: await FileOutboxStore.open(dir),
  });
  const entry = await first.send("db-a", { nonce: "mid-send" });
  const killed = new AbortController();
  const stuck = first.drain(killed.signal);
  const onDisk = await waitForState(dir, entry.seq, "sending");
  assert.equal(onDisk.idempotencyKey, entry.idempotencyKey);

  // The app starts again on the same folder.
  const answers: number[] = [];
  const observing: FetchLike = async (url, request) => {
    const response = await fetch(url, request as RequestInit);
    answers.push(response.status);
    return response;
  };
  const second = await Outbox.open({
    client: new EstafetaClient({ baseUrl: server.url, token: device.token, fetch: observing }),
    store: await FileOutboxStore.open(dir),
  });
  assert.equal(second.recovered, 1);
  assert.equal(second.entry(entry.seq)!.state, "queued");
  await second.drain();
  assert.deepEqual(answers, [200], "the server knew the key: the same message, no second one");
  const received = await receiveAll(t.databases[0]!.client, "db-a");
  assert.deepEqual(
    received.map((m) => [m.id, (m.body as { nonce: string }).nonce]),
    [[second.entry(entry.seq)!.messageId, "mid-send"]],
  );

  killed.abort();
  release!();
  await stuck.catch(() => undefined);
});

/** The entry `seq` as its file in `dir` holds it, once it is in `state` (bounded). */
async function waitForState(dir: string, seq: number, state: string): Promise<OutboxEntry> {
  const path = join(dir, `${String(seq).padStart(12, "0")}.json`);
  for (let i = 0; i < 400; i++) {
    const found = await readFile(path, "utf8").then(
      (text) => parseEntry(text, path),
      () => undefined,
    );
    if (found?.state === state) return found;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`entry ${seq} never became ${state} on disk`);
}

test("the file store survives a reopen, keeps the newest sent entries, and names a damaged file", { timeout: 30_000 }, async () => {
  const dir = join(scratch, "file-store");
  const outbox = await open({ store: await FileOutboxStore.open(dir), keepSent: 2 });
  for (let i = 0; i < 4; i++) await outbox.send("db-a", { nonce: `kept-${i}` });
  await outbox.drain();
  assert.deepEqual(
    outbox.entries().map((e) => [e.seq, e.state]),
    [
      [3, "sent"],
      [4, "sent"],
    ],
  );
  const reopened = await open({ store: await FileOutboxStore.open(dir) });
  assert.deepEqual(reopened.entries(), outbox.entries());
  const next = await reopened.send("db-a", { nonce: "kept-4" });
  assert.equal(next.seq, 5, "numbers go on after a reopen");
  await reopened.drain();
  assert.equal((await receiveAll(t.databases[0]!.client, "db-a")).length, 5);

  await writeFile(join(dir, "000000000009.json.tmp"), "{half a wri");
  await writeFile(join(dir, "000000000007.json"), "{damaged");
  const err = await (await FileOutboxStore.open(dir)).load().catch((e: unknown) => e);
  assert.ok(err instanceof OutboxStoreError, String(err));
  assert.match(err.message, /000000000007\.json: not JSON/);
  assert.ok(!(await readdir(dir)).includes("000000000009.json.tmp"), "a save cut short is cleared");
});

test("send() rejects when the store cannot write, and keeps nothing", { timeout: 30_000 }, async () => {
  const dir = join(scratch, "gone");
  const store = await FileOutboxStore.open(dir);
  const outbox = await open({ store });
  await rm(dir, { recursive: true });
  const err = await outbox.send("db-a", { nonce: "nowhere" }).catch((e: unknown) => e);
  assert.ok(err instanceof OutboxStoreError, String(err));
  assert.deepEqual(outbox.entries(), []);
  assert.equal(outbox.depth(), 0);
});

test("the AsyncStorage store keeps entries under its prefix across a restart", { timeout: 30_000 }, async () => {
  // React Native cannot run here: AsyncStorage's interface over a Map.
  const items = new Map<string, string>([["app-setting", "x"]]);
  const storage: AsyncStorageLike = {
    getItem: async (k) => items.get(k) ?? null,
    setItem: async (k, v) => void items.set(k, v),
    removeItem: async (k) => void items.delete(k),
    getAllKeys: async () => [...items.keys()],
  };
  const device = t.devices[1]!.client;
  const first = await open({ client: device, store: new AsyncStorageOutboxStore(storage) });
  await first.send("db-b", { nonce: "rn-0" });
  await first.send("db-b", { nonce: "rn-1" });
  assert.deepEqual([...items.keys()].sort(), ["app-setting", "estafeta-outbox:1", "estafeta-outbox:2"]);
  const second = await open({ client: device, store: new AsyncStorageOutboxStore(storage) });
  assert.equal(second.depth(), 2);
  await second.drain();
  assert.deepEqual(
    (await receiveAll(t.databases[1]!.client, "db-b")).map((m) => (m.body as { nonce: string }).nonce),
    ["rn-0", "rn-1"],
  );
  assert.equal(items.get("app-setting"), "x");
});

test("the background sender sends what send() adds and stops when asked", { timeout: 30_000 }, async () => {
  const outbox = await Outbox.open({ client: t.devices[0]!.client, store: new MemoryOutboxStore() });
  outbox.start();
  for (let i = 0; i < 3; i++) await outbox.send("db-a", { nonce: `bg-${i}` });
  await waitFor("the background sender to send three messages", () => (outbox.count().sent === 3 ? true : undefined));
  await outbox.stop();
  await outbox.send("db-a", { nonce: "after-stop" });
  assert.equal(outbox.depth(), 1, "a stopped sender sends nothing");
  assert.equal((await receiveAll(t.databases[0]!.client, "db-a")).length, 3);
});
