// Authorization servers on oidc-provider for cmd/broker's
// TestGatewayOIDCProvider: the upstream MCP servers' ASes, on loopback.
//
//   node as.mjs '<config JSON>'
//
// config: {"servers": [{"name", "cimd": bool, "resources": [url, ...],
//          "scope": "mcp:read mcp:write", "clients": [client metadata, ...]}],
//          "introspector": {"client_id", "client_secret"}}
//
// Each server listens on an ephemeral port of 127.0.0.1 and prints one JSON
// line per event on stdout:
//
//   {"event":"listening","as":NAME,"issuer":URL}
//   {"event":"request","as":NAME,"route":"authorization"|"token"|"registration"|
//    "introspection"|"revocation"|..., "status":N, "client_id", "grant_type",
//    "resource", "scope", "prompt", "refresh_token": issued (token route)}
//                                    one per request oidc-provider routed
//   {"event":"fetch","as":NAME,"url":URL,"status":N}
//                                    a Client ID Metadata Document fetched
//   {"event":"control","as":NAME,"op":OP,"client_id":ID,"removed":N}
//
// Features: dynamic registration (open), resource indicators (opaque access
// tokens bound to one of the server's resources, its scopes), refresh
// tokens rotated on every use, introspection (for the introspector client
// only), revocation, Client ID Metadata Documents (when cimd is true; fetched
// over https with the CAs of NODE_EXTRA_CA_CERTS, loopback allowed: the
// test's broker is on loopback), the development login and consent pages.
//
// Test controls (POST, on each server's port, outside oidc-provider):
//
//   /test/expire-access-tokens?client_id=ID   drop the client's access
//                                             tokens (refresh tokens stay)
//   /test/revoke-grants?client_id=ID          drop the client's grants and
//                                             every token of them
import http from 'node:http';
import Provider from 'oidc-provider';

const config = JSON.parse(process.argv[2]);

function emit(ev) {
  process.stdout.write(JSON.stringify(ev) + '\n');
}

// An in-memory adapter whose records the test controls can find by client.
function adapterFor(store) {
  return class Adapter {
    constructor(model) { this.model = model; }
    key(id) { return `${this.model}:${id}`; }
    async upsert(id, payload, expiresIn) {
      store.set(this.key(id), { model: this.model, payload, expires: expiresIn ? Date.now() + expiresIn * 1000 : Infinity });
    }
    async find(id) {
      const e = store.get(this.key(id));
      if (!e) return undefined;
      if (e.expires < Date.now()) { store.delete(this.key(id)); return undefined; }
      return e.payload;
    }
    async findByUid(uid) {
      for (const e of store.values()) {
        if (e.model === this.model && e.payload.uid === uid && e.expires >= Date.now()) return e.payload;
      }
      return undefined;
    }
    async findByUserCode(code) {
      for (const e of store.values()) {
        if (e.model === this.model && e.payload.userCode === code && e.expires >= Date.now()) return e.payload;
      }
      return undefined;
    }
    async consume(id) {
      const e = store.get(this.key(id));
      if (e) e.payload.consumed = Math.floor(Date.now() / 1000);
    }
    async destroy(id) { store.delete(this.key(id)); }
    async revokeByGrantId(grantId) {
      for (const [k, e] of store) {
        if (e.payload.grantId === grantId) store.delete(k);
      }
    }
  };
}

// remove drops the store's records of models whose clientId is clientId.
function remove(store, models, clientId) {
  let n = 0;
  for (const [k, e] of store) {
    if (models.includes(e.model) && e.payload.clientId === clientId) {
      store.delete(k);
      n++;
    }
  }
  return n;
}

// loopbackFetch fetches Client ID Metadata Documents without
// oidc-provider's special-use address guard (its dispatcher): the broker
// under test is on loopback. TLS is verified as usual (NODE_EXTRA_CA_CERTS).
function loopbackFetch(name) {
  return async (url, options) => {
    const { dispatcher, ...rest } = options;
    const resp = await fetch(url, rest);
    emit({ event: 'fetch', as: name, url: String(url), status: resp.status });
    return resp;
  };
}

async function start(s) {
  const store = new Map();
  const server = http.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const resources = new Set(s.resources);
  const provider = new Provider(issuer, {
    adapter: adapterFor(store),
    clients: [...s.clients, {
      client_id: config.introspector.client_id,
      client_secret: config.introspector.client_secret,
      grant_types: [], response_types: [], redirect_uris: [],
    }],
    scopes: ['openid', 'offline_access', ...s.scope.split(' ')],
    pkce: { required: () => true },
    cookies: { keys: ['test-only-cookie-key'] },
    rotateRefreshToken: () => true,
    ttl: { AccessToken: 3600, RefreshToken: 86400, Grant: 86400, Session: 3600, Interaction: 600, AuthorizationCode: 60 },
    fetch: loopbackFetch(s.name),
    features: {
      devInteractions: { enabled: true },
      registration: { enabled: true },
      revocation: { enabled: true },
      introspection: {
        enabled: true,
        allowedPolicy: async (ctx, client) => client.clientId === config.introspector.client_id,
      },
      resourceIndicators: {
        enabled: true,
        defaultResource: async () => undefined,
        useGrantedResource: async () => true,
        getResourceServerInfo: async (ctx, indicator) => {
          if (!resources.has(indicator)) throw new Provider.errors.InvalidTarget();
          return { scope: s.scope, audience: indicator, accessTokenTTL: 3600, accessTokenFormat: 'opaque' };
        },
      },
      clientIdMetadataDocument: { enabled: !!s.cimd, ack: 'draft-02' },
    },
  });
  provider.proxy = false;
  provider.use(async (ctx, next) => {
    await next();
    const route = ctx.oidc?.route;
    if (!route || route === 'discovery' || route === 'jwks') return;
    const p = ctx.oidc.params ?? {};
    emit({
      event: 'request', as: s.name, route, status: ctx.status, client_id: ctx.oidc.client?.clientId ?? p.client_id,
      grant_type: p.grant_type, resource: p.resource, scope: p.scope, prompt: p.prompt,
      refresh_token: route === 'token' && ctx.status === 200 ? !!ctx.body?.refresh_token : undefined,
    });
  });
  const handle = provider.callback();
  server.on('request', (req, res) => {
    const u = new URL(req.url, issuer);
    if (req.method === 'POST' && u.pathname.startsWith('/test/')) {
      const clientId = u.searchParams.get('client_id');
      let removed;
      switch (u.pathname) {
        case '/test/expire-access-tokens':
          removed = remove(store, ['AccessToken'], clientId);
          break;
        case '/test/revoke-grants':
          removed = remove(store, ['Grant', 'AccessToken', 'RefreshToken', 'AuthorizationCode'], clientId);
          break;
        default:
          res.writeHead(404).end();
          return;
      }
      emit({ event: 'control', as: s.name, op: u.pathname.slice(6), client_id: clientId, removed });
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ removed }));
      return;
    }
    handle(req, res);
  });
  emit({ event: 'listening', as: s.name, issuer });
}

for (const s of config.servers) {
  await start(s);
}
process.on('SIGTERM', () => process.exit(0));
