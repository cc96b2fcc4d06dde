package vault

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"maps"
	"slices"
	"time"
)

// Principal identifies a person: the issuer and subject of a validated
// credential. It is never taken from a client-asserted field.
type Principal struct {
	Issuer  string `json:"iss"`
	Subject string `json:"sub"`
}

// IsZero reports whether p is unset.
func (p Principal) IsZero() bool { return p.Issuer == "" && p.Subject == "" }

// Same reports whether p and q are the same person: both set and equal,
// compared in constant time (per field length). It is the one comparison
// of principals.
func (p Principal) Same(q Principal) bool {
	iss := subtle.ConstantTimeCompare([]byte(p.Issuer), []byte(q.Issuer))
	sub := subtle.ConstantTimeCompare([]byte(p.Subject), []byte(q.Subject))
	return iss&sub == 1 && p.Issuer != "" && p.Subject != ""
}

// Key is how a person's connection changes are announced
// (AppWatch.WatchConnections): hex SHA-256 of the issuer's length as four
// big-endian bytes, the issuer and the subject. pgstore's connections
// trigger computes the same.
//
// Every call on the MCP hot path computes it (the listing cache's key), so
// it hashes one buffer on the stack (for usual lengths) and allocates only
// the string it returns.
func (p Principal) Key() string {
	var buf [256]byte
	b := binary.BigEndian.AppendUint32(buf[:0], uint32(len(p.Issuer)))
	b = append(append(b, p.Issuer...), p.Subject...)
	sum := sha256.Sum256(b)
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// ConnectionStatus is the lifecycle state of a connection.
type ConnectionStatus string

const (
	// StatusActive: the tokens are believed to work.
	StatusActive ConnectionStatus = "active"
	// StatusNeedsReconnect: the provider rejected the refresh token
	// (invalid_grant); the user must connect again.
	StatusNeedsReconnect ConnectionStatus = "needs_reconnect"
)

// TokenSet is the token material of a connection. It is the only part of a
// connection that is encrypted at rest.
type TokenSet struct {
	AccessToken  Secret    `json:"-"`
	RefreshToken Secret    `json:"-"`
	TokenType    string    `json:"-"`
	Expiry       time.Time `json:"-"`
	IDToken      Secret    `json:"-"`
	// Fields are the values a person entered for an API-key connection
	// (field name → value, e.g. "api_key", or "email" and "api_token"),
	// sealed with the rest; nil for OAuth connections.
	Fields map[string]Secret `json:"-"`
}

// IsZero reports whether t holds no token material at all.
func (t TokenSet) IsZero() bool {
	return t.AccessToken == "" && t.RefreshToken == "" && t.TokenType == "" && t.Expiry.IsZero() &&
		t.IDToken == "" && len(t.Fields) == 0
}

// Equal reports whether t and o hold the same token material.
func (t TokenSet) Equal(o TokenSet) bool {
	return t.AccessToken == o.AccessToken && t.RefreshToken == o.RefreshToken && t.TokenType == o.TokenType &&
		t.Expiry.Equal(o.Expiry) && t.IDToken == o.IDToken && maps.Equal(t.Fields, o.Fields)
}

// Clone returns a copy of t whose Fields map is its own.
func (t TokenSet) Clone() TokenSet {
	t.Fields = maps.Clone(t.Fields)
	return t
}

// Connection links a principal to one account at one provider.
type Connection struct {
	ID        string
	Principal Principal
	Provider  string
	// AccountID is the provider account's stable id (GitHub numeric id, OIDC sub).
	AccountID string
	// AccountLogin is the display login or email of the provider account.
	AccountLogin string
	// Scopes are what the provider granted; Requested what the connect
	// request that made or last updated the connection asked for (nil
	// when unknown: API keys, connections stored before brokers recorded
	// it). A person may grant less than was asked (Google's granular
	// consent); the difference is what the model is told it lacks.
	Scopes        []string
	Requested     []string
	Token         TokenSet
	Status        ConnectionStatus
	Created       time.Time
	Updated       time.Time
	LastUsed      time.Time
	LastRefreshed time.Time
	// RefreshExpires is when the refresh token expires, as the provider
	// said (refresh_token_expires_in); zero when it did not say.
	RefreshExpires time.Time
	// NoRefreshToken: the stored token set has no refresh token. It is
	// metadata (listings show it without opening tokens): set by the store
	// on read from what it sealed, ignored on write.
	NoRefreshToken bool
	// Version increases by one on every write; the store sets it.
	Version uint64
	// SealedWith is the id of the key that sealed the stored token set; set
	// by the store on read, ignored on write (the primary key always seals).
	SealedWith string
}

// Clone returns a deep copy of c.
func (c Connection) Clone() Connection {
	c.Scopes = slices.Clone(c.Scopes)
	c.Requested = slices.Clone(c.Requested)
	c.Token = c.Token.Clone()
	return c
}

// GrantState is the state of a connect request. The machine is
//
//	pending → approved → completed
//	pending → denied | expired
//	approved → denied | expired
//
// completed, denied and expired are final. pending → approved → completed
// may be one write (binding.ApproveAndCompleteWith), so a pending grant can
// become completed in one step.
type GrantState string

const (
	GrantPending   GrantState = "pending"
	GrantApproved  GrantState = "approved"
	GrantCompleted GrantState = "completed"
	GrantDenied    GrantState = "denied"
	GrantExpired   GrantState = "expired"
)

// Final reports whether no further transition is possible from s.
func (s GrantState) Final() bool {
	return s == GrantCompleted || s == GrantDenied || s == GrantExpired
}

// UnnamedServer is Grant.Server for a co-located server that authenticated
// with the single unnamed sidecar secret (BROKER_SIDECAR_SECRET); no named
// server may take this name.
const UnnamedServer = "unnamed"

// Grant is a pending connect request, bound to the principal that started it.
type Grant struct {
	ID        string
	Principal Principal
	Provider  string
	Scopes    []string
	// ClientName is the requesting MCP client's self-reported name: untrusted text.
	ClientName string
	// Server is the configured name of the co-located MCP server that
	// asked through the sidecar API, set by the broker from the secret the
	// server authenticated with (trusted): UnnamedServer for the single
	// unnamed secret, empty for requests of MCP clients. Records written
	// before this field existed read as empty.
	Server  string
	Created time.Time
	Expires time.Time
	State   GrantState
	// ConnectionID is set when State is GrantCompleted.
	ConnectionID string
	// Rounds counts MRTR retries answered while the grant was open.
	Rounds int
	// Attempts counts key entries checked at the provider for this grant
	// (API-key providers), so a connect link cannot serve as a key oracle.
	Attempts int
	// Why is a reason code the broker recorded when it asks the person
	// in the browser after connecting without them was refused (the
	// upstream ID-JAG outcome, such as "idp_refused"); empty otherwise.
	// Set at creation; the connect page says it in words.
	Why string

	Version uint64
}

// Clone returns a deep copy of g.
func (g Grant) Clone() Grant {
	g.Scopes = slices.Clone(g.Scopes)
	return g
}

// GrantLimits bounds one principal's grants. CreateGrantLimited counts the
// principal's grants created at or after Since, and of those the ones still
// open at Now (not final, Expires after Now), in the same atomic step as the
// insert, so concurrent creates (on one process or many sharing the store)
// can never pass a limit together. A limit of zero or less is not enforced.
type GrantLimits struct {
	// Since starts the window: grants created before it do not count.
	Since time.Time
	// Now decides which grants are still open.
	Now time.Time
	// MaxOpen bounds the open grants; reaching it gives ErrTooManyOpenGrants.
	MaxOpen int
	// MaxCreated bounds the grants created since Since; reaching it gives
	// ErrTooManyRecentGrants.
	MaxCreated int
}

// Enforced reports whether l limits anything.
func (l GrantLimits) Enforced() bool { return l.MaxOpen > 0 || l.MaxCreated > 0 }

// Counts reports whether g counts towards l: created is true when g was
// created at or after l.Since, open when it is also still open at l.Now.
// Stores use it on the grants they count.
func (l GrantLimits) Counts(g Grant) (created, open bool) {
	if g.Created.Before(l.Since) {
		return false, false
	}
	return true, !g.State.Final() && l.Now.Before(g.Expires)
}

// Check returns the refusal for a principal with created grants in the
// window, open of them still open, or nil when one more is allowed. The
// open-grants limit is reported first.
func (l GrantLimits) Check(created, open int) error {
	if l.MaxOpen > 0 && open >= l.MaxOpen {
		return ErrTooManyOpenGrants
	}
	if l.MaxCreated > 0 && created >= l.MaxCreated {
		return ErrTooManyRecentGrants
	}
	return nil
}

// Store is the persistence contract. All methods are safe for concurrent use.
// Errors wrap the sentinels above so callers can use errors.Is.
type Store interface {
	// CreateConnection stores a new connection (Version becomes 1).
	// ErrExists if the id is taken.
	CreateConnection(ctx context.Context, c Connection) (Connection, error)
	// GetConnection returns the connection with its tokens decrypted. It is
	// the one place a token set is opened: call it where the token is used.
	GetConnection(ctx context.Context, id string) (Connection, error)
	// ListConnections returns p's connections, ordered by id, via an index:
	// metadata only. Token is empty and nothing is decrypted (SealedWith
	// names the sealing key); a record whose ciphertext was tampered with is
	// listed but fails to open in GetConnection.
	ListConnections(ctx context.Context, p Principal) ([]Connection, error)
	// UpdateConnection applies fn to the current record and stores the result
	// atomically (Version+1): a compare-and-swap inside one transaction. ID,
	// Principal, Provider and AccountID are immutable; changing them is an
	// error. Returning a record whose Version differs from the one fn was
	// given (a stale copy) fails with ErrConflict. An error from fn aborts
	// the update and is returned as is. fn may run more than once (backends
	// batch writers and retry) and must not do I/O or have side effects
	// beyond its result.
	UpdateConnection(ctx context.Context, id string, fn func(Connection) (Connection, error)) (Connection, error)
	// UpdateConnectionMeta is UpdateConnection for metadata (status, times,
	// scopes, login): fn sees the record without its tokens and must leave
	// Token empty, and the stored sealed token set is kept byte for byte,
	// neither opened nor sealed again. The result has an empty Token.
	UpdateConnectionMeta(ctx context.Context, id string, fn func(Connection) (Connection, error)) (Connection, error)
	// DeleteConnection removes the connection. ErrNotFound if absent.
	DeleteConnection(ctx context.Context, id string) error
	// ConnectionIDs returns up to limit connection ids greater than after, in
	// order, without decrypting anything (for key rotation and migration).
	ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error)
	// AccountConnections returns every principal's connections to one
	// provider account, ordered by id: metadata only, as ListConnections.
	// Revoking at a provider ends the tokens of every connection to the
	// account; this is how the broker finds them first.
	AccountConnections(ctx context.Context, provider, accountID string) ([]Connection, error)

	// CreateGrant stores a new grant (Version becomes 1). ErrExists if the id is taken.
	CreateGrant(ctx context.Context, g Grant) (Grant, error)
	// GetGrant returns the grant as stored (expiry is not applied here).
	GetGrant(ctx context.Context, id string) (Grant, error)
	// UpdateGrant is the compare-and-swap mutation of a grant, with the same
	// rules as UpdateConnection. ID and Principal are immutable.
	UpdateGrant(ctx context.Context, id string, fn func(Grant) (Grant, error)) (Grant, error)
	// CreateGrantLimited is CreateGrant that first counts g.Principal's
	// grants under lim, atomically with the insert: it fails with
	// ErrTooManyOpenGrants or ErrTooManyRecentGrants, storing nothing, when
	// lim.Check refuses, so N concurrent calls store at most the limit.
	CreateGrantLimited(ctx context.Context, g Grant, lim GrantLimits) (Grant, error)
	// ListGrants returns p's grants created at or after since (expiry is not
	// applied here), oldest first, via the per-principal index.
	ListGrants(ctx context.Context, p Principal, since time.Time) ([]Grant, error)
	// CountGrants returns how many of p's grants were created at or after
	// since, and how many of those are still open (pending or approved, not
	// yet expired at now).
	CountGrants(ctx context.Context, p Principal, since, now time.Time) (created, open int, err error)
	// DeleteExpiredGrants removes grants whose Expires is before now and
	// returns how many it removed.
	DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error)

	// The store's other features, each a sub-store asked for by name, so
	// that nothing finds one by type assertion and a wrapper (Observe)
	// hands out its own wrapped sub-store for each. A sub-store keeps
	// working only while the store is open.

	// Connector returns the one-transaction connect, or nil when the
	// store has none (callers then write the connection and the grant
	// in two steps).
	Connector() GrantConnector
	// Auth returns the authorization server's records.
	Auth() AuthStore
	// Outbox returns the webhook outbox.
	Outbox() Outbox
	// Admin returns the operators' bulk operations.
	Admin() AdminStore
	// Assertions returns the ledger of spent one-time assertions.
	Assertions() AssertionLedger
	// Locker returns the store's connection locks. It is the same for
	// every call on one store, so every caller excludes every other.
	Locker() Locker
	// Resealer returns the batch re-seal of key rotation, or nil when the
	// store has none (Rekey then rewrites record by record).
	Resealer() Resealer
	// AppWatch returns the feed of the changes other processes make to
	// the authorization server's app access records, or nil when the
	// store has none (one process writes a bolt file or a memory store).
	AppWatch() AppWatch
	// UpstreamClients returns the broker's registrations at upstream MCP
	// servers' authorization servers.
	UpstreamClients() UpstreamClientStore
	// IdPSessions returns people's sessions at the organisation's IdP.
	IdPSessions() IdPSessionStore

	// Close releases the store. Further calls return ErrClosed.
	Close() error
}
