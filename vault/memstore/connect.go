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
	id, created, newRec, err := record.ConnectTarget(s.kr, w)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	type connected struct {
		c vault.Connection
		g vault.Grant
	}
	r, err := write(s, func() (connected, error) {
		old, exists := s.conns[id]
		var out vault.Connection
		switch {
		case w.Create != nil && exists:
			return connected{}, fmt.Errorf("memstore: connection %s: %w", id, vault.ErrExists)
		case w.Create != nil:
			out = created
			out.SealedWith = s.kr.Primary()
		case !exists:
			return connected{}, fmt.Errorf("memstore: connection %s: %w", id, vault.ErrNotFound)
		default:
			nb, nc, err := record.ApplyConnectionRecordUpdate(s.kr, old, id, w.Update)
			if err != nil {
				return connected{}, err
			}
			newRec, out = nb, nc
		}
		gb, ok := s.grants[grantID]
		if !ok {
			return connected{}, fmt.Errorf("memstore: grant %s: %w", grantID, vault.ErrNotFound)
		}
		ngb, _, ng, err := record.Grants.Update(gb, grant)
		if err != nil {
			return connected{}, err
		}
		var prev []byte
		if exists {
			prev = old
		}
		ds, err := record.ChangeDeliveries(s.changes, prev, newRec)
		if err != nil {
			return connected{}, err
		}
		// Nothing fails past this point: both writes land together.
		s.conns[id] = newRec
		s.enqueue(ds)
		if w.Create != nil {
			s.index(created.Principal, id)
		}
		s.grants[grantID] = ngb
		return connected{out, ng}, nil
	})
	return r.c, r.g, err
}
