// Preload (node --import ./loopback.mjs) for the TypeScript SDK's example
// server simpleStreamableHttp.js in cmd/broker's
// TestGatewayTypeScriptUpstream. It changes two things and nothing of the
// MCP server itself:
//
// 1. Loopback only. The example's MCP server and its authorization server
//    call listen(port) with no host, which binds every interface: a port
//    given alone is bound to 127.0.0.1 instead.
//
// 2. With TS_UPSTREAM_STATE=<file>, the example's in-memory authorization
//    server (demoInMemoryOAuthProvider.js) keeps its registered clients and
//    issued access tokens in that file, and knows them again after the
//    process restarts. The MCP sessions are still in memory only, so a
//    restart is what a hosted MCP server's restart looks like to the broker:
//    its session is gone (404), its token, issued by an authorization server
//    that did not restart, still good.
import fs from 'node:fs';
import net from 'node:net';
import {
  DemoInMemoryAuthProvider,
  DemoInMemoryClientsStore,
} from '@modelcontextprotocol/sdk/examples/server/demoInMemoryOAuthProvider.js';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function listenOnLoopback(...args) {
  const port = args[0];
  const portOnly = typeof port === 'number' || (typeof port === 'string' && /^\d+$/.test(port));
  if (portOnly && typeof args[1] !== 'string') {
    args.splice(1, 0, '127.0.0.1');
  }
  return listen.apply(this, args);
};

const file = process.env.TS_UPSTREAM_STATE;
if (file) {
  const state = fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, 'utf8')) : { clients: {}, tokens: {} };
  const save = () => fs.writeFileSync(file, JSON.stringify(state));

  const register = DemoInMemoryClientsStore.prototype.registerClient;
  DemoInMemoryClientsStore.prototype.registerClient = async function registerAndKeep(metadata) {
    const client = await register.call(this, metadata);
    state.clients[client.client_id] = client;
    save();
    return client;
  };
  const getClient = DemoInMemoryClientsStore.prototype.getClient;
  DemoInMemoryClientsStore.prototype.getClient = async function getKept(id) {
    return (await getClient.call(this, id)) ?? state.clients[id];
  };

  const exchange = DemoInMemoryAuthProvider.prototype.exchangeAuthorizationCode;
  DemoInMemoryAuthProvider.prototype.exchangeAuthorizationCode = async function exchangeAndKeep(...args) {
    const tokens = await exchange.apply(this, args);
    state.tokens[tokens.access_token] = this.tokens.get(tokens.access_token);
    save();
    return tokens;
  };
  const verify = DemoInMemoryAuthProvider.prototype.verifyAccessToken;
  DemoInMemoryAuthProvider.prototype.verifyAccessToken = async function verifyKept(token) {
    if (!this.tokens.has(token) && state.tokens[token]) {
      this.tokens.set(token, state.tokens[token]);
    }
    return verify.call(this, token);
  };
}
