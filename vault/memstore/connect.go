package memstore

import (
	"context"
	"fmt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Connector implements vault.Store: the store connects in one transaction.
func (s *Store) Connector() vault.GrantConnector { return s }

// Connect implements vault.GrantConnector under the write lock.
func (s *Store) Connect(ctx context.Context, w vault.ConnectionWrite, grantID string, grant func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	t, err := record.ConnectTarget(s.kr, w)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	type connected struct {
		c vault.Connection
		g vault.Grant
	}
	r, err := write(s, func() (connected, error) {
		old := s.conns[t.ID]
		rec, out, err := t.Onto(old)
		if err != nil {
			return connected{}, err
		}
		gb, ok := s.grants[grantID]
		if !ok {
			return connected{}, fmt.Errorf("memstore: grant %s: %w", grantID, vault.ErrNotFound)
		}
		ngb, _, ng, err := record.Grants.Update(gb, grant)
		if err != nil {
			return connected{}, err
		}
		ds, err := record.ChangeDeliveries(s.changes, old, rec)
		if err != nil {
			return connected{}, err
		}
		// Nothing fails past this point: both writes land together.
		s.conns[t.ID] = rec
		s.enqueue(ds)
		if w.Create != nil {
			s.index(t.Created.Principal, t.ID)
		}
		s.grants[grantID] = ngb
		return connected{out, ng}, nil
	})
	return r.c, r.g, err
}
