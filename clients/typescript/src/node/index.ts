/**
 * `estafeta-client/node`: what needs Node's file system. Everything else
 * is in the main entry, which runs in browsers and React Native too.
 */

export { FileOutboxStore } from "./file-outbox-store.js";
