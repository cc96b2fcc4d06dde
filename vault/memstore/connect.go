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
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(); err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	old, exists := s.conns[id]
	var out vault.Connection
	switch {
	case w.Create != nil && exists:
		return vault.Connection{}, vault.Grant{}, fmt.Errorf("memstore: connection %s: %w", id, vault.ErrExists)
	case w.Create != nil:
		out = created
		out.SealedWith = s.kr.Primary()
	case !exists:
		return vault.Connection{}, vault.Grant{}, fmt.Errorf("memstore: connection %s: %w", id, vault.ErrNotFound)
	default:
		nb, nc, err := record.ApplyConnectionRecordUpdate(s.kr, old, id, w.Update)
		if err != nil {
			return vault.Connection{}, vault.Grant{}, err
		}
		newRec, out = nb, nc
	}
	gb, ok := s.grants[grantID]
	if !ok {
		return vault.Connection{}, vault.Grant{}, fmt.Errorf("memstore: grant %s: %w", grantID, vault.ErrNotFound)
	}
	ngb, _, ng, err := record.Grants.Update(gb, grant)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	var prev []byte
	if exists {
		prev = old
	}
	ds, err := record.ChangeDeliveries(s.changes, prev, newRec)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	// Nothing fails past this point: both writes land together.
	s.conns[id] = newRec
	s.enqueue(ds)
	if w.Create != nil {
		idx := s.byPrincipal[created.Principal]
		if idx == nil {
			idx = map[string]struct{}{}
			s.byPrincipal[created.Principal] = idx
		}
		idx[id] = struct{}{}
	}
	s.grants[grantID] = ngb
	return out, ng, nil
}
