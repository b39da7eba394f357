/**
 * {@link receiveAll}: takes every message waiting for a database with the
 * plain six calls (start, prepare, commit until IDLE), so a test sees what
 * the server really holds, in the order it hands it out.
 */

import type { EstafetaClient, Message } from "../../src/index.js";

/** Every message waiting for `dbId`, processed and returned in the order handed out. */
export async function receiveAll(db: EstafetaClient, dbId: string): Promise<Message[]> {
  const received: Message[] = [];
  for (let round = 0; round < 1000; round++) {
    const started = await db.start({ db_id: dbId });
    if (started.status === "IDLE") return received;
    if (started.status !== "OK") throw new Error(`start answered ${started.status}`);
    const messages = started.messages ?? [];
    const pid = started.process_id!;
    const results = messages.map((m) => ({ message_id: m.id, status: "PROCESSED" as const }));
    if ((await db.prepare(pid, { results, replies: [] })).status !== "OK") throw new Error("prepare not OK");
    if ((await db.commit(pid)).status !== "OK") throw new Error("commit not OK");
    received.push(...messages);
  }
  throw new Error("the queue did not empty in 1000 processes");
}
