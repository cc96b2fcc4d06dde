// The MCP host side of the example's end-to-end test (cmd/broker's
// TestSidecarTypeScript): the official TypeScript client, pinned to
// 2026-07-28, calls list_demo_repos and lets its multi-round-trip loop do
// the retry. Each url elicitation is printed as a JSON line on stdout; the
// person's answer (accept, decline or cancel) is read from stdin. The
// tool's result is the last JSON line.
//
//   node test/client.ts http://127.0.0.1:8091/mcp <bearer token>

import { createInterface } from 'node:readline';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';

const [url, token] = process.argv.slice(2);
if (!url || !token) {
  console.error('usage: node test/client.ts MCP_URL BEARER_TOKEN');
  process.exit(2);
}

const answers = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const client = new Client(
  { name: 'sidecar-ts-host', version: '1.0.0' },
  { capabilities: { elicitation: { url: {} } }, versionNegotiation: { mode: { pin: '2026-07-28' } } },
);
client.setRequestHandler('elicitation/create', async (request) => {
  console.log(JSON.stringify({ elicit: request.params }));
  const next = await answers.next();
  const action = next.done ? 'cancel' : next.value.trim();
  if (action !== 'accept' && action !== 'decline' && action !== 'cancel') {
    throw new Error(`unexpected answer ${JSON.stringify(action)}`);
  }
  return { action };
});

await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { Authorization: `Bearer ${token}` } } }));
const result = await client.callTool({ name: 'list_demo_repos', arguments: {} });
console.log(JSON.stringify({ result }));
await client.close();
process.exit(0);
