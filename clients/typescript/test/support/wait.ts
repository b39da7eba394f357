/**
 * Bounded waiting for tests: every wait names what it waits for and fails
 * with that name when its bound passes.
 */

import { setTimeout as delay } from "node:timers/promises";

/** Thrown by a probe of {@link waitFor} to end the wait at once (what it waits for can no longer happen). */
export class GiveUp extends Error {}

/**
 * Polls `probe` every `everyMs` until it returns a value other than
 * `undefined`; fails after `timeoutMs`, or at once when the probe throws {@link GiveUp}.
 */
export async function waitFor<T>(
  what: string,
  probe: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 20_000,
  everyMs = 50,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (err) {
      if (err instanceof GiveUp) throw err;
      last = err;
    }
    if (Date.now() >= deadline) {
      const why = last instanceof Error ? ` (last error: ${last.message})` : "";
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why}`);
    }
    await delay(everyMs);
  }
}

/** `promise`, or a failure naming `what` after `timeoutMs`. */
export async function within<T>(what: string, promise: Promise<T>, timeoutMs: number): Promise<T> {
  const timer = new AbortController();
  try {
    return await Promise.race([
      promise,
      delay(timeoutMs, undefined, { signal: timer.signal }).then(() => {
        throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
      }),
    ]);
  } finally {
    timer.abort();
  }
}
