/**
 * A processor killed with SIGKILL at the moments that decide exactly-once:
 * with the answer to `prepare` arrived but unseen (local transaction open),
 * between its local commit and `commit`, with the answer to `commit`
 * arrived but unseen, and after `prepare` and after the local commit with
 * the server putting the process in doubt before the processor comes back.
 * Each restart settles the previous process from the processor's own
 * database (rollback, commit, commit again, late rollback and late commit
 * of a process in doubt), which the server's record of each process shows.
 *
 * The oracle counts by the nonce in each body, from what the devices sent,
 * what the processor's SQLite database applied, and the replies the device
 * received: lost = 0, duplicated = 0.
 */

import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { SqliteProcessorStore, inbox } from "../src/index.js";
import { Child } from "./support/children.js";
import { appliedCounts, assertExactlyOnce, messagesAppliedTwice, nonceOf, openLedger } from "./support/ledger.js";
import { TestServer } from "./support/server.js";
import { provision } from "./support/tenancy.js";
import { waitFor } from "./support/wait.js";

const MESSAGES = 30;

test("a processor killed around prepare and commit applies every message exactly once", { timeout: 120_000 }, async () => {
  // Short, so that the test can wait for a process to go in doubt.
  const server = await TestServer.start({ ESTAFETA_READY_TIMEOUT: "1s" });
  const scratch = await mkdtemp(join(tmpdir(), "estafeta-processor-crash-"));
  try {
    const t = await provision(server, ["db-a"], ["phone-1"]);
    const phone = t.devices[0]!.client;
    const db = t.databases[0]!.client;
    const sent: string[] = [];
    for (let i = 0; i < MESSAGES; i++) {
      const nonce = `p-${i}`;
      await phone.send({ to: "db-a", body: { nonce }, idempotency_key: nonce });
      sent.push(nonce);
    }

    const ledgerPath = join(scratch, "ledger.db");
    const run = (dieAt?: string): Child =>
      new Child("processor", [
        "--url", server.url, "--token", t.databases[0]!.token, "--db-id", "db-a", "--ledger", ledgerPath,
        "--max-files", "5", ...(dieAt ? ["--die-at", dieAt] : []),
      ]);
    /** Runs a processor until it stops at `point`, kills it; the process id it was in. */
    const dies = async (point: string): Promise<{ child: Child; pid: string }> => {
      const child = run(point);
      const [, pid] = await child.line(new RegExp(`^dying-at ${point} (\\S+)$`));
      await child.kill9();
      return { child, pid: pid! };
    };
    const state = async (pid: string): Promise<string> => (await db.process(pid)).state;
    const inDoubt = (pid: string): Promise<boolean> =>
      waitFor(`process ${pid} in doubt`, async () => ((await state(pid)) === "IN_DOUBT" ? true : undefined));

    // 1. The answer to prepare arrived, unseen: READY_TO_COMMIT on the
    //    server, the local transaction never committed.
    const one = await dies("prepare-answer");
    assert.match(await state(one.pid), /^(READY_TO_COMMIT|IN_DOUBT)$/);

    // 2. Settles 1 with a rollback; dies between its local commit and commit.
    const two = await dies("committed-locally");
    assert.ok(two.child.lines.includes(`resumed ${one.pid} false OK`), two.child.lines.join("\n"));
    assert.equal(await state(one.pid), "ROLLED_BACK");

    // 3. Settles 2 with a commit; dies with commit's answer unseen.
    const three = await dies("commit-answer");
    assert.ok(three.child.lines.includes(`resumed ${two.pid} true OK`), three.child.lines.join("\n"));
    assert.equal(await state(two.pid), "DONE");
    assert.equal(await state(three.pid), "DONE", "the server committed; the processor does not know");

    // 4. Commits 3 again (OK); dies after prepare, and the process goes in doubt.
    const four = await dies("prepared");
    assert.ok(four.child.lines.includes(`resumed ${three.pid} true OK`), four.child.lines.join("\n"));
    await inDoubt(four.pid);

    // 5. Rolls back 4 though in doubt; dies after its local commit, and 5 goes in doubt.
    const five = await dies("committed-locally");
    assert.ok(five.child.lines.includes(`resumed ${four.pid} false OK`), five.child.lines.join("\n"));
    assert.equal(await state(four.pid), "ROLLED_BACK");
    await inDoubt(five.pid);

    // 6. Commits 5 late, then works until nothing waits.
    const six = run();
    await six.line(/^idle$/);
    await six.succeeds();
    assert.ok(six.lines.includes(`resumed ${five.pid} true OK`), six.lines.join("\n"));
    assert.equal(await state(five.pid), "DONE");

    // The oracle, from the processor's own database and the device's inbox.
    const ledger = openLedger(ledgerPath);
    assertExactlyOnce(sent, appliedCounts(ledger), "the processor's database");
    assert.equal(messagesAppliedTwice(ledger), 0);
    assert.deepEqual(await (await SqliteProcessorStore.open(ledger)).unsettled(), [], "nothing left to settle");
    ledger.close();
    const replies = new Map<string, number>();
    await inbox(phone, (m) => void replies.set(nonceOf(m), (replies.get(nonceOf(m)) ?? 0) + 1));
    assertExactlyOnce(sent, replies, "the replies the device received");
    for (const folder of ["Unknown", "Prepared", "Messages"] as const) {
      assert.deepEqual((await t.admin.folder("db-a", folder)).files, [], `db-a's ${folder} is empty`);
    }
  } finally {
    await server.stop();
    await rm(scratch, { recursive: true, force: true });
  }
});
