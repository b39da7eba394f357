/**
 * {@link processOnce} and {@link runProcessor}: a database's processor
 * loop that applies each message exactly once in the processor's own
 * database, across lost answers, crashes and restarts.
 *
 * One cycle:
 * 1. settle: every process the processor's database still knows is told
 *    its outcome: `commit` when its transaction committed, `rollback` when
 *    it did not (a crash, a lost answer). The server honours both also for
 *    a process in doubt, so doubts end here without an operator;
 * 2. `start`: IDLE or BUSY end the cycle (the loop backs off);
 * 3. the process id is recorded durably on its own ({@link ProcessorStore.recordStarted}),
 *    so a process lost track of is rolled back on the server, not left to
 *    its timeout;
 * 4. `accept` when the optional `select` keeps only some messages;
 * 5. one local transaction ({@link ProcessorStore.begin}) that records the
 *    process id as committed and in which `apply` does the work: the
 *    transaction's outcome and the knowledge of which process it belongs to
 *    are one fact;
 * 6. `prepare` with a verdict per message and the replies; the transaction
 *    stays open until it answers OK;
 * 7. the local commit, then `commit` (or `rollback` if the local commit
 *    failed), and the process is forgotten.
 *
 * A failure anywhere leaves the record of step 3 for the next cycle's
 * settle, which then reads the outcome from the database itself.
 */

import { Backoff, type BackoffOptions } from "./backoff.js";
import { systemClock, type Clock, type StopSignal } from "./clock.js";
import type { EstafetaClient } from "./client.js";
import { isTransient } from "./errors.js";
import type { CallStatus, Message, MessageResult, Reply, ResultStatus } from "./types.js";

/** A transaction of the processor's database, open until committed or rolled back. */
export interface LocalTransaction<Tx> {
  /** What `apply` works with (a connection inside the transaction). */
  readonly tx: Tx;
  /** Commits; resolves once the commit is durable, rejects when it did not happen. */
  commit(): Promise<void>;
  /** Rolls back. */
  rollback(): Promise<void>;
}

/** A process the processor's database knows and the server has not yet been told the outcome of. */
export interface UnsettledProcess {
  /** The process id. */
  processId: string;
  /** Whether the transaction of {@link ProcessorStore.begin} for it committed. */
  committed: boolean;
}

/**
 * The part of the processor's own database the loop needs; every promise
 * resolves once the change is durable. `SqliteProcessorStore` implements it
 * on an SQLite connection.
 */
export interface ProcessorStore<Tx> {
  /** Processes recorded by `recordStarted` and not yet forgotten, with their outcome. */
  unsettled(): Promise<UnsettledProcess[]>;
  /** Records the process as started, in a small transaction of its own. */
  recordStarted(processId: string): Promise<void>;
  /** Begins the main transaction and records in it that the process committed. */
  begin(processId: string): Promise<LocalTransaction<Tx>>;
  /** Forgets the process: the server has its outcome. */
  forget(processId: string): Promise<void>;
}

/** A verdict other than PROCESSED on one message. */
export interface Verdict {
  /** `PROCESSED_DEADLOCK` (left in the queue, offered again) or `PROCESSED_INCORRECT` (moved to `Error`). */
  status: Exclude<ResultStatus, "PROCESSED">;
  /** The database's numeric error code, if any. */
  error_code?: number;
  /** The error text, if any. */
  error_text?: string;
}

/** What `apply` reports: messages without a verdict are PROCESSED. */
export interface ApplyResult {
  /** Verdicts by message id, for messages not PROCESSED (whose work `apply` undid, e.g. with a savepoint). */
  verdicts?: Record<string, Verdict>;
  /** Replies to devices, delivered when the process commits. */
  replies?: Reply[];
}

/** A named point of the cycle, reported after it is done. */
export type ProcessorStep =
  | "started"
  | "recorded"
  | "accepted"
  | "applied"
  | "prepared"
  | "committed-locally"
  | "settled";

/** How a process found by settle was told its outcome. */
export interface Resumed {
  /** The process. */
  processId: string;
  /** What the processor's database said. */
  committed: boolean;
  /** The server's answer to `commit` or `rollback`. */
  answer: CallStatus;
}

/** What one cycle did. */
export type Cycle = { resumed: Resumed[] } & (
  | { kind: "idle" }
  | { kind: "busy" }
  | { kind: "cancelled"; processId: string }
  | { kind: "rejected"; processId: string }
  | {
      kind: "done";
      processId: string;
      processed: number;
      deadlocked: number;
      incorrect: number;
      /** Whether the local transaction committed (else it was rolled back). */
      committed: boolean;
      /** The server's answer to `commit`/`rollback` (`FAILED`: its moves are retried; settle commits again). */
      answer: CallStatus;
    }
);

