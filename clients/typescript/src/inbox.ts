/**
 * {@link inbox}: a device reads its inbox and hands each message to the
 * app, acknowledging a message only once the app's handler for it has
 * resolved, so a message the app has not stored is never lost.
 *
 * An acknowledgement can be lost too (the app killed between its handler
 * and the ack, a network failure): the message then comes again, so the
 * handler must be idempotent by message id (store it under its `id`).
 */

import type { EstafetaClient } from "./client.js";
import type { Message } from "./types.js";

/** How {@link inbox} reads. */
export interface InboxOptions {
  /** Messages asked for per read (default: the server's page of up to 1000). */
  limit?: number;
}

/**
 * Reads the device's inbox page by page, oldest first, calls `handler` on
 * each message in turn, and acknowledges each page's messages whose handler
 * resolved. When a handler rejects, the messages before it are
 * acknowledged, it and those after it stay in the inbox for the next read,
 * and the handler's error is thrown. Resolves with how many messages were
 * handled, once a read finds nothing new.
 */
export async function inbox(
  client: EstafetaClient,
  handler: (message: Message) => Promise<void> | void,
  options: InboxOptions = {},
): Promise<number> {
  const seen = new Set<string>();
  let handled = 0;
  for (;;) {
    const page = (await client.inbox(options.limit)).filter((m) => !seen.has(m.id));
    // Nothing new: the inbox is empty (or holds only what this call has
    // acknowledged and the server has not yet moved).
    if (page.length === 0) return handled;
    const done: string[] = [];
    let failure: { error: unknown } | undefined;
    for (const message of page) {
      try {
        await handler(message);
      } catch (error) {
        failure = { error };
        break;
      }
      done.push(message.id);
      seen.add(message.id);
      handled += 1;
    }
    if (done.length > 0) {
      try {
        await client.ack(done);
      } catch (ackError) {
        // The handler's error is the one to report; unacknowledged
        // messages come again and the handler is idempotent.
        if (!failure) throw ackError;
      }
    }
    if (failure) throw failure.error;
  }
}
