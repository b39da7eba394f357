/**
 * {@link EstafetaClient}: one method per call of the HTTP API (version 1)
 * that devices, processors and provisioning use, over `fetch` and nothing
 * else, so it runs in Node 18+, browsers and React Native.
 *
 * Bodies are the types generated from the server's OpenAPI document; the
 * client adds `"version": 1`. A call resolves with the answer's body (status
 * words such as `BUSY` or `CANCELLED` included) or rejects with an error of
 * `errors.ts`: no answer, an HTTP error answer with the server's code, or a
 * body that is not JSON.
 */

import { ApiError, BadAnswerError, TransportError } from "./errors.js";
import { timeout, type StopSignal } from "./clock.js";
import type {
  CallResponse,
  Credentials,
  Folder,
  FolderListing,
  Message,
  PrepareRequest,
  ProcessList,
  ProcessStatus,
  SendMessage,
  Settlement,
  StartRequest,
  StartResponse,
  Stats,
  Unversioned,
  Webhook,
} from "./types.js";

/** The request a {@link FetchLike} is given. */
export interface FetchRequest {
  /** `GET`, `POST`, `PUT` or `DELETE`. */
  method: string;
  /** Authorization and content type. */
  headers: Record<string, string>;
  /** The JSON body, when the call has one. */
  body?: string;
  /** Aborts the request when the client's timeout passes. */
  signal?: StopSignal;
}

/** What the client reads of an answer (a `fetch` Response fits). */
export interface FetchResponse {
  /** The HTTP status. */
  readonly status: number;
  /** The answer's headers (`Retry-After`). */
  readonly headers: { get(name: string): string | null };
  /** The whole body as text. */
  text(): Promise<string>;
}

/**
 * A `fetch`: the global one by default; tests and apps may pass their own
 * (a wrapper that logs, or React Native's). Written in method form so that
 * the global `fetch`, whose parameters are wider, is accepted.
 */
export type FetchLike = {
  fetch(url: string, request: FetchRequest): Promise<FetchResponse>;
}["fetch"];

/** How a client reaches its server. */
export interface ClientOptions {
  /** The server's base URL, e.g. `https://estafeta.example.com` (a trailing `/` is dropped). */
  baseUrl: string;
  /** The bearer token: an admin, database or device token. */
  token: string;
  /**
   * A call without a complete answer after this many milliseconds fails
   * with a {@link TransportError} whose `timedOut` is true (default 30 s).
   */
  timeoutMs?: number;
  /** The `fetch` to use (default: the global one). */
  fetch?: FetchLike;
}

/** The answer to an upload: the message's id, and whether this call made it (201) or an earlier one with the same key did (200). */
export interface Sent {
  /** The message id the server assigned. */
  id: string;
  /** True for 201 (new), false for 200 (the idempotency key was known). */
  created: boolean;
}

interface AbortControllerLike {
  readonly signal: StopSignal;
  abort(): void;
}

const AbortControllerImpl = (globalThis as unknown as { AbortController?: new () => AbortControllerLike })
  .AbortController;

/** Calls the Estafeta HTTP API with one token. */
export class EstafetaClient {
  /** The base URL without a trailing slash. */
  readonly baseUrl: string;
  /** The bearer token of every call (none is sent when empty: the operations routes). */
  private readonly token: string;
  /** How long a call may take, answer body included. */
  private readonly timeoutMs: number;
  /** The fetch that carries the calls. */
  private readonly fetchImpl: FetchLike;

