/**
 * The official TypeScript SDK of sessionbox: isolated, resumable workspaces for AI-agent
 * conversations, over the HTTP API of `sessionbox serve`.
 *
 * Runs on Node >= 20 and in browsers: it uses only the global `fetch`, `ReadableStream`,
 * `TextEncoder`/`TextDecoder`, `atob`/`btoa`, `FormData`/`Blob` and `AbortSignal`.
 *
 * @packageDocumentation
 */

export { Client, execBytes } from "./client.js";
export { ConversationClient } from "./conversation.js";
export type {
  ClientOptions,
  CommandExitEvent,
  CommandLogsOptions,
  CommandStreamEvent,
  EgressLogOptions,
  ExecOptions,
  ExecStreamEvent,
  ExitEvent,
  FileData,
  FollowOptions,
  GrepOptions,
  ListConversationsOptions,
  LogOffsets,
  OutputEvent,
  ReadFileOptions,
  RequestOptions,
  SpawnOptions,
  UploadFile,
  WatchStreamItem,
} from "./client.js";
export {
  BadRequestError,
  BusyError,
  ConflictError,
  ForbiddenError,
  NotFoundError,
  RangeNotSatisfiableError,
  ServerError,
  SessionboxConnectionError,
  SessionboxError,
  SessionboxTimeoutError,
  TooLargeError,
  UnauthorizedError,
  UnprocessableError,
  errorClassForStatus,
  errorFromStreamEvent,
} from "./errors.js";
export type { ClientErrorCode, ErrorCode, KnownErrorCode, SessionboxErrorOptions } from "./errors.js";
export { base64ToBytes, bytesToBase64, outputBytes, readServerSentEvents } from "./sse.js";
export type { ServerSentEvent } from "./sse.js";
export type * from "./types.js";
