// Package connections makes credbroker's product decisions once, for every
// front door (the MCP endpoint, the sidecar API, the browser pages): does
// this person have a connection to that provider covering these scopes,
// and if not, start or resume a connect request; both halves of a connect
// request (the client's, and the browser's: open the link, decline, enter a
// key, complete at the provider's callback); which of several accounts to
// use; calling the provider as the person (Perform: pick, call, reconnect);
// what a listing shows; what disconnecting means (revocation with a
// three-way outcome, then deletion); what may be exported; and recording
// that a connection was used. For operators (offboard.go, keepalive.go):
// offboarding a person (resumable: a revocation that is not confirmed is
// retried by the next run, the deletion happens anyway; OffboardStep adds
// further kinds of a person's data), disabling a provider, and the
// keep-alive pass. It asks providers what they can do (the provider
// package's kind capabilities), never which kind they are.
//
// It answers with typed outcomes and errors, never with MCP, HTTP or HTML
// shapes; each front door translates them into its own wire form:
//
//	Connected{Conn}              the connection to use (metadata only)
//	Response{Conn, Resp}         the provider's answer to a call (Perform)
//	NeedsUser{Grant, URL, Why}   the person must act in the browser; Grant is
//	                             nil when the caller cannot send them a link
//	Declined / Cancelled         the person said no / did not decide
//	Ambiguous{Accounts}          several accounts qualify; the caller must name one
//
// The browser half answers ConnectRequest (an open link) or a *LinkError
// whose Problem says why not: unknown, not yours, expired, already used,
// declined, provider gone, scope not allowed, too many keys tried, not
// consented in this browser; Complete also *IssuerError and
// *ProviderError. Decline is the one place a decline is recorded (metric
// and audit event), wherever the person said no.
//
// Errors: *UnknownProviderError, *ScopeError, *AccountError,
// *ChoiceError, *KeyAccountError, ErrUnknownRequest (no such connect
// request for this person and call), ErrRequestExpired, ErrTooManyRounds,
// ErrTooManyPending, ErrRateLimited, ErrConnectionGone, ErrExportDisabled,
// and the provider package's typed errors. Explain classifies any of them
// once for every door (a Class each door maps to its wire, a stable Code,
// what to do Next) and Describe gives the words, fit for a person or a
// model. No decision reads an error's text.
//
// # API keys
//
// A connection to a type: api_key provider is decided exactly like an
// OAuth one (Ensure, Resume, Pick, Call, List, Disconnect): the person is
// asked in the browser (url mode only: a key is never asked for in a form
// the client renders), Save stores the verified key with the same
// one-connection-per-account rule, and a key the provider refuses makes
// the connection needs_reconnect, so the next call asks for a new key.
// ReplaceKey puts a new key into one existing connection (same account
// only); Export never hands a key out; Disconnect has nothing to revoke
// (provider.NotSupported) and the front doors say where to revoke the key.
//
// # Decrypting
//
// Listing and picking work on metadata (vault.Store.ListConnections opens
// nothing). The one record whose token is used is opened once, by the
// provider client, where it is used; recording the use rewrites metadata
// only (vault.Store.UpdateConnectionMeta).
//
// # Logging connect requests
//
// A grant id is a capability for its owner's connect link, so it is never
// logged or audited as is: logs and audit events carry binding.Ref(id), a
// short non-reversible reference that a support request (the error page
// shows the same reference) can be matched with.
package connections
