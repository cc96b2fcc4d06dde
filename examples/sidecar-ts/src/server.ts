// list_demo_repos, the tool of examples/demorepos, on the official MCP
// TypeScript SDK: it asks the broker's sidecar API for the person's demo
// connection and lists the repositories through the broker. When the
// person has not connected yet, the broker's url elicitation is relayed to
// the MCP host as this server's own input request; on the host's retry
// the requestState and the person's answer go back to the broker.

import {
  CLIENT_INFO_META_KEY,
  McpServer,
  inputRequired,
  type CallToolResult,
  type InputRequiredResult,
  type ServerContext,
} from '@modelcontextprotocol/server';

import { Sidecar, SidecarError } from './sidecar.ts';

interface Repo {
  name: string;
  full_name: string;
  private: boolean;
}

/** A fresh MCP server (one per request: the handler is stateless). */
export function newServer(sidecar: Sidecar): McpServer {
  const server = new McpServer({ name: 'sidecar-ts', version: '0.1.0' });
  server.registerTool(
    'list_demo_repos',
    {
      title: 'List my demo repositories',
      description: "List the repositories of the user's demo provider account (connecting it first if needed).",
      annotations: { readOnlyHint: true },
    },
    (ctx) => listRepos(sidecar, ctx),
  );
  return server;
}

function text(t: string, isError = false): CallToolResult {
  return { content: [{ type: 'text', text: t }], isError };
}

/** The caller's own bearer token: the broker validates it itself. */
function userToken(ctx: ServerContext): string {
  const header = ctx.http?.req?.headers.get('authorization') ?? '';
  const [scheme, token] = header.split(' ', 2);
  return scheme?.toLowerCase() === 'bearer' && token ? token.trim() : '';
}

/** The host's name for itself, as it says (not verified). */
function clientName(ctx: ServerContext): string | undefined {
  const envelope = ctx.mcpReq.envelope as Record<string, unknown> | undefined;
  const info = envelope?.[CLIENT_INFO_META_KEY] as { name?: unknown; title?: unknown } | undefined;
  const name = info?.title ?? info?.name;
  return typeof name === 'string' ? name : undefined;
}

async function listRepos(sidecar: Sidecar, ctx: ServerContext): Promise<CallToolResult | InputRequiredResult> {
  const token = userToken(ctx);
  if (!token) {
    return text("This server needs the user's bearer token (Authorization header).", true);
  }
  try {
    const rr = await sidecar.require(token, {
      provider: 'demo',
      scopes: ['repos'],
      request_state: ctx.mcpReq.requestState<string>(),
      input_responses: ctx.mcpReq.inputResponses,
      client_name: clientName(ctx),
    });
    switch (rr.status) {
      case 'input_required': {
        const { message, url } = rr.input_request.params;
        return inputRequired({
          inputRequests: { [rr.input_key]: inputRequired.elicitUrl({ message, url }) },
          requestState: rr.request_state,
        });
      }
      case 'declined':
        // An answer, not a failure: the person said no.
        return { ...text(rr.message), structuredContent: { status: 'declined', message: rr.message } };
      case 'cancelled':
        return text(`Nothing listed: ${rr.message}`, true);
    }
    const account = rr.connection.account;
    const resp = await sidecar.proxy(token, 'demo', '/repos', { account });
    if (resp.status !== 200) {
      return text(`The demo provider answered HTTP ${resp.status}.`, true);
    }
    const repos = (await resp.json()) as Repo[];
    return {
      content: [{ type: 'text', text: `Repositories of ${account}: ${repos.map((r) => r.full_name).join(', ')}` }],
      structuredContent: { account, repos },
    };
  } catch (err) {
    if (err instanceof SidecarError) {
      return text(`The broker refused: ${err.message}.`, true);
    }
    throw err;
  }
}
