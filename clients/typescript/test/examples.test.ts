/**
 * The README's two examples are the files in examples/ (compiled with the
 * tests, so they type-check), and they work: a device places orders
 * through its outbox, the orders processor applies them in SQLite and
 * replies, and the device's inbox saves the replies.
 */

import assert from "node:assert/strict";
import { readFile, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import nodeSqlite from "node-sqlite3-wasm";
import { FileOutboxStore } from "../src/node/index.js";
import { startDevice } from "../examples/mobile.js";
import { runOrders } from "../examples/processor.js";
import { TestServer } from "./support/server.js";
import { provision } from "./support/tenancy.js";
import { waitFor } from "./support/wait.js";

const packageDir = fileURLToPath(new URL("../..", import.meta.url));

test("the README shows the example files as they are", async () => {
  const readme = await readFile(join(packageDir, "README.md"), "utf8");
  for (const name of ["mobile.ts", "processor.ts"]) {
    const source = (await readFile(join(packageDir, "examples", name), "utf8"))
      .split('"../src/index.js"')
      .join('"estafeta-client"')
      .split('"../src/node/index.js"')
      .join('"estafeta-client/node"');
    assert.ok(readme.includes(source), `README.md shows examples/${name}`);
  }
});

test("the examples work together against a real server", { timeout: 60_000 }, async () => {
  const server = await TestServer.start();
  const scratch = await mkdtemp(join(tmpdir(), "estafeta-examples-"));
  const stop = new AbortController();
  try {
    const t = await provision(server, ["db-a"], ["phone-1"]);
    const replies = new Map<string, unknown>();
    const device = await startDevice({
      baseUrl: server.url,
      token: t.devices[0]!.token,
      store: await FileOutboxStore.open(join(scratch, "outbox")),
      saveReply: async (m) => void replies.set(m.id, m.body),
    });
    for (let i = 0; i < 3; i++) await device.placeOrder({ id: `order-${i}`, items: [`item-${i}`] });
    await waitFor("the outbox to send the orders", () =>
      device.orders().every((o) => o.state === "sent") ? true : undefined,
    );

    const path = join(scratch, "orders.db");
    const processor = runOrders({ baseUrl: server.url, token: t.databases[0]!.token, path, signal: stop.signal });
    await waitFor("the replies", async () => {
      await device.refresh();
      return replies.size === 3 ? true : undefined;
    });
    stop.abort();
    await processor;
    await device.stop();

    assert.deepEqual(
      [...replies.values()].map((b) => JSON.stringify(b)).sort(),
      [0, 1, 2].map((i) => JSON.stringify({ order: `order-${i}`, accepted: true })),
    );
    const db = new nodeSqlite.Database(path);
    assert.deepEqual(
      db.all("SELECT id, items FROM orders ORDER BY id"),
      [0, 1, 2].map((i) => ({ id: `order-${i}`, items: JSON.stringify([`item-${i}`]) })),
    );
    db.close();
  } finally {
    stop.abort();
    await server.stop();
    await rm(scratch, { recursive: true, force: true });
  }
});
