// An MCP host using enterprise-managed authorization (Cross App Access)
// with the official TypeScript MCP client's CrossAppAccessProvider, driven
// by cmd/broker's tests. The host already holds the person's ID token from
// the organisation's IdP; the provider trades it there for an ID-JAG
// (RFC 8693 token exchange, requestJwtAuthorizationGrant) and redeems the
// ID-JAG at the broker's authorization server (JWT bearer grant): no
// browser, no consent page. Then it calls list_connections.
//
//   node xaa.mjs <server url> <broker issuer> <IdP token endpoint>
//
// Environment: XAA_ID_TOKEN (the person's ID token), XAA_IDP_CLIENT and
// XAA_IDP_SECRET (the host at the IdP), XAA_CLIENT and XAA_SECRET (the
// host at the broker); XAA_REPLICA pins every request to a replica of the
// test's balancer (X-Test-Replica); XAA_REPLAY_ON, when set, presents the
// same ID-JAG again at that replica's token endpoint afterwards.
//
// JSON lines on stdout:
//   {"event":"jag","audience":...,"resource":...}   the IdP issued an ID-JAG
//   {"event":"result","result":...}                 list_connections' result
//   {"event":"replay","message":...}                the replay's refusal
//   {"event":"error","message":...}
// Token values are never printed.
import { Client, CrossAppAccessProvider, StreamableHTTPClientTransport, requestJwtAuthorizationGrant, exchangeJwtAuthGrant } from '@modelcontextprotocol/client';

const [serverUrl, issuer, idpTokenEndpoint] = process.argv.slice(2);
const env = process.env;
const say = (o) => process.stdout.write(JSON.stringify(o) + '\n');

// pinned adds the balancer's replica header to every request.
const pinned = (replica) => (url, init = {}) => {
  if (!replica) return fetch(url, init);
  const headers = new Headers(init.headers);
  headers.set('X-Test-Replica', replica);
  return fetch(url, { ...init, headers });
};
const fetchFn = pinned(env.XAA_REPLICA);

let jag;
const provider = new CrossAppAccessProvider({
  assertion: async (ctx) => {
    const r = await requestJwtAuthorizationGrant({
      tokenEndpoint: idpTokenEndpoint, audience: ctx.authorizationServerUrl, resource: ctx.resourceUrl,
      idToken: env.XAA_ID_TOKEN, clientId: env.XAA_IDP_CLIENT, clientSecret: env.XAA_IDP_SECRET,
      scope: ctx.scope, fetchFn: ctx.fetchFn,
    });
    jag = r.jwtAuthGrant;
    say({ event: 'jag', audience: ctx.authorizationServerUrl, resource: ctx.resourceUrl });
    return jag;
  },
  clientId: env.XAA_CLIENT, clientSecret: env.XAA_SECRET, clientName: 'TypeScript XAA host (test)',
  expectedIssuer: issuer, fetchFn,
});

try {
  const client = new Client({ name: 'ts-xaa-test', version: '1.0.0' }, {
    capabilities: {}, versionNegotiation: { mode: { pin: '2026-07-28' } },
  });
  await client.connect(new StreamableHTTPClientTransport(new URL(serverUrl), { authProvider: provider, fetch: fetchFn }));
  const result = await client.callTool({ name: 'list_connections', arguments: {} });
  say({ event: 'result', result });
  await client.close();
  if (env.XAA_REPLAY_ON) {
    try {
      await exchangeJwtAuthGrant({ tokenEndpoint: issuer + '/token', jwtAuthGrant: jag, clientId: env.XAA_CLIENT,
        clientSecret: env.XAA_SECRET, fetchFn: pinned(env.XAA_REPLAY_ON) });
      say({ event: 'error', message: 'the replayed ID-JAG was accepted' });
      process.exitCode = 1;
    } catch (e) {
      say({ event: 'replay', message: String(e && e.message || e) });
    }
  }
} catch (e) {
  say({ event: 'error', message: String(e && e.stack || e) });
  process.exitCode = 1;
}
