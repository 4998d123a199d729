import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

// The SDK gives up on a request after 60 s; `bash` may run 120 s (its `timeout` argument, in ms).
export const LONG_CALL = { timeout: 130_000 };

// Over streamable HTTP. With `conversation` (a chat id of yours) every connection reaches that
// conversation's workspace; without it, /mcp/new makes a conversation for this MCP session and
// names it in the X-Conversation-Id header of its answer to `initialize`.
export async function connectHttp(baseUrl, apiKey, conversation) {
  const path = conversation ? `/mcp/conversations/${encodeURIComponent(conversation)}` : '/mcp/new';
  let conversationId = conversation;
  const transport = new StreamableHTTPClientTransport(new URL(baseUrl + path), {
    requestInit: { headers: { Authorization: `Bearer ${apiKey}` } },
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      conversationId ??= response.headers.get('x-conversation-id') ?? undefined;
      return response;
    },
  });
  const client = new Client({ name: 'my-agent', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport, conversationId };
}

// As a child process: `sessionbox mcp --new` serves a new conversation of its own, named on
// stderr and at the end of the instructions the server gives the model. The SDK passes the
// child only a few environment variables (PATH, HOME, ...): put SESSIONBOX_HOME etc. in `env`.
export async function connectStdio({ command = 'sessionbox', args = ['mcp', '--new'], env, stderr } = {}) {
  const transport = new StdioClientTransport({ command, args, env, stderr });
  const client = new Client({ name: 'my-agent', version: '1.0.0' });
  await client.connect(transport);
  const conversationId = client.getInstructions()?.match(/conversation is `([^`]+)`/)?.[1];
  return { client, transport, conversationId };
}

// Ends the MCP session (an HTTP DELETE, or the child's exit); the conversation and its files stay.
export async function disconnect({ client, transport }) {
  try {
    if (transport instanceof StreamableHTTPClientTransport) await transport.terminateSession();
  } finally {
    await client.close();
  }
}

// A tool's result as the model reads it: its text, and whether the call failed.
export function toolText(result) {
  const text = result.content.map((part) => (part.type === 'text' ? part.text : '')).join('');
  return { text, isError: result.isError === true };
}
