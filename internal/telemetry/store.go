package telemetry

import (
	"context"
	"time"

	"credbroker/vault"
)

// WrapStore returns s with every operation timed into
// credbroker_vault_operation_duration_seconds. The optional vault.Resealer
// feature is kept when s has it. A nil Recorder returns s itself.
func (r *Recorder) WrapStore(s vault.Store) vault.Store {
	if r == nil {
		return s
	}
	t := &timedStore{next: s, r: r}
	if rs, ok := s.(vault.Resealer); ok {
		return &timedResealer{timedStore: t, rs: rs}
	}
	return t
}

// timedStore times each call to next.
type timedStore struct {
	next vault.Store
	r    *Recorder
}

var (
	_ vault.Store    = (*timedStore)(nil)
	_ vault.Resealer = (*timedResealer)(nil)
)

func (t *timedStore) done(op string, start time.Time, err error) {
	t.r.vaultOp(op, err, time.Since(start))
}

func (t *timedStore) CreateConnection(ctx context.Context, c vault.Connection) (vault.Connection, error) {
	start := time.Now()
	out, err := t.next.CreateConnection(ctx, c)
	t.done("create_connection", start, err)
	return out, err
}

func (t *timedStore) GetConnection(ctx context.Context, id string) (vault.Connection, error) {
	start := time.Now()
	out, err := t.next.GetConnection(ctx, id)
	t.done("get_connection", start, err)
	return out, err
}

func (t *timedStore) ListConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	start := time.Now()
	out, err := t.next.ListConnections(ctx, p)
	t.done("list_connections", start, err)
	return out, err
}

func (t *timedStore) UpdateConnection(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	start := time.Now()
	out, err := t.next.UpdateConnection(ctx, id, fn)
	t.done("update_connection", start, err)
	return out, err
}

func (t *timedStore) UpdateConnectionMeta(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	start := time.Now()
	out, err := t.next.UpdateConnectionMeta(ctx, id, fn)
	t.done("update_connection_meta", start, err)
	return out, err
}

func (t *timedStore) DeleteConnection(ctx context.Context, id string) error {
	start := time.Now()
	err := t.next.DeleteConnection(ctx, id)
	t.done("delete_connection", start, err)
	return err
}

func (t *timedStore) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	start := time.Now()
	out, err := t.next.ConnectionIDs(ctx, after, limit)
	t.done("connection_ids", start, err)
	return out, err
}

func (t *timedStore) AccountConnections(ctx context.Context, provider, accountID string) ([]vault.Connection, error) {
	start := time.Now()
	out, err := t.next.AccountConnections(ctx, provider, accountID)
	t.done("account_connections", start, err)
	return out, err
}

func (t *timedStore) CreateGrant(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	start := time.Now()
	out, err := t.next.CreateGrant(ctx, g)
	t.done("create_grant", start, err)
	return out, err
}

func (t *timedStore) CreateGrantLimited(ctx context.Context, g vault.Grant, lim vault.GrantLimits) (vault.Grant, error) {
	start := time.Now()
	out, err := t.next.CreateGrantLimited(ctx, g, lim)
	t.done("create_grant_limited", start, err)
	return out, err
}

func (t *timedStore) GetGrant(ctx context.Context, id string) (vault.Grant, error) {
	start := time.Now()
	out, err := t.next.GetGrant(ctx, id)
	t.done("get_grant", start, err)
	return out, err
}

func (t *timedStore) UpdateGrant(ctx context.Context, id string, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
	start := time.Now()
	out, err := t.next.UpdateGrant(ctx, id, fn)
	t.done("update_grant", start, err)
	return out, err
}

func (t *timedStore) CountGrants(ctx context.Context, p vault.Principal, since, now time.Time) (int, int, error) {
	start := time.Now()
	created, open, err := t.next.CountGrants(ctx, p, since, now)
	t.done("count_grants", start, err)
	return created, open, err
}

func (t *timedStore) ListGrants(ctx context.Context, p vault.Principal, since time.Time) ([]vault.Grant, error) {
	start := time.Now()
	out, err := t.next.ListGrants(ctx, p, since)
	t.done("list_grants", start, err)
	return out, err
}

func (t *timedStore) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	start := time.Now()
	n, err := t.next.DeleteExpiredGrants(ctx, now)
	t.done("delete_expired_grants", start, err)
	return n, err
}

func (t *timedStore) Close() error { return t.next.Close() }

// Unwrap returns the wrapped store (for backend-specific features).
func (t *timedStore) Unwrap() vault.Store { return t.next }

// timedResealer keeps the optional Resealer feature visible.
type timedResealer struct {
	*timedStore
	rs vault.Resealer
}

func (t *timedResealer) Reseal(ctx context.Context, ids []string) (int, error) {
	start := time.Now()
	n, err := t.rs.Reseal(ctx, ids)
	t.done("reseal", start, err)
	return n, err
}
