/**
 * The HTTP client against a real server: every call a device and a
 * processor make, the server's error answers as typed errors with its
 * codes, and requests without an answer as transport errors.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer as createTcpServer, type Socket } from "node:net";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import {
  ApiError,
  BadAnswerError,
  ERROR_CODES,
  EstafetaClient,
  TransportError,
  isApiError,
  isTransient,
} from "../src/index.js";
import { refusedUrl } from "./support/closed-port.js";
import { close, listen } from "./support/http.js";
import { TestServer } from "./support/server.js";
import { provision, type Tenancy } from "./support/tenancy.js";

let server: TestServer;
let t: Tenancy;

before(async () => {
  server = await TestServer.start();
  t = await provision(server, ["db-a"], ["phone-1"]);
});

after(async () => {
  await server?.stop();
});

test("a device's upload, a processor's six calls and the inbox, end to end", { timeout: 30_000 }, async () => {
  const phone = t.devices[0]!.client;
  const db = t.databases[0]!.client;

  const first = await phone.send({ to: "db-a", body: { order: 42 }, idempotency_key: "order-42" });
  assert.equal(first.created, true);
  const again = await phone.send({ to: "db-a", body: { order: 42 }, idempotency_key: "order-42" });
  assert.deepEqual(again, { id: first.id, created: false }, "the same key answers the same id, made no second message");

  const started = await db.start({ db_id: "db-a" });
  assert.equal(started.status, "OK");
  const pid = started.process_id!;
  assert.deepEqual(
    started.messages?.map((m) => [m.id, m.from, m.body]),
    [[first.id, "phone-1", { order: 42 }]],
  );
  assert.equal((await db.start({ db_id: "db-a" })).status, "BUSY");
  assert.equal((await db.accept(pid, [first.id])).status, "OK");
  const prepared = await db.prepare(pid, {
    results: [{ message_id: first.id, status: "PROCESSED" }],
    replies: [{ to: "phone-1", body: { order: 42, accepted: true } }],
  });
  assert.equal(prepared.status, "OK");
  assert.equal((await db.process(pid)).state, "READY_TO_COMMIT");
  assert.equal((await db.commit(pid)).status, "OK");
  assert.equal((await db.commit(pid)).status, "OK", "commit of a DONE process answers OK again");
  assert.equal((await db.rollback(pid, "too late")).status, "CANCELLED");
  assert.equal((await db.process(pid)).state, "DONE");
  assert.equal((await db.start({ db_id: "db-a" })).status, "IDLE");

  const inbox = await phone.inbox(10);
  assert.deepEqual(
    inbox.map((m) => [m.from, m.body]),
    [["db-a", { order: 42, accepted: true }]],
  );
  assert.equal(await phone.ack([inbox[0]!.id, "01ARZ3NDEKTSV4RRFFQ69G5FAV"]), 1, "unknown ids are not counted");
  assert.deepEqual(await phone.inbox(), []);

  const admin = t.admin;
  const log = await admin.folder("db-a", "Log");
  assert.equal(log.files.length, 1);
  assert.ok((await admin.processes()).processes.some((p) => p.process_id === pid && p.state === "DONE"));
  const stats = await admin.stats();
  assert.ok(stats.databases.some((d) => d.id === "db-a"));
});

test("a rollback and an abort leave the messages queued", { timeout: 30_000 }, async () => {
  const phone = t.devices[0]!.client;
  const db = t.databases[0]!.client;
  const sent = await phone.send({ to: "db-a", body: { n: 1 } });
  const one = await db.start({ db_id: "db-a", max_files: 1 });
  assert.equal((await db.rollback(one.process_id!, "the transaction failed")).status, "OK");
  const two = await db.start({ db_id: "db-a" });
  assert.deepEqual(two.messages?.map((m) => m.id), [sent.id]);
  assert.equal((await db.abort(two.process_id!, "giving up")).status, "OK");
  assert.equal((await db.process(two.process_id!)).state, "ABORTED");
  const three = await db.start({ db_id: "db-a" });
  assert.equal(
    (
      await db.prepare(three.process_id!, {
        results: [{ message_id: sent.id, status: "PROCESSED" }],
        replies: [],
      })
    ).status,
    "OK",
  );
  assert.equal((await db.commit(three.process_id!)).status, "OK");
});

/** The error `promise` rejects with, which must be an ApiError. */
async function apiError(promise: Promise<unknown>): Promise<ApiError> {
  const err = await promise.then(
    () => assert.fail("expected an error answer"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof ApiError, `not an ApiError: ${String(err)}`);
  return err;
}

test("error answers are ApiErrors with the server's status and code", { timeout: 30_000 }, async () => {
  const phone = t.devices[0]!.client;
  const db = t.databases[0]!.client;

  const unauthorized = await apiError(phone.withToken("no-such-token").inbox());
  assert.equal(unauthorized.status, 401);
  assert.equal(unauthorized.code, "unauthorized");
  assert.equal(unauthorized.knownCode, "unauthorized");

  const forbidden = await apiError(phone.start({ db_id: "db-a" }));
  assert.equal(forbidden.status, 403);
  assert.ok(isApiError(forbidden, "forbidden"));

  const badKey = await apiError(phone.send({ to: "db-a", body: {}, idempotency_key: "k".repeat(201) }));
  assert.deepEqual([badKey.status, badKey.code], [400, "bad_idempotency_key"]);

  const exists = await apiError(t.admin.createEnterprise("acme"));
  assert.deepEqual([exists.status, exists.code], [409, "already_exists"]);

  const unknown = await apiError(db.process("01ARZ3NDEKTSV4RRFFQ69G5FAV"));
  assert.deepEqual([unknown.status, unknown.code], [404, "not_found"]);

  await phone.send({ to: "db-a", body: { n: 2 } });
  const started = await db.start({ db_id: "db-a" });
  const mismatch = await apiError(db.prepare(started.process_id!, { results: [], replies: [] }));
  assert.deepEqual([mismatch.status, mismatch.code], [422, "results_mismatch"]);
  const nobody = await apiError(
    db.prepare(started.process_id!, {
      results: started.messages!.map((m) => ({ message_id: m.id, status: "PROCESSED" as const })),
      replies: [{ to: "no-such-phone", body: {} }],
    }),
  );
  assert.equal(nobody.code, "unknown_recipient");
  assert.equal((await db.abort(started.process_id!, "test over")).status, "OK");

  for (const err of [unauthorized, forbidden, badKey, exists, unknown, mismatch, nobody]) {
    assert.equal(isTransient(err), false, `${err.code} is not transient`);
  }
  assert.equal(isTransient(new ApiError(503, "not_ready", "recovering", 1)), true);
  assert.equal(isTransient(new ApiError(500, "internal", "oops")), true);
});

test("ERROR_CODES are exactly the server's error codes, in its order", () => {
  const source = readFileSync(
    fileURLToPath(new URL("../../../../crates/wire/src/error_code.rs", import.meta.url)),
    "utf8",
  );
  const block = source.slice(source.indexOf("error_codes! {"));
  const codes = [...block.matchAll(/^\s+[A-Z]\w* = "([a-z_]+)",$/gm)].map((m) => m[1]);
  assert.ok(codes.length > 20, "the server's list was found");
  assert.deepEqual([...ERROR_CODES], codes);
});

test("a refused connection and a silent server are TransportErrors", { timeout: 30_000 }, async () => {
  const refused = await new EstafetaClient({ baseUrl: await refusedUrl(), token: "t" })
    .inbox()
    .catch((e: unknown) => e);
  assert.ok(refused instanceof TransportError, String(refused));
  assert.equal(refused.timedOut, false);
  assert.ok(isTransient(refused));

  // A server that accepts connections and never answers.
  const sockets: Socket[] = [];
  const silent = createTcpServer((socket) => sockets.push(socket));
  await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  try {
    const port = (silent.address() as { port: number }).port;
    const hung = await new EstafetaClient({ baseUrl: `http://127.0.0.1:${port}`, token: "t", timeoutMs: 300 })
      .send({ to: "db-a", body: {} })
      .catch((e: unknown) => e);
    assert.ok(hung instanceof TransportError, String(hung));
    assert.equal(hung.timedOut, true);
  } finally {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => silent.close(() => resolve()));
  }
});

