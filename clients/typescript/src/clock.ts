/**
 * Time as the outbox and the processor see it: the current time and a
 * sleep that a stop signal cuts short. Both are given by the caller (tests
 * pass a clock they advance by hand), and {@link systemClock} is the real one.
 *
 * The timer functions are reached through `globalThis` with local types,
 * so that this package's declarations need neither the DOM library nor
 * Node's types: they type-check in a browser, React Native or Node project.
 */

/** What the package needs of an `AbortSignal` (a real one fits). */
export interface StopSignal {
  /** Whether stop was asked for. */
  readonly aborted: boolean;
  /** Calls `listener` once stop is asked for. */
  addEventListener(type: "abort", listener: () => void, options?: { once?: boolean }): void;
  /** Removes a listener added by `addEventListener`. */
  removeEventListener(type: "abort", listener: () => void): void;
}

/** The current time and a way to wait. */
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
  /** Resolves after `ms` milliseconds, or at once when `signal` is (or becomes) aborted. */
  sleep(ms: number, signal?: StopSignal): Promise<void>;
}

interface Timers {
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

const timers = globalThis as unknown as Timers;

/** Calls `callback` after `ms`; the returned function cancels it. */
export function timeout(callback: () => void, ms: number): () => void {
  const handle = timers.setTimeout(callback, ms);
  return () => timers.clearTimeout(handle);
}

/** The real time: `Date.now()` and a timer. */
export const systemClock: Clock = {
  now: () => Date.now(),
  sleep(ms: number, signal?: StopSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal?.aborted) {
        resolve();
        return;
      }
      const done = (): void => {
        cancel();
        signal?.removeEventListener("abort", done);
        resolve();
      };
      const cancel = timeout(done, ms);
      signal?.addEventListener("abort", done, { once: true });
    });
  },
};

/** A {@link StopSignal} and the switch that trips it (what an `AbortController` is, without needing one). */
export class Stopper {
  /** Whether `stop()` was called. */
  private tripped = false;
  /** Who to tell when it is. */
  private readonly listeners = new Set<() => void>();
  /** The signal: aborted once {@link Stopper.stop} is called. */
  readonly signal: StopSignal;

  constructor() {
    const isTripped = (): boolean => this.tripped;
    this.signal = {
      get aborted(): boolean {
        return isTripped();
      },
      addEventListener: (_type: "abort", listener: () => void): void => {
        this.listeners.add(listener);
      },
      removeEventListener: (_type: "abort", listener: () => void): void => {
        this.listeners.delete(listener);
      },
    };
  }

  /** Trips the signal and calls its listeners once. */
  stop(): void {
    if (this.tripped) return;
    this.tripped = true;
    const listeners = [...this.listeners];
    this.listeners.clear();
    for (const listener of listeners) listener();
  }
}
