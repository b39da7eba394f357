/**
 * `inbox()` against a real server: a message is acknowledged only once
 * the app's handler for it resolved, and one whose acknowledgement was
 * lost comes again; and the push webhook's notification, as the server
 * really sends it, parses into its type.
 */

import assert from "node:assert/strict";
import { createServer, type IncomingMessage } from "node:http";
import { after, before, test } from "node:test";
import {
  BadAnswerError,
  EstafetaClient,
  TransportError,
  inbox,
  parsePushNotification,
  type FetchLike,
  type Message,
} from "../src/index.js";
import { close, listen } from "./support/http.js";
import { TestServer } from "./support/server.js";
import { provision, type Tenancy } from "./support/tenancy.js";
import { waitFor } from "./support/wait.js";

let server: TestServer;
let t: Tenancy;

before(async () => {
  server = await TestServer.start();
  t = await provision(server, ["db-a"], ["phone-1", "phone-2"]);
});

after(async () => {
  await server?.stop();
});

/** Puts replies with `nonces` into `device`'s inbox through one process of db-a. */
async function replies(device: string, nonces: string[]): Promise<void> {
  const phone = t.devices.find((d) => d.id === device)!.client;
  await phone.send({ to: "db-a", body: { ask: nonces } });
  const db = t.databases[0]!.client;
  const started = await db.start({ db_id: "db-a" });
  const pid = started.process_id!;
  const results = started.messages!.map((m) => ({ message_id: m.id, status: "PROCESSED" as const }));
  const prepared = await db.prepare(pid, {
    results,
    replies: nonces.map((nonce) => ({ to: device, body: { nonce } })),
  });
  assert.equal(prepared.status, "OK");
  assert.equal((await db.commit(pid)).status, "OK");
}

const nonce = (m: Message): string => (m.body as { nonce: string }).nonce;

test("inbox() acknowledges only the messages whose handler resolved", { timeout: 30_000 }, async () => {
  await replies("phone-1", ["r0", "r1", "r2", "r3", "r4"]);
  const phone = t.devices[0]!.client;
  const stored: string[] = [];
  const failing = inbox(phone, (m) => {
    if (nonce(m) === "r2") throw new Error("the app's disk is full");
    stored.push(nonce(m));
  });
  await assert.rejects(failing, /the app's disk is full/);
  assert.deepEqual(stored, ["r0", "r1"]);
  assert.deepEqual(
    (await phone.inbox()).map(nonce),
    ["r2", "r3", "r4"],
    "the failed message and those after it wait",
  );

  const handled = await inbox(phone, async (m) => {
    stored.push(nonce(m));
  });
  assert.equal(handled, 3);
  assert.deepEqual(stored, ["r0", "r1", "r2", "r3", "r4"], "each message handled once, in order");
  assert.deepEqual(await phone.inbox(), []);
});

test("inbox() reads page after page", { timeout: 30_000 }, async () => {
  await replies("phone-2", ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
  const seen: string[] = [];
  const handled = await inbox(t.devices[1]!.client, (m) => void seen.push(nonce(m)), { limit: 3 });
  assert.equal(handled, 7);
  assert.deepEqual(seen, ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]);
});

test("a message whose acknowledgement was lost comes again", { timeout: 30_000 }, async () => {
  await replies("phone-1", ["lost-ack"]);
  const device = t.devices[0]!;
  const noAck: FetchLike = (url, request) =>
    url.endsWith("/v1/inbox/ack")
      ? Promise.reject(new Error("network down"))
      : fetch(url, request as RequestInit);
  const offline = new EstafetaClient({ baseUrl: server.url, token: device.token, fetch: noAck });
  const stored = new Map<string, string>();
  const store = (m: Message): void => void stored.set(m.id, nonce(m));
  await assert.rejects(inbox(offline, store), TransportError);
  assert.equal(stored.size, 1);
  assert.equal(await inbox(device.client, store), 1, "handed over again");
  assert.deepEqual([...stored.values()], ["lost-ack"], "an idempotent handler keeps it once");
  assert.deepEqual(await device.client.inbox(), []);
});

test("the push webhook's notification parses into PushNotification", { timeout: 30_000 }, async () => {
  const received: Array<{ path: string; json: unknown }> = [];
  const hooks = createServer((req: IncomingMessage, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (chunk: string) => (body += chunk));
    req.on("end", () => {
      if (req.method === "POST") received.push({ path: req.url ?? "", json: JSON.parse(body) });
      res.writeHead(200).end();
    });
  });
  const base = await listen(hooks);
  try {
    assert.equal((await t.admin.setWebhook("database", "db-a", `${base}/db`)).url, `${base}/db`);
    await t.admin.setWebhook("device", "phone-2", `${base}/phone`);
    await replies("phone-2", ["pushed"]);

    const forDb = await waitFor("the database's push", () => received.find((r) => r.path === "/db"));
    const forPhone = await waitFor("the device's push", () => received.find((r) => r.path === "/phone"));
    const db = parsePushNotification(forDb.json);
    assert.deepEqual([db.event, db.recipient, db.kind], ["messages_waiting", "db-a", "database"]);
    const phone = parsePushNotification(forPhone.json);
    assert.deepEqual([phone.recipient, phone.kind], ["phone-2", "device"]);
    assert.ok(Date.parse(phone.at) > 0);
    assert.equal(await inbox(t.devices[1]!.client, () => undefined), 1);
  } finally {
    await t.admin.setWebhook("database", "db-a", null);
    await t.admin.setWebhook("device", "phone-2", null);
    await close(hooks);
  }

  for (const bad of [null, { version: 2 }, { version: 1, event: "other" }, { version: 1, event: "messages_waiting", recipient: "x", kind: "db", at: "now" }]) {
    assert.throws(() => parsePushNotification(bad), BadAnswerError);
  }
});
