// node example.mjs [CHAT_ID]   over HTTP: SESSIONBOX_URL, SESSIONBOX_API_KEY
// node example.mjs --stdio     `sessionbox mcp --new` from PATH
import { LONG_CALL, connectHttp, connectStdio, disconnect, toolText } from './sessionbox-mcp.mjs';

const { SESSIONBOX_URL = 'http://127.0.0.1:7070', SESSIONBOX_API_KEY, SESSIONBOX_HOME } = process.env;
const stdio = process.argv[2] === '--stdio';
if (!stdio && !SESSIONBOX_API_KEY) throw new Error('set SESSIONBOX_API_KEY (sessionbox keys create)');
const conn = stdio
  ? await connectStdio({ env: SESSIONBOX_HOME ? { SESSIONBOX_HOME } : {} })
  : await connectHttp(SESSIONBOX_URL, SESSIONBOX_API_KEY, process.argv[2]);
try {
  console.log(`conversation: ${conn.conversationId}`);
  const { tools } = await conn.client.listTools(); // what you hand your model, with inputSchema
  console.log(`tools: ${tools.map((tool) => tool.name).join(' ')}`);

  const call = async (name, args) =>
    toolText(await conn.client.callTool({ name, arguments: args }, undefined, LONG_CALL));
  console.log((await call('write', { path: 'fruit.txt', content: 'pear\napple\nfig\n' })).text);
  const sorted = await call('bash', { command: 'sort fruit.txt | tee sorted.txt' });
  console.log(sorted.isError ? `failed: ${sorted.text}` : sorted.text);
} finally {
  await disconnect(conn);
}
