/**
 * A small server-sent events reader over a `ReadableStream<Uint8Array>` (WHATWG streams only, no
 * Node APIs), and base64 helpers.
 *
 * @packageDocumentation
 */

/** One server-sent event: its name (`message` when unnamed) and its data lines joined by `\n`. */
export interface ServerSentEvent {
  /** The `event:` field, or `message`. */
  event: string;
  /** The `data:` lines, joined with `\n`. */
  data: string;
  /** The `id:` field, when sent. */
  id?: string;
}

/**
 * Reads server-sent events from a byte stream as they arrive. Comments (`: keepalive`) are
 * skipped. Returning early from the iteration (`break`) cancels the stream.
 */
export async function* readServerSentEvents(
  body: ReadableStream<Uint8Array>,
): AsyncGenerator<ServerSentEvent, void, undefined> {
  const reader = body.getReader();
  const decoder = new TextDecoder("utf-8");
  let buffer = "";
  let event = "";
  let data: string[] = [];
  let id: string | undefined;
  let finished = false;

  function* lines(final: boolean): Generator<ServerSentEvent> {
    for (;;) {
      const match = /\r\n|\r|\n/.exec(buffer);
      // A lone `\r` at the end may be the first half of `\r\n`: wait for more unless final.
      if (match === null || (!final && match[0] === "\r" && match.index === buffer.length - 1)) {
        if (final && buffer.length > 0) {
          const line = buffer;
          buffer = "";
          const dispatched = field(line);
          if (dispatched) yield dispatched;
        }
        return;
      }
      const line = buffer.slice(0, match.index);
      buffer = buffer.slice(match.index + match[0].length);
      const dispatched = field(line);
      if (dispatched) yield dispatched;
    }
  }

  function field(line: string): ServerSentEvent | undefined {
    if (line === "") {
      if (data.length === 0) {
        event = "";
        return undefined;
      }
      const out: ServerSentEvent = { event: event || "message", data: data.join("\n") };
      if (id !== undefined) out.id = id;
      event = "";
      data = [];
      return out;
    }
    if (line.startsWith(":")) return undefined;
    const colon = line.indexOf(":");
    const name = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") event = value;
    else if (name === "data") data.push(value);
    else if (name === "id") id = value;
    return undefined;
  }

  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        buffer += decoder.decode();
        yield* lines(true);
        finished = true;
        return;
      }
      buffer += decoder.decode(value, { stream: true });
      yield* lines(false);
    }
  } finally {
    if (!finished) {
      await reader.cancel().catch(() => undefined);
    }
    reader.releaseLock();
  }
}

/** Decodes standard base64 (padded) to bytes, with `atob` (browsers, Node >= 16). */
export function base64ToBytes(base64: string): Uint8Array {
  const binary = atob(base64);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** Encodes bytes as standard base64 (padded), with `btoa`. */
export function bytesToBase64(bytes: Uint8Array): string {
  let binary = "";
  const chunk = 0x8000;
  for (let i = 0; i < bytes.length; i += chunk) {
    binary += String.fromCharCode(...bytes.subarray(i, i + chunk));
  }
  return btoa(binary);
}

/**
 * The exact bytes of a piece of command output as the API sends it: `base64` when present (the
 * bytes were not valid UTF-8), else the UTF-8 encoding of `text`.
 */
export function outputBytes(output: { text: string; base64?: string | null }): Uint8Array {
  if (typeof output.base64 === "string") return base64ToBytes(output.base64);
  return new TextEncoder().encode(output.text);
}
