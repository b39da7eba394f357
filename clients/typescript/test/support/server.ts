/**
 * {@link TestServer}: a real `estafeta serve` on a free loopback port and a
 * temporary data folder, started by the tests themselves, killed with
 * SIGKILL for crash tests and started again on the same port and folder.
 *
 * The binary is `$ESTAFETA_BIN`, else CI's debug build
 * (`/var/tmp/estafeta-target/debug/estafeta`); a missing binary fails the
 * test that needs it, saying how to build it.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { EstafetaClient } from "../../src/index.js";
import { GiveUp, waitFor, within } from "./wait.js";

/** CI's target folder's debug build, when `ESTAFETA_BIN` is not set. */
const DEFAULT_BINARY = "/var/tmp/estafeta-target/debug/estafeta";

/** The admin token every test server runs with (the server wants at least 32 characters). */
export const ADMIN_TOKEN = "test-admin-token-0123456789abcdef0123456789";

/** The server binary the tests run. */
export function serverBinary(): string {
  const path = process.env.ESTAFETA_BIN ?? DEFAULT_BINARY;
  if (!existsSync(path)) {
    throw new Error(
      `no Estafeta server binary at ${path}: build it with ` +
        "`cargo build -p estafeta-server --bin estafeta` and set ESTAFETA_BIN to target/debug/estafeta",
    );
  }
  return path;
}

/** A port that was free a moment ago. */
async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      const port = typeof address === "object" && address ? address.port : 0;
      probe.close(() => resolve(port));
    });
  });
}

/** A running (or killed) server of the tests. */
export class TestServer {
  /** The loopback port, kept across restarts. */
  readonly port: number;
  /** The data folder, kept across restarts, removed by `stop()`. */
  readonly dataDir: string;
  /** Settings added to the server's environment. */
  private readonly env: Record<string, string>;
  /** The running server process, if any. */
  private child: ChildProcess | undefined;
  /** The end of its stderr, for failure messages. */
  private stderr = "";

  private constructor(port: number, dataDir: string, env: Record<string, string>) {
    this.port = port;
    this.dataDir = dataDir;
    this.env = env;
  }

  /** Starts a server on a new data folder; `env` adds settings (`ESTAFETA_READY_TIMEOUT`, …). */
  static async start(env: Record<string, string> = {}): Promise<TestServer> {
    const binary = serverBinary();
    const dataDir = await mkdtemp(join(tmpdir(), "estafeta-ts-"));
    let lastError: unknown;
    // Another program may take the free port before the server binds it: try another.
    for (let attempt = 0; attempt < 3; attempt++) {
      const server = new TestServer(await freePort(), dataDir, env);
      try {
        await server.launch(binary);
        return server;
      } catch (err) {
        lastError = err;
        if (!server.stderr.toLowerCase().includes("address")) break;
      }
    }
    await rm(dataDir, { recursive: true, force: true });
    throw lastError;
  }

  /** `http://127.0.0.1:<port>`. */
  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** A client with the admin token. */
  admin(): EstafetaClient {
    return new EstafetaClient({ baseUrl: this.url, token: ADMIN_TOKEN, timeoutMs: 10_000 });
  }

  /** Kills the server with SIGKILL and waits for it to be gone. */
  async kill9(): Promise<void> {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    child.kill("SIGKILL");
    await within("the killed server to exit", gone, 10_000);
    this.child = undefined;
  }

  /** Starts the server again on the same port and data folder; resolves once it is ready. */
  async restart(): Promise<void> {
    await this.kill9();
    await this.launch(serverBinary());
  }

  /** Stops the server (SIGTERM, then SIGKILL if it lingers) and removes its data folder. */
  async stop(): Promise<void> {
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      const gone = new Promise<void>((resolve) => child.once("exit", () => resolve()));
      child.kill("SIGTERM");
      try {
        await within("the server to stop", gone, 10_000);
      } catch {
        await this.kill9();
      }
    }
    this.child = undefined;
    await rm(this.dataDir, { recursive: true, force: true });
  }

  private async launch(binary: string): Promise<void> {
    this.stderr = "";
    const child = spawn(binary, ["serve", "--listen", `127.0.0.1:${this.port}`, "--data-dir", this.dataDir], {
      env: {
        PATH: process.env.PATH ?? "/usr/bin:/bin",
        ESTAFETA_ADMIN_TOKEN: ADMIN_TOKEN,
        ESTAFETA_LOG: "warn",
        ...this.env,
      },
      stdio: ["ignore", "ignore", "pipe"],
    });
    this.child = child;
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      this.stderr = (this.stderr + chunk).slice(-8000);
    });
    const admin = this.admin();
    await waitFor(`the server on port ${this.port} to be ready`, async () => {
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new GiveUp(`the server exited (${child.exitCode ?? child.signalCode})`);
      }
      return (await admin.readyz()) ? true : undefined;
    }).catch(async (err: unknown) => {
      if (child.exitCode === null) child.kill("SIGKILL");
      throw new Error(`${err instanceof Error ? err.message : String(err)}\nserver stderr:\n${this.stderr}`);
    });
  }
}
