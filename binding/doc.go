// Package binding owns connect requests ("grants"): a grant is created for
// the principal that asked for a connection, named by an opaque 128-bit id,
// lives for a short TTL, and is used at most once.
//
// State machine (vault.GrantState):
//
//	pending ──Approve──▶ approved ──Complete──▶ completed
//	   │                    │
//	   ├──Deny/Decline──────┴──▶ denied
//	   └──(TTL passes)──────────▶ expired
//
// The browser takes the first two edges in one store transaction
// (ApproveAndCompleteWith, through connections.Save): the consent form
// writes nothing (oauthflow carries the consent to the provider's callback
// in its sealed flow cookie, naming the person and the grant), and the
// callback stores the connection, approves and completes the grant at once.
// So an MRTR round trip costs two durable commits: creating the grant and
// that one.
//
// Every transition names the acting principal and is refused unless it is
// the grant's own (compared in constant time). Create enforces per-principal
// limits on open grants and on grants started per hour; the store counts and
// inserts in one atomic step (vault.Store.CreateGrantLimited), so concurrent
// requests, on one replica or several, never pass a limit together.
// binding knows nothing about
// HTTP or MCP, and only the connections layer calls it: it creates grants
// for every front door that asks (Ensure, Pick, Reconnect), continues them
// on a client's retry (Resume), and takes the browser's steps (Open,
// Decline, EnterKey, Complete).
package binding
