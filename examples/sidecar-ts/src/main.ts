// sidecar-ts: an MCP server that lives next to credbroker and offers one
// tool, list_demo_repos, through the broker's sidecar API.
//
//   node src/main.ts --addr 127.0.0.1:8091 --sidecar-url http://127.0.0.1:8081 --secret-file ../../data/sidecar.secret
//
// (Node 22.18 or later runs the TypeScript as it is.) The secret comes from
// --secret-file or BROKER_SIDECAR_SECRET, never from a flag value.

import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { parseArgs } from 'node:util';

import {
  createMcpHandler,
  hostHeaderValidationResponse,
  localhostAllowedHostnames,
  localhostAllowedOrigins,
  originValidationResponse,
} from '@modelcontextprotocol/server';

import { newServer } from './server.ts';
import { Sidecar } from './sidecar.ts';

const { values: flags } = parseArgs({
  options: {
    addr: { type: 'string', default: '127.0.0.1:8091' },
    'sidecar-url': { type: 'string', default: process.env.BROKER_SIDECAR_URL ?? 'http://127.0.0.1:8081' },
    'secret-file': { type: 'string', default: process.env.BROKER_SIDECAR_SECRET_FILE ?? '' },
  },
});

function secret(): string {
  const file = flags['secret-file'];
  const s = file ? readFileSync(file, 'utf8').trim() : (process.env.BROKER_SIDECAR_SECRET ?? '');
  if (!s) {
    console.error('sidecar-ts: no sidecar secret: pass --secret-file (broker dev writes data/sidecar.secret) or set BROKER_SIDECAR_SECRET');
    process.exit(2);
  }
  return s;
}

const sidecar = new Sidecar(flags['sidecar-url'], secret());
const mcp = createMcpHandler(() => newServer(sidecar));

/** node:http → the web-standard Request the SDK's handler takes. */
async function toRequest(req: IncomingMessage, origin: string): Promise<Request> {
  const headers = new Headers();
  for (const [k, v] of Object.entries(req.headers)) {
    for (const one of Array.isArray(v) ? v : v === undefined ? [] : [v]) {
      headers.append(k, one);
    }
  }
  const chunks: Buffer[] = [];
  for await (const c of req) {
    chunks.push(c as Buffer);
  }
  const body = req.method === 'GET' || req.method === 'HEAD' ? undefined : Buffer.concat(chunks);
  return new Request(new URL(req.url ?? '/', origin), { method: req.method, headers, body });
}

async function send(res: ServerResponse, resp: Response): Promise<void> {
  res.statusCode = resp.status;
  resp.headers.forEach((v, k) => res.setHeader(k, v));
  res.end(Buffer.from(await resp.arrayBuffer()));
}

const [host, port] = [flags.addr.slice(0, flags.addr.lastIndexOf(':')), Number(flags.addr.slice(flags.addr.lastIndexOf(':') + 1))];
const http = createServer((req, res) => {
  (async () => {
    const request = await toRequest(req, `http://${flags.addr}`);
    if (new URL(request.url).pathname !== '/mcp') {
      return send(res, new Response('not found', { status: 404 }));
    }
    // A loopback server: refuse other hosts and origins (DNS rebinding).
    const refused =
      hostHeaderValidationResponse(request, localhostAllowedHostnames()) ?? originValidationResponse(request, localhostAllowedOrigins());
    await send(res, refused ?? (await mcp.fetch(request)));
  })().catch((err: unknown) => {
    console.error('sidecar-ts:', err);
    if (!res.headersSent) {
      res.statusCode = 500;
    }
    res.end();
  });
});
http.listen(port, host, () => {
  const a = http.address();
  const where = typeof a === 'object' && a ? `${a.address}:${a.port}` : flags.addr;
  console.error(`sidecar-ts: MCP endpoint on http://${where}/mcp (broker sidecar ${flags['sidecar-url']})`);
});
process.on('SIGTERM', () => {
  http.close();
  void mcp.close();
});
