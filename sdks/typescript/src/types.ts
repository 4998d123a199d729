/**
 * Names for the API's types, taken from the types generated from the OpenAPI document
 * (`src/generated/openapi.ts`, openapi-typescript). Regenerate them with `npm run generate`.
 *
 * @packageDocumentation
 */

import type { components, operations, paths } from "./generated/openapi.js";

export type { components, operations, paths };

type Schemas = components["schemas"];

/** A background command as the API shows it. */
export type BackgroundCommand = Schemas["BackgroundCommand"];
/** A conversation's background commands. */
export type BackgroundCommandList = Schemas["BackgroundCommandList"];
/** Output of a background command from the requested offsets on. */
export type CommandLogsView = Schemas["CommandLogsView"];
/** A conversation as the API shows it. */
export type Conversation = Schemas["Conversation"];
/** A page of conversations. */
export type ConversationPage = Schemas["ConversationPage"];
/** One directory entry. */
export type DirEntry = Schemas["DirEntry"];
/** A workspace's disk usage against its quota. */
export type DiskUsage = Schemas["DiskUsage"];
/** `POST /v1/conversations/{id}/edit`. */
export type EditBody = Schemas["EditBody"];
/** What an edit did. */
export type EditResult = Schemas["EditResult"];
/** Verdicts, newest first. */
export type EgressLog = Schemas["EgressLog"];
/** One verdict of the egress gateway. */
export type EgressVerdict = Schemas["EgressVerdict"];
/** `POST /v1/conversations/{id}/exec`. */
export type ExecBody = Schemas["ExecBody"];
/** How a streamed command ended: the `exit` event's data. */
export type ExecExit = Schemas["ExecExit"];
/** What a command did. `stdout`/`stderr` are text (invalid UTF-8 replaced by U+FFFD); when the */
export type ExecResult = Schemas["ExecResult"];
/** How a command ended: `{"code": N}` or `{"signal": N}`. */
export type ExitStatus = Schemas["ExitStatus"];
/** FileKind */
export type FileKind = Schemas["FileKind"];
/** Metadata of one path. */
export type FileStat = Schemas["FileStat"];
/** `POST .../fork`. */
export type ForkBody = Schemas["ForkBody"];
/** Paths matching a glob. */
export type GlobView = Schemas["GlobView"];
/** One matching line. */
export type GrepMatch = Schemas["GrepMatch"];
/** A content search. */
export type GrepRequest = Schemas["GrepRequest"];
/** Matching lines. */
export type GrepView = Schemas["GrepView"];
/** A directory listing. */
export type LsView = Schemas["LsView"];
/** A network policy as the API shows it. */
export type NetworkPolicy = Schemas["NetworkPolicy"];
/** `PUT /v1/policy` and `PUT /v1/conversations/{id}/policy`. */
export type NetworkPolicyRequest = Schemas["NetworkPolicyRequest"];
/** `POST /v1/conversations/{id}`: the conversation, opened (and created when new). */
export type OpenedConversation = Schemas["OpenedConversation"];
/** A piece of output as the API sends it: `text` always (invalid UTF-8 replaced by U+FFFD), */
export type OutputText = Schemas["OutputText"];
/** PathBody */
export type PathBody = Schemas["PathBody"];
/** Where the policy in force comes from. */
export type PolicySource = Schemas["PolicySource"];
/** A request for a preview link. */
export type PreviewLinkRequest = Schemas["PreviewLinkRequest"];
/** A preview link. */
export type PreviewLinkView = Schemas["PreviewLinkView"];
/** A network profile. */
export type Profile = Schemas["Profile"];
/** `POST .../restore`. */
export type RestoreBody = Schemas["RestoreBody"];
/** What an archive put into a workspace held. */
export type Restored = Schemas["Restored"];
/** A skill as listed. */
export type SkillSummary = Schemas["SkillSummary"];
/** One skill, loaded. */
export type SkillView = Schemas["SkillView"];
/** The tenant's skills, by name. */
export type SkillsView = Schemas["SkillsView"];
/** A snapshot as the API shows it. */
export type Snapshot = Schemas["Snapshot"];
/** `POST /v1/conversations/{id}/snapshots`. */
export type SnapshotBody = Schemas["SnapshotBody"];
/** The snapshots of the tenant. */
export type SnapshotList = Schemas["SnapshotList"];
/** How much of a write reached the command. */
export type StdinWriteView = Schemas["StdinWriteView"];
/** A template: a name for a snapshot. */
export type Template = Schemas["Template"];
/** The templates of the tenant. */
export type TemplateList = Schemas["TemplateList"];
/** What an upload wrote, in the order of the parts. */
export type UploadView = Schemas["UploadView"];
/** One file an upload wrote. */
export type UploadedFile = Schemas["UploadedFile"];
/** Operations run on a conversation since its creation, from the audit log. */
export type Usage = Schemas["Usage"];
/** One event of a watch (`GET /v1/conversations/{id}/watch`): the SSE event's name is `kind`, */
export type WatchEvent = Schemas["WatchEvent"];
/** One server-sent event of a watch as an event-stream reader sees it: `event` is the kind, */
export type WatchStreamEvent = Schemas["WatchStreamEvent"];
/** The JSON body of every error answer: `{"code", "message"}`. */
export type ErrorBody = Schemas["Error"];
