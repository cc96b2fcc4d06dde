package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Outbox implements vault.Store: the store is its own Outbox.
func (s *Store) Outbox() vault.Outbox { return s }

const insertDelivery = `INSERT INTO outbox (id, endpoint, type, created_ns, due_ns, attempts, last_error, payload)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id, endpoint) DO NOTHING`

func deliveryArgs(d vault.Delivery) []any {
	return []any{d.ID, d.Endpoint, d.Type, nanos(d.Created), nanos(d.Due), d.Attempts, shown(d.LastError), d.Payload}
}

// queueDeliveries adds the inserts of ds to b.
func queueDeliveries(b *pgx.Batch, ds []vault.Delivery) {
	for _, d := range ds {
		b.Queue(insertDelivery, deliveryArgs(d)...)
	}
}

// execWithDeliveries runs one statement and, when ds is not empty, the
// inserts of ds in the same transaction, committed only when the
// statement changed a row (a lost compare-and-swap or a taken id writes
// no delivery).
func (s *Store) execWithDeliveries(ctx context.Context, ds []vault.Delivery, sql string, args ...any) (pgconn.CommandTag, error) {
	if len(ds) == 0 {
		return s.pool.Exec(ctx, sql, args...)
	}
	var tag pgconn.CommandTag
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if tag, err = tx.Exec(ctx, sql, args...); err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return errNoChange
		}
		b := &pgx.Batch{}
		queueDeliveries(b, ds)
		return tx.SendBatch(ctx, b).Close()
	})
	if errors.Is(err, errNoChange) {
		err = nil
	}
	return tag, err
}

var errNoChange = errors.New("pgstore: no row changed")

// deleteConnection deletes connection id and writes its deliveries in
// one transaction, keeping the record among the retired ones when retire
// is set.
func (s *Store) deleteConnection(ctx context.Context, id string, retire bool) error {
	return s.deleteReturning(ctx, "connection", id, "DELETE FROM connections WHERE id = $1 RETURNING record", func(rec []byte, b *pgx.Batch) error {
		ds, err := record.ChangeDeliveries(s.changes, rec, nil)
		if err != nil {
			return err
		}
		queueDeliveries(b, ds)
		if retire {
			m, err := record.ConnectionMeta(rec)
			if err != nil {
				return err
			}
			b.Queue(`INSERT INTO retired_connections (id, iss, sub, record) VALUES ($1, $2, $3, $4)
				ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record`, id, []byte(m.Principal.Issuer), []byte(m.Principal.Subject), rec)
		}
		return nil
	})
}

// deleteReturning runs del (a DELETE of row id … RETURNING record) and, in
// the same transaction, what then adds to a batch given the deleted
// record (its deliveries, …). An error from then rolls the deletion back
// and is the answer; ErrNotFound when there was no row.
func (s *Store) deleteReturning(ctx context.Context, what, id, del string, then func(rec []byte, b *pgx.Batch) error) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	if !storable(id) {
		return fmt.Errorf("pgstore: %s %q: %w", what, id, vault.ErrNotFound)
	}
	var opErr error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		opErr = nil
		var rec []byte
		err := tx.QueryRow(ctx, del, id).Scan(&rec)
		if errors.Is(err, pgx.ErrNoRows) {
			opErr = fmt.Errorf("pgstore: %s %s: %w", what, id, vault.ErrNotFound)
			return nil
		}
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		if opErr = then(rec, b); opErr != nil {
			return errNoChange // roll back
		}
		if b.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if errors.Is(err, errNoChange) {
		err = nil
	}
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: delete %s %s: %w", what, id, err))
	}
	return opErr
}

// EnqueueDeliveries implements vault.Outbox.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []vault.Delivery) error {
	if err := s.open.CheckDeliveries(ctx, ds); err != nil {
		return err
	}
	if len(ds) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	queueDeliveries(b, ds)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return s.dbErr(fmt.Errorf("pgstore: enqueue deliveries: %w", err))
	}
	return nil
}

// ClaimDeliveries implements vault.Outbox with one statement: the due
// rows are locked with FOR UPDATE SKIP LOCKED, so replicas claiming at the
// same moment take disjoint rows without waiting for each other, and
// their due time moves to the end of the claim before the lock is let go.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]vault.Delivery, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	var lim *int64
	if limit > 0 {
		l := int64(limit)
		lim = &l
	}
	rows, err := s.pool.Query(ctx, `UPDATE outbox SET due_ns = $2 WHERE (id, endpoint) IN (
		SELECT id, endpoint FROM outbox WHERE due_ns <= $1 ORDER BY due_ns LIMIT $3 FOR UPDATE SKIP LOCKED)
		RETURNING id, endpoint, type, created_ns, attempts, last_error, payload`, nanos(now), nanos(now.Add(lease)), lim)
	if err != nil {
		return nil, s.dbErr(fmt.Errorf("pgstore: claim deliveries: %w", err))
	}
	var (
		out       []vault.Delivery
		d         vault.Delivery
		createdNs int64
	)
	_, err = pgx.ForEachRow(rows, []any{&d.ID, &d.Endpoint, &d.Type, &createdNs, &d.Attempts, &d.LastError, &d.Payload}, func() error {
		d.Created = time.Unix(0, createdNs).UTC()
		d.Due = now.Add(lease)
		out = append(out, d.Clone())
		return nil
	})
	if err != nil {
		return nil, s.dbErr(fmt.Errorf("pgstore: claim deliveries: %w", err))
	}
	slices.SortFunc(out, func(a, b vault.Delivery) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Key(), b.Key())
	})
	return out, nil
}

