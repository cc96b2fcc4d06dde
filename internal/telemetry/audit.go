package telemetry

import (
	"errors"
	"log/slog"

	"credbroker/binding"
	"credbroker/vault"
)

// Audit event kinds (Event.Kind).
const (
	EventConnect          = "connect"                // a connection was stored (new or updated)
	EventDisconnect       = "disconnect"             // a connection was deleted by its owner
	EventRevoke           = "revoke"                 // revocation at the provider was attempted (Outcome says how it went)
	EventRefreshFailed    = "refresh_failed"         // a token refresh failed
	EventNeedsReconnect   = "needs_reconnect"        // a connection was marked needs_reconnect
	EventIdentityMismatch = "identity_mismatch"      // a connect link was opened by another principal
	EventConnectDeclined  = "connect_declined"       // a person declined a connect request (on a page, at the provider, or in their client)
	EventStepUp           = "step_up"                // an upstream MCP server asked for more scopes; a connect request for them was started
	EventStepUpRefused    = "step_up_refused"        // an upstream MCP server asked for more scopes too often; no connect request was started
	EventToolsChanged     = "upstream_tools_changed" // an upstream MCP server's tool list changed
	EventUpstreamError    = "upstream_error"         // an upstream MCP server's authorization cannot be used (discovery or registration failed; Outcome is the kind)
	EventKeyRotation      = "key_rotation"           // records were re-sealed with a new primary key
	EventTokenExport      = "token_export"           // a provider access token was handed to a sidecar
	EventAppAuthorized    = "app_authorized"         // a person approved an app (OAuth client) at the broker's authorization server
	EventAppRemoved       = "app_removed"            // a person removed an app's access (all its tokens revoked)
	EventTokenReplay      = "token_replay"           // a spent refresh token or a redeemed code was presented again; its tokens were revoked

	// EventUpstreamRegistrationDropped: the broker's dynamic registration
	// at an upstream MCP server's authorization server was deleted: that
	// server no longer knows it (invalid_client at its token endpoint), or
	// an operator ran broker upstreams forget. The next connect registers
	// anew. Client is the dropped client id, Outcome why.
	EventUpstreamRegistrationDropped = "upstream_registration_dropped"
)

var knownEvents = []string{EventConnect, EventConnectDeclined, EventDisconnect, EventRevoke, EventRefreshFailed,
	EventNeedsReconnect, EventIdentityMismatch, EventKeyRotation, EventTokenExport,
	EventAppAuthorized, EventAppRemoved, EventTokenReplay, EventStepUp, EventStepUpRefused, EventToolsChanged, EventUpstreamError,
	EventUpstreamRegistrationDropped}

// Event is one audit record. It has no field for secret material: tokens,
// codes, cookies and client secrets have no place in it.
type Event struct {
	Kind string // Event* constants
	// Principal is the person the event concerns: the connection's owner,
	// or for an identity mismatch the signed-in browser user (the actor).
	Principal vault.Principal
	// Owner is, for an identity mismatch, the principal that started the grant.
	Owner vault.Principal
	// Admin is the operator who acted, for admin actions (offboarding,
	// provider disable, listings) and what they caused.
	Admin      vault.Principal
	Provider   string
	Account    string // provider account login or id
	Grant      string // grant (connect request) id; logged as its binding.Ref only
	Connection string // connection id
	Client     string // OAuth client id of an app (authorization server events)
	Via        string // "mcp", "browser", "sidecar", "background"
	// Server is the configured name of the co-located MCP server the event
	// came from or was asked by (sidecar), when there is one.
	Server  string
	Outcome string // e.g. revoke: revoked, not_revoked, not_supported, failed
	KeyID   string // key rotation: the new primary key id
	Count   int    // key rotation: records re-sealed
	Err     error  // what went wrong, for failures (scrubbed by the redacting handler)
}

func principalAttr(key string, p vault.Principal) slog.Attr {
	return slog.Group(key, slog.String("iss", p.Issuer), slog.String("sub", p.Subject))
}

func (e Event) attrs() []slog.Attr {
	as := []slog.Attr{slog.Bool("audit", true), slog.String("event", e.Kind)}
	add := func(k, v string) {
		if v != "" {
			as = append(as, slog.String(k, v))
		}
	}
	if !e.Principal.IsZero() {
		as = append(as, principalAttr("principal", e.Principal))
	}
	if !e.Owner.IsZero() {
		as = append(as, principalAttr("owner", e.Owner))
	}
	if !e.Admin.IsZero() {
		as = append(as, principalAttr("admin", e.Admin))
	}
	add("provider", e.Provider)
	add("account", e.Account)
	if e.Grant != "" {
		// Never the grant id itself: it is its owner's connect link.
		add("grant_ref", binding.Ref(e.Grant))
	}
	add("connection", e.Connection)
	add("client", e.Client)
	add("via", e.Via)
	add("server", e.Server)
	add("outcome", e.Outcome)
	add("key_id", e.KeyID)
	if e.Kind == EventKeyRotation {
		as = append(as, slog.Int("records", e.Count))
	}
	if e.Err != nil {
		as = append(as, slog.String("err", e.Err.Error()))
	}
	return as
}

func isConflict(err error) bool { return errors.Is(err, vault.ErrConflict) }
