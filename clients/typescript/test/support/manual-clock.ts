/**
 * {@link ManualClock}: time that moves only when the code under test
 * sleeps, by exactly what it asked for, so tests of backoff and age limits
 * take no real time and see every wait.
 */

import type { Clock } from "../../src/index.js";

/** A clock the test owns. */
export class ManualClock implements Clock {
  /** Every sleep asked for, in order. */
  readonly sleeps: number[] = [];
  /** The time it shows, in milliseconds since the epoch. */
  private current: number;

  constructor(start = Date.UTC(2026, 10, 28)) {
    this.current = start;
  }

  now(): number {
    return this.current;
  }

  async sleep(ms: number): Promise<void> {
    this.sleeps.push(ms);
    this.current += ms;
  }

  /** Moves the time forward by `ms`. */
  advance(ms: number): void {
    this.current += ms;
  }
}
