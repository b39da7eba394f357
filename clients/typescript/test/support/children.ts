/**
 * {@link Child}: a test program run as a real child process (a device or
 * a processor), whose stdout lines the test waits on, and which the test
 * kills with SIGKILL at the moment it chooses.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { GiveUp, waitFor, within } from "./wait.js";

/** A running child program of the tests. */
export class Child {
  /** Every line the child wrote to stdout, in order. */
  readonly lines: string[] = [];
  /** The child process. */
  private readonly process: ChildProcess;
  /** The end of its stderr, for failure messages. */
  private stderr = "";
  /** Its exit code or signal, once it exits. */
  private readonly exit: Promise<number | string>;

  /** Runs `build/test/children/<name>.js` with `args`. */
  constructor(name: string, args: string[]) {
    const script = fileURLToPath(new URL(`../children/${name}.js`, import.meta.url));
    this.process = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let partial = "";
    this.process.stdout?.setEncoding("utf8");
    this.process.stdout?.on("data", (chunk: string) => {
      partial += chunk;
      const parts = partial.split("\n");
      partial = parts.pop() ?? "";
      this.lines.push(...parts);
    });
    this.process.stderr?.setEncoding("utf8");
    this.process.stderr?.on("data", (chunk: string) => {
      this.stderr = (this.stderr + chunk).slice(-8000);
    });
    this.exit = new Promise((resolve) => {
      this.process.once("exit", (code, signal) => resolve(code ?? signal ?? "unknown"));
    });
  }

  /** The first line matching `pattern` (waiting up to `timeoutMs` for it). */
  async line(pattern: RegExp, timeoutMs = 30_000): Promise<RegExpMatchArray> {
    return waitFor(
      `a line matching ${pattern} from the child`,
      () => {
        for (const l of this.lines) {
          const m = pattern.exec(l);
          if (m) return m;
        }
        if (this.process.exitCode !== null || this.process.signalCode !== null) {
          throw new GiveUp(`the child exited before ${pattern}: ${this.describe()}`);
        }
        return undefined;
      },
      timeoutMs,
      20,
    );
  }

  /** How many lines match `pattern` so far. */
  count(pattern: RegExp): number {
    return this.lines.filter((l) => pattern.test(l)).length;
  }

  /** Kills the child with SIGKILL and waits for it to be gone. */
  async kill9(): Promise<void> {
    this.process.kill("SIGKILL");
    await within("the killed child to exit", this.exit, 10_000);
  }

  /** Waits for the child to exit by itself; fails unless it exits 0. */
  async succeeds(timeoutMs = 60_000): Promise<void> {
    const code = await within("the child to exit", this.exit, timeoutMs).catch(async (err: unknown) => {
      this.process.kill("SIGKILL");
      throw new Error(`${err instanceof Error ? err.message : String(err)}: ${this.describe()}`);
    });
    if (code !== 0) throw new Error(`the child exited with ${code}: ${this.describe()}`);
  }

  private describe(): string {
    return `stdout tail: ${this.lines.slice(-5).join(" | ")}; stderr: ${this.stderr}`;
  }
}
