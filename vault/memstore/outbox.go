package memstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Outbox implements vault.Store: the store is its own Outbox.
func (s *Store) Outbox() vault.Outbox { return s }

// EnqueueDeliveries implements vault.Outbox.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []vault.Delivery) error {
	if err := record.CheckDeliveries(ds); err != nil {
		return err
	}
	return update(s, func() error {
		s.enqueue(ds)
		return nil
	})
}

// ClaimDeliveries implements vault.Outbox under the write lock.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]vault.Delivery, error) {
	return write(s, func() ([]vault.Delivery, error) {
		var due []vault.Delivery
		for _, d := range s.outbox {
			if !d.Due.After(now) {
				due = append(due, d)
			}
		}
		slices.SortFunc(due, func(a, b vault.Delivery) int {
			if c := a.Due.Compare(b.Due); c != 0 {
				return c
			}
			return strings.Compare(a.Key(), b.Key())
		})
		if limit > 0 && len(due) > limit {
			due = due[:limit]
		}
		out := make([]vault.Delivery, 0, len(due))
		for _, d := range due {
			d.Due = now.Add(lease)
			s.outbox[d.Key()] = d
			out = append(out, d.Clone())
		}
		return out, nil
	})
}

// FinishDelivery implements vault.Outbox.
func (s *Store) FinishDelivery(ctx context.Context, id, endpoint string) error {
	return deleteKey(s, s.outbox, vault.Delivery{ID: id, Endpoint: endpoint}.Key(), fmt.Sprintf("delivery %s to %s", id, endpoint))
}

// RetryDelivery implements vault.Outbox.
func (s *Store) RetryDelivery(ctx context.Context, d vault.Delivery) error {
	return update(s, func() error {
		old, ok := s.outbox[d.Key()]
		if !ok {
			return fmt.Errorf("memstore: delivery %s to %s: %w", d.ID, d.Endpoint, vault.ErrNotFound)
		}
		old.Attempts, old.Due, old.LastError = d.Attempts, d.Due, d.LastError
		s.outbox[d.Key()] = old
		return nil
	})
}

// OutboxDepth implements vault.Outbox.
func (s *Store) OutboxDepth(ctx context.Context) (int, time.Time, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.check(); err != nil {
		return 0, time.Time{}, err
	}
	var oldest time.Time
	for _, d := range s.outbox {
		if oldest.IsZero() || d.Created.Before(oldest) {
			oldest = d.Created
		}
	}
	return len(s.outbox), oldest, nil
}

// Admin implements vault.Store: the store is its own AdminStore.
func (s *Store) Admin() vault.AdminStore { return s }

// ProviderConnections implements vault.AdminStore: a scan of every
// record's metadata.
func (s *Store) ProviderConnections(ctx context.Context, provider, after string, limit int) ([]vault.Connection, error) {
	return read(s, func() ([]vault.Connection, error) {
		var out []vault.Connection
		for id, b := range s.conns {
			if id <= after {
				continue
			}
			m, err := record.ConnectionMeta(b)
			if err != nil {
				return nil, err
			}
			if m.Provider == provider {
				out = append(out, m)
			}
		}
		slices.SortFunc(out, func(a, b vault.Connection) int { return strings.Compare(a.ID, b.ID) })
		if limit > 0 && len(out) > limit {
			out = out[:limit]
		}
		return out, nil
	})
}

// DeleteGrants implements vault.AdminStore.
func (s *Store) DeleteGrants(ctx context.Context, p vault.Principal) (int, error) {
	return deleteWhere(s, s.grants, func(b []byte) (bool, error) {
		g, err := record.DecodeGrant(b)
		return err == nil && g.Principal == p, err
	})
}

// RetireConnection implements vault.AdminStore.
func (s *Store) RetireConnection(ctx context.Context, id string) error {
	return s.deleteConnection(id, true)
}

// RetiredConnections implements vault.AdminStore.
func (s *Store) RetiredConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	recs, err := read(s, func() ([][]byte, error) { return inOrder(s.retired, maps.Keys(s.retired)), nil })
	if err != nil {
		return nil, err
	}
	var out []vault.Connection
	for _, b := range recs {
		m, err := record.ConnectionMeta(b)
		if err != nil {
			return nil, err
		}
		if m.Principal != p {
			continue
		}
		c, err := record.DecodeConnection(s.kr, b)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b vault.Connection) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// ForgetRetired implements vault.AdminStore.
func (s *Store) ForgetRetired(ctx context.Context, id string) error {
	return deleteKey(s, s.retired, id, "retired connection "+id)
}
