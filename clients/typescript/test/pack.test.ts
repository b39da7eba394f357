/**
 * What `npm pack` gives installs into a fresh folder (without the network:
 * the package has no runtime dependency), holds only the built files and
 * the README, loads as ES modules, and type-checks in a consumer project
 * with no DOM and no Node types (a React Native or browser build must not
 * need them) and in a Node project for `estafeta-client/node`, with every
 * declaration file checked (`skipLibCheck: false`).
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const packageDir = fileURLToPath(new URL("../..", import.meta.url));
const tsc = join(packageDir, "node_modules", "typescript", "bin", "tsc");

/** The command's stdout; on failure an error that carries its output. */
function run(command: string, args: string[], cwd: string): string {
  try {
    return execFileSync(command, args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 120_000 });
  } catch (err) {
    const { stdout, stderr } = err as { stdout?: string; stderr?: string };
    throw new Error(`${command} ${args.join(" ")} failed:\n${stdout ?? ""}${stderr ?? ""}`);
  }
}

test("npm pack gives a package that installs, loads and type-checks in a fresh folder", { timeout: 180_000 }, async () => {
  const scratch = await mkdtemp(join(tmpdir(), "estafeta-pack-"));
  try {
    const packed = JSON.parse(run("npm", ["pack", "--json", "--pack-destination", scratch], packageDir)) as Array<{
      filename: string;
      files: Array<{ path: string }>;
    }>;
    const files = packed[0]!.files.map((f) => f.path);
    assert.ok(files.includes("dist/index.js") && files.includes("dist/index.d.ts"), files.join(" "));
    assert.ok(files.includes("dist/node/index.js") && files.includes("README.md"));
    assert.deepEqual(
      files.filter((f) => !f.startsWith("dist/") && f !== "README.md" && f !== "package.json"),
      [],
      "only the built files, the README and package.json",
    );

    const consumer = join(scratch, "consumer");
    run("mkdir", ["-p", consumer], scratch);
    await writeFile(join(consumer, "package.json"), JSON.stringify({ name: "consumer", private: true, type: "module" }));
    run("npm", ["install", "--offline", "--no-audit", "--no-fund", join(scratch, packed[0]!.filename)], consumer);
    assert.deepEqual(
      (await readdir(join(consumer, "node_modules"))).filter((name) => !name.startsWith(".")),
      ["estafeta-client"],
      "no dependency came along",
    );

    const loaded = run(
      process.execPath,
      [
        "--input-type=module",
        "-e",
        'const m = await import("estafeta-client"); const n = await import("estafeta-client/node");' +
          "console.log([typeof m.EstafetaClient, typeof m.Outbox, typeof m.runProcessor, typeof m.inbox, typeof n.FileOutboxStore].join(' '))",
      ],
      consumer,
    );
    assert.equal(loaded.trim(), "function function function function function");

    await writeFile(
      join(consumer, "app.ts"),
      `import {
  EstafetaClient, MemoryOutboxStore, Outbox, inbox, runProcessor, isApiError, parsePushNotification,
  type Message, type ProcessorStore, type PushNotification,
} from "estafeta-client";

const client = new EstafetaClient({ baseUrl: "https://estafeta.example.com", token: "t" });
export async function device(): Promise<number> {
  const outbox = await Outbox.open({ client, store: new MemoryOutboxStore() });
  const entry = await outbox.send("db-a", { order: 1 });
  const state: "queued" | "sending" | "sent" | "failed" = entry.state;
  void state;
  return inbox(client, async (m: Message) => void m.id);
}
export async function processor(store: ProcessorStore<{ run(sql: string): void }>): Promise<void> {
  await runProcessor({ client, dbId: "db-a", store, apply: async (messages, tx) => { tx.run(String(messages.length)); }, untilIdle: true });
}
export function push(body: unknown): PushNotification["kind"] { return parsePushNotification(body).kind; }
export function code(err: unknown): boolean { return isApiError(err, "not_found"); }
// The declarations catch a mistake (the check fails if this line compiles).
// @ts-expect-error a client must be an EstafetaClient
export const wrong = Outbox.open({ client: 1, store: new MemoryOutboxStore() });
`,
    );
    await writeFile(
      join(consumer, "server.ts"),
      `import { EstafetaClient, Outbox } from "estafeta-client";
import { FileOutboxStore } from "estafeta-client/node";
export async function open(dir: string): Promise<Outbox> {
  const client = new EstafetaClient({ baseUrl: "http://127.0.0.1:8080", token: "t" });
  return Outbox.open({ client, store: await FileOutboxStore.open(dir) });
}
`,
    );
    const common = {
      target: "ES2020",
      module: "NodeNext",
      moduleResolution: "NodeNext",
      strict: true,
      noEmit: true,
      skipLibCheck: false,
    };
    await writeFile(
      join(consumer, "tsconfig.app.json"),
      JSON.stringify({ compilerOptions: { ...common, lib: ["ES2020"], types: [] }, files: ["app.ts"] }),
    );
    await writeFile(
      join(consumer, "tsconfig.server.json"),
      JSON.stringify({
        compilerOptions: {
          ...common,
          lib: ["ES2020"],
          types: ["node"],
          typeRoots: [join(packageDir, "node_modules", "@types")],
        },
        files: ["server.ts"],
      }),
    );
    run(process.execPath, [tsc, "-p", "tsconfig.app.json"], consumer);
    run(process.execPath, [tsc, "-p", "tsconfig.server.json"], consumer);

  } finally {
    await rm(scratch, { recursive: true, force: true });
  }
});
