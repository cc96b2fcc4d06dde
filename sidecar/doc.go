// Package sidecar is credbroker's API for MCP servers running next to the
// broker: they use the user's connections without holding any OAuth code or
// (unless a provider opts in) any token. It is served on a separate
// listener, off by default (broker serve --sidecar-addr 127.0.0.1:8081 or
// --sidecar-socket PATH).
//
// Every call carries two credentials, both checked before anything else:
//
//	Broker-Sidecar-Secret: <BROKER_SIDECAR_SECRET>   compared in constant time
//	Authorization: Bearer <the end user's token>     validated by the broker itself
//	                                                  (issuer, signature, accepted audiences,
//	                                                  the broker's --required-scope if set)
//
// The caller never asserts who the user is: the principal comes from the
// validated bearer token.
//
// Routes:
//
//	POST /v1/require                 {provider, scopes?, request_state?}
//	                                 → 200 {"status":"connected","connection":{id,provider,account,scopes,status}}
//	                                 → 200 {"status":"input_required","input_request":{"method":"elicitation/create",
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
//	                                 connection; never the token).
//
// The co-located server copies input_request into its own MCP
// InputRequiredResult and sends request_state back on its retry; the state
// is sealed like an MCP requestState (package internal/requeststate), bound
// to the principal, "sidecar/require" and the digest of {provider, scopes}.
//
// Every decision (which connection, whether to start a connect request,
// token export) is the connections package's; this package translates its
// outcomes and errors into the REST answers above and imports no other
// front door.
//
// Errors are JSON: {"error": code, "message": words, "accounts"?: […]}, with
// codes unauthorized (401: secret or user token), insufficient_scope (403:
// the user token lacks the broker's --required-scope), invalid_request (400),
// invalid_request_state (400), unknown_provider (404), not_connected and
// needs_reconnect and account_required (409), request_refused (400),
// body_too_large (413), token_export_disabled (403), provider_answer_refused
// (502: an answer in an encoding the broker cannot check), provider_unavailable
// (502) and internal (500).
package sidecar