  constructor(options: ClientOptions) {
    // Checked by pattern: React Native's URL class does not parse.
    if (!/^https?:\/\/[^/?#\s]+(\/\S*)?$/i.test(options.baseUrl)) {
      throw new TypeError(`not an http(s) URL: ${JSON.stringify(options.baseUrl)}`);
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    const globalFetch = (globalThis as unknown as { fetch?: FetchLike }).fetch;
    if (options.fetch === undefined && globalFetch === undefined) {
      throw new TypeError("no global fetch here: pass one in ClientOptions.fetch");
    }
    // The global fetch is called as a plain function: some runtimes refuse
    // it as a method of another object.
    this.fetchImpl = options.fetch ?? ((url, request) => (globalFetch as FetchLike)(url, request));
  }

  /** The same server, timeout and fetch with another token (the admin client turned into a device's). */
  withToken(token: string): EstafetaClient {
    return new EstafetaClient({
      baseUrl: this.baseUrl,
      token,
      timeoutMs: this.timeoutMs,
      fetch: this.fetchImpl,
    });
  }

  // Operations.

  /** `GET /readyz`: true once start-up recovery is done, false while the server answers 503. */
  async readyz(): Promise<boolean> {
    const answer = await this.exchange("GET", "/readyz");
    if (answer.status === 503) return false;
    this.check(answer);
    return true;
  }

  /** `GET /v1/openapi.json`: the OpenAPI document the server serves. */
  openapi(): Promise<unknown> {
    return this.call("GET", "/v1/openapi.json");
  }

  // Administration (admin token).

  /** `POST /v1/admin/enterprises` (409 `already_exists` when it exists). */
  async createEnterprise(id: string): Promise<void> {
    await this.call("POST", "/v1/admin/enterprises", { id });
  }

  /** `POST /v1/admin/enterprises/{ent}/subsystems`. */
  async createSubsystem(enterprise: string, id: string): Promise<void> {
    await this.call("POST", `/v1/admin/enterprises/${seg(enterprise)}/subsystems`, { id });
  }

  /** `POST /v1/admin/enterprises/{ent}/databases`: the database's token, shown once. */
  createDatabase(enterprise: string, id: string): Promise<Credentials> {
    return this.call("POST", `/v1/admin/enterprises/${seg(enterprise)}/databases`, { id });
  }

  /** `POST /v1/admin/enterprises/{ent}/devices`: the device's token, shown once. */
  createDevice(enterprise: string, id: string, subsystem: string): Promise<Credentials> {
    return this.call("POST", `/v1/admin/enterprises/${seg(enterprise)}/devices`, { id, subsystem });
  }

  /** `PUT /v1/admin/{databases|devices}/{id}/webhook`: where arrivals are pushed; `null` clears it. */
  setWebhook(kind: "database" | "device", id: string, url: string | null): Promise<Webhook> {
    return this.call("PUT", `/v1/admin/${kind}s/${seg(id)}/webhook`, { url });
  }

  /** `GET /v1/admin/processes`: current and recently ended processes. */
  processes(): Promise<ProcessList> {
    return this.call("GET", "/v1/admin/processes");
  }

  /** `GET /v1/admin/stats`: counters per database and per device. */
  stats(): Promise<Stats> {
    return this.call("GET", "/v1/admin/stats");
  }

  /** `GET /v1/admin/databases/{id}/folders/{folder}`: the files of a mailbox's place (a device id works too). */
  folder(mailbox: string, folder: Folder): Promise<FolderListing> {
    return this.call("GET", `/v1/admin/databases/${seg(mailbox)}/folders/${folder}`);
  }

  /** `POST /v1/admin/processes/{pid}/settle`: an operator settles a process in doubt. */
  settle(processId: string, outcome: Settlement): Promise<CallResponse> {
    return this.call("POST", `/v1/admin/processes/${seg(processId)}/settle`, { outcome });
  }

  // Devices (device token).

  /**
   * `POST /v1/messages`: resolves once the message is durable on the server.
   * With an `idempotency_key`, repeating the call (after a lost answer)
   * answers the first call's id and makes no second message. The outbox
   * ({@link Outbox}) does this for you, across restarts.
   */
  async send(message: Unversioned<SendMessage>): Promise<Sent> {
    const answer = await this.exchange("POST", "/v1/messages", message);
    const body = this.parse<{ id?: unknown }>(this.check(answer));
    if (typeof body.id !== "string") throw new BadAnswerError(answer.status, "no id in the answer");
    return { id: body.id, created: answer.status === 201 };
  }

  /** `GET /v1/inbox?limit=N`: messages for this device not yet acknowledged, oldest first. */
  async inbox(limit?: number): Promise<Message[]> {
    const query = limit === undefined ? "" : `?limit=${limit}`;
    const body = await this.call<{ messages?: Message[] }>("GET", `/v1/inbox${query}`);
    return body.messages ?? [];
  }

  /** `POST /v1/inbox/ack`: how many of `ids` were acknowledged now (unknown ids are not counted). */
  async ack(ids: readonly string[]): Promise<number> {
    const body = await this.call<{ acked: number }>("POST", "/v1/inbox/ack", { ids });
    return body.acked;
  }

  // Processors (database token): the six calls.

  /** API_1, `POST /v1/processes`: IDLE, BUSY, or OK with a process id and messages. */
  start(request: Unversioned<StartRequest>): Promise<StartResponse> {
    return this.call("POST", "/v1/processes", request);
  }

  /** API_2: narrow the process's messages to `messageIds`; the others come again later. */
  accept(processId: string, messageIds: readonly string[]): Promise<CallResponse> {
    return this.call("POST", `/v1/processes/${seg(processId)}/accept`, { message_ids: messageIds });
  }

  /** API_3: a verdict on every accepted message and the replies; OK once the replies are durable. */
  prepare(processId: string, request: Unversioned<PrepareRequest>): Promise<CallResponse> {
    return this.call("POST", `/v1/processes/${seg(processId)}/prepare`, request);
  }

  /** API_4: the processor's transaction committed. */
  commit(processId: string): Promise<CallResponse> {
    return this.call("POST", `/v1/processes/${seg(processId)}/commit`, {});
  }

  /** API_5: the processor's transaction did not commit. */
  rollback(processId: string, errorText: string): Promise<CallResponse> {
    return this.call("POST", `/v1/processes/${seg(processId)}/rollback`, { error_text: errorText });
  }

  /** API_6: the processor gives up the process. */
  abort(processId: string, message: string): Promise<CallResponse> {
    return this.call("POST", `/v1/processes/${seg(processId)}/abort`, { message });
  }

  /** `GET /v1/processes/{pid}`: the process's state (404 for an id never issued). */
  process(processId: string): Promise<ProcessStatus> {
    return this.call("GET", `/v1/processes/${seg(processId)}`);
  }

  // Plumbing.

  /** A call whose success body is JSON of type `T`. */
  private async call<T>(method: string, path: string, body?: object): Promise<T> {
    const answer = await this.exchange(method, path, body);
    return this.parse<T>(this.check(answer));
  }

  /** One request and its whole answer, within the timeout. */
  private async exchange(method: string, path: string, body?: object): Promise<Answer> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (this.token !== "") headers.authorization = `Bearer ${this.token}`;
    const request: FetchRequest = { method, headers };
    if (body !== undefined) {
      headers["content-type"] = "application/json";
      request.body = JSON.stringify({ version: 1, ...body });
    }
    const controller = AbortControllerImpl ? new AbortControllerImpl() : undefined;
    if (controller) request.signal = controller.signal;
    let timedOut = false;
    let cancelTimer = (): void => {};
    const expired = new Promise<never>((_, reject) => {
      cancelTimer = timeout(() => {
        timedOut = true;
        controller?.abort();
        reject(new TransportError(`${method} ${path}: no answer within ${this.timeoutMs} ms`, true));
      }, this.timeoutMs);
    });
    try {
      const whole = (async (): Promise<Answer> => {
        const response = await this.fetchImpl(`${this.baseUrl}${path}`, request);
        const text = await response.text();
        return { status: response.status, text, retryAfter: response.headers.get("retry-after") };
      })();
      // When the timer wins, the aborted request still rejects: handled here.
      whole.catch(() => undefined);
      return await Promise.race([whole, expired]);
    } catch (err) {
      if (err instanceof TransportError) throw err;
      throw new TransportError(
        timedOut
          ? `${method} ${path}: no answer within ${this.timeoutMs} ms`
          : `${method} ${path}: ${describe(err)}`,
        timedOut,
        err,
      );
    } finally {
      cancelTimer();
    }
  }

  /** The answer when it is a success; an {@link ApiError} otherwise. */
  private check(answer: Answer): Answer {
    if (answer.status >= 200 && answer.status < 300) return answer;
    let code = `http_${answer.status}`;
    let message = answer.text;
    try {
      const parsed = JSON.parse(answer.text) as { error?: { code?: unknown; message?: unknown } };
      if (typeof parsed.error?.code === "string" && typeof parsed.error.message === "string") {
        code = parsed.error.code;
        message = parsed.error.message;
      }
    } catch {
      // Not the server's error JSON (a proxy in between): the body is the message.
    }
    const seconds = answer.retryAfter === null ? Number.NaN : Number(answer.retryAfter.trim());
    throw new ApiError(answer.status, code, message, Number.isFinite(seconds) ? seconds : undefined);
  }

  private parse<T>(answer: Answer): T {
    try {
      return JSON.parse(answer.text) as T;
    } catch (err) {
      throw new BadAnswerError(answer.status, describe(err));
    }
  }
}

/** A whole HTTP answer. */
interface Answer {
  status: number;
  text: string;
  retryAfter: string | null;
}

/** A path segment, escaped (ids are URL-safe; anything else must not change the path). */
function seg(value: string): string {
  return encodeURIComponent(value);
}

function describe(err: unknown): string {
  if (err instanceof Error) {
    const cause = (err as { cause?: unknown }).cause;
    return cause instanceof Error ? `${err.message} (${cause.message})` : err.message;
  }
  return String(err);
}
