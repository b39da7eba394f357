/**
 * A device's outbox on disk across a real app process killed with SIGKILL
 * (once right after an upload's answer arrived and before the outbox saw
 * it, once at a random point of its draining) and started again, and across
 * the server killed with SIGKILL and restarted while the outbox drains.
 *
 * The oracle counts by the nonce in each body, from what the device queued
 * and what a processor's own database applied afterwards: lost = 0,
 * duplicated = 0.
 */

import assert from "node:assert/strict";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { SqliteProcessorStore, parseEntry, runProcessor } from "../src/index.js";
import { Child } from "./support/children.js";
import { appliedCounts, applyMessages, assertExactlyOnce, messagesAppliedTwice, openLedger } from "./support/ledger.js";
import { TestServer } from "./support/server.js";
import { provision } from "./support/tenancy.js";
import { waitFor } from "./support/wait.js";

const MESSAGES = 60;

test("uploads survive the app and the server killed mid-drain: none lost, none twice", { timeout: 120_000 }, async () => {
  const server = await TestServer.start();
  const scratch = await mkdtemp(join(tmpdir(), "estafeta-device-crash-"));
  try {
    const t = await provision(server, ["db-a"], ["phone-1"]);
    const outboxDir = join(scratch, "outbox");
    const device = (extra: string[]): Child =>
      new Child("device", [
        "--url", server.url, "--token", t.devices[0]!.token, "--dir", outboxDir, "--to", "db-a", "--pace-ms", "10",
        ...extra,
      ]);

    // 1. The app queues everything, then dies just after the 10th upload's
    //    answer arrived: the server has that message, the outbox says sending.
    const first = device(["--enqueue", String(MESSAGES), "--prefix", "n", "--lose-answer-after", "10"]);
    await first.line(/^queued-all$/);
    await first.line(/^answer-lost$/);
    await first.kill9();
    const queued = first.lines.filter((l) => l.startsWith("queued n-")).map((l) => l.slice("queued ".length));
    assert.equal(queued.length, MESSAGES);
    assert.equal(first.count(/^sent /), 9);

    // 2. Started again: the message caught mid-send is queued again, and its
    //    retry is recognised (200). Killed again at some point of the drain.
    const second = device([]);
    await second.line(/^recovered 1$/);
    await second.line(/^answer 200$/);
    await waitFor("15 uploads of the second run", () => (second.count(/^sent /) >= 15 ? true : undefined));
    await second.kill9();
    assert.equal(second.count(/^drained$/), 0, "killed mid-drain");

    // 3. Started once more; the server is killed while it drains, and restarted.
    const third = device([]);
    await waitFor("5 uploads of the third run", () => (third.count(/^sent /) >= 5 ? true : undefined));
    await server.kill9();
    const sentBeforeRestart = third.count(/^sent /);
    await server.restart();
    await third.line(/^drained$/, 60_000);
    await third.succeeds();
    assert.ok(third.count(/^sent /) > sentBeforeRestart, "the server died with messages still queued");

    // The outbox holds no message that is not sent.
    for (const name of await readdir(outboxDir)) {
      const entry = parseEntry(await readFile(join(outboxDir, name), "utf8"), name);
      assert.equal(entry.state, "sent", `${name} is ${entry.state}`);
    }

    // The oracle: a processor applies what the server holds, and counts.
    const ledger = openLedger(join(scratch, "ledger.db"));
    await runProcessor({
      client: t.databases[0]!.client,
      dbId: "db-a",
      store: await SqliteProcessorStore.open(ledger),
      apply: async (messages, tx) => applyMessages(messages, tx),
      untilIdle: true,
    });
    assertExactlyOnce(queued, appliedCounts(ledger), "the processor's database");
    assert.equal(messagesAppliedTwice(ledger), 0);
    ledger.close();
  } finally {
    await server.stop();
    await rm(scratch, { recursive: true, force: true });
  }
});

