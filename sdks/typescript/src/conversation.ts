/**
 * A conversation bound to its id: the conversation-scoped methods of {@link Client} without the
 * id argument.
 *
 * @packageDocumentation
 */

import type {
  Client,
  CommandLogsOptions,
  CommandStreamEvent,
  EgressLogOptions,
  ExecOptions,
  ExecStreamEvent,
  FileData,
  FollowOptions,
  GrepOptions,
  ReadFileOptions,
  RequestOptions,
  SpawnOptions,
  UploadFile,
  WatchStreamItem,
} from "./client.js";
import type {
  BackgroundCommand,
  CommandLogsView,
  Conversation,
  DirEntry,
  DiskUsage,
  EgressVerdict,
  ExecResult,
  FileStat,
  GrepMatch,
  NetworkPolicy,
  NetworkPolicyRequest,
  OpenedConversation,
  PreviewLinkView,
  Restored,
  SkillView,
  Snapshot,
  UploadedFile,
} from "./types.js";

/**
 * One conversation of a {@link Client}, from {@link Client.conversation}. Making one sends
 * nothing; each method is the {@link Client} method of the same meaning with this id.
 *
 * @example
 * ```ts
 * const chat = client.conversation("chat-42");
 * await chat.writeText("notes.md", "# Notes\n");
 * const { stdout } = await chat.exec("wc -l notes.md");
 * ```
 */
export class ConversationClient {
  /** The client it calls through. */
  readonly client: Client;
  /** The conversation id. */
  readonly id: string;

  /** Binds `client` to the conversation `id`. */
  constructor(client: Client, id: string) {
    this.client = client;
    this.id = id;
  }

  /** {@link Client.openConversation}: opens it, creating it when new. */
  open(options?: RequestOptions): Promise<OpenedConversation> {
    return this.client.openConversation(this.id, options);
  }
  /** {@link Client.getConversation}. */
  get(options?: RequestOptions): Promise<Conversation> {
    return this.client.getConversation(this.id, options);
  }
  /** {@link Client.renewConversation}. */
  renew(options?: RequestOptions): Promise<Conversation> {
    return this.client.renewConversation(this.id, options);
  }
  /** {@link Client.destroyConversation}. */
  destroy(options?: RequestOptions): Promise<void> {
    return this.client.destroyConversation(this.id, options);
  }
  /** {@link Client.diskUsage}. */
  diskUsage(options?: RequestOptions): Promise<DiskUsage | null> {
    return this.client.diskUsage(this.id, options);
  }

  /** {@link Client.exec}. */
  exec(command: string, options?: ExecOptions): Promise<ExecResult> {
    return this.client.exec(this.id, command, options);
  }
  /** {@link Client.execStream}. */
  execStream(command: string, options?: ExecOptions): AsyncGenerator<ExecStreamEvent, void, undefined> {
    return this.client.execStream(this.id, command, options);
  }
  /** {@link Client.spawn}. */
  spawn(command: string, options?: SpawnOptions): Promise<BackgroundCommand> {
    return this.client.spawn(this.id, command, options);
  }
  /** {@link Client.listCommands}. */
  listCommands(options?: RequestOptions): Promise<BackgroundCommand[]> {
    return this.client.listCommands(this.id, options);
  }
  /** {@link Client.getCommand}. */
  getCommand(commandId: string, options?: RequestOptions): Promise<BackgroundCommand> {
    return this.client.getCommand(this.id, commandId, options);
  }
  /** {@link Client.commandLogs}. */
  commandLogs(commandId: string, options?: CommandLogsOptions): Promise<CommandLogsView> {
    return this.client.commandLogs(this.id, commandId, options);
  }
  /** {@link Client.followCommand}. */
  followCommand(commandId: string, options?: FollowOptions): AsyncGenerator<CommandStreamEvent, void, undefined> {
    return this.client.followCommand(this.id, commandId, options);
  }
  /** {@link Client.killCommand}. */
  killCommand(commandId: string, options?: RequestOptions): Promise<BackgroundCommand> {
    return this.client.killCommand(this.id, commandId, options);
  }
  /** {@link Client.writeStdin}. */
  writeStdin(commandId: string, data: FileData, options?: RequestOptions & { close?: boolean }): Promise<number> {
    return this.client.writeStdin(this.id, commandId, data, options);
  }
  /** {@link Client.closeStdin}. */
  closeStdin(commandId: string, options?: RequestOptions): Promise<void> {
    return this.client.closeStdin(this.id, commandId, options);
  }

