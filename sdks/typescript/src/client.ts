/**
 * The sessionbox HTTP API client.
 *
 * @packageDocumentation
 */

import {
  SessionboxConnectionError,
  SessionboxError,
  SessionboxTimeoutError,
  errorFromResponse,
  errorFromStreamEvent,
} from "./errors.js";
import type { operations } from "./generated/openapi.js";
import { ConversationClient } from "./conversation.js";
import { base64ToBytes, bytesToBase64, readServerSentEvents } from "./sse.js";
import type {
  BackgroundCommand,
  CommandLogsView,
  Conversation,
  ConversationPage,
  DirEntry,
  DiskUsage,
  EditResult,
  EgressVerdict,
  ErrorBody,
  ExecBody,
  ExecExit,
  ExecResult,
  FileStat,
  GrepMatch,
  NetworkPolicy,
  NetworkPolicyRequest,
  OpenedConversation,
  PreviewLinkView,
  Restored,
  SkillSummary,
  SkillView,
  Snapshot,
  Template,
  UploadedFile,
  WatchEvent,
} from "./types.js";

/** Options of the {@link Client} constructor. */
export interface ClientOptions {
  /** The server's base URL, e.g. `http://127.0.0.1:7070` (a path prefix is kept). */
  baseUrl: string;
  /**
   * The API key (`sbk_...`), sent as `Authorization: Bearer KEY`. Leave it out only for a
   * loopback server whose store has never had a key (open mode).
   */
  apiKey?: string;
  /**
   * Default timeout of each request, in milliseconds, until the whole answer is read (default
   * 60000; 0 turns it off). Streaming methods ({@link Client.execStream},
   * {@link Client.followCommand}, {@link Client.downloadFile}, {@link Client.exportSnapshot},
   * {@link Client.watch}) do not use it: give them a `signal` or `timeoutMs` of their own.
   */
  timeoutMs?: number;
  /** Headers added to every request. */
  headers?: Record<string, string>;
  /** The `fetch` to use (default the global one). */
  fetch?: typeof fetch;
}

/** Options every method takes. */
export interface RequestOptions {
  /** Aborts the request (and, for streams, the stream). */
  signal?: AbortSignal;
  /** Timeout of this request in milliseconds, instead of the client's (0: none). */
  timeoutMs?: number;
}

/** Options of {@link Client.exec}, {@link Client.execStream} and {@link Client.spawn}. */
export interface ExecOptions extends RequestOptions {
  /** Working directory, a workspace path (default the workspace root). */
  cwd?: string;
  /** Variables added to the base environment. */
  env?: Record<string, string>;
  /** The command's timeout on the server, 1-600000 ms (default 120000). */
  commandTimeoutMs?: number;
  /** Text or bytes for stdin (at most 1 MiB). Bytes travel as `stdin_base64`. */
  stdin?: string | Uint8Array;
  /** Cap on each of stdout and stderr in bytes (1-16777216; default 1 MiB). */
  outputLimit?: number;
}

/** Options of {@link Client.spawn}. */
export interface SpawnOptions extends ExecOptions {
  /**
   * Keep the command's stdin open, to write with {@link Client.writeStdin} (runtimes `isolated`
   * and `opensandbox`; `host` and `aio` answer 503 `runtime_unavailable`). Not with `stdin`.
   */
  keepStdinOpen?: boolean;
}

/** A piece of a streamed command's output. */
export interface OutputEvent {
  /** Which stream it was written to. */
  type: "stdout" | "stderr";
  /** The output as text (invalid UTF-8 replaced by U+FFFD). */
  text: string;
  /** The exact bytes (from `base64` when the server sent it, else the UTF-8 of `text`). */
  bytes: Uint8Array;
}

/** The last event of a streamed command: how it ended. */
export interface ExitEvent extends ExecExit {
  type: "exit";
}

/** An event of {@link Client.execStream}: output as it is written, then `exit`. */
export type ExecStreamEvent = OutputEvent | ExitEvent;

/** An event of {@link Client.followCommand}: output as it is written, then `exit`. */
export type CommandStreamEvent = OutputEvent | CommandExitEvent;

/** The last event of {@link Client.followCommand}: the command's final status. */
export type CommandExitEvent = { type: "exit" } & BackgroundCommand;

/** Byte offsets into a background command's output. */
export interface LogOffsets {
  /** Bytes of stdout already read (default 0). */
  stdoutOffset?: number;
  /** Bytes of stderr already read (default 0). */
  stderrOffset?: number;
}

/** Options of {@link Client.commandLogs}. */
export interface CommandLogsOptions extends RequestOptions, LogOffsets {
  /** Long-poll: with nothing new and the command running, wait up to this long (at most 30000 ms). */
  waitMs?: number;
}

/** Options of {@link Client.followCommand}. */
export interface FollowOptions extends RequestOptions, LogOffsets {}

/** A body the client can send as a file: bytes, text (UTF-8), a `Blob` or an `ArrayBuffer`. */
export type FileData = Uint8Array | ArrayBuffer | Blob | string;

/** Options of {@link Client.readFile} and {@link Client.downloadFile}. */
export interface ReadFileOptions extends RequestOptions {
  /** A byte range, both ends included (`Range: bytes=start-end`); `end` defaults to the end. */
  range?: { start: number; end?: number };
}

/** One file of {@link Client.uploadFiles}. */
export interface UploadFile {
  /** The workspace path to write. */
  path: string;
  /** Its contents. */
  data: FileData;
}

