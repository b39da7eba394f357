/**
 * `estafeta-client`: a TypeScript client for Estafeta, with no runtime
 * dependency beyond `fetch`: the HTTP API ({@link EstafetaClient}), a
 * device's durable outbox ({@link Outbox}) and inbox reader ({@link inbox}),
 * and a processor loop that applies each message exactly once in the
 * processor's own database ({@link runProcessor}). The Node file store of
 * the outbox is in `estafeta-client/node`.
 */

export { EstafetaClient } from "./client.js";
export type { ClientOptions, FetchLike, FetchRequest, FetchResponse, Sent } from "./client.js";
export {
  ApiError,
  BadAnswerError,
  ERROR_CODES,
  EstafetaError,
  OutboxFullError,
  OutboxStoreError,
  TransportError,
  isApiError,
  isTransient,
} from "./errors.js";
export type { ErrorCode } from "./errors.js";
export { Backoff } from "./backoff.js";
export type { BackoffOptions } from "./backoff.js";
export { systemClock } from "./clock.js";
export type { Clock, StopSignal } from "./clock.js";
export { KEY_LIFETIME_MS, Outbox } from "./outbox.js";
export type { OutboxCounts, OutboxOptions } from "./outbox.js";
export { MemoryOutboxStore, parseEntry } from "./outbox-store.js";
export type { OutboxEntry, OutboxFailure, OutboxState, OutboxStore } from "./outbox-store.js";
export { AsyncStorageOutboxStore } from "./async-storage-store.js";
export type { AsyncStorageLike } from "./async-storage-store.js";
export { inbox } from "./inbox.js";
export type { InboxOptions } from "./inbox.js";
export { processOnce, runProcessor } from "./processor.js";
export type {
  ApplyResult,
  Cycle,
  LocalTransaction,
  ProcessorEvent,
  ProcessorOptions,
  ProcessorStep,
  ProcessorStore,
  Resumed,
  RunOptions,
  UnsettledProcess,
  Verdict,
} from "./processor.js";
export { SqliteProcessorStore } from "./sqlite-processor-store.js";
export type { SqlConnection } from "./sqlite-processor-store.js";
export { parsePushNotification } from "./types.js";
export type {
  CallResponse,
  CallStatus,
  Credentials,
  Folder,
  FolderListing,
  Message,
  MessageResult,
  PrepareRequest,
  ProcessList,
  ProcessState,
  ProcessStatus,
  PushNotification,
  Reply,
  ResultStatus,
  SendMessage,
  Settlement,
  StartRequest,
  StartResponse,
  Stats,
  Unversioned,
  Webhook,
} from "./types.js";
export type { components, paths } from "./generated/openapi.js";
