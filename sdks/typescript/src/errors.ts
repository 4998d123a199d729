/**
 * Errors thrown by the client.
 *
 * Every error the server answers (`{"code": "...", "message": "..."}` with a 4xx or 5xx status)
 * becomes a {@link SessionboxError} (or one of its subclasses, chosen by status) carrying the
 * server's `code`, `message` and HTTP `status`. Failures before an answer (the connection, a
 * client-side timeout) are {@link SessionboxConnectionError} and {@link SessionboxTimeoutError},
 * which are `SessionboxError`s too, with `status` 0.
 *
 * @packageDocumentation
 */

/**
 * The error codes the server documents. The server may add codes; an unknown one is kept as it
 * is, so `code` is typed as this union or any string.
 */
export type KnownErrorCode =
  | "invalid_id"
  | "invalid_path"
  | "invalid_request"
  | "unauthorized"
  | "forbidden"
  | "outside_workspace"
  | "not_found"
  | "method_not_allowed"
  | "conflict"
  | "already_exists"
  | "too_large"
  | "range_not_satisfiable"
  | "upgrade_required"
  | "busy"
  | "timed_out"
  | "runtime_unavailable"
  | "unavailable"
  | "backend_error"
  | "not_ready";

/** Codes the client itself uses for failures that have no server answer. */
export type ClientErrorCode = "connection_error" | "client_timeout" | "invalid_response";

/** A server error code, a client error code, or a code this SDK does not know yet. */
export type ErrorCode = KnownErrorCode | ClientErrorCode | (string & {});

/** Options of {@link SessionboxError}'s constructor. */
export interface SessionboxErrorOptions {
  /** The underlying cause (a network error, an abort reason). */
  cause?: unknown;
  /** The HTTP method of the request that failed. */
  method?: string;
  /** The URL of the request that failed. */
  url?: string;
}

/**
 * An error answered by the sessionbox server, or a failure to get an answer.
 *
 * Discriminate on {@link SessionboxError.code} (the server's stable code, such as `not_found`
 * or `invalid_id`) or with `instanceof` on the subclasses ({@link NotFoundError}, ...), which
 * are chosen by HTTP status.
 *
 * @example
 * ```ts
 * try {
 *   await client.readText("chat-42", "missing.txt");
 * } catch (err) {
 *   if (err instanceof SessionboxError && err.code === "not_found") { ... }
 * }
 * ```
 */
export class SessionboxError extends Error {
  /** The server's error code (`not_found`, `invalid_request`, ...) or a client code. */
  readonly code: ErrorCode;
  /** The HTTP status of the answer; 0 when there was none (connection failure, timeout). */
  readonly status: number;
  /** The HTTP method of the request, when known. */
  readonly method: string | undefined;
  /** The URL of the request, when known (never carries the API key). */
  readonly url: string | undefined;

  constructor(code: ErrorCode, message: string, status: number, options: SessionboxErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.status = status;
    this.method = options.method;
    this.url = options.url;
  }
}

/** 400: a malformed request (`invalid_id`, `invalid_path`, `invalid_request`). */
export class BadRequestError extends SessionboxError {}
/** 401: a missing, unknown or revoked API key (`unauthorized`), or an invalid preview link. */
export class UnauthorizedError extends SessionboxError {}
/** 403: a path outside the workspace (`outside_workspace`), or a request the API key's scope does not allow, or a refused origin (`forbidden`; the message names the rule). */
export class ForbiddenError extends SessionboxError {}
/** 404: no such conversation, file, command, snapshot, template, skill or route (`not_found`). */
export class NotFoundError extends SessionboxError {}
/** 409: `conflict` (not unique, not empty, wrong state) or `already_exists`. */
export class ConflictError extends SessionboxError {}
/** 413: a body or value past a limit (`too_large`); the message names the limit. */
export class TooLargeError extends SessionboxError {}
/** 416: a `Range` the file cannot satisfy (`range_not_satisfiable`). */
export class RangeNotSatisfiableError extends SessionboxError {}
/** 422: well-formed JSON of the wrong shape, an unknown field or query parameter (`invalid_request`). */
export class UnprocessableError extends SessionboxError {}
/** 429: a limit reached (`busy`); the message names it. Retry later. */
export class BusyError extends SessionboxError {}
/**
 * 5xx: `timed_out` (504), `runtime_unavailable` (503), `unavailable` (503: the store cannot be
 * reached or its disk is full; retry), `backend_error` (500), `not_ready` (503).
 */
export class ServerError extends SessionboxError {}
/** No answer: the connection failed (`connection_error`, `status` 0). */
export class SessionboxConnectionError extends SessionboxError {}
/** No answer within the client's timeout (`client_timeout`, `status` 0). */
export class SessionboxTimeoutError extends SessionboxError {}

/** The subclass for an HTTP status. */
export function errorClassForStatus(status: number): typeof SessionboxError {
  switch (status) {
    case 400:
      return BadRequestError;
    case 401:
      return UnauthorizedError;
    case 403:
      return ForbiddenError;
    case 404:
      return NotFoundError;
    case 409:
      return ConflictError;
    case 413:
      return TooLargeError;
    case 416:
      return RangeNotSatisfiableError;
    case 422:
      return UnprocessableError;
    case 429:
      return BusyError;
    default:
      return status >= 500 ? ServerError : SessionboxError;
  }
}

const STATUS_OF_CODE: Record<string, number> = {
  invalid_id: 400,
  invalid_path: 400,
  invalid_request: 400,
  unauthorized: 401,
  forbidden: 403,
  outside_workspace: 403,
  not_found: 404,
  method_not_allowed: 405,
  conflict: 409,
  already_exists: 409,
  too_large: 413,
  range_not_satisfiable: 416,
  upgrade_required: 426,
  busy: 429,
  backend_error: 500,
  runtime_unavailable: 503,
  unavailable: 503,
  not_ready: 503,
  timed_out: 504,
};

/**
 * The error for an `error` event of an event stream (`{"code","message"}` after the stream's
 * 200): the same class and `status` the server answers that code with on a JSON route, so that
 * `exec` and `execStream` fail alike (500 for an unknown code).
 */
export function errorFromStreamEvent(code: string, message: string, options: SessionboxErrorOptions = {}): SessionboxError {
  const status = STATUS_OF_CODE[code] ?? 500;
  const Class = errorClassForStatus(status);
  return new Class(code, message, status, options);
}

/**
 * Builds the error for a failed response, reading its JSON body `{"code","message"}`. A body
 * that is not such JSON keeps the status, with code `http_<status>` and the body's text as the
 * message.
 */
export async function errorFromResponse(response: Response, method?: string): Promise<SessionboxError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // The body could not be read; the status still says what happened.
  }
  let code: string = `http_${response.status}`;
  let message = text || response.statusText || `HTTP ${response.status}`;
  try {
    const body: unknown = JSON.parse(text);
    if (body !== null && typeof body === "object") {
      const { code: c, message: m } = body as { code?: unknown; message?: unknown };
      if (typeof c === "string") code = c;
      if (typeof m === "string") message = m;
    }
  } catch {
    // Not JSON: keep the text.
  }
  const Class = errorClassForStatus(response.status);
  return new Class(code, message, response.status, { method, url: response.url });
}
