/**
 * {@link FileOutboxStore}: the outbox's entries in a folder on disk, for
 * Node: one JSON file per entry (`<seq>.json`), each written to a
 * temporary name, fsynced, renamed into place and its folder fsynced, so
 * that after a crash an entry is either its old version or its new one,
 * and a save that resolved survives the crash.
 */

import { mkdir, open, readdir, readFile, rename, unlink } from "node:fs/promises";
import { join } from "node:path";
import { OutboxStoreError } from "../errors.js";
import { parseEntry, type OutboxEntry, type OutboxStore } from "../outbox-store.js";

const ENTRY = /^(\d{1,15})\.json$/;
const TEMPORARY = ".tmp";

/** Outbox entries as files in one folder; one outbox per folder at a time. */
export class FileOutboxStore implements OutboxStore {
  /** The folder. */
  readonly dir: string;

  private constructor(dir: string) {
    this.dir = dir;
  }

  /** The store in `dir`, created (durably) when it does not exist. */
  static async open(dir: string): Promise<FileOutboxStore> {
    try {
      await mkdir(dir, { recursive: true });
      await syncDir(join(dir, ".."));
    } catch (err) {
      throw storeError(`cannot create the outbox folder ${dir}`, err);
    }
    return new FileOutboxStore(dir);
  }

  async load(): Promise<OutboxEntry[]> {
    let names: string[];
    try {
      names = await readdir(this.dir);
    } catch (err) {
      throw storeError(`cannot list ${this.dir}`, err);
    }
    // A save cut short by a crash never resolved: its entry is the file it
    // was to replace (or none). Cleared first, whatever else is found.
    for (const name of names.filter((n) => n.endsWith(TEMPORARY))) {
      const path = join(this.dir, name);
      await unlink(path).catch((err: unknown) => {
        throw storeError(`cannot remove ${path}`, err);
      });
    }
    const entries: OutboxEntry[] = [];
    for (const name of names) {
      const match = ENTRY.exec(name);
      if (!match) continue;
      const path = join(this.dir, name);
      let text: string;
      try {
        text = await readFile(path, "utf8");
      } catch (err) {
        throw storeError(`cannot read ${path}`, err);
      }
      const entry = parseEntry(text, path);
      if (entry.seq !== Number(match[1])) throw new OutboxStoreError(`${path}: holds entry ${entry.seq}`);
      entries.push(entry);
    }
    return entries;
  }

  async save(entry: OutboxEntry): Promise<void> {
    const path = this.path(entry.seq);
    const temporary = path + TEMPORARY;
    try {
      const file = await open(temporary, "w");
      try {
        await file.writeFile(JSON.stringify(entry));
        await file.sync();
      } finally {
        await file.close();
      }
      await rename(temporary, path);
      await syncDir(this.dir);
    } catch (err) {
      throw storeError(`cannot write ${path}`, err);
    }
  }

  async remove(seq: number): Promise<void> {
    const path = this.path(seq);
    try {
      await unlink(path);
      await syncDir(this.dir);
    } catch (err) {
      if ((err as { code?: unknown }).code === "ENOENT") return;
      throw storeError(`cannot remove ${path}`, err);
    }
  }

  private path(seq: number): string {
    return join(this.dir, `${String(seq).padStart(12, "0")}.json`);
  }
}

/** Makes a folder's entries (new, renamed, removed names) durable. */
async function syncDir(dir: string): Promise<void> {
  // Windows cannot open a folder for fsync; NTFS orders its metadata itself.
  if (process.platform === "win32") return;
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

function storeError(what: string, err: unknown): OutboxStoreError {
  return new OutboxStoreError(`${what}: ${err instanceof Error ? err.message : String(err)}`);
}
