/**
 * {@link SqliteProcessorStore}: the processor loop's records in the
 * processor's own SQLite database, next to its data, through any
 * synchronous or asynchronous SQLite connection that can run SQL with `?`
 * parameters (node-sqlite3-wasm's `Database` as it is; better-sqlite3 and
 * `node:sqlite` with a three-line adapter, in the README).
 *
 * Two tables: `estafeta_pending` holds the processes started and not yet
 * settled with the server (each written in a transaction of its own), and
 * `estafeta_committed` the processes whose main transaction committed (the
 * row is written inside that transaction, so it exists exactly when the
 * transaction committed).
 */

import type { LocalTransaction, ProcessorStore, UnsettledProcess } from "./processor.js";

/** An SQLite connection: results may be values or promises. */
export interface SqlConnection {
  /** Runs statements without parameters. */
  exec(sql: string): unknown;
  /** Runs one statement with `?` parameters. */
  run(sql: string, params: string[]): unknown;
  /** The rows of one query with `?` parameters, as objects keyed by column name. */
  all(sql: string, params: string[]): unknown;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS estafeta_pending (process_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS estafeta_committed (process_id TEXT PRIMARY KEY);
`;

/**
 * A {@link ProcessorStore} on an SQLite connection that the processor
 * uses for nothing else while the loop runs; `apply` gets the same
 * connection, inside the transaction. SQLite must commit durably: the
 * store sets `PRAGMA synchronous = FULL` (a commit lost to a power cut
 * after the server was told "commit" would lose the messages).
 */
export class SqliteProcessorStore<C extends SqlConnection> implements ProcessorStore<C> {
  /** The processor's connection: the store's tables and `apply`'s work share its transactions. */
  private readonly conn: C;

  private constructor(conn: C) {
    this.conn = conn;
  }

  /** Creates the two tables when they are missing. */
  static async open<C extends SqlConnection>(conn: C): Promise<SqliteProcessorStore<C>> {
    await conn.exec("PRAGMA synchronous = FULL");
    await conn.exec(SCHEMA);
    return new SqliteProcessorStore(conn);
  }

  async unsettled(): Promise<UnsettledProcess[]> {
    const rows = (await this.conn.all(
      `SELECT p.process_id AS process_id,
              EXISTS (SELECT 1 FROM estafeta_committed c WHERE c.process_id = p.process_id) AS committed
       FROM estafeta_pending p ORDER BY p.process_id`,
      [],
    )) as Array<{ process_id: string; committed: number | bigint }>;
    return rows.map((r) => ({ processId: r.process_id, committed: Number(r.committed) === 1 }));
  }

  async recordStarted(processId: string): Promise<void> {
    await this.conn.run("INSERT INTO estafeta_pending (process_id) VALUES (?) ON CONFLICT DO NOTHING", [processId]);
  }

  async begin(processId: string): Promise<LocalTransaction<C>> {
    const conn = this.conn;
    await conn.exec("BEGIN IMMEDIATE");
    try {
      await conn.run("INSERT INTO estafeta_committed (process_id) VALUES (?)", [processId]);
    } catch (err) {
      await conn.exec("ROLLBACK");
      throw err;
    }
    return {
      tx: conn,
      commit: async () => {
        await conn.exec("COMMIT");
      },
      rollback: async () => {
        await conn.exec("ROLLBACK");
      },
    };
  }

  async forget(processId: string): Promise<void> {
    await this.conn.exec("BEGIN IMMEDIATE");
    try {
      await this.conn.run("DELETE FROM estafeta_committed WHERE process_id = ?", [processId]);
      await this.conn.run("DELETE FROM estafeta_pending WHERE process_id = ?", [processId]);
      await this.conn.exec("COMMIT");
    } catch (err) {
      await this.conn.exec("ROLLBACK");
      throw err;
    }
  }
}