/** Options of {@link Client.grep}. */
export interface GrepOptions extends RequestOptions {
  /** File or directory to search (default the whole workspace). */
  path?: string;
  /** Only files whose workspace-relative path matches this glob. */
  glob?: string;
  /** Match case-insensitively. */
  caseInsensitive?: boolean;
  /** Stop after this many matches. */
  maxMatches?: number;
}

/** Options of the egress-log methods. */
export interface EgressLogOptions extends RequestOptions {
  /** RFC 3339 time or an age (`15m`, `2h`): only verdicts since then. */
  since?: string;
  /** At most this many (1-1000; default 100). */
  limit?: number;
}

/** Options of {@link Client.listConversations}. */
export interface ListConversationsOptions extends RequestOptions {
  /** Page size, 1-1000 (default 100). */
  limit?: number;
  /** The `next_cursor` of the previous page. */
  cursor?: string;
}

/** An event of {@link Client.watch}: a change beneath the watched directory. */
export type WatchStreamItem = WatchEvent;

const DEFAULT_TIMEOUT_MS = 60_000;

type Query = Record<string, string | number | boolean | undefined | null>;

interface InternalRequest extends RequestOptions {
  method: string;
  path: string;
  query?: Query;
  json?: unknown;
  body?: BodyInit | ReadableStream<Uint8Array>;
  contentType?: string;
  headers?: Record<string, string>;
  /** Statuses that are success (default any 2xx). */
  streaming?: boolean;
}

/** `AbortSignal.any`, with a fallback for runtimes before it (Node < 20.3, older browsers). */
function anySignal(signals: AbortSignal[]): AbortSignal {
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const controller = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true, signal: controller.signal });
  }
  return controller.signal;
}

/** Encodes an id or name as one path segment. */
function segment(value: string): string {
  return encodeURIComponent(value);
}

/**
 * Encodes a workspace path for `.../files/{path}`: each part percent-encoded, `/` kept (an
 * absolute path under the workspace root keeps its leading `/`). A path with a `.` or `..`
 * part is sent as one segment (`/` as `%2F`): URL parsers (`fetch`'s included) would otherwise
 * resolve those parts away before the request is sent, so the server could not judge the path
 * itself (and a `..` could reach another route).
 */
function filePath(path: string): string {
  const parts = path.split("/");
  if (parts.some((p) => p === "." || p === "..")) return encodeURIComponent(path);
  return parts.map(encodeURIComponent).join("/");
}

function toBody(data: FileData): BodyInit {
  if (typeof data === "string") return new TextEncoder().encode(data);
  // A Uint8Array over any buffer is a valid body; TypeScript's DOM types want an ArrayBuffer one.
  return data as BodyInit;
}

/**
 * A client of one sessionbox server (`sessionbox serve`), for one API key (one tenant).
 *
 * Every method takes a conversation id (1-128 ASCII letters, digits, `.`, `_`, `-`) where it
 * acts on a conversation, and `RequestOptions` last (`signal`, `timeoutMs`). Failures throw
 * {@link SessionboxError}.
 *
 * @example
 * ```ts
 * import { Client } from "sessionbox";
 * const client = new Client({ baseUrl: "http://127.0.0.1:7070", apiKey: process.env.SESSIONBOX_API_KEY });
 * const result = await client.exec("chat-42", "echo hello > a.txt && cat a.txt");
 * console.log(result.stdout); // "hello\n"
 * ```
 */
export class Client {
  /** The base URL, without a trailing `/`. */
  readonly baseUrl: string;
  readonly #apiKey: string | undefined;
  readonly #timeoutMs: number;
  readonly #headers: Record<string, string>;
  readonly #fetch: typeof fetch;

  /** Makes a client; no request is sent until a method is called. */
  constructor(options: ClientOptions) {
    if (!options || typeof options.baseUrl !== "string" || options.baseUrl === "") {
      throw new TypeError("sessionbox: `baseUrl` is required");
    }
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.#apiKey = options.apiKey;
    this.#timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.#headers = { ...(options.headers ?? {}) };
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("sessionbox: no global fetch; pass `fetch`");
    this.#fetch = f.bind(globalThis);
  }

  // ------------------------------------------------------------------------------------------
  // Transport

