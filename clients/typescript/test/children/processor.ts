/**
 * A processor as a child process, for the crash tests: the tests' ledger
 * (`--ledger`, SQLite) under `runProcessor` until IDLE. With `--die-at` it
 * stops for good at one point of its first process: after a step
 * (`prepared`, `committed-locally`, …), or when the answer to `prepare` or
 * `commit` has arrived but before the loop sees it (`prepare-answer`,
 * `commit-answer`). It reports on stdout: `resumed <pid> <committed>
 * <answer>` for each process settled at a cycle's start, `cycle <kind>`,
 * `dying-at <point> <pid>`, `idle`.
 */

import { EstafetaClient, SqliteProcessorStore, runProcessor, type FetchLike } from "../../src/index.js";
import { applyMessages, openLedger } from "../support/ledger.js";
import { arg, hangUntilKilled } from "./args.js";

const say = (line: string): void => void process.stdout.write(`${line}\n`);
const dieAt = arg("die-at", "");
/** The process this run started: the die points are in it, not in the settling of earlier ones. */
let own: string | undefined;

const losing: FetchLike = async (url, request) => {
  const response = await fetch(url, request as RequestInit);
  const point = /\/v1\/processes\/([^/]+)\/(prepare|commit)$/.exec(url);
  if (point && point[1] === own && dieAt === `${point[2]}-answer`) {
    await response.text();
    say(`dying-at ${dieAt} ${point[1]}`);
    await hangUntilKilled();
  }
  return response;
};

const db = openLedger(arg("ledger"));
await runProcessor({
  client: new EstafetaClient({ baseUrl: arg("url"), token: arg("token"), timeoutMs: 5000, fetch: losing }),
  dbId: arg("db-id"),
  store: await SqliteProcessorStore.open(db),
  maxFiles: Number(arg("max-files", "5")),
  apply: async (messages, tx) => applyMessages(messages, tx),
  untilIdle: true,
  backoff: { initialMs: 50, maxMs: 500 },
  onStep: async (step, pid) => {
    if (step === "started") own = pid;
    if (step === dieAt) {
      say(`dying-at ${step} ${pid}`);
      await hangUntilKilled();
    }
  },
  onEvent: (event) => {
    if (event.kind === "resumed") say(`resumed ${event.processId} ${event.committed} ${event.answer}`);
  },
  onCycle: (cycle) => say(`cycle ${cycle.kind}`),
});
db.close();
say("idle");
