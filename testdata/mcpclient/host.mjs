// An MCP host built on the official TypeScript MCP client
// (@modelcontextprotocol/client), driven by cmd/broker's tests: it connects
// to the broker with the client's own OAuth support, then calls
// connect_account and lets the client's multi round-trip driver answer the
// url elicitation.
//
//   node host.mjs <server url> dcr
//   node host.mjs <server url> cimd <client id metadata document url>
//
// With HOST_COMMANDS=1 it calls nothing by itself: once connected it says
// {"event":"ready"} and runs the JSON commands it reads on stdin, one a
// line: {"list":true} answers {"event":"tools","names":[...]}, and
// {"call":NAME,"arguments":{...}} answers a result (url elicitations on
// the way, as below). HOST_ERA picks the protocol: 2026-07-28 (the
// default; the client's multi round-trip driver retries) or 2025-11-25
// (initialize; a -32042 error's links are elicit events, after which the
// host calls again itself, as that era has it).
//
// It talks to the test as JSON lines: on stdout
//   {"event":"authorize","url":...}   open this in the browser and sign in
//   {"event":"authorized","refresh":true}
//   {"event":"elicit","url":...}      open this and connect; then send "continue"
//   {"event":"result","result":...}   the final tool result
//   {"event":"error","message":...}
// and it reads lines on stdin ("continue"). Token values are never printed.
import http from 'node:http';
import readline from 'node:readline';
import { Client, StreamableHTTPClientTransport, UnauthorizedError, UrlElicitationRequiredError } from '@modelcontextprotocol/client';

const [serverUrl, mode, metadataUrl] = process.argv.slice(2);
const era = process.env.HOST_ERA || '2026-07-28';
const commands = process.env.HOST_COMMANDS === '1';
const say = (o) => process.stdout.write(JSON.stringify(o) + '\n');

const lines = readline.createInterface({ input: process.stdin });
const waiting = [];
const queued = []; // lines read before anyone waited for them
lines.on('line', (l) => { const w = waiting.shift(); if (w) w(l.trim()); else queued.push(l.trim()); });
lines.on('close', () => { for (const w of waiting.splice(0)) w(undefined); });
const nextLine = () => queued.length ? Promise.resolve(queued.shift()) : new Promise((resolve) => waiting.push(resolve));

// The loopback redirect target (RFC 8252 section 7.3).
let deliver;
const callback = new Promise((resolve) => { deliver = resolve; });
const server = http.createServer((req, res) => {
  const u = new URL(req.url, 'http://127.0.0.1');
  if (u.pathname !== '/callback') { res.writeHead(404).end(); return; }
  res.writeHead(200, { 'Content-Type': 'text/plain' }).end('Signed in: return to the test host.');
  deliver(u.searchParams);
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const redirectUrl = `http://127.0.0.1:${server.address().port}/callback`;

// An OAuthClientProvider that keeps everything in memory.
const store = {};
const provider = {
  get redirectUrl() { return redirectUrl; },
  get clientMetadata() {
    return {
      client_name: 'TypeScript MCP host (test)', redirect_uris: [redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'], response_types: ['code'],
      token_endpoint_auth_method: 'none', application_type: 'native',
    };
  },
  clientMetadataUrl: mode === 'cimd' ? metadataUrl : undefined,
  clientInformation() { return store.client; },
  saveClientInformation(info) { store.client = info; },
  tokens() { return store.tokens; },
  saveTokens(t) { store.tokens = t; say({ event: 'authorized', refresh: Boolean(t.refresh_token) }); },
  redirectToAuthorization(url) { say({ event: 'authorize', url: url.toString() }); },
  saveCodeVerifier(v) { store.verifier = v; },
  codeVerifier() { return store.verifier; },
};

function newClient() {
  const client = new Client({ name: 'ts-host-test', version: '1.0.0' }, {
    capabilities: { elicitation: { url: {} } },
    versionNegotiation: { mode: era === '2025-11-25' ? 'legacy' : { pin: era } },
  });
  client.setRequestHandler('elicitation/create', async (req) => {
    if (req.params.mode !== 'url') return { action: 'decline' };
    say({ event: 'elicit', url: req.params.url });
    const answer = await nextLine();
    return { action: answer === 'continue' ? 'accept' : 'cancel' };
  });
  return client;
}

// call calls a tool; in 2025-11-25 a -32042 error's links are opened (each
// an elicit event the test answers) and the call is made again.
async function call(client, name, args) {
  for (let round = 0; ; round++) {
    try {
      return await client.callTool({ name, arguments: args });
    } catch (e) {
      if (!(e instanceof UrlElicitationRequiredError) || round >= 3) throw e;
      for (const el of e.elicitations) {
        say({ event: 'elicit', url: el.url, legacy: true });
        if ((await nextLine()) !== 'continue') throw e;
      }
    }
  }
}

try {
  let client = newClient();
  try {
    await client.connect(new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider }));
  } catch (e) {
    if (!(e instanceof UnauthorizedError)) throw e;
    const params = await callback;
    const transport = new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider });
    await transport.finishAuth(params);
    client = newClient();
    await client.connect(new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider }));
  }
  if (commands) {
    say({ event: 'ready' });
    for (let line = await nextLine(); line !== undefined && line !== ''; line = await nextLine()) {
      const cmd = JSON.parse(line);
      if (cmd.list) {
        const { tools } = await client.listTools();
        say({ event: 'tools', names: tools.map((t) => t.name) });
        continue;
      }
      say({ event: 'result', result: await call(client, cmd.call, cmd.arguments || {}) });
    }
  } else {
    say({ event: 'result', result: await client.callTool({ name: 'connect_account', arguments: { provider: 'demo' } }) });
  }
  await client.close();
} catch (e) {
  say({ event: 'error', message: String(e && e.stack || e) });
  process.exitCode = 1;
} finally {
  server.close();
  lines.close();
}
