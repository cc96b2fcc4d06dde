// Package mcpapi is credbroker's MCP surface: one Streamable HTTP endpoint
// that serves MCP 2026-07-28 with a lean handler of its own (built on the
// go-sdk's exported wire types) and 2025-11-25 legacy clients through the
// go-sdk's stateless handler, the OAuth 2.0 protected-resource side (bearer
// token validation: the broker's own tokens through Options.Verifier in
// --mcp-auth broker, the IdP's JWTs otherwise; RFC 9728 metadata naming the
// authorization server; 401/403 challenges), the broker's tools,
// and multi round-trip requests (MRTR) with a sealed requestState.
//
// # Routes (mounted by [Server.Register])
//
//	POST   /mcp                                      MCP endpoint (both eras)
//	GET    /mcp                                      405, JSON-RPC error body, Allow: POST
//	DELETE /mcp                                      405, JSON-RPC error body, Allow: POST
//	GET    /.well-known/oauth-protected-resource     RFC 9728 metadata
//	GET    /.well-known/oauth-protected-resource/mcp RFC 9728 metadata (path-inserted form)
//
// # Order of checks on POST /mcp
//
//  1. Origin, when present, must be the public origin (or loopback in
//     development mode): else 403.
//  2. Content-Type must be application/json: else 415.
//  3. Bearer token (Authorization header only): missing or invalid → 401
//     with WWW-Authenticate naming the resource metadata; lacking the
//     required scope → 403 error="insufficient_scope".
//  4. The body (capped, default 1 MiB → 413) is decoded once as one
//     JSON-RPC message; batches are rejected.
//  5. Era: params._meta["io.modelcontextprotocol/protocolVersion"] ≥
//     2026-07-28 → the modern handler; "initialize" or no version claim →
//     the go-sdk legacy handler; an unknown version → -32022.
//
// Every 4xx answer carries a JSON-RPC error body, never plain text (the
// go-sdk's plain-text errors are rewritten). Legacy requests other than
// initialize, ping, tools/list, tools/call and notifications get -32601.
//
// # Modern (2026-07-28) requests
//
// Header checks: MCP-Protocol-Version equal to the _meta version, Mcp-Method
// equal to the body's method, Mcp-Name equal to the tool name on tools/call
// (=?base64?…?= values decoded), Accept listing application/json and
// text/event-stream; any mismatch → -32020 (HTTP 400). _meta must carry
// protocolVersion and clientCapabilities (-32602 otherwise). Methods:
// server/discover, tools/list, tools/call (unknown → 404 -32601);
// notifications → 202. Results carry resultType and
// _meta["io.modelcontextprotocol/serverInfo"]; list and discover results
// carry ttlMs and cacheScope.
//
// # Tools
//
//	connect_account    {provider, scopes?}   connection description, or input_required (url elicitation)
//	list_connections   {}                    the caller's connections (descriptions only)
//	disconnect_account {provider, account?}  revoke at the provider (revoked | not_confirmed |
//	                                         not_supported), then delete
//	provider_request   {provider, method, path, query?, headers?, body?, account?}
//	                                         the provider API's status, selected headers and body;
//	                                         input_required first when not connected, a form
//	                                         elicitation to pick one of several accounts
//
// The tools translate: every decision (which connection, whether to ask the
// person, what disconnecting means) is the connections package's, and its
// typed outcomes and errors become JSON-RPC results, tool errors or
// protocol errors here. No result, error or log line ever contains a token;
// grant ids are logged only as binding.Ref references.
//
// # MRTR
//
// connect_account for a provider the caller has not connected (or whose
// connection needs reconnecting or lacks scopes) gets a connect request
// from the connections layer and answers input_required with one
// elicitation/create url entry whose URL is PublicURL/connect/<grant id>,
// plus a requestState sealed by package internal/requeststate (AEAD, AAD
// "credbroker/requestState/v1") binding principal, tool, a SHA-256 digest of
// the canonical arguments, grant id and expiry. A client without elicitation.url gets -32021. Legacy
// clients get -32042 (URLElicitationRequiredError, elicitationId = grant id)
// when their initialize declared elicitation.url: the broker hands such a
// client a sealed Mcp-Session-Id on initialize recording its capabilities,
// because the go-sdk's stateless handler forgets them between requests.
package mcpapi