/** Something the loop reports as it happens, besides cycles. */
export type ProcessorEvent =
  | { kind: "error"; error: unknown }
  | ({ kind: "resumed" } & Resumed)
  | { kind: "commit-cancelled"; processId: string };

/** A processor: its database, its store, and its work. */
export interface ProcessorOptions<Tx> {
  /** The database's client (database token). */
  client: EstafetaClient;
  /** The database id. */
  dbId: string;
  /** The processor's own database, as the loop needs it. */
  store: ProcessorStore<Tx>;
  /**
   * Applies the messages inside `tx` (the work of each message and nothing
   * else; the loop commits). Rejecting rolls the transaction back and
   * aborts the process: its messages stay queued.
   */
  apply(messages: Message[], tx: Tx): Promise<ApplyResult | void>;
  /** The messages to handle now; the others are left queued (default: all). */
  select?(messages: Message[]): Message[];
  /** Only messages of these subsystems. */
  subsystems?: string[];
  /** Only messages from these senders. */
  senders?: string[];
  /** At most this many messages per process (the server's limit applies too). */
  maxFiles?: number;
  /** At most this many megabytes per process. */
  maxMb?: number;
  /** Told after each step (for logging, metrics, and tests that stop a processor at a step). */
  onStep?(step: ProcessorStep, processId: string): void | Promise<void>;
  /** Told of each cycle. */
  onCycle?(cycle: Cycle): void;
  /** Told of errors the loop waits out, of each process settled at a cycle's start, and of commits the server cancelled. */
  onEvent?(event: ProcessorEvent): void;
}

/** How {@link runProcessor} waits and when it ends. */
export interface RunOptions {
  /** Ends the loop (after the cycle under way). */
  signal?: StopSignal;
  /** Return at the first IDLE instead of waiting for more. */
  untilIdle?: boolean;
  /** Waits after IDLE, BUSY and transient errors (default 0.5 s doubling to 30 s). */
  backoff?: BackoffOptions;
  /** The time (default: the system's). */
  clock?: Clock;
  /** Random numbers in [0, 1) for the backoff's jitter. */
  random?: () => number;
}

/**
 * Runs cycles until `signal` aborts (or, with `untilIdle`, until IDLE),
 * backing off after IDLE, BUSY and transient errors (network, 503). Any
 * other error ends it: an error answer that repeating cannot change, a
 * failure of `apply` or of the store.
 */
export async function runProcessor<Tx>(options: ProcessorOptions<Tx> & RunOptions): Promise<void> {
  const clock = options.clock ?? systemClock;
  const backoff = new Backoff({ initialMs: 500, maxMs: 30_000, ...options.backoff }, options.random);
  while (!options.signal?.aborted) {
    let cycle: Cycle;
    try {
      cycle = await processOnce(options);
    } catch (error) {
      if (!isTransient(error)) throw error;
      options.onEvent?.({ kind: "error", error });
      await clock.sleep(backoff.next(), options.signal);
      continue;
    }
    options.onCycle?.(cycle);
    if (cycle.kind === "idle" && options.untilIdle) return;
    if (cycle.kind === "idle" || cycle.kind === "busy") {
      await clock.sleep(backoff.next(), options.signal);
    } else {
      backoff.reset();
    }
  }
}

