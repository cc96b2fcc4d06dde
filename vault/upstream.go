package vault

import (
	"context"
	"time"
)

// UpstreamClient is a client the broker registered dynamically (RFC 7591)
// at the authorization server of an upstream MCP server (the gateway's
// provider kind mcp). Replicas share it through the store, so the broker
// registers once per authorization server and redirect URI, not once per
// process or start.
type UpstreamClient struct {
	// Key names the registration: the authorization server's issuer and
	// the broker's redirect URI (provider.UpstreamClientKey).
	Key      string
	ClientID string
	// ClientSecret is empty for a public client. It is the record's only
	// sealed field: the Keyring seals it at rest, bound to Key and
	// ClientID.
	ClientSecret Secret
	// AuthMethod is none, client_secret_basic or client_secret_post.
	AuthMethod string
	Created    time.Time
	// SealedWith is the id of the key that sealed ClientSecret (empty
	// without one); set by the store on read, ignored on write.
	SealedWith string
}

// UpstreamClientStore keeps the broker's registrations at upstream
// authorization servers: the Store feature that Store.UpstreamClients
// returns; vaulttest.RunUpstreamClients is its conformance suite.
type UpstreamClientStore interface {
	// GetUpstreamClient returns the registration under key, its secret
	// opened. ErrNotFound if absent.
	GetUpstreamClient(ctx context.Context, key string) (UpstreamClient, error)
	// PutUpstreamClient stores c unless a registration under c.Key
	// exists, and returns the stored one either way: of concurrent puts
	// of one key, on one process or many sharing the store, the first
	// wins and every caller gets it. A key no backend can keep (empty,
	// longer than 2048 bytes, not UTF-8 or holding a NUL) or a client
	// without ClientID is an error and stores nothing.
	PutUpstreamClient(ctx context.Context, c UpstreamClient) (UpstreamClient, error)
	// DeleteUpstreamClient forgets the registration under key (the
	// authorization server no longer knows it) when it is client clientID,
	// whatever client it is when clientID is empty: compare-and-delete, so
	// a caller that saw one client fail never deletes the one another
	// replica registered since. ErrNotFound if absent, ErrConflict if the
	// registration under key is another client (nothing is deleted).
	DeleteUpstreamClient(ctx context.Context, key, clientID string) error
	// ResealUpstreamClients seals again, with the primary key, every
	// client secret sealed with another, and returns how many it
	// rewrote (Rekey calls it, so a key that is rotated out seals none).
	ResealUpstreamClients(ctx context.Context) (int, error)
}
