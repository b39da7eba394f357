/**
 * Why a call or an outbox operation did not give its answer: one class per
 * kind of failure, and every error code of the API as a string literal type,
 * so that callers branch on `err.code` with the compiler's help.
 *
 * Status words (`IDLE`, `BUSY`, `OK`, `CANCELLED`, `FAILED`) are answers,
 * not errors: an error is always a request without an HTTP answer
 * ({@link TransportError}), an HTTP error answer ({@link ApiError}), an
 * answer that is not the expected JSON ({@link BadAnswerError}), or a
 * refusal of the outbox itself ({@link OutboxFullError}, {@link OutboxStoreError}).
 */

/**
 * Every error code the server sends in `{"version":1,"error":{"code",…}}`,
 * in the order the server declares them.
 */
export const ERROR_CODES = [
  "bad_request",
  "bad_json",
  "bad_content_type",
  "bad_idempotency_key",
  "bad_id",
  "bad_folder",
  "bad_path",
  "bad_query",
  "bad_limits",
  "bad_limit",
  "bad_webhook_url",
  "bad_admin_token",
  "results_mismatch",
  "unknown_recipient",
  "unauthorized",
  "forbidden",
  "not_found",
  "method_not_allowed",
  "request_timeout",
  "already_exists",
  "in_use",
  "not_empty",
  "admin_token_pinned",
  "body_too_large",
  "not_in_process",
  "not_in_doubt",
  "held_by_process",
  "storage_error",
  "storage_full",
  "not_ready",
  "stopping",
  "too_many_attempts",
  "too_busy",
  "internal",
] as const;

/** An error code of the API. */
export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * The codes of answers that may change when the same call is made again
 * unchanged: the server was recovering, stopping, short of disk or storage,
 * serving as many connections or bodies as it may, or the request body came
 * too slowly.
 */
const TRANSIENT_CODES: ReadonlySet<string> = new Set<ErrorCode>([
  "request_timeout",
  "storage_error",
  "storage_full",
  "not_ready",
  "stopping",
  "too_busy",
  "internal",
]);

/** The base class of every error this package throws. */
export class EstafetaError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message);
    this.name = new.target.name;
    if (options && "cause" in options) {
      Object.defineProperty(this, "cause", { value: options.cause, enumerable: false });
    }
  }
}

/** The request got no HTTP answer: connection refused or reset, DNS, timeout. */
export class TransportError extends EstafetaError {
  /** Whether the client gave up waiting (its `timeoutMs`) rather than the network failing. */
  readonly timedOut: boolean;

  constructor(message: string, timedOut: boolean, cause?: unknown) {
    super(message, { cause });
    this.timedOut = timedOut;
  }
}

/** The server answered with an HTTP error status and (usually) its error JSON. */
export class ApiError extends EstafetaError {
  /** The HTTP status: 400, 401, 403, 404, 408, 409, 413, 422, 500, 503, … */
  readonly status: number;
  /**
   * The server's error code; `http_<status>` when the answer was not the
   * error JSON (a proxy in between). A newer server may send a code this
   * client does not list: see {@link ApiError.knownCode}.
   */
  readonly code: ErrorCode | (string & {});
  /** The server's explanation (or the body, when it was not the error JSON). */
  readonly serverMessage: string;
  /** Seconds from the `Retry-After` header (503 answers), when given. */
  readonly retryAfterSeconds: number | undefined;

  constructor(status: number, code: string, serverMessage: string, retryAfterSeconds?: number) {
    super(`server answered ${status}: ${code}: ${serverMessage}`);
    this.status = status;
    this.code = code;
    this.serverMessage = serverMessage;
    this.retryAfterSeconds = retryAfterSeconds;
  }

  /** The code when it is one of {@link ERROR_CODES}, else `undefined`. */
  get knownCode(): ErrorCode | undefined {
    return (ERROR_CODES as readonly string[]).includes(this.code) ? (this.code as ErrorCode) : undefined;
  }
}

/** A success status whose body is not the JSON the call expects. */
export class BadAnswerError extends EstafetaError {
  /** The HTTP status of the answer. */
  readonly status: number;

  constructor(status: number, reason: string) {
    super(`unexpected answer body (${status}): ${reason}`);
    this.status = status;
  }
}

/** {@link Outbox.send} refused a message: the outbox holds its limit of unsent and failed messages. */
export class OutboxFullError extends EstafetaError {
  /** Messages held that are not sent (queued, sending or failed). */
  readonly held: number;
  /** The outbox's `maxEntries`. */
  readonly limit: number;

  constructor(held: number, limit: number) {
    super(
      `outbox full: ${held} messages not sent (limit ${limit}); ` +
        "wait for the sender, or remove or retry failed ones",
    );
    this.held = held;
    this.limit = limit;
  }
}

/** An outbox store could not read or write its entries (a damaged file, a full disk). */
export class OutboxStoreError extends EstafetaError {}

/** `err` is an {@link ApiError}, with the given code when one is given. */
export function isApiError(err: unknown, code?: ErrorCode): err is ApiError {
  return err instanceof ApiError && (code === undefined || err.code === code);
}

/**
 * Whether the same call may succeed later unchanged: no answer came
 * (network, timeout), or the server answered that it is recovering,
 * stopping, or short of storage (503, 500, 408). Any other answer will not
 * change by repeating the call.
 */
export function isTransient(err: unknown): boolean {
  if (err instanceof TransportError) return true;
  if (err instanceof ApiError) {
    return TRANSIENT_CODES.has(err.code) || err.status >= 500 || err.status === 408;
  }
  return false;
}
