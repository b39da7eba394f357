// A back-office processor for db-a: each order applied exactly once in its own SQLite database.
import { rmSync } from "node:fs";
import nodeSqlite from "node-sqlite3-wasm";
import { EstafetaClient, SqliteProcessorStore, runProcessor } from "../src/index.js";

export async function runOrders(options: { baseUrl: string; token: string; path: string; signal: AbortSignal }) {
  rmSync(`${options.path}.lock`, { recursive: true, force: true }); // left by a killed run: see below
  const db = new nodeSqlite.Database(options.path);
  db.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, items TEXT NOT NULL, message_id TEXT NOT NULL)");
  try {
    await runProcessor({
      client: new EstafetaClient({ baseUrl: options.baseUrl, token: options.token }),
      dbId: "db-a",
      store: await SqliteProcessorStore.open(db), // records process ids beside the orders
      signal: options.signal,
      // Runs inside the transaction that commits exactly when the server is told "commit".
      apply: async (messages, tx) => ({
        replies: messages.map((m) => {
          const order = m.body as { id: string; items: string[] };
          tx.run("INSERT INTO orders (id, items, message_id) VALUES (?, ?, ?)", [order.id, JSON.stringify(order.items), m.id]);
          return { to: m.from, body: { order: order.id, accepted: true } };
        }),
      }),
    });
  } finally {
    db.close();
  }
}