/** One cycle (see the module overview). */
export async function processOnce<Tx>(options: ProcessorOptions<Tx>): Promise<Cycle> {
  const { client, store } = options;
  const resumed = await settle(options);
  const started = await client.start({
    db_id: options.dbId,
    subsystems: options.subsystems,
    senders: options.senders,
    max_files: options.maxFiles,
    max_mb: options.maxMb,
  });
  if (started.status === "BUSY") return { kind: "busy", resumed };
  if (started.status !== "OK" || !started.process_id) return { kind: "idle", resumed };
  const pid = started.process_id;
  const offered = started.messages ?? [];
  await options.onStep?.("started", pid);

  await store.recordStarted(pid);
  await options.onStep?.("recorded", pid);

  const messages = options.select ? options.select(offered) : offered;
  const offeredIds = new Set(offered.map((m) => m.id));
  const foreign = messages.filter((m) => !offeredIds.has(m.id)).map((m) => m.id);
  if (foreign.length > 0 || new Set(messages.map((m) => m.id)).size !== messages.length) {
    await giveUp(options, pid, "the processor selected messages not offered, or one twice");
    throw new TypeError(
      `select must return some of the offered messages, each once (foreign: ${foreign.join(", ") || "none"})`,
    );
  }
  if (messages.length === 0) {
    await giveUp(options, pid, "the processor takes none of these messages now");
    return { kind: "rejected", processId: pid, resumed };
  }
  if (messages.length < offered.length) {
    const answer = await client.accept(pid, messages.map((m) => m.id));
    if (answer.status !== "OK") {
      await store.forget(pid);
      return { kind: "cancelled", processId: pid, resumed };
    }
  }
  await options.onStep?.("accepted", pid);

  const local = await store.begin(pid);
  let results: MessageResult[];
  let replies: Reply[];
  try {
    ({ results, replies } = verdicts(messages, (await options.apply(messages, local.tx)) ?? {}));
  } catch (error) {
    // The error to report is apply's: the database may have ended the
    // transaction itself, and if the server does not answer the abort, the
    // record of step 3 makes the next settle roll the process back.
    await local.rollback().catch(() => undefined);
    const why = error instanceof Error ? error.message : String(error);
    await giveUp(options, pid, `the processor's apply failed: ${why}`).catch(() => undefined);
    throw error;
  }
  await options.onStep?.("applied", pid);

  let prepared: CallStatus;
  try {
    prepared = (await client.prepare(pid, { results, replies })).status;
  } catch (error) {
    // Whether the server prepared is unknown: undo locally and tell it so
    // now if it answers, else the next settle does.
    await local.rollback();
    await finish(options, pid, false).catch(() => undefined);
    throw error;
  }
  if (prepared !== "OK") {
    await local.rollback();
    await finish(options, pid, false);
    return { kind: "cancelled", processId: pid, resumed };
  }
  await options.onStep?.("prepared", pid);

  let committed = true;
  try {
    await local.commit();
  } catch {
    // A commit that reports failure may still have happened (an error
    // after the commit point): the database says which.
    await local.rollback().catch(() => undefined);
    committed = (await store.unsettled()).some((p) => p.processId === pid && p.committed);
  }
  await options.onStep?.("committed-locally", pid);
  const answer = await finish(options, pid, committed);
  await options.onStep?.("settled", pid);
  const count = (status: ResultStatus): number => results.filter((r) => r.status === status).length;
  return {
    kind: "done",
    processId: pid,
    processed: count("PROCESSED"),
    deadlocked: count("PROCESSED_DEADLOCK"),
    incorrect: count("PROCESSED_INCORRECT"),
    committed,
    answer,
    resumed,
  };
}

/** Aborts `pid` (nothing of it was applied) and forgets it. */
async function giveUp<Tx>(options: ProcessorOptions<Tx>, pid: string, why: string): Promise<void> {
  await options.client.abort(pid, why);
  await options.store.forget(pid);
}

/** Tells the server the outcome of every process the store still knows. */
async function settle<Tx>(options: ProcessorOptions<Tx>): Promise<Resumed[]> {
  const resumed: Resumed[] = [];
  for (const { processId, committed } of await options.store.unsettled()) {
    const answer = await finish(options, processId, committed);
    resumed.push({ processId, committed, answer });
    options.onEvent?.({ kind: "resumed", processId, committed, answer });
  }
  return resumed;
}

/**
 * `commit` or `rollback` of `pid`; the process is forgotten once the
 * server has the outcome (OK or CANCELLED). FAILED (the server retries its
 * moves) keeps it for the next settle.
 */
async function finish<Tx>(options: ProcessorOptions<Tx>, pid: string, committed: boolean): Promise<CallStatus> {
  const { client, store } = options;
  const { status } = committed
    ? await client.commit(pid)
    : await client.rollback(pid, "the processor's transaction did not commit");
  if (status === "FAILED") return status;
  if (status === "CANCELLED" && committed) {
    // The server ended the process another way (an operator rolled it back):
    // its messages are queued again although this transaction applied them.
    options.onEvent?.({ kind: "commit-cancelled", processId: pid });
  }
  await store.forget(pid);
  return status;
}

/** The prepare's results and replies from what `apply` reported. */
function verdicts(messages: Message[], applied: ApplyResult): { results: MessageResult[]; replies: Reply[] } {
  const given = applied.verdicts ?? {};
  const ids = new Set(messages.map((m) => m.id));
  const stray = Object.keys(given).filter((id) => !ids.has(id));
  if (stray.length > 0) {
    throw new TypeError(`apply gave verdicts for messages not in the process: ${stray.join(", ")}`);
  }
  const results = messages.map((m): MessageResult => {
    const v = given[m.id];
    return v
      ? { message_id: m.id, status: v.status, error_code: v.error_code, error_text: v.error_text }
      : { message_id: m.id, status: "PROCESSED" };
  });
  return { results, replies: applied.replies ?? [] };
}
