package vault

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"slices"
	"time"
)

// OAuthClient is a client registered at the broker's authorization server
// through dynamic client registration (RFC 7591). Clients identified by a
// Client ID Metadata Document are fetched, not stored.
type OAuthClient struct {
	ID string
	// SecretHash is SHA-256 of the client secret of a confidential client;
	// empty for a public client. The secret itself is never stored.
	SecretHash []byte
	// AuthMethod is the token endpoint auth method: none,
	// client_secret_basic or client_secret_post.
	AuthMethod string
	// Name and URI are the client's self-asserted client_name and
	// client_uri: untrusted text.
	Name            string
	URI             string
	RedirectURIs    []string
	GrantTypes      []string
	ApplicationType string // web or native
	Created         time.Time
	// Used is when the client first redeemed an authorization code; zero
	// while it never has (such clients expire, see DeleteUnusedOAuthClients).
	Used    time.Time
	Version uint64
}

// Clone returns a deep copy of c.
func (c OAuthClient) Clone() OAuthClient {
	c.SecretHash = slices.Clone(c.SecretHash)
	c.RedirectURIs = slices.Clone(c.RedirectURIs)
	c.GrantTypes = slices.Clone(c.GrantTypes)
	return c
}

// AuthCode is an authorization code issued by the broker's authorization
// server. It is stored under SecretKey(code): the code itself never is.
type AuthCode struct {
	// Key is SecretKey of the code.
	Key         string
	ClientID    string
	RedirectURI string
	Principal   Principal
	Scopes      []string
	Resource    string
	// Challenge is the PKCE S256 code_challenge of the authorization request.
	Challenge string
	// AppID and FamilyID name the AppAccess and the TokenFamily the code's
	// tokens belong to: the family is created when the code is redeemed,
	// and revoked if the code is ever presented again.
	AppID    string
	FamilyID string
	Created  time.Time
	Expires  time.Time
	Redeemed bool
}

// Clone returns a deep copy of c.
func (c AuthCode) Clone() AuthCode {
	c.Scopes = slices.Clone(c.Scopes)
	return c
}

// AppAccess is one person's authorization of one OAuth client (an "app"):
// the consent they gave and the token families issued under it. Removing
// the record revokes everything the app holds for that person at once.
type AppAccess struct {
	ID        string
	Principal Principal
	ClientID  string
	// ClientName is the client's self-asserted name when consent was
	// given: untrusted text, shown escaped.
	ClientName string
	// RedirectURI, Scopes and Resources are what the person consented
	// to. Resources are the broker's MCP endpoints the consent covers (the
	// main one, gateway endpoints); empty in a record from before they
	// were recorded, which covers the main endpoint only.
	RedirectURI string
	Scopes      []string
	Resources   []string
	Created     time.Time
	// Updated is when consent was last given.
	Updated time.Time
	// LastUsed is when the app last received a token.
	LastUsed time.Time
	Families []TokenFamily
	Version  uint64
}

// Clone returns a deep copy of a.
func (a AppAccess) Clone() AppAccess {
	a.Scopes = slices.Clone(a.Scopes)
	a.Resources = slices.Clone(a.Resources)
	fams := make([]TokenFamily, len(a.Families))
	for i, f := range a.Families {
		fams[i] = f.Clone()
	}
	if a.Families == nil {
		fams = nil
	}
	a.Families = fams
	return a
}

// Family returns the family with id, if a holds it.
func (a AppAccess) Family(id string) (TokenFamily, bool) {
	for _, f := range a.Families {
		if f.ID == id {
			return f, true
		}
	}
	return TokenFamily{}, false
}

// TokenFamily is the tokens issued from one authorization code: the access
// tokens (which name the family) and the chain of refresh tokens, each
// replacing the one before. Deleting the family revokes all of them.
type TokenFamily struct {
	ID       string
	Scopes   []string
	Resource string
	Created  time.Time
	// Expires is the absolute end of the family: no token of it is valid
	// afterwards.
	Expires time.Time
	// RefreshHash is SecretKey of the current refresh token; empty when
	// the family has none.
	RefreshHash string
	// Refreshed is when the current refresh token was issued (its idle
	// lifetime counts from here).
	Refreshed time.Time
	// Spent are the SecretKeys of refresh tokens already exchanged, oldest
	// first and capped: presenting one again is a replay, and revokes the
	// family.
	Spent []string
	// Via says how the family was granted when not by the person's consent
	// in the browser, in the apps core's words (apps.ViaIDJAG: an ID-JAG
	// the organisation's IdP issued); empty otherwise. The store keeps it
	// as it is.
	Via string
}

// AppWatcher is told about changes of app access records made by any
// process sharing the store (AppWatch).
type AppWatcher struct {
	// Changed is called with the id of a record that was updated or
	// deleted, after the change committed.
	Changed func(appID string)
	// Fresh is called with a time asOf: every change committed before
	// asOf (this process's monotonic clock) has been passed to Changed.
	Fresh func(asOf time.Time)
	// Lost is called when the feed breaks: changes may be missed until
	// the next Fresh.
	Lost func()
}

