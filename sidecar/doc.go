// Package sidecar is credbroker's API for MCP servers running next to the
// broker: they use the user's connections without holding any OAuth code or
// (unless a provider opts in) any token. It is served on a separate
// listener, off by default (broker serve --sidecar-addr 127.0.0.1:8081 or
// --sidecar-socket PATH; broker dev serves it on 127.0.0.1:8081). The
// contract, with every route, body, status and error code, is
// docs/sidecar.openapi.yaml (OpenAPI 3.1); tests validate the real
// answers against it.
//
// Every call carries two credentials, both checked before anything else:
//
//	Broker-Sidecar-Secret: <the server's own secret>  names the co-located server (Caller);
//	                                                  compared in constant time
//	Authorization: Bearer <the end user's token>       validated by the broker itself
//	                                                  (a token the broker issued, or an IdP JWT:
//	                                                  issuer, signature, an accepted audience,
//	                                                  that audience's required scope if any)
//
// The caller never asserts who the user is: the principal comes from the
// validated bearer token. Which server is calling comes from its secret:
// each configured server (a name:secret line of --sidecar-secrets-file, or
// the unnamed BROKER_SIDECAR_SECRET) has its own, may be limited to some
// providers (403 provider_not_allowed), and its name is shown on the
// consent page ("Requested by <name>, a server your administrator
// configured"), in audit events (server=…) and in the metrics.
//
// Routes:
//
//	POST /v1/require                 {provider, scopes?, request_state?, input_responses?, client_name?}
//	                                 → 200 {"status":"connected","connection":{id,provider,account,scopes,status}}
//	                                 → 200 {"status":"input_required","input_key":"connect_<provider>",
//	                                        "input_request":{"method":"elicitation/create",
//	                                        "params":{"mode":"url","message":…,"url":…}},"request_state":…}
//	                                 → 200 {"status":"declined"|"cancelled","message":…}
//	ANY  /v1/proxy/{provider}/{path…} the provider API request with the stored token injected
//	                                 (same path rules, allow-list, caps and refresh as
//	                                 provider_request); the upstream status, selected headers
//	                                 and body, plus Broker-Truncated: true when the body was cut and
//	                                 Broker-Decoded: gzip|deflate when the provider compressed its
//	                                 answer unasked (the broker decodes it to check it for secrets).
//	                                 Broker-Account selects the account when several are connected.
//	POST /v1/token                   {provider, account?} → {"access_token","token_type","expires_at"}
//	                                 only for providers with sidecar_token_export: true; never
//	                                 the refresh token. Every export is an audit event
//	                                 (token_export: principal, provider, account,
//	                                 connection, server; never the token).
//
// The co-located server copies input_request into its own MCP
// InputRequiredResult under input_key, and on the host's retry sends back
// request_state and the host's inputResponses as input_responses (the
// same accept/decline/cancel shapes; entries under other keys answer the
// server's own requests and are ignored). The broker answers the three
// outcomes as connect_account does: accept keeps the request open until
// the person finished in the browser, decline closes it (declined, also on
// every later retry), cancel leaves the link usable (cancelled).
// client_name is the host's self-asserted name, shown as not verified.
// request_state is sealed like an MCP requestState (package
// internal/requeststate), bound to the principal, "sidecar/require" and
// the digest of {provider, scopes}.
//
// Every decision (which connection, whether to start a connect request,
// token export) is the connections package's; this package translates its
// outcomes and errors into the REST answers above and imports no other
// front door.
//
// Errors are JSON: {"error": code, "message": words, "accounts"?: […]},
// with the header Broker-Error: true (which tells them from a provider's
// relayed answer on /v1/proxy), and codes unauthorized (401: secret or
// user token), insufficient_scope (403: the token lacks its audience's
// required scope), provider_not_allowed (403), invalid_request (400, 415),
// invalid_request_state (400), unknown_provider (404), not_connected,
// needs_reconnect, account_required and refused (409), request_refused
// (400), body_too_large (413), token_export_disabled (403),
// provider_answer_refused (502: an answer in an encoding the broker cannot
// check), provider_unavailable (502, 504) and internal (500, 503).
package sidecar
