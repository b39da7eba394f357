/**
 * {@link AsyncStorageOutboxStore}: the outbox's entries in React Native's
 * AsyncStorage, reached through the few methods it needs, so this package
 * does not depend on the AsyncStorage package.
 */

import { parseEntry, type OutboxEntry, type OutboxStore } from "./outbox-store.js";

/** The part of React Native's AsyncStorage the outbox uses (`@react-native-async-storage/async-storage` fits). */
export interface AsyncStorageLike {
  getItem(key: string): Promise<string | null>;
  setItem(key: string, value: string): Promise<void>;
  removeItem(key: string): Promise<void>;
  getAllKeys(): Promise<readonly string[]>;
}

/**
 * Entries in React Native's AsyncStorage, one item per entry under
 * `prefix` + sequence number. AsyncStorage resolves `setItem` once the
 * platform has stored the value (SQLite on Android, files on iOS).
 */
export class AsyncStorageOutboxStore implements OutboxStore {
  /** The app's AsyncStorage. */
  private readonly storage: AsyncStorageLike;
  /** Keeps this outbox's items apart from the app's own (and from another device's outbox). */
  private readonly prefix: string;

  constructor(storage: AsyncStorageLike, prefix = "estafeta-outbox:") {
    this.storage = storage;
    this.prefix = prefix;
  }

  async load(): Promise<OutboxEntry[]> {
    const keys = (await this.storage.getAllKeys()).filter((k) => k.startsWith(this.prefix));
    const entries: OutboxEntry[] = [];
    for (const key of keys) {
      const text = await this.storage.getItem(key);
      if (text !== null) entries.push(parseEntry(text, `AsyncStorage item ${key}`));
    }
    return entries;
  }

  save(entry: OutboxEntry): Promise<void> {
    return this.storage.setItem(this.prefix + entry.seq, JSON.stringify(entry));
  }

  remove(seq: number): Promise<void> {
    return this.storage.removeItem(this.prefix + seq);
  }
}