// AppWatch is the Store feature that Store.AppWatch returns, for a store
// several processes share (pgstore: PostgreSQL LISTEN/NOTIFY): a feed of
// the changes of app access records, so each process can cache what it
// read.
type AppWatch interface {
	// WatchApps follows the changes until ctx ends, reconnecting on its
	// own; it calls w's functions from one goroutine, in order.
	WatchApps(ctx context.Context, w AppWatcher) error
	// WatchConnections is WatchApps for connections: w.Changed is called
	// with the Principal.Key of the person whose connection was created,
	// updated or deleted, after the change committed.
	WatchConnections(ctx context.Context, w AppWatcher) error
}

// Clone returns a deep copy of f.
func (f TokenFamily) Clone() TokenFamily {
	f.Scopes = slices.Clone(f.Scopes)
	f.Spent = slices.Clone(f.Spent)
	return f
}

// SecretKey is how a high-entropy secret (an authorization code, a refresh
// token, a client secret) is stored and looked up: base64url of its
// SHA-256, never the secret itself.
func SecretKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// AuthStore is the storage of the broker's OAuth authorization server,
// the Store feature that Store.Auth returns; vaulttest.RunAuth is its
// conformance suite. Nothing secret is stored: codes and refresh tokens
// are kept as SecretKey hashes, client secrets as SHA-256.
type AuthStore interface {
	// CreateOAuthClient stores a registered client (Version becomes 1),
	// counting the stored clients atomically with the insert: with max > 0
	// it fails with ErrTooManyClients, storing nothing, when max clients
	// are stored already. ErrExists if the id is taken.
	CreateOAuthClient(ctx context.Context, c OAuthClient, max int) (OAuthClient, error)
	// GetOAuthClient returns a registered client. ErrNotFound if absent.
	GetOAuthClient(ctx context.Context, id string) (OAuthClient, error)
	// UpdateOAuthClient is the compare-and-swap mutation of a client, with
	// the rules of Store.UpdateConnection. ID is immutable.
	UpdateOAuthClient(ctx context.Context, id string, fn func(OAuthClient) (OAuthClient, error)) (OAuthClient, error)
	// DeleteOAuthClient removes a client. ErrNotFound if absent.
	DeleteOAuthClient(ctx context.Context, id string) error
	// DeleteUnusedOAuthClients removes the clients created before
	// createdBefore that never redeemed a code, and returns how many.
	DeleteUnusedOAuthClients(ctx context.Context, createdBefore time.Time) (int, error)

	// CreateAuthCode stores a new authorization code. ErrExists if its
	// key is taken.
	CreateAuthCode(ctx context.Context, c AuthCode) error
	// RedeemAuthCode marks the code with key as redeemed and returns it,
	// atomically, so of concurrent redemptions (on one process or many
	// sharing the store) exactly one succeeds. A code redeemed before is
	// returned with ErrCodeRedeemed. ErrNotFound if absent. Expiry is the
	// caller's to check.
	RedeemAuthCode(ctx context.Context, key string) (AuthCode, error)
	// DeleteExpiredAuthCodes removes codes whose Expires is before before,
	// redeemed or not, and returns how many.
	DeleteExpiredAuthCodes(ctx context.Context, before time.Time) (int, error)

	// CreateAppAccess stores a new app access record (Version becomes 1).
	// ErrExists if the id is taken or the principal already has a record
	// for the client.
	CreateAppAccess(ctx context.Context, a AppAccess) (AppAccess, error)
	// GetAppAccess returns a record by id. ErrNotFound if absent.
	GetAppAccess(ctx context.Context, id string) (AppAccess, error)
	// GetAppLiveness returns what checking an access token needs of a
	// record: whose it is (ID, Principal, ClientID) and which token
	// families it holds until when (each family's ID and Expires). Nothing
	// else is decoded or set (no consent, no scopes, no refresh token
	// hashes), as ListConnections leaves a connection's Token empty.
	// ErrNotFound if absent.
	GetAppLiveness(ctx context.Context, id string) (AppAccess, error)
	// FindAppAccess returns p's record for clientID. ErrNotFound if absent.
	FindAppAccess(ctx context.Context, p Principal, clientID string) (AppAccess, error)
	// ListAppAccess returns p's records ordered by id.
	ListAppAccess(ctx context.Context, p Principal) ([]AppAccess, error)
	// UpdateAppAccess is the compare-and-swap mutation of a record, with
	// the rules of Store.UpdateConnection. ID, Principal and ClientID are
	// immutable.
	UpdateAppAccess(ctx context.Context, id string, fn func(AppAccess) (AppAccess, error)) (AppAccess, error)
	// DeleteAppAccess removes a record. ErrNotFound if absent.
	DeleteAppAccess(ctx context.Context, id string) error
}