  #url(path: string, query?: Query): string {
    let url = this.baseUrl + path;
    if (query) {
      const params = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) {
        if (v !== undefined && v !== null) params.append(k, String(v));
      }
      const text = params.toString();
      if (text) url += "?" + text;
    }
    return url;
  }

  /**
   * Sends a request; answers the response when its status is 2xx, else throws the server's
   * error. The timeout (unless streaming) covers reading the body too: the signal stays armed.
   */
  async #send(req: InternalRequest): Promise<Response> {
    const timeoutMs = req.timeoutMs ?? (req.streaming ? 0 : this.#timeoutMs);
    const signals: AbortSignal[] = [];
    if (req.signal) signals.push(req.signal);
    let timeoutSignal: AbortSignal | undefined;
    if (timeoutMs > 0) {
      timeoutSignal = AbortSignal.timeout(timeoutMs);
      signals.push(timeoutSignal);
    }
    const signal = signals.length === 0 ? undefined : signals.length === 1 ? signals[0] : anySignal(signals);

    const headers: Record<string, string> = { ...this.#headers, ...(req.headers ?? {}) };
    if (this.#apiKey !== undefined) headers["authorization"] = `Bearer ${this.#apiKey}`;
    let body: BodyInit | ReadableStream<Uint8Array> | undefined = req.body;
    if (req.json !== undefined) {
      body = JSON.stringify(req.json);
      headers["content-type"] = "application/json";
    } else if (req.contentType !== undefined) {
      headers["content-type"] = req.contentType;
    }
    const url = this.#url(req.path, req.query);
    const init: RequestInit & { duplex?: "half" } = { method: req.method, headers };
    if (body !== undefined) init.body = body as BodyInit;
    if (body instanceof ReadableStream) init.duplex = "half";
    if (signal) init.signal = signal;

    let response: Response;
    try {
      response = await this.#fetch(url, init);
    } catch (err) {
      throw this.#failure(err, req, url, timeoutSignal, timeoutMs);
    }
    if (!response.ok) {
      throw await errorFromResponse(response, req.method);
    }
    return response;
  }

  #failure(
    err: unknown,
    req: InternalRequest,
    url: string,
    timeoutSignal: AbortSignal | undefined,
    timeoutMs: number,
  ): unknown {
    if (err instanceof SessionboxError) return err;
    if (timeoutSignal?.aborted && !req.signal?.aborted) {
      return new SessionboxTimeoutError(
        "client_timeout",
        `${req.method} ${req.path}: no complete answer within ${timeoutMs} ms`,
        0,
        { cause: err, method: req.method, url },
      );
    }
    if (req.signal?.aborted) return req.signal.reason ?? err;
    const detail = err instanceof Error ? err.message : String(err);
    return new SessionboxConnectionError("connection_error", `${req.method} ${req.path}: ${detail}`, 0, {
      cause: err,
      method: req.method,
      url,
    });
  }

  /** Reads a body; a timeout or abort while reading becomes the same errors as {@link #send}. */
  async #read<T>(req: InternalRequest, read: () => Promise<T>): Promise<T> {
    try {
      return await read();
    } catch (err) {
      throw Client.#readFailure(req, err);
    }
  }

  /** A failure while reading a body: the client's timeout becomes {@link SessionboxTimeoutError}. */
  static #readFailure(req: InternalRequest, err: unknown): unknown {
    if (err instanceof SessionboxError) return err;
    const aborted = req.signal?.aborted ?? false;
    if (!aborted && err instanceof DOMException && err.name === "TimeoutError") {
      return new SessionboxTimeoutError("client_timeout", `${req.method} ${req.path}: the answer did not end within the timeout`, 0, {
        cause: err,
        method: req.method,
      });
    }
    return err;
  }

  async #json<T>(req: InternalRequest): Promise<T> {
    const response = await this.#send(req);
    const text = await this.#read(req, () => response.text());
    try {
      return JSON.parse(text) as T;
    } catch (err) {
      throw new SessionboxError("invalid_response", `${req.method} ${req.path}: the answer is not JSON`, response.status, {
        cause: err,
        method: req.method,
        url: response.url,
      });
    }
  }

  async #empty(req: InternalRequest): Promise<void> {
    const response = await this.#send(req);
    await this.#read(req, () => response.arrayBuffer());
  }

  async *#events(req: InternalRequest): AsyncGenerator<{ event: string; data: unknown }, void, undefined> {
    const response = await this.#send({ ...req, streaming: true, headers: { ...req.headers, accept: "text/event-stream" } });
    const type = response.headers.get("content-type") ?? "";
    if (!type.startsWith("text/event-stream") || response.body === null) {
      await response.body?.cancel();
      throw new SessionboxError("invalid_response", `${req.method} ${req.path}: expected an event stream, got ${type || "no body"}`, response.status, {
        method: req.method,
        url: response.url,
      });
    }
    // Leaving early (break, an error) returns this generator, whose `finally` returns the
    // reader's, which cancels the body: the connection closes.
    const events = readServerSentEvents(response.body);
    try {
      for (;;) {
        let next: IteratorResult<{ event: string; data: string }>;
        try {
          next = await events.next();
        } catch (err) {
          throw Client.#readFailure(req, err);
        }
        if (next.done) return;
        const sse = next.value;
        let data: unknown;
        try {
          data = JSON.parse(sse.data);
        } catch {
          data = sse.data;
        }
        if (sse.event === "error") {
          const e = (data ?? {}) as Partial<ErrorBody>;
          throw errorFromStreamEvent(e.code ?? "backend_error", e.message ?? String(sse.data), {
            method: req.method,
            url: response.url,
          });
        }
        yield { event: sse.event, data };
      }
    } finally {
      await events.return(undefined);
    }
  }


  static #output(event: string, data: unknown): OutputEvent {
    const o = data as { text?: string; base64?: string | null };
    const text = o.text ?? "";
    const bytes = typeof o.base64 === "string" ? base64ToBytes(o.base64) : new TextEncoder().encode(text);
    return { type: event as "stdout" | "stderr", text, bytes };
  }

  static #execBody(command: string, options: ExecOptions): ExecBody {
    const body: ExecBody = { command };
    if (options.cwd !== undefined) body.cwd = options.cwd;
    if (options.env !== undefined) body.env = options.env;
    if (options.commandTimeoutMs !== undefined) body.timeout_ms = options.commandTimeoutMs;
    if (options.outputLimit !== undefined) body.output_limit = options.outputLimit;
    if (typeof options.stdin === "string") body.stdin = options.stdin;
    else if (options.stdin instanceof Uint8Array) body.stdin_base64 = bytesToBase64(options.stdin);
    return body;
  }

  static #conv(id: string): string {
    return `/v1/conversations/${segment(id)}`;
  }

  // ------------------------------------------------------------------------------------------
  // Server

  /** `GET /healthz`: liveness (no key needed). */
  health(options: RequestOptions = {}): Promise<{ status: string }> {
    return this.#json({ ...options, method: "GET", path: "/healthz" });
  }

  /** `GET /readyz`: store and runtime reachable; a 503 `not_ready` throws {@link ServerError}. */
  ready(options: RequestOptions = {}): Promise<{ status: string; runtime?: string }> {
    return this.#json({ ...options, method: "GET", path: "/readyz" });
  }

  /** `GET /metrics`: the server's Prometheus metrics, as text. */
  async metrics(options: RequestOptions = {}): Promise<string> {
    const req: InternalRequest = { ...options, method: "GET", path: "/metrics" };
    const response = await this.#send(req);
    return this.#read(req, () => response.text());
  }

  /** `GET /v1/openapi.json`: the server's OpenAPI 3.1 document. */
  openapi(options: RequestOptions = {}): Promise<Record<string, unknown>> {
    return this.#json({ ...options, method: "GET", path: "/v1/openapi.json" });
  }

  // ------------------------------------------------------------------------------------------
  // Conversations

  /**
   * The conversation `id` as an object whose methods need no id (sends nothing).
   *
   * @example
   * ```ts
   * const chat = client.conversation("chat-42");
   * await chat.exec("ls");
   * ```
   */
  conversation(id: string): ConversationClient {
    return new ConversationClient(this, id);
  }

  /**
   * `POST /v1/conversations/{id}`: opens a conversation, creating its workspace and sandbox
   * when it is new (idempotent). `created` says which; `previous_expired_at` is set when it was
   * made anew because the last one of this id expired (its files are gone).
   */
  openConversation(id: string, options: RequestOptions = {}): Promise<OpenedConversation> {
    return this.#json({ ...options, method: "POST", path: Client.#conv(id) });
  }

  /** The same as {@link Client.openConversation}: creates the conversation when it is new. */
  createConversation(id: string, options: RequestOptions = {}): Promise<OpenedConversation> {
    return this.openConversation(id, options);
  }

  /**
   * `GET /v1/conversations`: one page of this tenant's conversations, by id. Pass the page's
   * `next_cursor` as `cursor` for the next one (`null` on the last).
   */
  listConversations(options: ListConversationsOptions = {}): Promise<ConversationPage> {
    return this.#json({
      ...options,
      method: "GET",
      path: "/v1/conversations",
      query: { limit: options.limit, cursor: options.cursor },
    });
  }

  /** Every conversation of the tenant, following the cursors page by page. */
  async *conversations(options: Omit<ListConversationsOptions, "cursor"> = {}): AsyncGenerator<Conversation, void, undefined> {
    let cursor: string | undefined;
    do {
      const page = await this.listConversations(cursor === undefined ? options : { ...options, cursor });
      yield* page.conversations;
      cursor = page.next_cursor ?? undefined;
    } while (cursor !== undefined);
  }

  /**
   * `GET /v1/conversations/{id}`: one conversation, with its `usage` (operations since its
   * creation) and `disk` (its disk usage, where the runtime has a quota). 404 when absent.
   */
  getConversation(id: string, options: RequestOptions = {}): Promise<Conversation> {
    return this.#json({ ...options, method: "GET", path: Client.#conv(id) });
  }

  /**
   * Renews a conversation's expiry (its time to live counts from its last use) without creating
   * it: checks that it exists (404 `not_found` otherwise, also when it has expired), then opens it,
   * which is a use. Answers the conversation as it is now. The API has no route of its own for
   * this: every use renews.
   */
  async renewConversation(id: string, options: RequestOptions = {}): Promise<Conversation> {
    const current = await this.getConversation(id, options);
    if (current.state !== "active") {
      throw new SessionboxError("not_found", `conversation ${JSON.stringify(id)} is ${current.state}`, 404);
    }
    const opened = await this.openConversation(id, options);
    return opened.conversation;
  }

  /**
   * `DELETE /v1/conversations/{id}`: destroys the conversation: its processes, sandbox,
   * workspace, record, own network policy and egress log. Succeeds also when it is absent.
   */
  destroyConversation(id: string, options: RequestOptions = {}): Promise<void> {
    return this.#empty({ ...options, method: "DELETE", path: Client.#conv(id) });
  }

  /**
   * The workspace's disk usage against its quota (the `disk` of {@link Client.getConversation}),
   * or `null` where the conversation has no disk quota (a runtime other than `isolated`, a
   * server not running as root, the quota turned off).
   */
  async diskUsage(id: string, options: RequestOptions = {}): Promise<DiskUsage | null> {
    const conversation = await this.getConversation(id, options);
    return conversation.disk ?? null;
  }

  // ------------------------------------------------------------------------------------------
  // Exec

  /**
   * `POST /v1/conversations/{id}/exec`: runs `/bin/sh -c command` (creating the conversation)
   * and answers when it has ended. A command that fails or times out still resolves: look at
   * `exit_code` and `timed_out`. When output is not valid UTF-8, `stdout_base64` /
   * `stderr_base64` hold the exact bytes (see {@link outputBytes} or {@link execBytes}).
   */
  exec(id: string, command: string, options: ExecOptions = {}): Promise<ExecResult> {
    return this.#json({ ...options, method: "POST", path: `${Client.#conv(id)}/exec`, json: Client.#execBody(command, options) });
  }

  /**
   * The same as {@link Client.exec}, streamed: output events as the command writes them (in
   * order), then one `exit` event. Breaking out of the loop closes the stream, which kills the
   * command's process group. An `error` event from the server (the command could not run, e.g.
   * a `cwd` that does not exist) throws the {@link SessionboxError} a JSON `exec` would (same
   * code, class and status).
   *
   * @example
   * ```ts
   * for await (const ev of client.execStream("chat-42", "make test")) {
   *   if (ev.type === "exit") console.log("exit", ev.exit_code);
   *   else process.stdout.write(ev.bytes);
   * }
   * ```
   */
  async *execStream(id: string, command: string, options: ExecOptions = {}): AsyncGenerator<ExecStreamEvent, void, undefined> {
    const req: InternalRequest = {
      ...options,
      method: "POST",
      path: `${Client.#conv(id)}/exec`,
      json: Client.#execBody(command, options),
    };
    for await (const { event, data } of this.#events(req)) {
      if (event === "stdout" || event === "stderr") yield Client.#output(event, data);
      else if (event === "exit") yield { type: "exit", ...(data as ExecExit) };
    }
  }

  // ------------------------------------------------------------------------------------------
  // Background commands

  /**
   * Starts a command in the background (`exec` with `"background": true`; creates the
   * conversation) and answers its status at once (`id`, `running: true`, ...). It runs outside
   * the conversation's queue; follow it with {@link Client.commandLogs} or
   * {@link Client.followCommand}.
   */
  spawn(id: string, command: string, options: SpawnOptions = {}): Promise<BackgroundCommand> {
    const body = Client.#execBody(command, options);
    body.background = true;
    if (options.keepStdinOpen) body.keep_stdin_open = true;
    return this.#json({ ...options, method: "POST", path: `${Client.#conv(id)}/exec`, json: body });
  }

  /** `GET .../commands`: the background commands, running ones and recently finished ones, oldest first. */
  async listCommands(id: string, options: RequestOptions = {}): Promise<BackgroundCommand[]> {
    const list = await this.#json<{ commands: BackgroundCommand[] }>({ ...options, method: "GET", path: `${Client.#conv(id)}/commands` });
    return list.commands;
  }

  /** `GET .../commands/{cmd}`: one background command's status. */
  getCommand(id: string, commandId: string, options: RequestOptions = {}): Promise<BackgroundCommand> {
    return this.#json({ ...options, method: "GET", path: `${Client.#conv(id)}/commands/${segment(commandId)}` });
  }

  /**
   * `GET .../commands/{cmd}/logs`: output after the given byte offsets (at most 1 MiB of each
   * stream), with the offsets to pass next time. `waitMs` long-polls.
   */
  commandLogs(id: string, commandId: string, options: CommandLogsOptions = {}): Promise<CommandLogsView> {
    const query: operations["command_logs"]["parameters"]["query"] = {};
    if (options.stdoutOffset !== undefined) query.stdout_offset = options.stdoutOffset;
    if (options.stderrOffset !== undefined) query.stderr_offset = options.stderrOffset;
    if (options.waitMs !== undefined) query.wait_ms = options.waitMs;
    return this.#json({
      ...options,
      method: "GET",
      path: `${Client.#conv(id)}/commands/${segment(commandId)}/logs`,
      query,
    });
  }

  /**
   * Follows a background command live from the given offsets (the logs route as an event
   * stream): output events as it writes, then one `exit` event with its final status. Breaking
   * out leaves the command running.
   */
  async *followCommand(id: string, commandId: string, options: FollowOptions = {}): AsyncGenerator<CommandStreamEvent, void, undefined> {
    const req: InternalRequest = {
      ...options,
      method: "GET",
      path: `${Client.#conv(id)}/commands/${segment(commandId)}/logs`,
      query: { stdout_offset: options.stdoutOffset, stderr_offset: options.stderrOffset },
    };
    for await (const { event, data } of this.#events(req)) {
      if (event === "stdout" || event === "stderr") yield Client.#output(event, data);
      else if (event === "exit") yield { ...(data as BackgroundCommand), type: "exit" };
    }
  }

  /**
   * `DELETE .../commands/{cmd}`: kills the command's process group and answers its final status
   * (`killed: true`); a command that had ended is answered as it was.
   */
  killCommand(id: string, commandId: string, options: RequestOptions = {}): Promise<BackgroundCommand> {
    return this.#json({ ...options, method: "DELETE", path: `${Client.#conv(id)}/commands/${segment(commandId)}` });
  }

  /**
   * `POST .../commands/{cmd}/stdin`: writes bytes (or UTF-8 text; at most 1 MiB) to the stdin
   * of a command spawned with `keepStdinOpen`; `close` closes it after. Answers how many bytes
   * the command took.
   */
  async writeStdin(
    id: string,
    commandId: string,
    data: FileData,
    options: RequestOptions & { close?: boolean } = {},
  ): Promise<number> {
    const view = await this.#json<{ written: number }>({
      ...options,
      method: "POST",
      path: `${Client.#conv(id)}/commands/${segment(commandId)}/stdin`,
      query: { close: options.close ? "true" : undefined },
      body: toBody(data),
      contentType: "application/octet-stream",
    });
    return view.written;
  }

  /** `DELETE .../commands/{cmd}/stdin`: closes the command's stdin (it reads end of file). */
  closeStdin(id: string, commandId: string, options: RequestOptions = {}): Promise<void> {
    return this.#empty({ ...options, method: "DELETE", path: `${Client.#conv(id)}/commands/${segment(commandId)}/stdin` });
  }

  // ------------------------------------------------------------------------------------------
  // Files

  /** `GET .../files/{path}`: a file's bytes (or a `range` of them). */
  async readFile(id: string, path: string, options: ReadFileOptions = {}): Promise<Uint8Array> {
    const req = Client.#readRequest(id, path, options);
    const response = await this.#send(req);
    return new Uint8Array(await this.#read(req, () => response.arrayBuffer()));
  }

  /** A file decoded as UTF-8 text. */
  async readText(id: string, path: string, options: ReadFileOptions = {}): Promise<string> {
    return new TextDecoder().decode(await this.readFile(id, path, options));
  }

  /**
   * A file as a stream of bytes, read as the caller takes them (the server holds the file's
   * bytes in its output budget until they are read: read the stream to its end or cancel it).
   */
  async downloadFile(id: string, path: string, options: ReadFileOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const response = await this.#send({ ...Client.#readRequest(id, path, options), streaming: true });
    if (response.body === null) return new ReadableStream({ start: (c) => c.close() });
    return response.body;
  }

  static #readRequest(id: string, path: string, options: ReadFileOptions): InternalRequest {
    const headers: Record<string, string> = {};
    if (options.range) headers["range"] = `bytes=${options.range.start}-${options.range.end ?? ""}`;
    return { ...options, method: "GET", path: `${Client.#conv(id)}/files/${filePath(path)}`, headers };
  }

  /**
   * `PUT .../files/{path}`: writes a file atomically, parents created (creates the
   * conversation). Text is written as UTF-8.
   */
  writeFile(id: string, path: string, data: FileData, options: RequestOptions = {}): Promise<void> {
    return this.#empty({
      ...options,
      method: "PUT",
      path: `${Client.#conv(id)}/files/${filePath(path)}`,
      body: toBody(data),
      contentType: "application/octet-stream",
    });
  }

  /** Writes UTF-8 text to a file (see {@link Client.writeFile}). */
  writeText(id: string, path: string, text: string, options: RequestOptions = {}): Promise<void> {
    return this.writeFile(id, path, text, options);
  }

  /**
   * Writes a file from a stream of bytes, sent as it is read (a streaming request body,
   * `duplex: "half"`; in browsers this needs HTTP/2 or later and Chromium: elsewhere pass a
   * `Blob` to {@link Client.writeFile}). Bytes, text and `Blob`s are accepted as well.
   */
  uploadFile(
    id: string,
    path: string,
    data: ReadableStream<Uint8Array> | FileData,
    options: RequestOptions = {},
  ): Promise<void> {
    return this.#empty({
      ...options,
      method: "PUT",
      path: `${Client.#conv(id)}/files/${filePath(path)}`,
      body: data instanceof ReadableStream ? data : toBody(data),
      contentType: "application/octet-stream",
    });
  }

  /**
   * `POST .../files`: uploads several files in one `multipart/form-data` request (creates the
   * conversation). Every path is checked before anything is written.
   */
  async uploadFiles(id: string, files: UploadFile[], options: RequestOptions = {}): Promise<UploadedFile[]> {
    const form = new FormData();
    for (const file of files) {
      form.append("path", file.path);
      const blob = file.data instanceof Blob ? file.data : new Blob([toBody(file.data) as BlobPart]);
      const name = file.path.split("/").pop() || "file";
      form.append("file", blob, name);
    }
    const view = await this.#json<{ files: UploadedFile[] }>({
      ...options,
      method: "POST",
      path: `${Client.#conv(id)}/files`,
      body: form,
    });
    return view.files;
  }

  /**
   * `POST .../edit`: replaces `oldText` by `newText` in a file. `oldText` must occur exactly
   * once (409 `conflict` otherwise) unless `replaceAll`. Answers the number of replacements.
   */
  async editFile(
    id: string,
    path: string,
    oldText: string,
    newText: string,
    options: RequestOptions & { replaceAll?: boolean } = {},
  ): Promise<number> {
    const json: { path: string; old: string; new: string; replace_all?: boolean } = { path, old: oldText, new: newText };
    if (options.replaceAll !== undefined) json.replace_all = options.replaceAll;
    const result = await this.#json<EditResult>({ ...options, method: "POST", path: `${Client.#conv(id)}/edit`, json });
    return result.replacements;
  }

  /** `GET .../ls`: a directory's entries (default the workspace root). */
  async ls(id: string, path?: string, options: RequestOptions = {}): Promise<DirEntry[]> {
    const view = await this.#json<{ entries: DirEntry[] }>({ ...options, method: "GET", path: `${Client.#conv(id)}/ls`, query: { path } });
    return view.entries;
  }

  /** `GET .../glob`: workspace-relative paths matching a glob such as `src/**\/*.ts`. */
  async glob(id: string, pattern: string, options: RequestOptions = {}): Promise<string[]> {
    const view = await this.#json<{ paths: string[] }>({ ...options, method: "GET", path: `${Client.#conv(id)}/glob`, query: { pattern } });
    return view.paths;
  }

  /** `POST .../grep`: lines matching a (Rust `regex`) pattern. */
  async grep(id: string, pattern: string, options: GrepOptions = {}): Promise<GrepMatch[]> {
    const json: Record<string, unknown> = { pattern };
    if (options.path !== undefined) json.path = options.path;
    if (options.glob !== undefined) json.glob = options.glob;
    if (options.caseInsensitive !== undefined) json.case_insensitive = options.caseInsensitive;
    if (options.maxMatches !== undefined) json.max_matches = options.maxMatches;
    const view = await this.#json<{ matches: GrepMatch[] }>({ ...options, method: "POST", path: `${Client.#conv(id)}/grep`, json });
    return view.matches;
  }

  /** `GET .../stat`: a path's metadata (`kind`, `size`, `mode` as octal text, `modified_unix`). */
  stat(id: string, path: string, options: RequestOptions = {}): Promise<FileStat> {
    return this.#json({ ...options, method: "GET", path: `${Client.#conv(id)}/stat`, query: { path } });
  }

  /**
   * `DELETE .../files/{path}`: removes a file, link or directory; a non-empty directory needs
   * `recursive` (409 `conflict` otherwise).
   */
  remove(id: string, path: string, options: RequestOptions & { recursive?: boolean } = {}): Promise<void> {
    return this.#empty({
      ...options,
      method: "DELETE",
      path: `${Client.#conv(id)}/files/${filePath(path)}`,
      query: { recursive: options.recursive ? 1 : undefined },
    });
  }

  /** `POST .../mkdir`: makes a directory and its parents (creates the conversation). */
  mkdir(id: string, path: string, options: RequestOptions = {}): Promise<void> {
    return this.#empty({ ...options, method: "POST", path: `${Client.#conv(id)}/mkdir`, json: { path } });
  }

  /**
   * `GET .../watch`: changes beneath a directory (default the root) as they happen: `ready`
   * first, then `created`, `modified`, `deleted`, `moved`, ... and `ended` last. Breaking out
   * of the loop closes the watch. Runtime `aio` answers 503.
   */
  async *watch(id: string, options: RequestOptions & { path?: string } = {}): AsyncGenerator<WatchStreamItem, void, undefined> {
    const req: InternalRequest = { ...options, method: "GET", path: `${Client.#conv(id)}/watch`, query: { path: options.path } };
    for await (const { data } of this.#events(req)) {
      yield data as WatchEvent;
    }
  }

  /**
   * `POST .../previews`: a signed link (a path on this server, no key needed) to what a program
   * in the sandbox serves on `port`, valid `ttlSecs` (default 900).
   */
  createPreviewLink(id: string, port: number, options: RequestOptions & { ttlSecs?: number } = {}): Promise<PreviewLinkView> {
    const json: { port: number; ttl_secs?: number } = { port };
    if (options.ttlSecs !== undefined) json.ttl_secs = options.ttlSecs;
    return this.#json({ ...options, method: "POST", path: `${Client.#conv(id)}/previews`, json });
  }

  // ------------------------------------------------------------------------------------------
  // Network policies and the egress log

  /** `GET /v1/policy`: the tenant's network policy. */
  getTenantPolicy(options: RequestOptions = {}): Promise<NetworkPolicy> {
    return this.#json({ ...options, method: "GET", path: "/v1/policy" });
  }

  /**
   * `PUT /v1/policy`: sets the tenant's network policy (`{profile: "none"}` or
   * `{profile: "allowlist", allow: [...], deny: [...]}`); a refused rule is 422.
   */
  setTenantPolicy(policy: NetworkPolicyRequest, options: RequestOptions = {}): Promise<NetworkPolicy> {
    return this.#json({ ...options, method: "PUT", path: "/v1/policy", json: policy });
  }

  /** `DELETE /v1/policy`: removes the tenant's policy; answers the default now in force. */
  deleteTenantPolicy(options: RequestOptions = {}): Promise<NetworkPolicy> {
    return this.#json({ ...options, method: "DELETE", path: "/v1/policy" });
  }

  /** `GET .../policy`: the policy in force for a conversation and its `source`. */
  getConversationPolicy(id: string, options: RequestOptions = {}): Promise<NetworkPolicy> {
    return this.#json({ ...options, method: "GET", path: `${Client.#conv(id)}/policy` });
  }

  /** `PUT .../policy`: sets a conversation's own policy (wins over the tenant's; does not create it). */
  setConversationPolicy(id: string, policy: NetworkPolicyRequest, options: RequestOptions = {}): Promise<NetworkPolicy> {
    return this.#json({ ...options, method: "PUT", path: `${Client.#conv(id)}/policy`, json: policy });
  }

  /** `DELETE .../policy`: removes a conversation's own policy; answers the one now in force. */
  deleteConversationPolicy(id: string, options: RequestOptions = {}): Promise<NetworkPolicy> {
    return this.#json({ ...options, method: "DELETE", path: `${Client.#conv(id)}/policy` });
  }

  /** `GET /v1/egress-log`: the egress gateway's verdicts for the tenant, newest first. */
  async egressLog(options: EgressLogOptions = {}): Promise<EgressVerdict[]> {
    const view = await this.#json<{ entries: EgressVerdict[] }>({
      ...options,
      method: "GET",
      path: "/v1/egress-log",
      query: { since: options.since, limit: options.limit },
    });
    return view.entries;
  }

  /** `GET .../egress-log`: the egress verdicts of one conversation, newest first. */
  async conversationEgressLog(id: string, options: EgressLogOptions = {}): Promise<EgressVerdict[]> {
    const view = await this.#json<{ entries: EgressVerdict[] }>({
      ...options,
      method: "GET",
      path: `${Client.#conv(id)}/egress-log`,
      query: { since: options.since, limit: options.limit },
    });
    return view.entries;
  }

  // ------------------------------------------------------------------------------------------
  // Skills

  /** `GET /v1/skills`: the tenant's Agent Skills (name and description). */
  async listSkills(options: RequestOptions = {}): Promise<SkillSummary[]> {
    const view = await this.#json<{ skills: SkillSummary[] }>({ ...options, method: "GET", path: "/v1/skills" });
    return view.skills;
  }

  /** `GET .../skills/{name}`: loads a skill for a conversation: its SKILL.md body and `base_path`. */
  loadSkill(id: string, name: string, options: RequestOptions = {}): Promise<SkillView> {
    return this.#json({ ...options, method: "GET", path: `${Client.#conv(id)}/skills/${segment(name)}` });
  }

  // ------------------------------------------------------------------------------------------
  // Snapshots, fork, templates

  /**
   * `POST .../snapshots`: a snapshot of the workspace named `name` (background commands paused
   * meanwhile). `keepSeconds` 0 keeps it until deleted (default 30 days). 409 `already_exists`
   * for a taken name.
   */
  createSnapshot(id: string, name: string, options: RequestOptions & { keepSeconds?: number } = {}): Promise<Snapshot> {
    const json: { name: string; keep_seconds?: number } = { name };
    if (options.keepSeconds !== undefined) json.keep_seconds = options.keepSeconds;
    return this.#json({ ...options, method: "POST", path: `${Client.#conv(id)}/snapshots`, json });
  }

  /** `GET /v1/snapshots`: the tenant's snapshots, oldest first. */
  async listSnapshots(options: RequestOptions = {}): Promise<Snapshot[]> {
    const view = await this.#json<{ snapshots: Snapshot[] }>({ ...options, method: "GET", path: "/v1/snapshots" });
    return view.snapshots;
  }

  /** `GET /v1/snapshots/{name}`: one snapshot. */
  getSnapshot(name: string, options: RequestOptions = {}): Promise<Snapshot> {
    return this.#json({ ...options, method: "GET", path: `/v1/snapshots/${segment(name)}` });
  }

  /** `DELETE /v1/snapshots/{name}`: deletes a snapshot (also when absent; 409 while a template names it). */
  deleteSnapshot(name: string, options: RequestOptions = {}): Promise<void> {
    return this.#empty({ ...options, method: "DELETE", path: `/v1/snapshots/${segment(name)}` });
  }

  /**
   * `POST .../restore`: replaces the conversation's workspace by a snapshot (kill its
   * background commands first).
   */
  restoreSnapshot(id: string, snapshot: string, options: RequestOptions = {}): Promise<Restored> {
    return this.#json({ ...options, method: "POST", path: `${Client.#conv(id)}/restore`, json: { snapshot } });
  }

  /** `POST .../fork`: a new conversation `to`, a copy of this one as it is now (409 when `to` exists). */
  forkConversation(id: string, to: string, options: RequestOptions = {}): Promise<Restored> {
    return this.#json({ ...options, method: "POST", path: `${Client.#conv(id)}/fork`, json: { to } });
  }

  /** `POST /v1/snapshots/{name}/fork`: a new conversation `to` from a snapshot. */
  forkSnapshot(name: string, to: string, options: RequestOptions = {}): Promise<Restored> {
    return this.#json({ ...options, method: "POST", path: `/v1/snapshots/${segment(name)}/fork`, json: { to } });
  }

  /**
   * `GET /v1/snapshots/{name}/archive`: exports a snapshot as its zstd-compressed POSIX tar, as a
   * stream of bytes.
   */
  async exportSnapshot(name: string, options: RequestOptions = {}): Promise<ReadableStream<Uint8Array>> {
    const response = await this.#send({ ...options, method: "GET", path: `/v1/snapshots/${segment(name)}/archive`, streaming: true });
    if (response.body === null) return new ReadableStream({ start: (c) => c.close() });
    return response.body;
  }

  /** Exports a snapshot's archive (see {@link Client.exportSnapshot}) into memory. */
  async exportSnapshotBytes(name: string, options: RequestOptions = {}): Promise<Uint8Array> {
    const req: InternalRequest = { ...options, method: "GET", path: `/v1/snapshots/${segment(name)}/archive` };
    const response = await this.#send(req);
    return new Uint8Array(await this.#read(req, () => response.arrayBuffer()));
  }

  /**
   * `PUT /v1/snapshots/{name}/archive`: imports a tar, or a zstd-compressed tar, as a snapshot
   * named `name` (bytes, a `Blob` or a stream; the server checks it before keeping it).
   */
  importSnapshot(
    name: string,
    archive: ReadableStream<Uint8Array> | Uint8Array | ArrayBuffer | Blob,
    options: RequestOptions & { keepSeconds?: number } = {},
  ): Promise<Snapshot> {
    return this.#json({
      ...options,
      method: "PUT",
      path: `/v1/snapshots/${segment(name)}/archive`,
      query: { keep_seconds: options.keepSeconds },
      body: archive instanceof ReadableStream ? archive : (archive as BodyInit),
      contentType: "application/octet-stream",
    });
  }

  /** `GET /v1/templates`: the tenant's templates (`default` is restored into every new conversation). */
  async listTemplates(options: RequestOptions = {}): Promise<Template[]> {
    const view = await this.#json<{ templates: Template[] }>({ ...options, method: "GET", path: "/v1/templates" });
    return view.templates;
  }

  /** `PUT /v1/templates/{name}`: names a snapshot as a template. */
  setTemplate(name: string, snapshot: string, options: RequestOptions = {}): Promise<Template> {
    return this.#json({ ...options, method: "PUT", path: `/v1/templates/${segment(name)}`, json: { snapshot } });
  }

  /** `DELETE /v1/templates/{name}`: removes a template (its snapshot stays). */
  deleteTemplate(name: string, options: RequestOptions = {}): Promise<void> {
    return this.#empty({ ...options, method: "DELETE", path: `/v1/templates/${segment(name)}` });
  }

  /** `POST /v1/templates/{name}/fork`: a new conversation `to` from the snapshot a template names. */
  forkTemplate(name: string, to: string, options: RequestOptions = {}): Promise<Restored> {
    return this.#json({ ...options, method: "POST", path: `/v1/templates/${segment(name)}/fork`, json: { to } });
  }
}

/** The exact stdout and stderr bytes of an {@link ExecResult} (from base64 when present). */
export function execBytes(result: ExecResult): { stdout: Uint8Array; stderr: Uint8Array } {
  const enc = new TextEncoder();
  return {
    stdout: typeof result.stdout_base64 === "string" ? base64ToBytes(result.stdout_base64) : enc.encode(result.stdout),
    stderr: typeof result.stderr_base64 === "string" ? base64ToBytes(result.stderr_base64) : enc.encode(result.stderr),
  };
}
