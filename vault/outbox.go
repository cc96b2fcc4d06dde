package vault

import (
	"context"
	"slices"
	"time"
)

// Delivery is one event on its way to one webhook endpoint: a row of the
// outbox. An event sent to two endpoints is two deliveries with the same
// ID. The payload is the exact body sent (it never holds a token).
type Delivery struct {
	// ID is the event's id (the webhook-id header): the same for every
	// endpoint and every attempt, so receivers deduplicate by it.
	ID string
	// Endpoint is the configured name of the endpoint.
	Endpoint string
	// Type is the event type ("connection.deleted").
	Type string
	// Created is when the event happened; a delivery is given up some
	// time after it.
	Created time.Time
	// Payload is the body, byte for byte (the signature covers it).
	Payload []byte
	// Attempts counts the failed attempts so far.
	Attempts int
	// Due is when the next attempt may start. While a dispatcher holds
	// the delivery (ClaimDeliveries), it is the end of that claim.
	Due time.Time
	// LastError says why the last attempt failed (for people).
	LastError string
}

// Key is the delivery's identity in the outbox: its ID and endpoint.
func (d Delivery) Key() string { return d.ID + "\x00" + d.Endpoint }

// Clone returns a deep copy of d.
func (d Delivery) Clone() Delivery {
	d.Payload = slices.Clone(d.Payload)
	return d
}

// ChangeHook says which deliveries a change of a record causes: of a
// connection (ChangeHook[Connection]) or of one of the authorization
// server's app access records (ChangeHook[AppAccess], AuthStore). A
// backend given one calls it inside the transaction that writes the
// change (a create, an update, a delete) and stores what it returns in
// the outbox in that same transaction, so a committed change always has
// its events and a change that is rolled back has none. before is nil for
// a created record, after is nil for a deleted one; a connection's are
// metadata only (no token). It must be pure: no I/O, no side effects (a
// backend may call it again when it retries a transaction).
type ChangeHook[R Connection | AppAccess] func(before, after *R) []Delivery

// Outbox is the durable queue of webhook deliveries, the Store feature
// that Store.Outbox returns. Deliveries are handed out at least once: a
// dispatcher that claims some and dies leaves them due again when its
// claim ends.
type Outbox interface {
	// EnqueueDeliveries stores deliveries that no change of a stored
	// record carries (a failed refresh, say). A delivery whose (ID,
	// Endpoint) is already stored is left as it is.
	EnqueueDeliveries(ctx context.Context, ds []Delivery) error
	// ClaimDeliveries returns up to limit deliveries due at now, earliest
	// due first, and in the same atomic step moves their Due to
	// now+lease: another dispatcher (another replica sharing the store)
	// never gets one of them while the claim runs.
	ClaimDeliveries(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]Delivery, error)
	// FinishDelivery removes a delivery: sent, or given up. ErrNotFound
	// when it is not stored.
	FinishDelivery(ctx context.Context, id, endpoint string) error
	// RetryDelivery stores d's Attempts, Due and LastError after a failed
	// attempt. ErrNotFound when it is not stored.
	RetryDelivery(ctx context.Context, d Delivery) error
	// OutboxDepth reports how many deliveries are stored and when the
	// oldest of their events happened (zero when there is none).
	OutboxDepth(ctx context.Context) (n int, oldest time.Time, err error)
}

// AdminStore is what operators' bulk operations need beyond Store, the
// Store feature that Store.Admin returns.
type AdminStore interface {
	// ProviderConnections returns up to limit connections to provider
	// whose id is greater than after, ordered by id: metadata only, as
	// ListConnections. limit <= 0 means no limit.
	ProviderConnections(ctx context.Context, provider, after string, limit int) ([]Connection, error)
	// DeleteGrants removes every grant of p, whatever its state, and
	// returns how many it removed.
	DeleteGrants(ctx context.Context, p Principal) (int, error)
	// RetireConnection deletes connection id (the ChangeHook sees a
	// deletion) and, in the same transaction, keeps its sealed record
	// apart, so that revoking its tokens at the provider can be retried
	// later. Only offboarding does this, when revocation was not
	// confirmed. ErrNotFound when the connection is not stored.
	RetireConnection(ctx context.Context, id string) error
	// RetiredConnections returns p's retired connections with their
	// tokens opened, ordered by id.
	RetiredConnections(ctx context.Context, p Principal) ([]Connection, error)
	// ForgetRetired removes a retired record (its tokens are revoked, or
	// given up). ErrNotFound when it is not stored.
	ForgetRetired(ctx context.Context, id string) error
}