test("a success answer that is not JSON is a BadAnswerError; a foreign error page keeps its status", async () => {
  const pages = createHttpServer((req, res) => {
    if (req.url === "/v1/inbox") {
      res.writeHead(200, { "content-type": "text/html" }).end("<html>captive portal</html>");
    } else {
      res.writeHead(502, { "content-type": "text/html" }).end("<html>bad gateway</html>");
    }
  });
  const base = await listen(pages);
  try {
    const client = new EstafetaClient({ baseUrl: `${base}/`, token: "t" });
    assert.equal(client.baseUrl, base);
    const bad = await client.inbox().catch((e: unknown) => e);
    assert.ok(bad instanceof BadAnswerError, String(bad));
    const gateway = await apiError(client.ack(["x"]));
    assert.deepEqual([gateway.status, gateway.code, gateway.knownCode], [502, "http_502", undefined]);
    assert.match(gateway.serverMessage, /bad gateway/);
    assert.ok(isTransient(gateway));
  } finally {
    await close(pages);
  }
});

test("a base URL that is not http(s) is refused at construction", () => {
  assert.throws(() => new EstafetaClient({ baseUrl: "not a url", token: "t" }), TypeError);
  assert.throws(() => new EstafetaClient({ baseUrl: "ftp://host", token: "t" }), TypeError);
});