// FinishDelivery implements vault.Outbox.
func (s *Store) FinishDelivery(ctx context.Context, id, endpoint string) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	if !storable(id) || !storable(endpoint) {
		return fmt.Errorf("pgstore: delivery %q: %w", id, vault.ErrNotFound)
	}
	tag, err := s.pool.Exec(ctx, "DELETE FROM outbox WHERE id = $1 AND endpoint = $2", id, endpoint)
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: finish delivery %s: %w", id, err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: delivery %s to %s: %w", id, endpoint, vault.ErrNotFound)
	}
	return nil
}

// RetryDelivery implements vault.Outbox.
func (s *Store) RetryDelivery(ctx context.Context, d vault.Delivery) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	if !storable(d.ID) || !storable(d.Endpoint) {
		return fmt.Errorf("pgstore: delivery %q: %w", d.ID, vault.ErrNotFound)
	}
	tag, err := s.pool.Exec(ctx, "UPDATE outbox SET attempts = $3, due_ns = $4, last_error = $5 WHERE id = $1 AND endpoint = $2",
		d.ID, d.Endpoint, d.Attempts, nanos(d.Due), shown(strings.ToValidUTF8(d.LastError, "\uFFFD")))
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: retry delivery %s: %w", d.ID, err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: delivery %s to %s: %w", d.ID, d.Endpoint, vault.ErrNotFound)
	}
	return nil
}

// OutboxDepth implements vault.Outbox.
func (s *Store) OutboxDepth(ctx context.Context) (int, time.Time, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, time.Time{}, err
	}
	var (
		n      int
		oldest *int64
	)
	if err := s.pool.QueryRow(ctx, "SELECT count(*), min(created_ns) FROM outbox").Scan(&n, &oldest); err != nil {
		return 0, time.Time{}, s.dbErr(fmt.Errorf("pgstore: outbox depth: %w", err))
	}
	if oldest == nil {
		return n, time.Time{}, nil
	}
	return n, time.Unix(0, *oldest).UTC(), nil
}

// Admin implements vault.Store: the store is its own AdminStore.
func (s *Store) Admin() vault.AdminStore { return s }

// ProviderConnections implements vault.AdminStore through the (provider,
// id) index.
func (s *Store) ProviderConnections(ctx context.Context, provider, after string, limit int) ([]vault.Connection, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	if !storable(after) {
		return nil, fmt.Errorf("pgstore: provider connections after %q: not a storable id", after)
	}
	recs, err := queryColumn[[]byte](ctx, s, "provider connections", "SELECT record FROM connections WHERE provider = $1 AND id > $2 ORDER BY id LIMIT $3",
		shown(provider), after, limitArg(limit))
	if err != nil {
		return nil, err
	}
	out := make([]vault.Connection, 0, len(recs))
	for _, rec := range recs {
		m, err := record.ConnectionMeta(rec)
		if err != nil {
			return nil, err
		}
		if m.Provider == provider {
			out = append(out, m)
		}
	}
	return out, nil
}

// DeleteGrants implements vault.AdminStore.
func (s *Store) DeleteGrants(ctx context.Context, p vault.Principal) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, "DELETE FROM grants WHERE iss = $1 AND sub = $2", []byte(p.Issuer), []byte(p.Subject))
	if err != nil {
		return 0, s.dbErr(fmt.Errorf("pgstore: delete grants: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

// RetireConnection implements vault.AdminStore.
func (s *Store) RetireConnection(ctx context.Context, id string) error {
	return s.deleteConnection(ctx, id, true)
}

// RetiredConnections implements vault.AdminStore.
func (s *Store) RetiredConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	recs, err := queryColumn[[]byte](ctx, s, "retired connections", "SELECT record FROM retired_connections WHERE iss = $1 AND sub = $2 ORDER BY id",
		[]byte(p.Issuer), []byte(p.Subject))
	if err != nil {
		return nil, err
	}
	return record.DecodeRetired(s.kr, p, recs)
}

// ForgetRetired implements vault.AdminStore.
func (s *Store) ForgetRetired(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "retired_connections", "id", id, "retired connection")
}