  /** {@link Client.readFile}. */
  readFile(path: string, options?: ReadFileOptions): Promise<Uint8Array> {
    return this.client.readFile(this.id, path, options);
  }
  /** {@link Client.readText}. */
  readText(path: string, options?: ReadFileOptions): Promise<string> {
    return this.client.readText(this.id, path, options);
  }
  /** {@link Client.downloadFile}. */
  downloadFile(path: string, options?: ReadFileOptions): Promise<ReadableStream<Uint8Array>> {
    return this.client.downloadFile(this.id, path, options);
  }
  /** {@link Client.writeFile}. */
  writeFile(path: string, data: FileData, options?: RequestOptions): Promise<void> {
    return this.client.writeFile(this.id, path, data, options);
  }
  /** {@link Client.writeText}. */
  writeText(path: string, text: string, options?: RequestOptions): Promise<void> {
    return this.client.writeText(this.id, path, text, options);
  }
  /** {@link Client.uploadFile}. */
  uploadFile(path: string, data: ReadableStream<Uint8Array> | FileData, options?: RequestOptions): Promise<void> {
    return this.client.uploadFile(this.id, path, data, options);
  }
  /** {@link Client.uploadFiles}. */
  uploadFiles(files: UploadFile[], options?: RequestOptions): Promise<UploadedFile[]> {
    return this.client.uploadFiles(this.id, files, options);
  }
  /** {@link Client.editFile}. */
  editFile(path: string, oldText: string, newText: string, options?: RequestOptions & { replaceAll?: boolean }): Promise<number> {
    return this.client.editFile(this.id, path, oldText, newText, options);
  }
  /** {@link Client.ls}. */
  ls(path?: string, options?: RequestOptions): Promise<DirEntry[]> {
    return this.client.ls(this.id, path, options);
  }
  /** {@link Client.glob}. */
  glob(pattern: string, options?: RequestOptions): Promise<string[]> {
    return this.client.glob(this.id, pattern, options);
  }
  /** {@link Client.grep}. */
  grep(pattern: string, options?: GrepOptions): Promise<GrepMatch[]> {
    return this.client.grep(this.id, pattern, options);
  }
  /** {@link Client.stat}. */
  stat(path: string, options?: RequestOptions): Promise<FileStat> {
    return this.client.stat(this.id, path, options);
  }
  /** {@link Client.remove}. */
  remove(path: string, options?: RequestOptions & { recursive?: boolean }): Promise<void> {
    return this.client.remove(this.id, path, options);
  }
  /** {@link Client.mkdir}. */
  mkdir(path: string, options?: RequestOptions): Promise<void> {
    return this.client.mkdir(this.id, path, options);
  }
  /** {@link Client.watch}. */
  watch(options?: RequestOptions & { path?: string }): AsyncGenerator<WatchStreamItem, void, undefined> {
    return this.client.watch(this.id, options);
  }
  /** {@link Client.createPreviewLink}. */
  createPreviewLink(port: number, options?: RequestOptions & { ttlSecs?: number }): Promise<PreviewLinkView> {
    return this.client.createPreviewLink(this.id, port, options);
  }

  /** {@link Client.getConversationPolicy}. */
  getPolicy(options?: RequestOptions): Promise<NetworkPolicy> {
    return this.client.getConversationPolicy(this.id, options);
  }
  /** {@link Client.setConversationPolicy}. */
  setPolicy(policy: NetworkPolicyRequest, options?: RequestOptions): Promise<NetworkPolicy> {
    return this.client.setConversationPolicy(this.id, policy, options);
  }
  /** {@link Client.deleteConversationPolicy}. */
  deletePolicy(options?: RequestOptions): Promise<NetworkPolicy> {
    return this.client.deleteConversationPolicy(this.id, options);
  }
  /** {@link Client.conversationEgressLog}. */
  egressLog(options?: EgressLogOptions): Promise<EgressVerdict[]> {
    return this.client.conversationEgressLog(this.id, options);
  }
  /** {@link Client.loadSkill}. */
  loadSkill(name: string, options?: RequestOptions): Promise<SkillView> {
    return this.client.loadSkill(this.id, name, options);
  }

  /** {@link Client.createSnapshot}. */
  snapshot(name: string, options?: RequestOptions & { keepSeconds?: number }): Promise<Snapshot> {
    return this.client.createSnapshot(this.id, name, options);
  }
  /** {@link Client.restoreSnapshot}. */
  restore(snapshot: string, options?: RequestOptions): Promise<Restored> {
    return this.client.restoreSnapshot(this.id, snapshot, options);
  }
  /** {@link Client.forkConversation}: answers the new conversation, bound. */
  async fork(to: string, options?: RequestOptions): Promise<ConversationClient> {
    await this.client.forkConversation(this.id, to, options);
    return new ConversationClient(this.client, to);
  }
}
