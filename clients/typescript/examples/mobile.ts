// A device app's messaging: orders through the durable outbox, replies through the inbox.
import { EstafetaClient, Outbox, inbox, type Message, type OutboxStore } from "../src/index.js";

// In React Native: new AsyncStorageOutboxStore(AsyncStorage) (from
// @react-native-async-storage/async-storage); in Node: await FileOutboxStore.open(dir)
// (from "estafeta-client/node").
export async function startDevice(options: {
  baseUrl: string;
  token: string;
  store: OutboxStore;
  saveReply: (message: Message) => Promise<void>; // idempotent: keyed by message.id
}) {
  const client = new EstafetaClient({ baseUrl: options.baseUrl, token: options.token });
  const outbox = await Outbox.open({ client, store: options.store });
  outbox.start(); // uploads in the background, in order, across restarts

  return {
    // Resolves once the order is on the device's disk: it will reach the server.
    placeOrder: (order: { id: string; items: string[] }) => outbox.send("db-a", order),
    // What the app shows: each order's state (queued, sending, sent, failed).
    orders: () => outbox.entries(),
    // On start, on a push notification, on pull-to-refresh: each reply is
    // acknowledged only once saveReply has resolved.
    refresh: () => inbox(client, options.saveReply),
    stop: () => outbox.stop(),
  };
}
