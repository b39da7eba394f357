/**
 * The API's bodies under short names, from the types generated from the
 * server's OpenAPI document (`generated/openapi.ts`), and the one body the
 * document does not describe because the server sends it rather than
 * answers it: the push webhook's notification.
 */

import type { components } from "./generated/openapi.js";
import { BadAnswerError } from "./errors.js";

type Schemas = components["schemas"];

/** A request body without its `version` field, which the client adds. */
export type Unversioned<T> = Omit<T, "version">;

/** A message as the server hands it out. */
export type Message = Schemas["Message"];
/** `POST /v1/messages`. */
export type SendMessage = Schemas["SendMessage"];
/** The answer to `POST /v1/processes` (start). */
export type StartRequest = Schemas["StartRequest"];
/** The answer to start: IDLE, BUSY, or OK with a process id and messages. */
export type StartResponse = Schemas["StartResponse"];
/** The answer to accept, prepare, commit, rollback and abort. */
export type CallResponse = Schemas["CallResponse"];
/** `OK`, `CANCELLED` or `FAILED`. */
export type CallStatus = Schemas["CallStatus"];
/** The verdict on one message in a prepare. */
export type MessageResult = Schemas["MessageResult"];
/** `PROCESSED`, `PROCESSED_DEADLOCK` or `PROCESSED_INCORRECT`. */
export type ResultStatus = Schemas["ResultStatus"];
/** A reply written by prepare, delivered to a device at commit. */
export type Reply = Schemas["Reply"];
/** `POST /v1/processes/{pid}/prepare`. */
export type PrepareRequest = Schemas["PrepareRequest"];
/** `GET /v1/processes/{pid}`. */
export type ProcessStatus = Schemas["ProcessStatus"];
/** A process's state. */
export type ProcessState = Schemas["ProcessState"];
/** A new database's or device's id and token. */
export type Credentials = Schemas["Credentials"];
/** `GET /v1/admin/processes`. */
export type ProcessList = Schemas["ProcessList"];
/** `GET /v1/admin/stats`. */
export type Stats = Schemas["Stats"];
/** One of a mailbox's places: `Messages`, `Prepared`, `Log`, `Unknown`, `Error`. */
export type Folder = Schemas["Folder"];
/** `GET /v1/admin/databases/{db}/folders/{folder}`. */
export type FolderListing = Schemas["FolderListing"];
/** How an operator settles a process in doubt. */
export type Settlement = Schemas["Settlement"];
/** A webhook setting and its answer. */
export type Webhook = Schemas["Webhook"];

/**
 * What the server POSTs to a database's or device's webhook when a message
 * enters its `Messages` (never the message itself: the recipient then
 * starts a process or reads its inbox).
 */
export interface PushNotification {
  /** Always 1. */
  version: 1;
  /** The only event: messages wait for the recipient. */
  event: "messages_waiting";
  /** The database or device id the messages wait for. */
  recipient: string;
  /** Whether `recipient` is a database or a device. */
  kind: "database" | "device";
  /** When the notification was made (RFC 3339, UTC, milliseconds). */
  at: string;
}

/**
 * The push notification in a webhook request's body (parsed JSON), checked
 * field by field; a {@link BadAnswerError} (status 0) names the first field
 * that does not fit.
 */
export function parsePushNotification(json: unknown): PushNotification {
  const bad = (why: string): never => {
    throw new BadAnswerError(0, `not a push notification: ${why}`);
  };
  if (typeof json !== "object" || json === null) return bad("not an object");
  const o = json as Record<string, unknown>;
  if (o.version !== 1) bad("version is not 1");
  if (o.event !== "messages_waiting") bad(`unknown event ${JSON.stringify(o.event)}`);
  if (typeof o.recipient !== "string" || o.recipient === "") bad("recipient is not an id");
  if (o.kind !== "database" && o.kind !== "device") bad(`unknown kind ${JSON.stringify(o.kind)}`);
  if (typeof o.at !== "string" || Number.isNaN(Date.parse(o.at))) bad("at is not a time");
  return o as unknown as PushNotification;
}
