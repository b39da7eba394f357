/**
 * {@link Backoff}: how long to wait before the next try after a failure,
 * for the outbox's sender and the processor's loop.
 */

/** Waits growing from `initialMs` to `maxMs`, each doubled, with jitter. */
export interface BackoffOptions {
  /** The first wait (default 500 ms). */
  initialMs?: number;
  /** The longest wait (default 60 s). */
  maxMs?: number;
}

/**
 * Exponential backoff with "equal jitter": the n-th wait is between half
 * and all of `min(initialMs · 2ⁿ, maxMs)`, so clients that failed together
 * do not retry together.
 */
export class Backoff {
  /** The first wait. */
  private readonly initialMs: number;
  /** The longest wait (also what the outbox's sender waits after an error that stopped it). */
  readonly maxMs: number;
  /** The source of the jitter. */
  private readonly random: () => number;
  /** Waits since the last reset. */
  private failures = 0;

  constructor(options: BackoffOptions = {}, random: () => number = Math.random) {
    this.initialMs = options.initialMs ?? 500;
    this.maxMs = options.maxMs ?? 60_000;
    if (!(this.initialMs > 0) || !(this.maxMs >= this.initialMs)) {
      throw new RangeError(`backoff needs 0 < initialMs <= maxMs (got ${this.initialMs}, ${this.maxMs})`);
    }
    this.random = random;
  }

  /** The next wait, in milliseconds. */
  next(): number {
    const ceiling = Math.min(this.initialMs * 2 ** Math.min(this.failures, 30), this.maxMs);
    this.failures += 1;
    return ceiling / 2 + (this.random() * ceiling) / 2;
  }

  /** Back to the first wait (after a success). */
  reset(): void {
    this.failures = 0;
  }
}
