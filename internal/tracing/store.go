package tracing

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"credbroker/vault"
)

// WrapStore returns s with every operation in a span named
// "vault.<operation>" (attribute vault.operation; never an id, a principal
// or a token). The optional vault.Resealer feature is kept, and Unwrap
// reaches s. A nil provider returns s itself.
func WrapStore(tp trace.TracerProvider, s vault.Store) vault.Store {
	if tp == nil {
		return s
	}
	t := &tracedStore{next: s, tr: Tracer(tp)}
	if rs, ok := s.(vault.Resealer); ok {
		return &tracedResealer{tracedStore: t, rs: rs}
	}
	return t
}

type tracedStore struct {
	next vault.Store
	tr   trace.Tracer
}

var (
	_ vault.Store    = (*tracedStore)(nil)
	_ vault.Resealer = (*tracedResealer)(nil)
)

func (t *tracedStore) start(ctx context.Context, op string) (context.Context, trace.Span) {
	return t.tr.Start(ctx, "vault."+op, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("vault.operation", op)))
}

// end records a failure's kind, never its text (which may name an id).
func end(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, "vault operation failed")
	}
	span.End()
}

func (t *tracedStore) CreateConnection(ctx context.Context, c vault.Connection) (vault.Connection, error) {
	ctx, span := t.start(ctx, "create_connection")
	out, err := t.next.CreateConnection(ctx, c)
	end(span, err)
	return out, err
}

func (t *tracedStore) GetConnection(ctx context.Context, id string) (vault.Connection, error) {
	ctx, span := t.start(ctx, "get_connection")
	out, err := t.next.GetConnection(ctx, id)
	end(span, err)
	return out, err
}

func (t *tracedStore) ListConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	ctx, span := t.start(ctx, "list_connections")
	out, err := t.next.ListConnections(ctx, p)
	end(span, err)
	return out, err
}

func (t *tracedStore) UpdateConnection(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	ctx, span := t.start(ctx, "update_connection")
	out, err := t.next.UpdateConnection(ctx, id, fn)
	end(span, err)
	return out, err
}

func (t *tracedStore) UpdateConnectionMeta(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	ctx, span := t.start(ctx, "update_connection_meta")
	out, err := t.next.UpdateConnectionMeta(ctx, id, fn)
	end(span, err)
	return out, err
}

func (t *tracedStore) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	ctx, span := t.start(ctx, "connection_ids")
	out, err := t.next.ConnectionIDs(ctx, after, limit)
	end(span, err)
	return out, err
}

func (t *tracedStore) AccountConnections(ctx context.Context, provider, accountID string) ([]vault.Connection, error) {
	ctx, span := t.start(ctx, "account_connections")
	out, err := t.next.AccountConnections(ctx, provider, accountID)
	end(span, err)
	return out, err
}

func (t *tracedStore) CreateGrant(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	ctx, span := t.start(ctx, "create_grant")
	out, err := t.next.CreateGrant(ctx, g)
	end(span, err)
	return out, err
}

func (t *tracedStore) CreateGrantLimited(ctx context.Context, g vault.Grant, lim vault.GrantLimits) (vault.Grant, error) {
	ctx, span := t.start(ctx, "create_grant_limited")
	out, err := t.next.CreateGrantLimited(ctx, g, lim)
	end(span, err)
	return out, err
}

func (t *tracedStore) GetGrant(ctx context.Context, id string) (vault.Grant, error) {
	ctx, span := t.start(ctx, "get_grant")
	out, err := t.next.GetGrant(ctx, id)
	end(span, err)
	return out, err
}

func (t *tracedStore) UpdateGrant(ctx context.Context, id string, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
	ctx, span := t.start(ctx, "update_grant")
	out, err := t.next.UpdateGrant(ctx, id, fn)
	end(span, err)
	return out, err
}

func (t *tracedStore) ListGrants(ctx context.Context, p vault.Principal, since time.Time) ([]vault.Grant, error) {
	ctx, span := t.start(ctx, "list_grants")
	out, err := t.next.ListGrants(ctx, p, since)
	end(span, err)
	return out, err
}

func (t *tracedStore) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	ctx, span := t.start(ctx, "delete_expired_grants")
	out, err := t.next.DeleteExpiredGrants(ctx, now)
	end(span, err)
	return out, err
}

func (t *tracedStore) DeleteConnection(ctx context.Context, id string) error {
	ctx, span := t.start(ctx, "delete_connection")
	err := t.next.DeleteConnection(ctx, id)
	end(span, err)
	return err
}

func (t *tracedStore) CountGrants(ctx context.Context, p vault.Principal, since, now time.Time) (int, int, error) {
	ctx, span := t.start(ctx, "count_grants")
	created, open, err := t.next.CountGrants(ctx, p, since, now)
	end(span, err)
	return created, open, err
}

func (t *tracedStore) Close() error { return t.next.Close() }

// Unwrap returns the wrapped store (for backend-specific features).
func (t *tracedStore) Unwrap() vault.Store { return t.next }

type tracedResealer struct {
	*tracedStore
	rs vault.Resealer
}

func (t *tracedResealer) Reseal(ctx context.Context, ids []string) (int, error) {
	ctx, span := t.start(ctx, "reseal")
	n, err := t.rs.Reseal(ctx, ids)
	end(span, err)
	return n, err
}

// Connect passes vault.GrantConnector through, so a traced store still
// writes the connection and completes its grant in one transaction; a store
// without it answers errors.ErrUnsupported and callers write twice.
func (t *tracedStore) Connect(ctx context.Context, w vault.ConnectionWrite, grantID string, fn func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	gc, ok := t.next.(vault.GrantConnector)
	if !ok {
		return vault.Connection{}, vault.Grant{}, errors.ErrUnsupported
	}
	ctx, span := t.start(ctx, "connect")
	c, g, err := gc.Connect(ctx, w, grantID, fn)
	end(span, err)
	return c, g, err
}

var _ vault.GrantConnector = (*tracedStore)(nil)
